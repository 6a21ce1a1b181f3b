//! Read sessions, over S2S (`ReadBatch` frames) or SSE (`batch`/`ping`/`error`/`done`
//! events). Both run the same loop: catch up in batches of at most 1000 records / 1 MiB,
//! announce the switch to following with an empty batch carrying the tail, then deliver
//! new records as they become durable, with a heartbeat every 5-15 s while idle. Bounds
//! (`count`, `bytes`, `until`) and `wait` (an idle timeout) end the session.

use std::convert::Infallible;
use std::pin::Pin;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::Response;
use rand::Rng;
use streamgate_core::names::{BasinName, StreamName};
use streamgate_core::read::{ReadBatch, ReadLimits, StreamReader};
use streamgate_core::record::StreamPosition;
use streamgate_core::Caller;
use tokio::time::{Instant, Sleep};

use super::append::streaming_response;
use super::frame::{encode_message, encode_terminal, Compression};
use super::Drain;
use crate::api::error::ApiError;
use crate::api::json::{self, Format};
use crate::api::proto;

/// What limits a session as a whole (not one batch).
#[derive(Debug, Clone, Copy)]
pub struct SessionBounds {
    pub count: Option<u64>,
    pub bytes: Option<u64>,
    pub until: Option<u64>,
    /// Idle timeout at the tail; `None` follows forever.
    pub wait: Option<Duration>,
}

impl SessionBounds {
    /// Applies the documented defaults: without `count`, `bytes` or `until` a session
    /// follows forever unless `wait` is given; with any of them it stops at the tail
    /// unless `wait` is given.
    pub fn new(
        count: Option<u64>,
        bytes: Option<u64>,
        until: Option<u64>,
        wait: Option<u64>,
    ) -> Self {
        let bounded = count.is_some() || bytes.is_some() || until.is_some();
        let wait = match wait {
            Some(secs) => Some(Duration::from_secs(secs)),
            None if bounded => Some(Duration::ZERO),
            None => None,
        };
        Self {
            count,
            bytes,
            until,
            wait,
        }
    }

    pub fn waits(&self) -> bool {
        self.wait != Some(Duration::ZERO)
    }
}

/// How session events become bytes on the wire.
pub trait SessionEncoder: Send + 'static {
    const CONTENT_TYPE: &'static str;
    /// How operator metrics count open sessions of this kind.
    const KIND: &'static str;
    fn batch(&mut self, batch: ReadBatch) -> Bytes;
    fn heartbeat(&mut self, tail: StreamPosition) -> Bytes;
    /// The last message of a session that ended normally, if the protocol has one.
    fn done(&mut self) -> Option<Bytes>;
    fn error(&mut self, err: &ApiError) -> Bytes;
}

pub struct S2sEncoder {
    pub compression: Compression,
}

impl SessionEncoder for S2sEncoder {
    const CONTENT_TYPE: &'static str = "s2s/proto";
    const KIND: &'static str = "s2s-read";

    fn batch(&mut self, batch: ReadBatch) -> Bytes {
        encode_message(&proto::ReadBatch::from(batch), self.compression, 0)
    }

    fn heartbeat(&mut self, tail: StreamPosition) -> Bytes {
        let batch = proto::ReadBatch {
            records: vec![],
            tail: Some(tail.into()),
        };
        encode_message(&batch, self.compression, 0)
    }

    fn done(&mut self) -> Option<Bytes> {
        None
    }

    fn error(&mut self, err: &ApiError) -> Bytes {
        encode_terminal(err.status().as_u16(), err.body(), 0)
    }
}

/// SSE events. Each batch's id is `seq_num,count,bytes`: the last record's sequence
/// number and what the session has delivered so far, so a reconnect with
/// `Last-Event-ID` can resume with the bounds reduced accordingly.
pub struct SseEncoder {
    pub format: Format,
    pub delivered_count: u64,
    pub delivered_bytes: u64,
}

impl SessionEncoder for SseEncoder {
    const CONTENT_TYPE: &'static str = "text/event-stream";
    const KIND: &'static str = "sse";

    fn batch(&mut self, batch: ReadBatch) -> Bytes {
        let Some(last) = batch.records.last().map(|r| r.seq_num) else {
            return self.heartbeat(batch.tail.unwrap_or_default());
        };
        self.delivered_count += batch.records.len() as u64;
        self.delivered_bytes += batch.records.iter().map(|r| r.metered_size()).sum::<u64>();
        let data = json::read_batch(&batch, self.format);
        Bytes::from(format!(
            "event: batch\nid: {last},{},{}\ndata: {data}\n\n",
            self.delivered_count, self.delivered_bytes
        ))
    }

    fn heartbeat(&mut self, tail: StreamPosition) -> Bytes {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let data = serde_json::json!({ "timestamp": now, "tail": json::position(tail) });
        Bytes::from(format!("event: ping\ndata: {data}\n\n"))
    }

    fn done(&mut self) -> Option<Bytes> {
        Some(Bytes::from_static(b"data: [DONE]\n\n"))
    }

    fn error(&mut self, err: &ApiError) -> Bytes {
        Bytes::from(format!("event: error\ndata: {}\n\n", err.body()))
    }
}

/// A resume point from SSE's `Last-Event-ID`: `seq_num,count,bytes` (or with `:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResumeFrom {
    pub seq_num: u64,
    pub count: u64,
    pub bytes: u64,
}

impl ResumeFrom {
    pub fn parse(value: &str) -> Option<ResumeFrom> {
        // Three numbers of at most 20 digits and their separators; anything longer is
        // not an id this server sent.
        if value.len() > 3 * 20 + 8 {
            return None;
        }
        let parts: Vec<u64> = value
            .trim()
            .split([',', ':'])
            .map(|p| p.trim().parse().ok())
            .collect::<Option<_>>()?;
        match parts[..] {
            [seq_num, count, bytes] => Some(ResumeFrom {
                seq_num,
                count,
                bytes,
            }),
            _ => None,
        }
    }
}

/// Returns the streaming response whose body is the session itself: each frame is read
/// and encoded when the response asks for its next chunk, on the task that sends it. A
/// task of its own with a channel to the response would cost every delivery one more
/// wake-up, which is most of a delivery's cost with thousands of tailing readers
/// (BENCHMARKS.md, "Live readers"). A client that goes away drops the body, and with it
/// the session.
pub fn respond<E: SessionEncoder>(
    caller: Caller,
    (basin, stream, reader): (BasinName, StreamName, StreamReader),
    bounds: SessionBounds,
    encoder: E,
    drain: Drain,
) -> Response {
    let session = ReadSession {
        _open: streamgate_core::telemetry::OpenGuard::new(E::KIND),
        caller,
        basin,
        stream,
        reader,
        bounds,
        encoder,
        drain,
        remaining_count: bounds.count,
        remaining_bytes: bounds.bytes,
        announced_following: false,
        wait_first: false,
        idle_since: Instant::now(),
        quiet_since: Instant::now(),
        heartbeat_delay: heartbeat_delay(),
        wake_at: None,
        ended: false,
    };
    let frames = futures::stream::unfold(session, |mut session| async move {
        let frame = session.next_frame().await?;
        Some((Ok::<_, Infallible>(frame), session))
    });
    streaming_response(E::CONTENT_TYPE, Body::from_stream(frames))
}

fn heartbeat_delay() -> Duration {
    Duration::from_millis(rand::rng().random_range(5_000..=15_000))
}

/// One read session's state between frames.
struct ReadSession<E> {
    _open: streamgate_core::telemetry::OpenGuard,
    caller: Caller,
    basin: BasinName,
    stream: StreamName,
    reader: StreamReader,
    bounds: SessionBounds,
    encoder: E,
    drain: Drain,
    remaining_count: Option<u64>,
    remaining_bytes: Option<u64>,
    announced_following: bool,
    /// The last batch reached the tail while following (see `next_event`).
    wait_first: bool,
    idle_since: Instant,
    /// When the session last sent records or a heartbeat: the next heartbeat is due a
    /// random 5-15 s later.
    quiet_since: Instant,
    heartbeat_delay: Duration,
    /// Wakes a following session for its next heartbeat or idle timeout. One timer for
    /// the session's life, moved only when it fires early: setting a timer for every
    /// wait cost each delivery a timer-wheel insertion and removal (a few per cent of
    /// the server's CPU with 10,000 readers; BENCHMARKS.md, "Live readers").
    wake_at: Option<Pin<Box<Sleep>>>,
    /// A terminal frame (error or done) was sent, or the session ended without one.
    ended: bool,
}

impl<E: SessionEncoder> ReadSession<E> {
    /// The session's next frame, waiting at the tail for records when it follows;
    /// `None` once it has ended.
    async fn next_frame(&mut self) -> Option<Bytes> {
        if self.ended {
            return None;
        }
        match self.next_event().await {
            Ok(Some(frame)) => Some(frame),
            Ok(None) => {
                self.ended = true;
                self.encoder.done()
            }
            Err(err) => {
                self.ended = true;
                Some(self.encoder.error(&err))
            }
        }
    }

    /// A batch or heartbeat to send; `Ok(None)` when the session's bounds or idle
    /// timeout end it, an error when it ends with one.
    async fn next_event(&mut self) -> Result<Option<Bytes>, ApiError> {
        loop {
            if self.remaining_count == Some(0) || self.remaining_bytes == Some(0) {
                return Ok(None);
            }
            // A follower that was just sent the records up to the tail waits before it
            // reads again: a read now would find nothing, and cost as much as a delivery.
            if !std::mem::take(&mut self.wait_first) {
                let limits = ReadLimits {
                    count: self.remaining_count,
                    bytes: self.remaining_bytes,
                    until: self.bounds.until,
                }
                .for_one_batch();
                // The caller re-checks its token before every batch: a token revoked or
                // expired while the session is open ends it.
                let (batch, bounded) = match self.caller.next_batch(&mut self.reader, limits).await
                {
                    Ok(next) => next,
                    Err(err) => {
                        self.follow_if_moved(err).await?;
                        continue;
                    }
                };
                if !batch.records.is_empty() {
                    let count = batch.records.len() as u64;
                    let bytes: u64 = batch.records.iter().map(|r| r.metered_size()).sum();
                    self.remaining_count = self.remaining_count.map(|c| c - count);
                    self.remaining_bytes = self.remaining_bytes.map(|b| b.saturating_sub(bytes));
                    self.idle_since = Instant::now();
                    self.quiet_since = self.idle_since;
                    self.wait_first = self.announced_following && !bounded && batch.tail.is_some();
                    return Ok(Some(self.encoder.batch(batch)));
                }
                if bounded {
                    return Ok(None); // `until`, or a record larger than the bytes left
                }
                // Caught up with the tail.
                if !self.bounds.waits() {
                    return Ok(None);
                }
                if !self.announced_following {
                    // Announced with the tail the reader is at: records published since the
                    // batch are read first, and announced after.
                    let Some(tail) = self.reader.tail_if_reached() else {
                        continue;
                    };
                    self.announced_following = true;
                    return Ok(Some(self.heartbeat(tail)));
                }
            }
            let heartbeat_at = self.quiet_since + self.heartbeat_delay;
            let idle_deadline = self
                .bounds
                .wait
                .and_then(|wait| self.idle_since.checked_add(wait));
            let deadline = idle_deadline.map_or(heartbeat_at, |idle| idle.min(heartbeat_at));
            // Deadlines only move later (records and heartbeats push them), so a timer
            // set earlier fires early at worst, and is moved then.
            let wake_at = self
                .wake_at
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
            if wake_at.deadline() > deadline {
                wake_at.as_mut().reset(deadline);
            }
            // A wait here is only a notification, dropped when the timer fires; a wait
            // at another node is a read there, which is told when to end.
            let wait_until = self.reader.is_remote().then_some(deadline);
            let timed_out = tokio::select! {
                more = self.reader.wait_for_records(wait_until) => match more {
                    Ok(true) => {
                        // A record that wakes thousands of followers at once: let the
                        // tasks already woken run first, the append's acknowledgement
                        // among them, so that the appender is not answered behind every
                        // delivery (ack p50 with 5,000 followers: 13 ms without, 4.6 ms
                        // with; BENCHMARKS.md, "Live readers").
                        if crate::coalesce::runtime_is_backlogged() {
                            tokio::task::yield_now().await;
                        }
                        false
                    }
                    // The deadline passed at the other node, or the tail can no
                    // longer change here.
                    Ok(false) => true,
                    Err(err) => {
                        self.follow_if_moved(err).await?;
                        false
                    }
                },
                () = wake_at.as_mut() => {
                    let now = Instant::now();
                    if now < deadline {
                        wake_at.as_mut().reset(deadline);
                    }
                    now >= deadline
                }
                _ = self.drain.started() => {
                    return Err(ApiError::from(streamgate_core::Error::ServerDraining));
                }
            };
            if !timed_out {
                continue;
            }
            if idle_deadline.is_some_and(|idle| Instant::now() >= idle) {
                return Ok(None);
            }
            // As above: a heartbeat names only a tail the reader is at.
            if let Some(tail) = self.reader.tail_if_reached() {
                return Ok(Some(self.heartbeat(tail)));
            }
        }
    }

    /// A heartbeat frame, which starts the next quiet period.
    fn heartbeat(&mut self, tail: StreamPosition) -> Bytes {
        self.quiet_since = Instant::now();
        self.heartbeat_delay = heartbeat_delay();
        self.encoder.heartbeat(tail)
    }

    /// A stream handed to another node: the session goes on there, from where it was.
    /// Any other error ends the session.
    async fn follow_if_moved(&mut self, err: streamgate_core::Error) -> Result<(), ApiError> {
        match err {
            streamgate_core::Error::StreamMoved if self.reader.has_moved() => Ok(self
                .caller
                .follow_move(&mut self.reader, &self.basin, &self.stream)
                .await?),
            err => Err(ApiError::from(err)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_follow_the_documented_wait_table() {
        assert_eq!(SessionBounds::new(None, None, None, None).wait, None);
        assert_eq!(
            SessionBounds::new(Some(5), None, None, None).wait,
            Some(Duration::ZERO)
        );
        assert_eq!(
            SessionBounds::new(None, None, Some(9), Some(3)).wait,
            Some(Duration::from_secs(3))
        );
        assert!(!SessionBounds::new(None, Some(1), None, None).waits());
        assert!(SessionBounds::new(None, None, None, Some(1)).waits());
    }

    #[test]
    fn last_event_id_accepts_both_separators() {
        let expected = Some(ResumeFrom {
            seq_num: 42,
            count: 10,
            bytes: 8192,
        });
        assert_eq!(ResumeFrom::parse("42,10,8192"), expected);
        assert_eq!(ResumeFrom::parse("42:10:8192"), expected);
        assert_eq!(ResumeFrom::parse(" 42, 10, 8192 "), expected);
        assert_eq!(ResumeFrom::parse("42,10"), None);
        assert_eq!(ResumeFrom::parse("a,b,c"), None);
    }

    #[test]
    fn sse_ids_count_what_was_delivered() {
        let mut encoder = SseEncoder {
            format: Format::Raw,
            delivered_count: 3,
            delivered_bytes: 30,
        };
        let batch = ReadBatch {
            records: vec![streamgate_core::record::SequencedRecord {
                seq_num: 7,
                timestamp: 1,
                headers: vec![],
                body: Bytes::from_static(b"hi"),
            }],
            tail: None,
        };
        let event = String::from_utf8(encoder.batch(batch).to_vec()).unwrap();
        assert!(
            event.starts_with("event: batch\nid: 7,4,40\ndata: {"),
            "{event}"
        );
        assert!(event.ends_with("}\n\n"));
        let done = encoder.done().unwrap();
        assert_eq!(&done[..], b"data: [DONE]\n\n");
    }
}
