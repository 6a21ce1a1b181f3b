//! S2S append sessions: `AppendInput` frames in, `AppendAck` frames out, pipelined and
//! acknowledged strictly in order. A failed input poisons the session: nothing after it
//! is appended, the inputs before it are acknowledged, and a terminal frame says why.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::Response;
use futures::stream::StreamExt;
use futures::FutureExt;
use streamgate_core::config::StreamConfig;
use streamgate_core::in_order::InOrder;
use streamgate_core::names::{BasinName, StreamName};
use streamgate_core::{Caller, Error};
use tokio::sync::mpsc;

use super::frame::{
    encode_message, encode_terminal, Compression, Frame, FrameDecoder, RECONNECT_ADVISED,
};
use super::Drain;
use crate::api::error::ApiError;
use crate::api::proto;

/// Inputs accepted but not yet acknowledged, per session. Past this the session stops
/// reading, and HTTP/2 flow control pushes back on the client.
const MAX_IN_FLIGHT: usize = 512;

pub struct AppendSession {
    pub caller: Caller,
    pub basin: BasinName,
    pub stream: StreamName,
    pub create_config: Option<StreamConfig>,
    pub compression: Compression,
    pub drain: Drain,
}

impl AppendSession {
    /// Starts the session and returns the streaming response.
    pub fn respond(self, body: Body) -> Response {
        let (tx, rx) = mpsc::channel::<Bytes>(64);
        tokio::spawn(self.run(body, tx));
        streaming_response("s2s/proto", body_from(rx))
    }

    async fn run(mut self, body: Body, out: mpsc::Sender<Bytes>) {
        let _open = streamgate_core::telemetry::OpenGuard::new("s2s-append");
        let mut inputs = body.into_data_stream();
        let mut decoder = FrameDecoder::default();
        let mut in_flight = InOrder::default();
        let mut draining = self.drain.is_draining();
        let mut reading = !draining;
        let mut failure: Option<ApiError> = None;
        let mut drain = self.drain.clone();
        loop {
            if (!reading || failure.is_some()) && in_flight.is_empty() {
                break;
            }
            let flags = if draining { RECONNECT_ADVISED } else { 0 };
            tokio::select! {
                biased;
                Some(ack) = in_flight.pop_front(), if !in_flight.is_empty() => {
                    if !self.deliver(ack, flags, &out, &mut in_flight, &mut failure).await {
                        return; // the client went away
                    }
                }
                _ = drain.started(), if !draining => {
                    draining = true;
                    reading = false;
                }
                chunk = inputs.next(), if reading && failure.is_none() && in_flight.len() < MAX_IN_FLIGHT => {
                    match chunk {
                        Some(Ok(data)) => {
                            decoder.push(&data);
                            loop {
                                match decoder.next_frame() {
                                    Ok(Some(Frame::Message(message))) => {
                                        // Acks that are ready go out before a submit that may
                                        // wait for the in-flight budget, so clients never wait
                                        // on acks the server already has.
                                        while let Some(Some(ack)) = in_flight.pop_front().now_or_never() {
                                            if !self.deliver(ack, flags, &out, &mut in_flight, &mut failure).await {
                                                return;
                                            }
                                        }
                                        if failure.is_some() {
                                            break;
                                        }
                                        match self.submit(message).await {
                                        Ok(pending) => in_flight.push_back(pending),
                                        Err(err) => {
                                            failure = Some(err);
                                            break;
                                        }
                                    }
                                    }
                                    Ok(Some(Frame::Terminal { .. })) => {
                                        failure = Some(ApiError::bad_frame("clients may not send terminal frames; end the request body instead"));
                                        break;
                                    }
                                    Ok(None) => break,
                                    Err(err) => {
                                        failure = Some(ApiError::bad_frame(err.0));
                                        break;
                                    }
                                }
                            }
                        }
                        Some(Err(_)) => return, // the client's side broke
                        None => {
                            reading = false;
                            if decoder.pending() > 0 {
                                failure = Some(ApiError::bad_frame("the session ended in the middle of a frame"));
                            }
                        }
                    }
                }
            }
        }
        // A submit can meet the drain (and fail with `server_draining`) before this loop
        // notices it: the terminal frame advises reconnecting either way.
        let draining = draining || self.drain.is_draining();
        let terminal = match failure {
            Some(err) => Some(err),
            None if draining => Some(ApiError::from(Error::ServerDraining)),
            None => None,
        };
        if let Some(err) = terminal {
            let flags = if draining { RECONNECT_ADVISED } else { 0 };
            let _ = out
                .send(encode_terminal(err.status().as_u16(), err.body(), flags))
                .await;
        }
    }

    /// Sends one acknowledgement, or records the failure that ends the session. Returns
    /// false if the client has gone away.
    async fn deliver(
        &self,
        ack: streamgate_core::Result<streamgate_core::record::AppendAck>,
        flags: u8,
        out: &mpsc::Sender<Bytes>,
        in_flight: &mut InOrder<streamgate_core::PendingAck>,
        failure: &mut Option<ApiError>,
    ) -> bool {
        match ack {
            Ok(ack) => {
                let frame = encode_message(&proto::AppendAck::from(ack), self.compression, flags);
                out.send(frame).await.is_ok()
            }
            Err(err) => {
                // Later inputs were sequenced after this one; none of them may be
                // acknowledged now.
                failure.get_or_insert(ApiError::from(err));
                in_flight.clear();
                true
            }
        }
    }

    async fn submit(&mut self, message: Bytes) -> Result<streamgate_core::PendingAck, ApiError> {
        let input = proto::decode_append_input(message)?;
        // A token revoked or expired while the session is open stops it here: the
        // caller re-checks it on every append.
        Ok(self
            .caller
            .submit_append(
                &self.basin,
                &self.stream,
                input,
                self.create_config.as_ref(),
            )
            .await?)
    }
}

/// A streaming response body fed by a channel of frames; it ends when the sender drops.
fn body_from(rx: mpsc::Receiver<Bytes>) -> Body {
    Body::from_stream(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|bytes| (Ok::<_, Infallible>(bytes), rx))
    }))
}

/// A 200 response streaming `body` with the given content type.
pub fn streaming_response(content_type: &'static str, body: Body) -> Response {
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CACHE_CONTROL, "no-cache")
        .body(body)
        .expect("a valid response")
}
