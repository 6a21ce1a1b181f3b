//! streamgate-resp: Redis Streams over RESP2/RESP3, on the streamgate engine.
//!
//! In the shape of tokio's mini-redis:
//! - `request` scans requests off the wire (bounded, incremental); `reply` encodes
//!   replies per protocol version;
//! - `connection` is one connection's loop: pipelining, gathering XADDs, reply order;
//! - `session` holds who is authenticated in which basin, and the error-reply table;
//! - `cmd` has one file per command (or family) with its parsing and execution;
//! - `permissions` is the docs' table of the operations each command needs;
//! - `streams` translates entry IDs to stream positions and reads entries;
//! - `entry` is the entry encoding (fields as headers) and the entry ID format.

mod cmd;
mod connection;
mod entry;
mod forwarded;
#[cfg(feature = "fuzz")]
pub mod fuzz;
mod permissions;
mod reply;
mod request;
mod session;
mod streams;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use streamgate_core::connections::{self, ConnectionSlots, HANDSHAKE_TIMEOUT};
use streamgate_core::names::BasinName;
use streamgate_core::Engine;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

pub use forwarded::run_forwarded;

/// How the RESP listener picks a connection's basin.
#[derive(Debug, Clone, Default)]
pub struct RespSettings {
    /// Basin for plain-TCP connections whose AUTH names none (username `default` or none).
    pub default_basin: Option<BasinName>,
}

/// Who is on the other end of a connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Client {
    /// Unique per connection (what `CLIENT ID` reports).
    pub id: u64,
    pub address: std::net::SocketAddr,
}

/// Accepts connections until `shutdown` turns true, then asks every connection to
/// finish and close.
pub async fn serve(
    listener: TcpListener,
    engine: Engine,
    settings: RespSettings,
    tls: Option<TlsAcceptor>,
    connections: ConnectionSlots,
    mut shutdown: watch::Receiver<bool>,
) {
    let settings = Arc::new(settings);
    let next_id = Arc::new(AtomicU64::new(1));
    loop {
        let (socket, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    tracing::warn!(error = %err, "accepting a RESP connection failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stopped(&mut shutdown) => return,
        };
        let Some(slot) = connections.take("RESP") else {
            // As Redis says it.
            let reply = b"-ERR max number of clients reached (--max-connections)\r\n";
            tokio::spawn(connections::refuse(socket, reply));
            continue;
        };
        let _ = socket.set_nodelay(true);
        let (engine, settings, tls, shutdown) = (
            engine.clone(),
            settings.clone(),
            tls.clone(),
            shutdown.clone(),
        );
        let client = Client {
            id: next_id.fetch_add(1, Ordering::Relaxed),
            address: peer,
        };
        tokio::spawn(async move {
            let result = match tls {
                None => connection::run(socket, engine, settings, None, client, shutdown).await,
                Some(tls) => match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(socket))
                    .await
                    .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
                {
                    Ok(stream) => {
                        let sni = stream.get_ref().1.server_name().map(str::to_owned);
                        match sni.as_deref().and_then(basin_from_sni) {
                            Some(basin) => {
                                connection::run(
                                    stream,
                                    engine,
                                    settings,
                                    Some(basin),
                                    client,
                                    shutdown,
                                )
                                .await
                            }
                            None => {
                                tracing::debug!(%peer, ?sni, "RESP TLS connection without a basin in SNI refused");
                                Ok(())
                            }
                        }
                    }
                    Err(err) => {
                        tracing::debug!(%peer, error = %err, "RESP TLS handshake failed");
                        Ok(())
                    }
                },
            };
            if let Err(err) = result {
                tracing::debug!(%peer, error = %err, "RESP connection ended with an error");
            }
            drop(slot);
        });
    }
}

/// Resolves once `shutdown` turns true (holding no borrow of it afterwards).
pub(crate) async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// `{basin}.anything` → the basin.
fn basin_from_sni(host: &str) -> Option<BasinName> {
    let (first, rest) = host.split_once('.')?;
    if rest.is_empty() {
        return None;
    }
    BasinName::new(first).ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn sni_names_the_basin() {
        assert_eq!(
            super::basin_from_sni("my-basin.r.example.com")
                .unwrap()
                .as_str(),
            "my-basin"
        );
        assert!(super::basin_from_sni("localhost").is_none());
        assert!(super::basin_from_sni("Bad_Basin.r.x").is_none());
    }
}
