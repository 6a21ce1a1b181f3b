//! `/v1/access-tokens`: issue, list and revoke access tokens.

use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use streamgate_core::access::{AccessTokenInfo, MAX_TOKEN_ID_BYTES};

use super::error::{ApiError, ApiResult};
use super::extract::{json_body, ApiQuery, Authenticated, UnaryBody};
use super::ListQuery;

pub async fn issue(
    Authenticated(caller): Authenticated,
    headers: HeaderMap,
    UnaryBody(body): UnaryBody,
) -> ApiResult<Response> {
    let info: AccessTokenInfo = json_body(&headers, &body)?
        .ok_or_else(|| ApiError::bad_json("a request body is required"))?;
    let secret = caller.issue_access_token(info).await?;
    Ok((
        StatusCode::CREATED,
        Json(serde_json::json!({ "access_token": secret })),
    )
        .into_response())
}

pub async fn list(
    Authenticated(caller): Authenticated,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> ApiResult<Json<serde_json::Value>> {
    let page = caller
        .list_access_tokens(&query.range(MAX_TOKEN_ID_BYTES)?)
        .await?;
    let tokens: Vec<AccessTokenInfo> = page.items.iter().map(AccessTokenInfo::normalized).collect();
    Ok(Json(
        serde_json::json!({ "access_tokens": tokens, "has_more": page.has_more }),
    ))
}

pub async fn revoke(
    Authenticated(caller): Authenticated,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    if id.is_empty() || id.len() > MAX_TOKEN_ID_BYTES {
        return Err(ApiError::bad_path(format!(
            "an access token id is 1 to {MAX_TOKEN_ID_BYTES} bytes long"
        )));
    }
    caller.revoke_access_token(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}
