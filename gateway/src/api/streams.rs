//! `/v1/streams`: create, ensure, get config, reconfigure, list, delete.

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use streamgate_core::config::{StreamConfig, StreamReconfiguration};
use streamgate_core::names::StreamName;

use super::error::{ApiError, ApiResult};
use super::extract::{
    json_body, request_token, ApiQuery, Authenticated, Basin, StreamPath, UnaryBody,
};
use super::json::StreamInfo;
use super::{provisioned, ListQuery};

#[derive(Deserialize)]
struct CreateStreamRequest {
    stream: String,
    #[serde(default)]
    config: Option<StreamConfig>,
}

pub async fn create(
    Authenticated(caller): Authenticated,
    Basin(basin): Basin,
    headers: HeaderMap,
    UnaryBody(body): UnaryBody,
) -> ApiResult<Response> {
    let request: CreateStreamRequest = json_body(&headers, &body)?
        .ok_or_else(|| ApiError::bad_json("a request body is required"))?;
    let token = request_token(&headers)?;
    let name = StreamName::new(request.stream).map_err(ApiError::bad_json)?;
    let stream = caller
        .create_stream(
            &basin,
            name,
            request.config.unwrap_or_default(),
            token.as_deref(),
        )
        .await?;
    Ok((StatusCode::CREATED, Json(StreamInfo::from(&stream))).into_response())
}

pub async fn ensure(
    Authenticated(caller): Authenticated,
    Basin(basin): Basin,
    StreamPath(name): StreamPath,
    headers: HeaderMap,
    UnaryBody(body): UnaryBody,
) -> ApiResult<Response> {
    let config: StreamConfig = json_body(&headers, &body)?.unwrap_or_default();
    let (stream, result) = caller.ensure_stream(&basin, name, config).await?;
    Ok(provisioned(result, StreamInfo::from(&stream)))
}

pub async fn get_config(
    Authenticated(caller): Authenticated,
    Basin(basin): Basin,
    StreamPath(name): StreamPath,
) -> ApiResult<Json<StreamConfig>> {
    Ok(Json(caller.stream_config(&basin, &name).await?))
}

pub async fn reconfigure(
    Authenticated(caller): Authenticated,
    Basin(basin): Basin,
    StreamPath(name): StreamPath,
    headers: HeaderMap,
    UnaryBody(body): UnaryBody,
) -> ApiResult<Json<StreamConfig>> {
    let change: StreamReconfiguration = json_body(&headers, &body)?.unwrap_or_default();
    Ok(Json(
        caller.reconfigure_stream(&basin, &name, &change).await?,
    ))
}

pub async fn list(
    Authenticated(caller): Authenticated,
    Basin(basin): Basin,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> ApiResult<Json<serde_json::Value>> {
    let page = caller
        .list_streams(&basin, &query.range(StreamName::MAX_LEN)?)
        .await?;
    let streams: Vec<StreamInfo> = page.items.iter().map(StreamInfo::from).collect();
    Ok(Json(
        serde_json::json!({ "streams": streams, "has_more": page.has_more }),
    ))
}

pub async fn delete(
    Authenticated(caller): Authenticated,
    Basin(basin): Basin,
    StreamPath(name): StreamPath,
) -> ApiResult<StatusCode> {
    caller.delete_stream(&basin, &name).await?;
    Ok(StatusCode::ACCEPTED)
}
