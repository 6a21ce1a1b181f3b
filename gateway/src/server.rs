//! The HTTP listener: HTTP/1.1 and cleartext HTTP/2 (prior knowledge) on one port, with
//! flow-control windows sized for streaming large batches, and a graceful drain.
//!
//! Connections are bounded in number, and a client must show it speaks HTTP (and finish
//! a TLS handshake) within `HANDSHAKE_TIMEOUT` and send each request's headers within
//! `HEADER_TIMEOUT`; so slow or silent clients cannot hold the server's connections.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::api::App;
use crate::coalesce::CoalescedWrites;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use streamgate_core::connections::{self, ConnectionSlot, ConnectionSlots, HANDSHAKE_TIMEOUT};
use streamgate_core::follow::ConnectionFollowers;
use streamgate_http::ClientAddress;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

/// HTTP/2 windows: large enough that a client pipelining megabyte batches on one
/// connection is limited by the disk, not by window updates.
const STREAM_WINDOW: u32 = 8 * 1024 * 1024;
const CONNECTION_WINDOW: u32 = 64 * 1024 * 1024;
/// How long an HTTP/1.1 request's headers may take to arrive; hyper also counts the
/// idle time before a kept-alive connection's next request in it, so this is the idle
/// timeout of HTTP/1.1 connections too (HTTP/2 ones are watched by keep-alive pings).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// Most bytes of headers in one request, and (HTTP/1.1) most header fields.
const MAX_HEADER_BYTES: u32 = 64 * 1024;
const MAX_HEADER_FIELDS: usize = 100;
/// The HTTP/2 connection preface, which a cleartext HTTP/2 client sends first.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn spawn_connection<E: std::fmt::Display>(
    connection: impl Future<Output = Result<(), E>> + Send + 'static,
    slot: ConnectionSlot,
) {
    tokio::spawn(async move {
        if let Err(err) = connection.await {
            tracing::debug!(error = %err, "connection ended with an error");
        }
        drop(slot);
    });
}

/// Serves `app` until `shutdown` resolves, then stops accepting, lets requests in flight
/// finish (up to `drain_timeout`), and returns. With `tls`, every connection is TLS.
/// `connections` bounds the connections open at once (shared with the RESP listener):
/// past it, a new connection is answered `503` and closed.
pub async fn serve(
    listener: TcpListener,
    app: App,
    tls: Option<TlsAcceptor>,
    connections: ConnectionSlots,
    shutdown: impl Future<Output = ()>,
    drain_timeout: Duration,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_headers(MAX_HEADER_FIELDS)
        .max_buf_size(MAX_HEADER_BYTES as usize + 16 * 1024);
    builder
        .http2()
        .timer(TokioTimer::new())
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(1024 * 1024 - 1)
        .max_header_list_size(MAX_HEADER_BYTES)
        // Many idle tailing read sessions may share one connection.
        .max_concurrent_streams(Some(10_000))
        .keep_alive_interval(Some(Duration::from_secs(20)));
    let graceful = GracefulShutdown::new();
    // Connections still waiting for their client's first bytes (or its TLS handshake)
    // when the drain starts are closed at once: they hold no request, and the drain
    // would otherwise wait out `HANDSHAKE_TIMEOUT` for a silent one (a pooled
    // connection a client opened ahead of use).
    let (stop_handshakes, stopping) = tokio::sync::watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (socket, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        tracing::warn!(error = %err, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Some(slot) = connections.take("HTTP") else {
                    tokio::spawn(async move { connections::refuse(socket, refusal().as_bytes()).await });
                    continue;
                };
                let _ = socket.set_nodelay(true);
                let (tls, builder, watcher) = (tls.clone(), builder.clone(), graceful.watcher());
                let (app, mut stopping) = (app.clone(), stopping.clone());
                // The handshake runs in its own task so a slow client cannot stall accepts.
                tokio::spawn(async move {
                    tokio::select! {
                        // The handshake is looked at first: a client whose request is
                        // already in the socket is served as before the drain.
                        biased;
                        () = handshake_then_serve(socket, peer, tls, builder, app, watcher, slot) => {}
                        _ = stopping.wait_for(|stopping| *stopping) => {
                            tracing::debug!(%peer, "connection closed in its handshake: the server is draining");
                        }
                    }
                });
            }
            _ = &mut shutdown => break,
        }
    }
    drop(listener);
    let _ = stop_handshakes.send(true);
    if tokio::time::timeout(drain_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("some connections did not finish within {drain_timeout:?}; closing them");
    }
}

/// Waits for a new connection's client to show it speaks HTTP (and for its TLS
/// handshake), then serves the connection under the graceful drain's `watcher`.
async fn handshake_then_serve(
    socket: TcpStream,
    peer: SocketAddr,
    tls: Option<TlsAcceptor>,
    builder: auto::Builder<TokioExecutor>,
    app: App,
    watcher: hyper_util::server::graceful::Watcher,
    slot: ConnectionSlot,
) {
    let followers = Arc::new(ConnectionFollowers::default());
    let service = service_for(&app, peer, followers.clone());
    match tls {
        None => {
            if !speaks_within_deadline(&socket).await {
                tracing::debug!(%peer, "connection closed: nothing sent within the handshake timeout");
                return;
            }
            let connection = builder.serve_connection_with_upgrades(
                TokioIo::new(CoalescedWrites::new(socket, followers)),
                service,
            );
            spawn_connection(watcher.watch(connection.into_owned()), slot);
        }
        Some(tls) => match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(socket)).await {
            Ok(Ok(stream)) => {
                let connection = builder.serve_connection_with_upgrades(
                    TokioIo::new(CoalescedWrites::new(stream, followers)),
                    service,
                );
                spawn_connection(watcher.watch(connection.into_owned()), slot);
            }
            Ok(Err(err)) => tracing::debug!(%peer, error = %err, "TLS handshake failed"),
            Err(_) => tracing::debug!(
                %peer,
                "TLS handshake did not finish within the handshake timeout"
            ),
        },
    }
}

/// The app for one connection: every request carries the client's address, and the
/// count of read sessions open on the connection.
fn service_for(
    app: &App,
    peer: SocketAddr,
    followers: Arc<ConnectionFollowers>,
) -> TowerToHyperService<
    tower::util::MapRequest<
        App,
        impl Fn(
                axum::http::Request<hyper::body::Incoming>,
            ) -> axum::http::Request<hyper::body::Incoming>
            + Clone,
    >,
> {
    let with_address = move |mut request: axum::http::Request<hyper::body::Incoming>| {
        request.extensions_mut().insert(ClientAddress(peer));
        request.extensions_mut().insert(followers.clone());
        request
    };
    TowerToHyperService::new(tower::util::MapRequest::new(app.clone(), with_address))
}

/// Waits until a cleartext client has sent enough to tell which HTTP version it speaks
/// (the whole HTTP/2 preface, or anything that is not its beginning), within
/// `HANDSHAKE_TIMEOUT`. Past that, hyper's own timeouts watch the connection.
async fn speaks_within_deadline(socket: &TcpStream) -> bool {
    let looked = async {
        let mut head = [0u8; H2_PREFACE.len()];
        let mut pause = Duration::from_millis(1);
        loop {
            match socket.peek(&mut head).await {
                Ok(0) | Err(_) => return false,
                Ok(n) if n == head.len() || head[..n] != H2_PREFACE[..n] => return true,
                // A partial preface (peek would report the same bytes at once): look
                // again later, less and less often, so stalled clients cost little.
                Ok(_) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
            }
        }
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, looked)
        .await
        .unwrap_or(false)
}

/// A `503` (readable by HTTP/1.1 clients) for a connection over the limit.
fn refusal() -> String {
    let body = r#"{"code":"unavailable","message":"the server has as many connections open as it allows (--max-connections); retry shortly"}"#;
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}
