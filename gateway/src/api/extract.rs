//! Request extractors that turn every malformed part of a request into the documented
//! 400 error (`bad_path`, `bad_query`, `bad_header`, `bad_json`) instead of axum's
//! plain-text rejections.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::HeaderMap;
use serde::de::DeserializeOwned;
use streamgate_core::config::StreamConfig;
use streamgate_core::encryption::EncryptionKey;
use streamgate_core::names::{BasinName, StreamName};
use streamgate_core::record;
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

/// The header that carries the key of an encrypted stream.
pub const ENCRYPTION_KEY_HEADER: &str = "s2-encryption-key";

/// The `s2-encryption-key` header of an append or read: 1 to 44 characters of text
/// (`bad_header` otherwise, whatever the stream); whether it is a key for the stream's
/// cipher is checked only if the stream is encrypted (S2 ignores it for the others).
pub fn encryption_key(headers: &HeaderMap) -> Result<Option<EncryptionKey>, ApiError> {
    let Some(value) = headers.get(ENCRYPTION_KEY_HEADER) else {
        return Ok(None);
    };
    let text = value
        .to_str()
        .map_err(|_| ApiError::bad_header("`s2-encryption-key` is not valid text"))?;
    EncryptionKey::from_text(text)
        .map(Some)
        .map_err(|e| ApiError::bad_header(format!("`s2-encryption-key`: {e}")))
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
    // Straight into `T` (never through a `serde_json::Value`, which takes tens of times
    // the body's size for a body of many small values), after a first pass that keeps
    // nothing and counts what a decoder would allocate for.
    let shape = serde_json::from_slice::<BodyShape>(body)
        .map_err(|e| ApiError::bad_json(format!("invalid JSON: {e}")))?;
    if let Some(records) = shape.records {
        record::check_record_count(records)?;
        record::check_header_count(shape.headers)?;
    }
    if body.trim_ascii() == b"null" {
        return Ok(None);
    }
    serde_json::from_slice(body)
        .map(Some)
        .map_err(|e| ApiError::bad_json(format!("invalid request body: {e}")))
}

/// What a JSON body holds, found without keeping any of it: how many `records` (and
/// headers in them) an append holds.
#[derive(Default)]
struct BodyShape {
    records: Option<usize>,
    headers: usize,
}

impl<'de> serde::Deserialize<'de> for BodyShape {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ShapeOf::Body)
    }
}

/// Which part of a body is being looked at.
#[derive(Clone, Copy)]
enum ShapeOf {
    Body,
    Records,
    Record,
    Headers,
}

impl<'de> serde::de::DeserializeSeed<'de> for ShapeOf {
    type Value = BodyShape;
    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<BodyShape, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for ShapeOf {
    type Value = BodyShape;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("JSON")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<BodyShape, A::Error> {
        use serde::de::IgnoredAny;
        let mut shape = BodyShape::default();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match (self, key.as_ref()) {
                (ShapeOf::Body, "records") => {
                    let records = map.next_value_seed(ShapeOf::Records)?;
                    shape.records = records.records;
                    shape.headers = records.headers;
                }
                (ShapeOf::Record, "headers") => {
                    shape.headers += map.next_value_seed(ShapeOf::Headers)?.headers;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(shape)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<BodyShape, A::Error> {
        let mut shape = BodyShape::default();
        match self {
            ShapeOf::Records => {
                let mut records = 0;
                while let Some(record) = seq.next_element_seed(ShapeOf::Record)? {
                    records += 1;
                    shape.headers += record.headers;
                }
                shape.records = Some(records);
            }
            ShapeOf::Headers => {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    shape.headers += 1;
                }
            }
            _ => while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {},
        }
        Ok(shape)
    }

    fn visit_bool<E>(self, _: bool) -> Result<BodyShape, E> {
        Ok(BodyShape::default())
    }
    fn visit_i64<E>(self, _: i64) -> Result<BodyShape, E> {
        Ok(BodyShape::default())
    }
    fn visit_u64<E>(self, _: u64) -> Result<BodyShape, E> {
        Ok(BodyShape::default())
    }
    fn visit_f64<E>(self, _: f64) -> Result<BodyShape, E> {
        Ok(BodyShape::default())
    }
    fn visit_str<E>(self, _: &str) -> Result<BodyShape, E> {
        Ok(BodyShape::default())
    }
    fn visit_unit<E>(self) -> Result<BodyShape, E> {
        Ok(BodyShape::default())
    }
}

/// The engine as the request's access token allows: `Authorization: Bearer <token>`,
/// verified (401 `authn` when missing, unknown, revoked or expired; 429 `rate_limited`
/// when this client address failed too often lately).
pub struct Authenticated(pub Caller);

impl FromRequestParts<Engine> for Authenticated {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, engine: &Engine) -> Result<Self, ApiError> {
        // Authenticated once per request: forwarding looks first (see `forward`).
        if let Some(caller) = parts.extensions.get::<streamgate_core::Caller>() {
            return Ok(Authenticated(caller.clone()));
        }
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
