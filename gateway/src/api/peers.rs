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

use super::forward::{PeerClient, FORWARDED_BY};
use super::proto;

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
    ) -> Result<Bytes, Error> {
        let uri = format!("{}/v1{path_and_query}", at.node_url.trim_end_matches('/'));
        let request = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::AUTHORIZATION, format!("Bearer {}", at.bearer))
            .header("s2-basin", at.basin.as_str())
            .header(header::CONTENT_TYPE, "application/protobuf")
            .header(header::ACCEPT, "application/protobuf")
            .header(FORWARDED_BY, self.client.epoch.clone())
            .body(Body::from(body))
            .map_err(|e| unreachable(at, &e.to_string()))?;
        let answer = tokio::time::timeout(timeout, async {
            let response = self.client.request(request).await?;
            let status = response.status();
            let bytes =
                streamgate_http::read_body(Body::new(response.into_body()), MAX_ANSWER_BYTES)
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
    format!("/streams/{}/records", encode_path(at.stream.as_str()))
}

/// Percent-encodes a stream name for a path segment.
fn encode_path(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for byte in name.bytes() {
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
            .call(at, Method::POST, path_of(at), body.into(), CALL_TIMEOUT)
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
            .call(at, Method::GET, path, Bytes::new(), timeout)
            .await?;
        let batch = proto::ReadBatch::decode(answer)
            .map_err(|e| unreachable(at, &format!("a batch that does not decode: {e}")))?;
        Ok(batch.into())
    }

    async fn check_tail(&self, at: &RemoteStream) -> Result<StreamPosition, Error> {
        let path = format!("{}/tail", path_of(at));
        let answer = self
            .call(at, Method::GET, path, Bytes::new(), CALL_TIMEOUT)
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
