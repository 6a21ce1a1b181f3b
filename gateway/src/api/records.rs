//! `/v1/streams/{stream}/records`: append, single-batch read, check tail. Bodies are JSON
//! or protobuf (`application/protobuf` or `application/x-protobuf`); errors are JSON.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use prost::Message;
use serde::Deserialize;
use streamgate_core::follow::ConnectionFollowers;
use streamgate_core::read::{ReadLimits, ReadRequest, ReadStart};

use super::error::{ApiError, ApiResult};
use super::extract::{
    encryption_key, stream_config_header, ApiQuery, Authenticated, Basin, StreamPath,
};
use super::json::{self, AppendInputJson, Format};
use super::proto;
use super::sessions::read::{ResumeFrom, S2sEncoder, SessionBounds, SseEncoder};
use super::sessions::{self, append::AppendSession, frame::Compression, Drain};

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

/// Whether the first media type of a header is `value` (case-insensitive), which is how
/// S2 dispatches between unary calls, S2S sessions and SSE.
fn first_media_type_is(headers: &HeaderMap, name: header::HeaderName, value: &str) -> bool {
    headers
        .get(name)
        .and_then(|v: &HeaderValue| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .map(|first| first.split(';').next().unwrap_or("").trim())
        .is_some_and(|first| first.eq_ignore_ascii_case(value))
}

/// Largest unary request body accepted before decoding (a 1 MiB batch in JSON with
/// base64 bodies is larger than 1 MiB on the wire).
const MAX_UNARY_BODY: usize = 8 * 1024 * 1024;

fn protobuf_response(message: impl Message) -> Response {
    (
        [(header::CONTENT_TYPE, "application/protobuf")],
        message.encode_to_vec(),
    )
        .into_response()
}

pub async fn append(
    Authenticated(caller): Authenticated,
    Extension(drain): Extension<Drain>,
    Basin(basin): Basin,
    StreamPath(stream): StreamPath,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let create_config = stream_config_header(&headers)?;
    let caller = caller.with_encryption_key(encryption_key(&headers)?);
    if first_media_type_is(&headers, header::CONTENT_TYPE, "s2s/proto") {
        // A missing stream (or basin) is a plain 404 before the session starts.
        caller
            .open_for_append(&basin, &stream, create_config.as_ref())
            .await?;
        let session = AppendSession {
            caller,
            basin,
            stream,
            create_config,
            compression: Compression::negotiate(&headers),
            drain,
        };
        return Ok(session.respond(body));
    }
    let body = streamgate_http::read_body(body, MAX_UNARY_BODY).await?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    let input = if is_protobuf(content_type) {
        proto::decode_append_input(body)?
    } else {
        let format = Format::from_headers(&headers)?;
        let input: AppendInputJson = super::extract::json_body(&headers, &body)?
            .ok_or_else(|| ApiError::bad_json("a request body is required"))?;
        input.into_core(format)?
    };
    let ack = caller
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
    pub(crate) fn request(&self) -> ApiResult<ReadRequest> {
        if self.wait.is_some_and(|wait| wait > i32::MAX as u64) {
            return Err(ApiError::bad_query(
                "`wait` must be at most 2147483647 seconds",
            ));
        }
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
    Authenticated(caller): Authenticated,
    Extension(drain): Extension<Drain>,
    Basin(basin): Basin,
    StreamPath(stream): StreamPath,
    ApiQuery(query): ApiQuery<ReadQuery>,
    followers: Option<Extension<Arc<ConnectionFollowers>>>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let format = Format::from_headers(&headers)?;
    let create_config = stream_config_header(&headers)?;
    let caller = caller.with_encryption_key(encryption_key(&headers)?);
    let s2s = first_media_type_is(&headers, header::ACCEPT, "s2s/proto")
        || first_media_type_is(&headers, header::CONTENT_TYPE, "s2s/proto");
    let sse = first_media_type_is(&headers, header::ACCEPT, "text/event-stream");
    if !s2s && !sse {
        let batch = caller
            .read(&basin, &stream, query.request()?, create_config.as_ref())
            .await?;
        return Ok(if wants_protobuf(&headers) {
            protobuf_response(proto::ReadBatch::from(batch))
        } else {
            Json(json::read_batch(&batch, format)).into_response()
        });
    }

    let mut request = query.request()?;
    let mut bounds = SessionBounds::new(query.count, query.bytes, query.until, query.wait);
    // SSE resumes after `Last-Event-ID`, with the bounds reduced by what was delivered.
    let resume =
        match headers.get("last-event-id").filter(|_| sse) {
            Some(value) => Some(value.to_str().ok().and_then(ResumeFrom::parse).ok_or_else(
                || ApiError::bad_header("`Last-Event-ID` must be `seq_num,count,bytes`"),
            )?),
            None => None,
        };
    if let Some(resume) = resume {
        let next = resume.seq_num.checked_add(1).ok_or_else(|| {
            ApiError::bad_header("`Last-Event-ID` names a sequence number past the end")
        })?;
        request.start = ReadStart::SeqNum(next);
        bounds.count = bounds.count.map(|c| c.saturating_sub(resume.count));
        bounds.bytes = bounds.bytes.map(|b| b.saturating_sub(resume.bytes));
    }
    request.validate()?;
    let mut reader = caller
        .open_reader(
            &basin,
            &stream,
            request.start,
            request.clamp,
            create_config.as_ref(),
        )
        .await?;
    let exhausted = bounds.count == Some(0) || bounds.bytes == Some(0);
    if !exhausted && !bounds.waits() {
        reader.refuse_at_tail()?;
    }
    if let Some(Extension(followers)) = followers {
        reader.follow_on(followers);
    }
    let session = (basin, stream, reader);
    Ok(if s2s {
        let encoder = S2sEncoder {
            compression: Compression::negotiate(&headers),
        };
        sessions::read::respond(caller, session, bounds, encoder, drain)
    } else {
        let encoder = SseEncoder {
            format,
            delivered_count: resume.map_or(0, |r| r.count),
            delivered_bytes: resume.map_or(0, |r| r.bytes),
        };
        sessions::read::respond(caller, session, bounds, encoder, drain)
    })
}

pub async fn check_tail(
    Authenticated(caller): Authenticated,
    Basin(basin): Basin,
    StreamPath(stream): StreamPath,
    headers: HeaderMap,
) -> ApiResult<Json<serde_json::Value>> {
    let create_config = stream_config_header(&headers)?;
    let tail = caller
        .check_tail(&basin, &stream, create_config.as_ref())
        .await?;
    Ok(Json(json::tail(tail)))
}
