//! streamgate-http: what the HTTP front ends (the S2 REST API in the gateway, and OTLP)
//! share, so each rule about an HTTP request lives once: which basin a request names,
//! who sent it (the bearer token and the client's address), and reading its body within
//! a size limit and a deadline.

pub mod protobuf;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use axum::body::Body;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap};
use bytes::Bytes;
use streamgate_core::names::BasinName;
use streamgate_core::usage::ConnectionId;
use streamgate_core::{Caller, Engine, Error};

/// The address of the client a request came from: the HTTP server puts it in every
/// request's extensions.
#[derive(Debug, Clone, Copy)]
pub struct ClientAddress(pub SocketAddr);

/// The client's IP address, if the server recorded it.
pub fn client_ip(parts: &Parts) -> Option<IpAddr> {
    parts
        .extensions
        .get::<ClientAddress>()
        .map(|ClientAddress(address)| address.ip())
}

/// The basin a basin-scoped request names: the `s2-basin` header, or else a
/// `{basin}.b.…` host name (how S2 clients name a basin in the endpoint instead). The
/// error says what is wrong, for a `bad_header` answer.
pub fn basin(parts: &Parts) -> Result<BasinName, String> {
    if let Some(value) = parts.headers.get("s2-basin") {
        let name =
            std::str::from_utf8(value.as_bytes()).map_err(|_| "`s2-basin` is not valid text")?;
        return BasinName::new(name.trim()).map_err(|e| format!("`s2-basin`: {e}"));
    }
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| parts.uri.host());
    match host.and_then(|h| h.split_once(".b.")) {
        Some((basin, _)) => BasinName::new(basin).map_err(|e| format!("basin in host name: {e}")),
        None => Err(
            "missing header `s2-basin`: name the basin in it, or address the server as `{basin}.b.<host>`"
                .into(),
        ),
    }
}

/// The engine as the request's `Authorization: Bearer <token>` allows (`authn` when it
/// is missing, unknown, revoked or expired; `rate_limited` when this client failed too
/// often lately).
pub async fn authenticate(engine: &Engine, parts: &Parts) -> streamgate_core::Result<Caller> {
    let token = bearer_token(&parts.headers)?;
    let caller = Caller::authenticate(engine, token, client_ip(parts)).await?;
    Ok(caller.with_connection(connection(engine, parts)))
}

/// On a request one node passes to another: the connection the client sent it on, at
/// the node that accepted it (see `connection`).
pub const CLIENT_CONNECTION: &str = "streamgate-client-connection";

/// Marks a request this node passes to another with the client's connection, so the
/// node that serves it counts usage by the client's connection, not the nodes' link.
pub fn pass_on_connection(headers: &mut HeaderMap, connection: Option<ConnectionId>) {
    if let Some(connection) = connection {
        headers.insert(CLIENT_CONNECTION, connection.0.into());
    }
}

/// The client connection a request came on, for the usage counts: the one another node
/// names (a request it passed on, marked by `streamgate-forwarded-by`), or this node's
/// connection from the client.
fn connection(engine: &Engine, parts: &Parts) -> Option<ConnectionId> {
    let passed_on = parts
        .headers
        .contains_key("streamgate-forwarded-by")
        .then(|| parts.headers.get(CLIENT_CONNECTION))
        .flatten()
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .map(ConnectionId);
    passed_on.or_else(|| {
        let ClientAddress(peer) = parts.extensions.get::<ClientAddress>()?;
        Some(ConnectionId::accepted(engine.epoch(), *peer))
    })
}

/// The secret of the `Authorization: Bearer <token>` header; `authn` when there is none.
fn bearer_token(headers: &HeaderMap) -> streamgate_core::Result<&str> {
    let missing = || {
        Error::Unauthenticated(
            "missing access token: send `Authorization: Bearer <token>` (the root token is printed at first start and kept in <data-dir>/root-token)"
                .into(),
        )
    };
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match authorization.ok_or_else(missing)?.trim().split_once(' ') {
        Some((scheme, token))
            if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() =>
        {
            Ok(token.trim())
        }
        _ => Err(missing()),
    }
}

/// How long a client may take to send a whole unary request body: a base, plus the
/// time to send the largest body allowed at `SLOWEST_BODY_RATE`. A client that sends
/// slower (or stops halfway) is answered with `408` instead of holding its connection
/// and buffer for ever.
pub fn body_deadline(limit: usize) -> Duration {
    BODY_DEADLINE_BASE + Duration::from_secs_f64(limit as f64 / SLOWEST_BODY_RATE)
}

const BODY_DEADLINE_BASE: Duration = Duration::from_secs(30);
/// Bytes per second (256 KiB/s).
const SLOWEST_BODY_RATE: f64 = 256.0 * 1024.0;

/// Why a request body could not be read.
#[derive(Debug)]
pub enum BodyError {
    /// Over the limit (after decompression): how many bytes are allowed.
    TooLarge(usize),
    /// Not all there within its deadline.
    TimedOut(Duration),
    /// The client's side broke, or its compressed body is malformed.
    Unreadable(String),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::TooLarge(limit) => write!(
                f,
                "the request body is larger than {limit} bytes (after decompression)"
            ),
            BodyError::TimedOut(deadline) => write!(
                f,
                "the request body did not arrive in full within {} s",
                deadline.as_secs()
            ),
            BodyError::Unreadable(why) => write!(f, "cannot read the request body: {why}"),
        }
    }
}

/// Reads a whole request body of at most `limit` bytes within `body_deadline(limit)`.
/// Memory never exceeds the limit, whatever the client announces or compresses.
pub async fn read_body(body: Body, limit: usize) -> Result<Bytes, BodyError> {
    read_body_within(body, limit, body_deadline(limit)).await
}

async fn read_body_within(
    body: Body,
    limit: usize,
    deadline: Duration,
) -> Result<Bytes, BodyError> {
    match tokio::time::timeout(deadline, axum::body::to_bytes(body, limit)).await {
        Err(_) => Err(BodyError::TimedOut(deadline)),
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(err)) => {
            let too_large =
                std::iter::successors(Some(&err as &(dyn std::error::Error + 'static)), |e| {
                    e.source()
                })
                .any(|e| e.is::<http_body_util::LengthLimitError>());
            if too_large {
                Err(BodyError::TooLarge(limit))
            } else {
                Err(BodyError::Unreadable(err.to_string()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bodies_are_bounded_in_size_and_time() {
        let body = Body::from(vec![7u8; 100]);
        assert_eq!(read_body(body, 100).await.unwrap().len(), 100);
        let body = Body::from(vec![7u8; 101]);
        assert!(matches!(
            read_body(body, 100).await,
            Err(BodyError::TooLarge(100))
        ));
        // A body whose sender never finishes.
        let stalled =
            Body::from_stream(futures::stream::pending::<Result<Bytes, std::io::Error>>());
        let outcome = read_body_within(stalled, 100, Duration::from_millis(50)).await;
        assert!(
            matches!(outcome, Err(BodyError::TimedOut(_))),
            "{outcome:?}"
        );
    }
}
