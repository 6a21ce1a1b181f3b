//! Request extractors that turn every malformed part of a request into the documented
//! 400 error (`bad_path`, `bad_query`, `bad_header`, `bad_json`) instead of axum's
//! plain-text rejections.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::HeaderMap;
use serde::de::DeserializeOwned;
use streamgate_core::config::StreamConfig;
use streamgate_core::names::{BasinName, StreamName};
use streamgate_core::{Caller, Engine};

use super::error::ApiError;

/// The basin of a basin-scoped request: the `s2-basin` header, or a `{basin}.b.…` host.
pub struct Basin(pub BasinName);

impl<S: Send + Sync> FromRequestParts<S> for Basin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        streamgate_http::basin(parts)
            .map(Basin)
            .map_err(ApiError::bad_header)
    }
}

/// A basin name from the path.
pub struct BasinPath(pub BasinName);

impl<S: Send + Sync> FromRequestParts<S> for BasinPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(name) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(ApiError::bad_path)?;
        BasinName::new(name)
            .map(BasinPath)
            .map_err(ApiError::bad_path)
    }
}

/// A stream name from the path (percent-decoded, so it may contain `/`).
pub struct StreamPath(pub StreamName);

impl<S: Send + Sync> FromRequestParts<S> for StreamPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(name) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(ApiError::bad_path)?;
        StreamName::new(name)
            .map(StreamPath)
            .map_err(ApiError::bad_path)
    }
}

/// Query parameters; a malformed query is `bad_query`.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(q)| ApiQuery(q))
            .map_err(|e| ApiError::bad_query(e.body_text()))
    }
}

/// The `s2-request-token` header, at most 36 bytes.
pub fn request_token(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("s2-request-token") else {
        return Ok(None);
    };
    let token = value
        .to_str()
        .map_err(|_| ApiError::bad_header("`s2-request-token` is not valid text"))?;
    if token.len() > 36 {
        return Err(ApiError::bad_header(
            "`s2-request-token` may be at most 36 bytes",
        ));
    }
    Ok(Some(token.to_owned()))
}

/// The `s2-stream-config` header: the config of a stream created by this request.
pub fn stream_config_header(headers: &HeaderMap) -> Result<Option<StreamConfig>, ApiError> {
    let Some(value) = headers.get("s2-stream-config") else {
        return Ok(None);
    };
    let config: StreamConfig = value
        .to_str()
        .ok()
        .and_then(|text| serde_json::from_str(text).ok())
        .ok_or_else(|| {
            ApiError::bad_header("`s2-stream-config` is not a valid JSON StreamConfig")
        })?;
    config
        .validate()
        .map_err(|e| ApiError::bad_header(format!("`s2-stream-config`: {e}")))?;
    Ok(Some(config))
}

/// Parses a JSON body. An empty body is `None` (for the PUT calls, where it is optional).
pub fn json_body<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Option<T>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    if let Some(content_type) = headers.get(axum::http::header::CONTENT_TYPE) {
        let content_type = content_type.to_str().unwrap_or_default();
        let essence = content_type.split(';').next().unwrap_or_default().trim();
        if essence != "application/json" && !essence.ends_with("+json") {
            return Err(ApiError::bad_json(
                "expected a request with `Content-Type: application/json`",
            ));
        }
    }
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_json(format!("invalid JSON: {e}")))?;
    if value.is_null() {
        return Ok(None);
    }
    reject_encryption(&value)?;
    serde_json::from_value(value)
        .map(Some)
        .map_err(|e| ApiError::bad_json(format!("invalid request body: {e}")))
}

/// Encryption is not offered yet: refuse a request for it rather than silently store
/// plaintext.
fn reject_encryption(value: &serde_json::Value) -> Result<(), ApiError> {
    let asks = |v: Option<&serde_json::Value>| v.is_some_and(|v| !v.is_null());
    let config = value.get("config").unwrap_or(value);
    if asks(value.get("stream_cipher")) || asks(config.get("stream_cipher")) {
        return Err(ApiError::not_implemented(
            "stream encryption (`stream_cipher`)",
        ));
    }
    Ok(())
}

/// The engine as the request's access token allows: `Authorization: Bearer <token>`,
/// verified (401 `authn` when missing, unknown, revoked or expired; 429 `rate_limited`
/// when this client address failed too often lately).
pub struct Authenticated(pub Caller);

impl FromRequestParts<Engine> for Authenticated {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, engine: &Engine) -> Result<Self, ApiError> {
        Ok(Authenticated(
            streamgate_http::authenticate(engine, parts).await?,
        ))
    }
}

/// Largest body of a control-plane call (basins, streams, tokens): their JSON is small.
const MAX_CONTROL_BODY: usize = 1024 * 1024;

/// The whole body of a control-plane call, read within the size limit and deadline of
/// `streamgate_http::read_body`.
pub struct UnaryBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for UnaryBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, _: &S) -> Result<Self, ApiError> {
        streamgate_http::read_body(request.into_body(), MAX_CONTROL_BODY)
            .await
            .map(UnaryBody)
            .map_err(ApiError::from)
    }
}
