//! Calls at other nodes for the front ends that cannot pass a request on whole (RESP,
//! OTLP): appends, reads and check-tails made through the owner's S2 REST API, in
//! protobuf, with the caller's own token (see `streamgate_core::remote`). The owner's
//! answer comes back as the engine error it stands for, so a client of RESP or OTLP
//! sees the same outcome as if it had come to the owner.

use std::time::Duration;

use async_trait::async_trait;
use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use bytes::Bytes;
use prost::Message;
use streamgate_core::read::{ReadBatch, ReadRequest, ReadStart};
use streamgate_core::record::{AppendAck, AppendInput, StreamPosition};
use streamgate_core::remote::{RemoteStream, RemoteStreams};
use streamgate_core::{Error, Resource};

use super::error::ApiError;
use super::extract::{ApiQuery, Authenticated, Basin, StreamPath};
use super::forward::{PeerClient, FORWARDED_BY, LAST_HOP};
use super::proto;
use axum::response::IntoResponse;

/// Largest answer read from a peer: a read batch is at most 1 MiB of records, and its
/// protobuf encoding adds a little.
const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

/// How long a peer may take to answer a call that does not wait at the tail.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

pub struct RestPeers {
    client: PeerClient,
}

impl RestPeers {
    pub fn new(client: PeerClient) -> RestPeers {
        RestPeers { client }
    }

    async fn call(
        &self,
        at: &RemoteStream,
        method: Method,
        path_and_query: String,
        body: Bytes,
        timeout: Duration,
        max_answer: usize,
    ) -> Result<Bytes, Error> {
        let uri = format!("{}/v1{path_and_query}", at.node_url.trim_end_matches('/'));
        let mut request = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::AUTHORIZATION, format!("Bearer {}", at.bearer))
            .header("s2-basin", at.basin.as_str())
            .header(header::CONTENT_TYPE, "application/protobuf")
            .header(header::ACCEPT, "application/protobuf")
            .header(FORWARDED_BY, self.client.epoch.clone())
            // Sent after a look of this node's own: the receiver serves it or refuses.
            .header(LAST_HOP, "1");
        if let Some(headers) = request.headers_mut() {
            streamgate_http::pass_on_connection(headers, at.connection);
        }
        if let Some(key) = &at.encryption_key {
            let mut value = axum::http::HeaderValue::from_str(key.as_header_text())
                .map_err(|e| unreachable(at, &e.to_string()))?;
            value.set_sensitive(true);
            request = request.header(super::extract::ENCRYPTION_KEY_HEADER, value);
        }
        let request = request
            .body(Body::from(body))
            .map_err(|e| unreachable(at, &e.to_string()))?;
        let answer = tokio::time::timeout(timeout, async {
            let response = self.client.request(request).await?;
            let status = response.status();
            let bytes = streamgate_http::read_body(Body::new(response.into_body()), max_answer)
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>((status, bytes))
        })
        .await
        .map_err(|_| unreachable(at, "no answer in time"))?
        .map_err(|e| unreachable(at, &e))?;
        match answer {
            (status, bytes) if status.is_success() => Ok(bytes),
            (status, bytes) => Err(error_of(at, status, &bytes)),
        }
    }
}

fn path_of(at: &RemoteStream) -> String {
    format!("/streams/{}/records", percent_encoded(at.stream.as_str()))
}

/// Largest reply of a RESP command run at the owner (an XREADGROUP of many entries).
const MAX_RESP_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// The RESP command a peer passes on whole, as its client sent it: what a RESP
/// connection accepts, and a little.
const MAX_RESP_COMMAND_BYTES: usize = 4 * 1024 * 1024;

#[derive(serde::Deserialize)]
pub(crate) struct RespProtocol {
    protocol: u8,
}

/// `POST /v1/streams/{stream}/resp?protocol=2|3`, between nodes only: a RESP command on
/// the consumer groups of a stream this node sequences, which a client sent to another
/// node (see `RemoteStreams::resp_command`). It runs here with the client's token and
/// the same checks as on a connection here; the answer is the reply, encoded.
pub(crate) async fn serve_resp_command(
    axum::extract::State(engine): axum::extract::State<streamgate_core::Engine>,
    Authenticated(caller): Authenticated,
    Basin(basin): Basin,
    StreamPath(_stream): StreamPath,
    ApiQuery(RespProtocol { protocol }): ApiQuery<RespProtocol>,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Result<axum::response::Response, ApiError> {
    if !headers.contains_key(FORWARDED_BY) {
        return Err(ApiError::bad_path(
            "no such endpoint; the S2 REST API lives under /v1",
        ));
    }
    let command = streamgate_http::read_body(body, MAX_RESP_COMMAND_BYTES).await?;
    let reply =
        streamgate_resp::run_forwarded(engine, caller.forwarded(), basin, command, protocol == 3)
            .await;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], reply).into_response())
}

/// `text` with everything but unreserved URL characters percent-encoded: a stream name
/// as one path segment, or a token in a URL fragment.
pub fn percent_encoded(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(byte as char)
            }
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

fn unreachable(at: &RemoteStream, why: &str) -> Error {
    Error::Unavailable(format!(
        "the node that sequences this stream ({}) did not answer ({why}); retry shortly",
        at.node_url
    ))
}

/// The engine error a peer's error answer stands for.
fn error_of(at: &RemoteStream, status: StatusCode, body: &[u8]) -> Error {
    let json: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let message = json["message"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| format!("the node that sequences this stream answered {status}"));
    let position = |value: &serde_json::Value| StreamPosition {
        seq_num: value["seq_num"].as_u64().unwrap_or(0),
        timestamp: value["timestamp"].as_u64().unwrap_or(0),
    };
    if let Some(next) = json["seq_num_mismatch"].as_u64() {
        return Error::SeqNumMismatch(next);
    }
    if let Some(token) = json["fencing_token_mismatch"].as_str() {
        return Error::FencingTokenMismatch(token.to_owned());
    }
    if status == StatusCode::RANGE_NOT_SATISFIABLE {
        return Error::RangeNotSatisfiable {
            tail: position(&json["tail"]),
        };
    }
    match json["code"].as_str().unwrap_or("") {
        "stream_not_found" => Error::NotFound(Resource::Stream(at.stream.clone())),
        "basin_not_found" => Error::NotFound(Resource::Basin(at.basin.to_string())),
        "stream_deletion_pending" => Error::DeletionPending(Resource::Stream(at.stream.clone())),
        "basin_deletion_pending" => Error::DeletionPending(Resource::Basin(at.basin.to_string())),
        "authn" => Error::Unauthenticated(message),
        "permission_denied" => Error::PermissionDenied(message),
        "server_draining" => Error::ServerDraining,
        _ if status.is_client_error() => Error::Invalid(message),
        _ => Error::Unavailable(message),
    }
}

#[async_trait]
impl RemoteStreams for RestPeers {
    async fn append(&self, at: &RemoteStream, input: AppendInput) -> Result<AppendAck, Error> {
        let body = proto::AppendInput::from(input).encode_to_vec();
        let answer = self
            .call(
                at,
                Method::POST,
                path_of(at),
                body.into(),
                CALL_TIMEOUT,
                MAX_ANSWER_BYTES,
            )
            .await?;
        let ack = proto::AppendAck::decode(answer)
            .map_err(|e| unreachable(at, &format!("an ack that does not decode: {e}")))?;
        Ok(ack.into())
    }

    async fn read(&self, at: &RemoteStream, request: ReadRequest) -> Result<ReadBatch, Error> {
        let mut query = match request.start {
            ReadStart::SeqNum(seq) => format!("seq_num={seq}"),
            ReadStart::Timestamp(ts) => format!("timestamp={ts}"),
            ReadStart::TailOffset(offset) => format!("tail_offset={offset}"),
        };
        let limits = request.limits;
        for (name, value) in [
            ("count", limits.count),
            ("bytes", limits.bytes),
            ("until", limits.until),
        ] {
            if let Some(value) = value {
                query.push_str(&format!("&{name}={value}"));
            }
        }
        if request.clamp {
            query.push_str("&clamp=true");
        }
        let wait = request.wait.as_secs();
        if wait > 0 {
            query.push_str(&format!("&wait={wait}"));
        }
        let path = format!("{}?{query}", path_of(at));
        let timeout = CALL_TIMEOUT + request.wait;
        let answer = self
            .call(
                at,
                Method::GET,
                path,
                Bytes::new(),
                timeout,
                MAX_ANSWER_BYTES,
            )
            .await?;
        let batch = proto::ReadBatch::decode(answer)
            .map_err(|e| unreachable(at, &format!("a batch that does not decode: {e}")))?;
        Ok(batch.into())
    }

    async fn resp_command(
        &self,
        at: &RemoteStream,
        command: Bytes,
        resp3: bool,
        timeout: Duration,
    ) -> Result<Bytes, Error> {
        let protocol = if resp3 { 3 } else { 2 };
        let path = format!(
            "/streams/{}/resp?protocol={protocol}",
            percent_encoded(at.stream.as_str())
        );
        self.call(
            at,
            Method::POST,
            path,
            command,
            timeout,
            MAX_RESP_ANSWER_BYTES,
        )
        .await
    }

    async fn check_tail(&self, at: &RemoteStream) -> Result<StreamPosition, Error> {
        let path = format!("{}/tail", path_of(at));
        let answer = self
            .call(
                at,
                Method::GET,
                path,
                Bytes::new(),
                CALL_TIMEOUT,
                MAX_ANSWER_BYTES,
            )
            .await?;
        let json: serde_json::Value = serde_json::from_slice(&answer)
            .map_err(|e| unreachable(at, &format!("a tail that does not parse: {e}")))?;
        let tail = &json["tail"];
        match (tail["seq_num"].as_u64(), tail["timestamp"].as_u64()) {
            (Some(seq_num), Some(timestamp)) => Ok(StreamPosition { seq_num, timestamp }),
            _ => Err(unreachable(at, "a tail without a position")),
        }
    }
}
