//! `/v1/basins`: create, ensure, get config, reconfigure, list, delete.

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use streamgate_core::config::{BasinConfig, BasinReconfiguration};
use streamgate_core::names::BasinName;
use streamgate_core::Caller;

use super::error::{ApiError, ApiResult};
use super::extract::{json_body, request_token, ApiQuery, Authenticated, BasinPath, UnaryBody};
use super::json::BasinInfo;
use super::{provisioned, ListQuery};

#[derive(Deserialize)]
struct CreateBasinRequest {
    basin: String,
    #[serde(default)]
    config: Option<BasinConfig>,
    /// Where the basin lives: the v1 spec's `scope`, or `location` as newer clients
    /// name it. Either must be the one location this server offers.
    #[serde(default)]
    scope: Option<String>,
    #[serde(default)]
    location: Option<String>,
}

#[derive(Deserialize, Default)]
struct EnsureBasinRequest {
    #[serde(default)]
    config: Option<BasinConfig>,
    #[serde(default)]
    scope: Option<String>,
    #[serde(default)]
    location: Option<String>,
}

/// A requested `scope` or `location` must name this server's location (`--location`,
/// what `GET /v1/locations` reports).
fn check_location(
    caller: &Caller,
    scope: &Option<String>,
    location: &Option<String>,
) -> ApiResult<()> {
    let offered = &caller.settings().location;
    for (field, requested) in [("scope", scope), ("location", location)] {
        match requested {
            Some(requested) if requested != offered => {
                return Err(ApiError::invalid(format!(
                    "unknown {field} `{requested}`: this server's one location is `{offered}` \
                     (GET /v1/locations; its operator sets it with --location)"
                )))
            }
            _ => {}
        }
    }
    Ok(())
}

pub async fn create(
    Authenticated(caller): Authenticated,
    headers: HeaderMap,
    UnaryBody(body): UnaryBody,
) -> ApiResult<Response> {
    let request: CreateBasinRequest = json_body(&headers, &body)?
        .ok_or_else(|| ApiError::bad_json("a request body is required"))?;
    let token = request_token(&headers)?;
    let name = BasinName::new(request.basin).map_err(ApiError::bad_json)?;
    check_location(&caller, &request.scope, &request.location)?;
    let basin = caller
        .create_basin(name, request.config.unwrap_or_default(), token.as_deref())
        .await?;
    Ok((StatusCode::CREATED, Json(BasinInfo::from(&basin))).into_response())
}

pub async fn ensure(
    Authenticated(caller): Authenticated,
    BasinPath(name): BasinPath,
    headers: HeaderMap,
    UnaryBody(body): UnaryBody,
) -> ApiResult<Response> {
    let request: EnsureBasinRequest = json_body(&headers, &body)?.unwrap_or_default();
    check_location(&caller, &request.scope, &request.location)?;
    let (basin, result) = caller
        .ensure_basin(name, request.config.unwrap_or_default())
        .await?;
    Ok(provisioned(result, BasinInfo::from(&basin)))
}

pub async fn get_config(
    Authenticated(caller): Authenticated,
    BasinPath(name): BasinPath,
) -> ApiResult<Json<BasinConfig>> {
    Ok(Json(caller.basin(&name).await?.config))
}

pub async fn reconfigure(
    Authenticated(caller): Authenticated,
    BasinPath(name): BasinPath,
    headers: HeaderMap,
    UnaryBody(body): UnaryBody,
) -> ApiResult<Json<BasinConfig>> {
    let change: BasinReconfiguration = json_body(&headers, &body)?.unwrap_or_default();
    Ok(Json(caller.reconfigure_basin(&name, &change).await?))
}

pub async fn list(
    Authenticated(caller): Authenticated,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> ApiResult<Json<serde_json::Value>> {
    let page = caller
        .list_basins(&query.range(BasinName::MAX_LEN)?)
        .await?;
    let basins: Vec<BasinInfo> = page.items.iter().map(BasinInfo::from).collect();
    Ok(Json(
        serde_json::json!({ "basins": basins, "has_more": page.has_more }),
    ))
}

pub async fn delete(
    Authenticated(caller): Authenticated,
    BasinPath(name): BasinPath,
) -> ApiResult<StatusCode> {
    caller.delete_basin(&name).await?;
    Ok(StatusCode::ACCEPTED)
}
