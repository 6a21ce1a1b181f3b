//! The HTTP listener: HTTP/1.1 and cleartext HTTP/2 (prior knowledge) on one port, with
//! flow-control windows sized for streaming large batches, and a graceful drain.

use std::future::Future;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

fn spawn_connection<E: std::fmt::Display>(
    connection: impl Future<Output = Result<(), E>> + Send + 'static,
) {
    tokio::spawn(async move {
        if let Err(err) = connection.await {
            tracing::debug!(error = %err, "connection ended with an error");
        }
    });
}

/// HTTP/2 windows: large enough that a client pipelining megabyte batches on one
/// connection is limited by the disk, not by window updates.
const STREAM_WINDOW: u32 = 8 * 1024 * 1024;
const CONNECTION_WINDOW: u32 = 64 * 1024 * 1024;

/// Serves `app` until `shutdown` resolves, then stops accepting, lets requests in flight
/// finish (up to `drain_timeout`), and returns. With `tls`, every connection is TLS.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
    drain_timeout: Duration,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http2()
        .timer(TokioTimer::new())
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(1024 * 1024 - 1)
        // Many idle tailing read sessions may share one connection.
        .max_concurrent_streams(Some(10_000))
        .keep_alive_interval(Some(Duration::from_secs(20)));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (socket, _) = match accepted {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        tracing::warn!(error = %err, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = socket.set_nodelay(true);
                let service = TowerToHyperService::new(app.clone());
                match &tls {
                    None => {
                        let connection = builder.serve_connection_with_upgrades(TokioIo::new(socket), service);
                        spawn_connection(graceful.watch(connection.into_owned()));
                    }
                    Some(tls) => {
                        // The handshake runs in its own task so a slow client cannot stall accepts.
                        let (tls, builder, watcher) = (tls.clone(), builder.clone(), graceful.watcher());
                        tokio::spawn(async move {
                            match tls.accept(socket).await {
                                Ok(stream) => {
                                    let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
                                    spawn_connection(watcher.watch(connection.into_owned()));
                                }
                                Err(err) => tracing::debug!(error = %err, "TLS handshake failed"),
                            }
                        });
                    }
                }
            }
            _ = &mut shutdown => break,
        }
    }
    drop(listener);
    if tokio::time::timeout(drain_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("some connections did not finish within {drain_timeout:?}; closing them");
    }
}
