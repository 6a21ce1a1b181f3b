//! `/v1/basins`: create, ensure, get config, reconfigure, list, delete.

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use streamgate_core::config::{BasinConfig, BasinReconfiguration};
use streamgate_core::names::BasinName;
use streamgate_core::Engine;

use super::error::{ApiError, ApiResult};
use super::extract::{json_body, request_token, ApiQuery, Authenticated, BasinPath};
use super::json::BasinInfo;
use super::{provisioned, ListQuery};

#[derive(Deserialize)]
struct CreateBasinRequest {
    basin: String,
    #[serde(default)]
    config: Option<BasinConfig>,
    #[serde(default)]
    location: Option<String>,
}

#[derive(Deserialize, Default)]
struct EnsureBasinRequest {
    #[serde(default)]
    config: Option<BasinConfig>,
    #[serde(default)]
    location: Option<String>,
}

fn check_location(engine: &Engine, location: &Option<String>) -> ApiResult<()> {
    match location {
        Some(location) if *location != engine.settings().location => {
            Err(ApiError::invalid(format!(
                "unknown location `{location}`; this server offers `{}`",
                engine.settings().location
            )))
        }
        _ => Ok(()),
    }
}

pub async fn create(
    Authenticated(engine): Authenticated,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let request: CreateBasinRequest = json_body(&headers, &body)?
        .ok_or_else(|| ApiError::bad_json("a request body is required"))?;
    let token = request_token(&headers)?;
    let name = BasinName::new(request.basin).map_err(ApiError::bad_json)?;
    check_location(engine.engine(), &request.location)?;
    let basin = engine
        .create_basin(name, request.config.unwrap_or_default(), token.as_deref())
        .await?;
    Ok((StatusCode::CREATED, Json(BasinInfo::from(&basin))).into_response())
}

pub async fn ensure(
    Authenticated(engine): Authenticated,
    BasinPath(name): BasinPath,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let request: EnsureBasinRequest = json_body(&headers, &body)?.unwrap_or_default();
    check_location(engine.engine(), &request.location)?;
    let (basin, result) = engine
        .ensure_basin(name, request.config.unwrap_or_default())
        .await?;
    Ok(provisioned(result, BasinInfo::from(&basin)))
}

pub async fn get_config(
    Authenticated(engine): Authenticated,
    BasinPath(name): BasinPath,
) -> ApiResult<Json<BasinConfig>> {
    Ok(Json(engine.basin(&name).await?.config))
}

pub async fn reconfigure(
    Authenticated(engine): Authenticated,
    BasinPath(name): BasinPath,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<BasinConfig>> {
    let change: BasinReconfiguration = json_body(&headers, &body)?.unwrap_or_default();
    Ok(Json(engine.reconfigure_basin(&name, &change).await?))
}

pub async fn list(
    Authenticated(engine): Authenticated,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> ApiResult<Json<serde_json::Value>> {
    let page = engine
        .list_basins(&query.range(BasinName::MAX_LEN)?)
        .await?;
    let basins: Vec<BasinInfo> = page.items.iter().map(BasinInfo::from).collect();
    Ok(Json(
        serde_json::json!({ "basins": basins, "has_more": page.has_more }),
    ))
}

pub async fn delete(
    Authenticated(engine): Authenticated,
    BasinPath(name): BasinPath,
) -> ApiResult<StatusCode> {
    engine.delete_basin(&name).await?;
    Ok(StatusCode::ACCEPTED)
}
