//! `/v1/streams/{stream}/records`: append, single-batch read, check tail. Bodies are JSON
//! or protobuf (`application/protobuf` or `application/x-protobuf`); errors are JSON.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use prost::Message;
use serde::Deserialize;
use streamgate_core::read::{ReadLimits, ReadRequest, ReadStart};
use streamgate_core::Engine;

use super::error::{ApiError, ApiResult};
use super::extract::{stream_config_header, ApiQuery, Basin, StreamPath};
use super::json::{self, AppendInputJson, Format};
use super::proto;

fn is_protobuf(media_type: &str) -> bool {
    let essence = media_type.split(';').next().unwrap_or_default().trim();
    essence == "application/protobuf" || essence == "application/x-protobuf"
}

/// Whether the client asked for a protobuf response (the first media type of `Accept`).
fn wants_protobuf(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .is_some_and(is_protobuf)
}

fn is_session_request(headers: &HeaderMap) -> bool {
    let has = |name, value: &str| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
            .is_some_and(|v| v.contains(value))
    };
    has(header::CONTENT_TYPE, "s2s/proto")
        || has(header::ACCEPT, "s2s/proto")
        || has(header::ACCEPT, "text/event-stream")
}

fn protobuf_response(message: impl Message) -> Response {
    (
        [(header::CONTENT_TYPE, "application/protobuf")],
        message.encode_to_vec(),
    )
        .into_response()
}

pub async fn append(
    State(engine): State<Engine>,
    Basin(basin): Basin,
    StreamPath(stream): StreamPath,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    if is_session_request(&headers) {
        return Err(ApiError::not_implemented("S2S append sessions"));
    }
    let create_config = stream_config_header(&headers)?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    let input = if is_protobuf(content_type) {
        proto::AppendInput::decode(body)
            .map_err(|e| ApiError::bad_proto(format!("invalid AppendInput: {e}")))?
            .into()
    } else {
        let format = Format::from_headers(&headers)?;
        let input: AppendInputJson = super::extract::json_body(&headers, &body)?
            .ok_or_else(|| ApiError::bad_json("a request body is required"))?;
        input.into_core(format)?
    };
    let ack = engine
        .append(&basin, &stream, input, create_config.as_ref())
        .await?;
    Ok(if wants_protobuf(&headers) {
        protobuf_response(proto::AppendAck::from(ack))
    } else {
        Json(json::append_ack(&ack)).into_response()
    })
}

#[derive(Debug, Deserialize)]
pub struct ReadQuery {
    seq_num: Option<u64>,
    timestamp: Option<u64>,
    tail_offset: Option<u64>,
    #[serde(default)]
    clamp: bool,
    count: Option<u64>,
    bytes: Option<u64>,
    until: Option<u64>,
    wait: Option<u64>,
}

impl ReadQuery {
    fn request(&self) -> ApiResult<ReadRequest> {
        let start = match (self.seq_num, self.timestamp, self.tail_offset) {
            (None, None, None) => ReadStart::TailOffset(0),
            (Some(seq), None, None) => ReadStart::SeqNum(seq),
            (None, Some(ts), None) => ReadStart::Timestamp(ts),
            (None, None, Some(offset)) => ReadStart::TailOffset(offset),
            _ => {
                return Err(ApiError::invalid(
                    "only one of seq_num, timestamp, or tail_offset can be provided",
                ))
            }
        };
        Ok(ReadRequest {
            start,
            clamp: self.clamp,
            limits: ReadLimits {
                count: self.count,
                bytes: self.bytes,
                until: self.until,
            },
            wait: Duration::from_secs(self.wait.unwrap_or(0)),
        })
    }
}

pub async fn read(
    State(engine): State<Engine>,
    Basin(basin): Basin,
    StreamPath(stream): StreamPath,
    ApiQuery(query): ApiQuery<ReadQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    if is_session_request(&headers) {
        return Err(ApiError::not_implemented("read sessions (S2S and SSE)"));
    }
    let format = Format::from_headers(&headers)?;
    let create_config = stream_config_header(&headers)?;
    let batch = engine
        .read(&basin, &stream, query.request()?, create_config.as_ref())
        .await?;
    Ok(if wants_protobuf(&headers) {
        protobuf_response(proto::ReadBatch::from(batch))
    } else {
        Json(json::read_batch(&batch, format)).into_response()
    })
}

pub async fn check_tail(
    State(engine): State<Engine>,
    Basin(basin): Basin,
    StreamPath(stream): StreamPath,
    headers: HeaderMap,
) -> ApiResult<Json<serde_json::Value>> {
    let create_config = stream_config_header(&headers)?;
    let tail = engine
        .check_tail(&basin, &stream, create_config.as_ref())
        .await?;
    Ok(Json(json::tail(tail)))
}
