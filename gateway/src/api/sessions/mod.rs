//! Streaming sessions on the records endpoint: S2S append and read sessions
//! (`s2s/proto`) and SSE read sessions (`text/event-stream`).

pub mod append;
pub mod frame;
pub mod read;

use tokio::sync::watch;

/// Tells sessions that the server is draining: append sessions acknowledge what they
/// accepted and end with `server_draining`; read sessions end.
#[derive(Clone)]
pub struct Drain(watch::Receiver<bool>);

impl Drain {
    pub fn new() -> (watch::Sender<bool>, Drain) {
        let (tx, rx) = watch::channel(false);
        (tx, Drain(rx))
    }

    pub fn is_draining(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once draining starts (at once if it already has).
    pub async fn started(&mut self) {
        let _ = self.0.wait_for(|draining| *draining).await;
    }
}
