//! Read sessions, over S2S (`ReadBatch` frames) or SSE (`batch`/`ping`/`error`/`done`
//! events). Both run the same loop: catch up in batches of at most 1000 records / 1 MiB,
//! announce the switch to following with an empty batch carrying the tail, then deliver
//! new records as they become durable, with a heartbeat every 5-15 s while idle. Bounds
//! (`count`, `bytes`, `until`) and `wait` (an idle timeout) end the session.

use std::time::Duration;

use axum::body::Bytes;
use axum::response::Response;
use rand::Rng;
use streamgate_core::names::{BasinName, StreamName};
use streamgate_core::read::{ReadBatch, ReadLimits, StreamReader};
use streamgate_core::record::StreamPosition;
use streamgate_core::Caller;
use tokio::sync::mpsc;
use tokio::time::Instant;

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

/// Starts the session loop and returns the streaming response.
pub fn respond<E: SessionEncoder>(
    caller: Caller,
    reading: (BasinName, StreamName, StreamReader),
    bounds: SessionBounds,
    encoder: E,
    drain: Drain,
) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(run(caller, reading, bounds, encoder, drain, tx));
    streaming_response(E::CONTENT_TYPE, rx)
}

fn heartbeat_delay() -> Duration {
    Duration::from_millis(rand::rng().random_range(5_000..=15_000))
}

async fn run<E: SessionEncoder>(
    caller: Caller,
    (basin, stream, mut reader): (BasinName, StreamName, StreamReader),
    bounds: SessionBounds,
    mut encoder: E,
    mut drain: Drain,
    out: mpsc::Sender<Bytes>,
) {
    let _open = streamgate_core::telemetry::OpenGuard::new(E::KIND);
    let mut remaining_count = bounds.count;
    let mut remaining_bytes = bounds.bytes;
    let mut announced_following = false;
    let mut idle_since = Instant::now();
    loop {
        if remaining_count == Some(0) || remaining_bytes == Some(0) {
            break;
        }
        let limits = ReadLimits {
            count: remaining_count,
            bytes: remaining_bytes,
            until: bounds.until,
        }
        .for_one_batch();
        // The caller re-checks its token before every batch: a token revoked or
        // expired while the session is open ends it.
        let (batch, bounded) = match caller.next_batch(&mut reader, limits).await {
            Ok(next) => next,
            // Handed to another node: the session goes on there, from where it was.
            Err(streamgate_core::Error::StreamMoved) if reader.has_moved() => {
                match caller.follow_move(&mut reader, &basin, &stream).await {
                    Ok(()) => continue,
                    Err(err) => {
                        let _ = out.send(encoder.error(&ApiError::from(err))).await;
                        return;
                    }
                }
            }
            Err(err) => {
                let _ = out.send(encoder.error(&ApiError::from(err))).await;
                return;
            }
        };
        if !batch.records.is_empty() {
            let count = batch.records.len() as u64;
            let bytes: u64 = batch.records.iter().map(|r| r.metered_size()).sum();
            remaining_count = remaining_count.map(|c| c - count);
            remaining_bytes = remaining_bytes.map(|b| b.saturating_sub(bytes));
            if out.send(encoder.batch(batch)).await.is_err() {
                return;
            }
            idle_since = Instant::now();
            continue;
        }
        if bounded {
            break; // `until`, or a record larger than the bytes left
        }
        // Caught up with the tail.
        if !bounds.waits() {
            break;
        }
        if !announced_following {
            // Announced with the tail the reader is at: records published since the
            // batch are read first, and announced after.
            let Some(tail) = reader.tail_if_reached() else {
                continue;
            };
            announced_following = true;
            if out.send(encoder.heartbeat(tail)).await.is_err() {
                return;
            }
        }
        let heartbeat_at = Instant::now() + heartbeat_delay();
        let idle_deadline = bounds.wait.and_then(|wait| idle_since.checked_add(wait));
        let deadline = idle_deadline.map_or(heartbeat_at, |idle| idle.min(heartbeat_at));
        tokio::select! {
            more = reader.wait_for_records(Some(deadline)) => match more {
                Ok(true) => {}
                Ok(false) if idle_deadline.is_some_and(|idle| Instant::now() >= idle) => break,
                Ok(false) => {
                    // As above: a heartbeat names only a tail the reader is at.
                    if let Some(tail) = reader.tail_if_reached() {
                        if out.send(encoder.heartbeat(tail)).await.is_err() {
                            return;
                        }
                    }
                }
                Err(streamgate_core::Error::StreamMoved) if reader.has_moved() => {
                    if let Err(err) = caller.follow_move(&mut reader, &basin, &stream).await {
                        let _ = out.send(encoder.error(&ApiError::from(err))).await;
                        return;
                    }
                }
                Err(err) => {
                    let _ = out.send(encoder.error(&ApiError::from(err))).await;
                    return;
                }
            },
            _ = drain.started() => {
                let err = ApiError::from(streamgate_core::Error::ServerDraining);
                let _ = out.send(encoder.error(&err)).await;
                return;
            }
            _ = out.closed() => return,
        }
    }
    if let Some(done) = encoder.done() {
        let _ = out.send(done).await;
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
