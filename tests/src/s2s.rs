//! An S2S append session over HTTP/2, as a test client drives one: inputs are written
//! as S2S frames on the request body while acknowledgements arrive on the response body,
//! in order, so several inputs can be in flight (pipelining).

use std::pin::Pin;

use bytes::Bytes;
use futures::{Stream, StreamExt};

use crate::wire;

type Frames = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

pub struct AppendSession {
    inputs: tokio::sync::mpsc::Sender<Result<Vec<u8>, std::io::Error>>,
    frames: Frames,
    buffer: Vec<u8>,
}

/// How a session ended, or why it could not start.
#[derive(Debug)]
pub enum SessionEnd {
    /// The server answered the session's request with this status and body.
    Refused(u16, String),
    /// A terminal frame (flag 0x80): its body, an error as JSON.
    Terminal(String),
    /// The connection broke or closed (e.g. the server was killed).
    Broken(String),
}

impl AppendSession {
    /// Opens an append session on `stream` of `basin` with the root token.
    pub async fn open(endpoint: &str, basin: &str, stream: &str) -> Result<Self, SessionEnd> {
        let (inputs, rx) = tokio::sync::mpsc::channel(64);
        let body = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        let h2 = crate::client_builder()
            .http2_prior_knowledge()
            .build()
            .expect("an HTTP/2 client");
        let response = h2
            .post(format!(
                "{endpoint}/v1/streams/{}/records",
                crate::path_segment(stream)
            ))
            .header("s2-basin", basin)
            .header("content-type", "s2s/proto")
            .body(reqwest::Body::wrap_stream(body))
            .send()
            .await
            .map_err(|e| SessionEnd::Broken(e.to_string()))?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return Err(SessionEnd::Refused(status.as_u16(), body));
        }
        Ok(AppendSession {
            inputs,
            frames: Box::pin(response.bytes_stream()),
            buffer: Vec::new(),
        })
    }

    /// Sends one input: a batch of records with these bodies.
    pub async fn send(&mut self, bodies: &[&[u8]]) -> Result<(), SessionEnd> {
        let frame = wire::s2s_frame(&wire::encode_append_input(bodies));
        self.inputs
            .send(Ok(frame))
            .await
            .map_err(|_| SessionEnd::Broken("the request body was closed".into()))
    }

    /// The next acknowledgement: the acknowledged input's `start..end` sequence numbers.
    pub async fn ack(&mut self) -> Result<(u64, u64), SessionEnd> {
        loop {
            if let Some((flags, body)) = wire::take_s2s_frame(&mut self.buffer) {
                if flags & 0x80 != 0 {
                    return Err(SessionEnd::Terminal(
                        String::from_utf8_lossy(&body).into_owned(),
                    ));
                }
                return Ok(wire::decode_ack_range(&body));
            }
            match self.frames.next().await {
                Some(Ok(chunk)) => self.buffer.extend_from_slice(&chunk),
                Some(Err(e)) => return Err(SessionEnd::Broken(e.to_string())),
                None => return Err(SessionEnd::Broken("the response ended".into())),
            }
        }
    }
}
