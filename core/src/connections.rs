//! The cap on client connections open at once, shared by every listener (HTTP and
//! RESP): each connection holds a slot for its life, and one that finds none free is
//! refused at once, so a flood of connections cannot exhaust memory or file descriptors.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A connection's slot; freed when dropped.
pub type ConnectionSlot = OwnedSemaphorePermit;

#[derive(Clone)]
pub struct ConnectionSlots {
    slots: Arc<Semaphore>,
    limit: usize,
    /// When a refusal was last logged: at most one line per `LOG_EVERY`.
    last_logged: Arc<Mutex<Option<Instant>>>,
}

const LOG_EVERY: Duration = Duration::from_secs(10);

/// How long a new connection may take to finish its TLS handshake, or (in cleartext
/// HTTP) to send the first bytes that tell HTTP/1.1 from HTTP/2.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Tells a connection over the limit why it is refused (`reply`, in its protocol) and
/// closes it. What the client already sent is read first (briefly): closing with unread
/// input would reset the connection, and the client might never see the reply.
pub async fn refuse(mut socket: TcpStream, reply: &[u8]) {
    let _ = tokio::time::timeout(Duration::from_secs(1), socket.write_all(reply)).await;
    let _ = socket.shutdown().await;
    let mut sink = [0u8; 4096];
    let drained = async {
        loop {
            socket.readable().await?;
            match socket.try_read(&mut sink) {
                Ok(0) => return Ok::<_, std::io::Error>(()),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_millis(200), drained).await;
}

impl ConnectionSlots {
    pub fn new(limit: usize) -> ConnectionSlots {
        ConnectionSlots {
            slots: Arc::new(Semaphore::new(limit)),
            limit,
            last_logged: Arc::new(Mutex::new(None)),
        }
    }

    /// A slot for a new connection on `listener`, or `None` (logged) if all are taken.
    pub fn take(&self, listener: &str) -> Option<ConnectionSlot> {
        let slot = self.slots.clone().try_acquire_owned().ok();
        if slot.is_none() {
            let mut last = self.last_logged.lock();
            if last.is_none_or(|at| at.elapsed() > LOG_EVERY) {
                *last = Some(Instant::now());
                tracing::warn!(
                    listener,
                    limit = self.limit,
                    "refusing new connections: as many are open as --max-connections allows"
                );
            }
        }
        slot
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_freed_when_their_connection_ends() {
        let slots = ConnectionSlots::new(2);
        let first = slots.take("test").unwrap();
        let _second = slots.take("test").unwrap();
        assert!(slots.take("test").is_none());
        drop(first);
        assert!(slots.take("test").is_some());
    }
}
