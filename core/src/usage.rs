//! Usage metering for the S2 metrics API: what each request did is counted in memory,
//! by minute, off the append path; a background task adds the counts to the metadata
//! store every few seconds (into minute, hour and day buckets at once), so they
//! survive restarts and every node of a cluster sees the same numbers. The cluster's
//! lifecycle leader also records each stream's stored bytes once a minute and drops
//! buckets past their retention.
//!
//! What counts, as the metrics pages define it:
//! - an append operation is one minute of appends to one stream over one connection,
//!   by storage class; append throughput is the metered bytes appended;
//! - a unary read is one operation; a streaming read is one operation per minute of a
//!   session on one stream over one connection; read throughput is the metered bytes
//!   read;
//! - account operations are the account-level requests (and the metrics requests);
//!   basin operations the stream-level control requests and check-tail;
//! - storage is the bytes of a stream's segments (records reach segments within one
//!   compaction interval of their append).
//!
//! Only requests that succeed are counted. Counts not yet written when the process is
//! killed are lost (at most `FLUSH_INTERVAL` of them): metrics may undercount by that.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::config::StorageClass;
use crate::error::Result;
use crate::names::BasinName;
use crate::storage::usage::{Resolution, StoredBytes, UsageRow};
use crate::storage::MetadataStore;

/// How often counts are written to the metadata store.
pub const FLUSH_INTERVAL: Duration = Duration::from_secs(5);

/// The metric (set) names rows are stored under.
pub mod metric {
    pub const ACCOUNT_OPS: &str = "account-ops";
    pub const BASIN_OPS: &str = "basin-ops";
    pub const APPEND_OPS: &str = "append-ops";
    pub const APPEND_THROUGHPUT: &str = "append-throughput";
    pub const READ_OPS: &str = "read-ops";
    pub const READ_THROUGHPUT: &str = "read-throughput";
    pub const STORAGE: &str = "storage";
}

/// A client's connection, as the front end that accepted it names it: what makes two
/// requests "one connection" for the operation counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnectionId(pub u64);

impl ConnectionId {
    /// The connection from `peer` accepted by the node of `epoch`.
    pub fn accepted(epoch: u64, peer: std::net::SocketAddr) -> ConnectionId {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (epoch, peer).hash(&mut hasher);
        ConnectionId(hasher.finish())
    }
}

/// One count of one minute of a basin, before it is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct CountKey {
    minute: u64,
    metric: &'static str,
    series: &'static str,
}

/// The counts not yet written, by basin (`""` for the account's): a count added to a
/// basin already counted allocates nothing (a read session adds one for every batch).
type Counts = HashMap<String, HashMap<CountKey, u64>>;

/// A streaming operation already counted this minute: (minute, connection, stream,
/// whether it is a read).
type SessionMinute = (u64, ConnectionId, u64, bool);

#[derive(Default)]
struct Pending {
    counts: Counts,
    sessions: HashSet<SessionMinute>,
}

/// Per (resolution, basin, stream): the bucket (for minutes, the hour) and the bytes
/// of the last storage reading written.
type WrittenReadings = HashMap<(Resolution, String, String), (u64, u64)>;

/// The counts of this node, until written.
#[derive(Default)]
pub(crate) struct UsageRecorder {
    pending: Mutex<Pending>,
    /// The last stored-bytes reading written per (basin, stream) and resolution, so a
    /// reading is written again only when it changed or a new bucket began.
    storage_written: Mutex<WrittenReadings>,
}

fn now_secs() -> u64 {
    crate::record::now_ms() / 1000
}

fn class_name(class: StorageClass) -> &'static str {
    match class {
        StorageClass::Standard => "standard",
        StorageClass::Express => "express",
    }
}

/// At most this many (minute, connection, stream) entries are remembered per minute;
/// past it (a flood of connections), each further one counts as an operation of its
/// own rather than growing the set.
const MAX_SESSION_MINUTES: usize = 1_000_000;

/// One kind of session-like traffic: bytes counted as throughput, and one operation per
/// minute on each stream over each connection.
struct PerMinute {
    throughput: (&'static str, &'static str),
    ops: (&'static str, &'static str),
    read: bool,
}

impl UsageRecorder {
    fn add(
        pending: &mut Pending,
        basin: &str,
        (metric, series): (&'static str, &'static str),
        n: u64,
    ) {
        Self::add_in(
            pending,
            Resolution::Minute.bucket_of(now_secs()),
            basin,
            (metric, series),
            n,
        );
    }

    fn add_in(
        pending: &mut Pending,
        minute: u64,
        basin: &str,
        (metric, series): (&'static str, &'static str),
        n: u64,
    ) {
        let key = CountKey {
            minute,
            metric,
            series,
        };
        if let Some(counts) = pending.counts.get_mut(basin) {
            *counts.entry(key).or_default() += n;
            return;
        }
        let counts = pending.counts.entry(basin.to_owned()).or_default();
        counts.insert(key, n);
    }

    /// An account-level request (`basin` is `None`) or a basin-level one.
    pub fn operation(&self, basin: Option<&BasinName>, op: &'static str) {
        let mut pending = self.pending.lock();
        match basin {
            None => Self::add(&mut pending, "", (metric::ACCOUNT_OPS, op), 1),
            Some(basin) => Self::add(&mut pending, basin.as_str(), (metric::BASIN_OPS, op), 1),
        }
    }

    /// An append of `metered` bytes to stream `stream_id`, over `connection` (counted
    /// once sequenced).
    pub fn append(
        &self,
        basin: &BasinName,
        stream_id: u64,
        class: StorageClass,
        metered: u64,
        connection: Option<ConnectionId>,
    ) {
        let class = class_name(class);
        let kind = PerMinute {
            throughput: (metric::APPEND_THROUGHPUT, class),
            ops: (metric::APPEND_OPS, class),
            read: false,
        };
        self.per_minute(kind, basin, stream_id, metered, connection, &mut None);
    }

    /// A batch of `bytes` a read session delivered. `counted_minute` is the session's
    /// own note of the minute its operation was last counted in: its later batches in
    /// that minute skip the shared set of counted sessions, which each of 10,000
    /// followers' deliveries otherwise hashes into under the lock.
    pub fn streaming_read(
        &self,
        basin: &BasinName,
        stream_id: u64,
        bytes: u64,
        connection: Option<ConnectionId>,
        counted_minute: &mut Option<u64>,
    ) {
        let kind = PerMinute {
            throughput: (metric::READ_THROUGHPUT, metric::READ_THROUGHPUT),
            ops: (metric::READ_OPS, "streaming"),
            read: true,
        };
        self.per_minute(kind, basin, stream_id, bytes, connection, counted_minute);
    }

    /// A unary read: one operation (its bytes are counted as they are read).
    pub fn unary_read(&self, basin: &BasinName) {
        let mut pending = self.pending.lock();
        Self::add(&mut pending, basin.as_str(), (metric::READ_OPS, "unary"), 1);
    }

    /// `bytes` of records read.
    pub fn read_throughput(&self, basin: &BasinName, bytes: u64) {
        let mut pending = self.pending.lock();
        let series = (metric::READ_THROUGHPUT, metric::READ_THROUGHPUT);
        Self::add(&mut pending, basin.as_str(), series, bytes);
    }

    fn per_minute(
        &self,
        kind: PerMinute,
        basin: &BasinName,
        stream_id: u64,
        bytes: u64,
        connection: Option<ConnectionId>,
        counted_minute: &mut Option<u64>,
    ) {
        let minute = Resolution::Minute.bucket_of(now_secs());
        let mut pending = self.pending.lock();
        if bytes > 0 {
            Self::add_in(&mut pending, minute, basin.as_str(), kind.throughput, bytes);
        }
        // Without a connection (the server's own calls), every call is one operation.
        let first = match connection {
            Some(_) if *counted_minute == Some(minute) => false,
            Some(connection) if pending.sessions.len() < MAX_SESSION_MINUTES => {
                *counted_minute = Some(minute);
                pending
                    .sessions
                    .insert((minute, connection, stream_id, kind.read))
            }
            _ => true,
        };
        if first {
            Self::add_in(&mut pending, minute, basin.as_str(), kind.ops, 1);
        }
    }

    /// Writes what was counted so far. The counts are taken out only once written, so
    /// a failed write (or one cut short by shutdown) leaves them for the next.
    pub async fn flush(&self, metadata: &dyn MetadataStore) -> Result<()> {
        let counts = {
            let mut pending = self.pending.lock();
            let current = Resolution::Minute.bucket_of(now_secs());
            pending.sessions.retain(|(minute, ..)| *minute >= current);
            pending.counts.clone()
        };
        if counts.is_empty() {
            return Ok(());
        }
        let rows: Vec<UsageRow> = counts
            .iter()
            .flat_map(|(basin, counts)| counts.iter().map(move |count| (basin, count)))
            .flat_map(|(basin, (key, value))| {
                Resolution::ALL.into_iter().map(move |resolution| UsageRow {
                    resolution,
                    bucket: resolution.bucket_of(key.minute),
                    basin: basin.clone(),
                    stream: String::new(),
                    metric: key.metric,
                    series: key.series.to_owned(),
                    value: *value,
                })
            })
            .collect();
        metadata.add_usage(&rows, &[]).await?;
        let mut pending = self.pending.lock();
        for (basin, written) in counts {
            let Some(counts) = pending.counts.get_mut(&basin) else {
                continue;
            };
            for (key, written) in written {
                if let std::collections::hash_map::Entry::Occupied(mut entry) = counts.entry(key) {
                    *entry.get_mut() -= written;
                    if *entry.get() == 0 {
                        entry.remove();
                    }
                }
            }
            if counts.is_empty() {
                pending.counts.remove(&basin);
            }
        }
        Ok(())
    }

    /// Records every stream's stored bytes, and each basin's sum, as gauge readings of
    /// this minute and hour: only those that changed since the last reading written, or
    /// whose bucket is new (for minutes: whose hour is new). Streams that are gone read 0.
    pub async fn record_storage(&self, metadata: &dyn MetadataStore) -> Result<()> {
        let now = now_secs();
        let streams = metadata.stored_bytes().await?;
        let mut readings: HashMap<(String, String), u64> = HashMap::new();
        for StoredBytes {
            basin,
            stream,
            bytes,
        } in streams
        {
            *readings.entry((basin.clone(), String::new())).or_default() += bytes;
            readings.insert((basin, stream), bytes);
        }
        let mut gauges = Vec::new();
        let mut written = self.storage_written.lock().clone();
        // What had bytes and is no longer listed (deleted, or all trimmed) reads 0.
        let gone: Vec<(String, String)> = written
            .keys()
            .map(|(_, basin, stream)| (basin.clone(), stream.clone()))
            .filter(|key| !readings.contains_key(key))
            .collect();
        for key in gone {
            readings.insert(key, 0);
        }
        for ((basin, stream), bytes) in &readings {
            // A query spans at most 90 days, which hour readings cover.
            for resolution in [Resolution::Minute, Resolution::Hour] {
                let bucket = resolution.bucket_of(now);
                let key = (resolution, basin.clone(), stream.clone());
                // A minute reading is written when it changed, and once an hour in any
                // case, so a reading of the past is never more than an hour back.
                let keyframe = match resolution {
                    Resolution::Minute => Resolution::Hour.bucket_of(now),
                    _ => bucket,
                };
                let due = match written.get(&key) {
                    Some((last_frame, last_bytes)) => {
                        *last_frame != keyframe || last_bytes != bytes
                    }
                    None => true,
                };
                if due {
                    gauges.push(UsageRow {
                        resolution,
                        bucket,
                        basin: basin.clone(),
                        stream: stream.clone(),
                        metric: metric::STORAGE,
                        series: metric::STORAGE.to_owned(),
                        value: *bytes,
                    });
                    if *bytes == 0 {
                        written.remove(&key);
                    } else {
                        written.insert(key, (keyframe, *bytes));
                    }
                }
            }
        }
        metadata.add_usage(&[], &gauges).await?;
        *self.storage_written.lock() = written;
        Ok(())
    }

    /// Drops buckets past their retention.
    pub async fn expire(&self, metadata: &dyn MetadataStore) -> Result<()> {
        let now = now_secs();
        for resolution in Resolution::ALL {
            let before = now.saturating_sub(resolution.retention_secs());
            metadata
                .expire_usage(resolution, resolution.bucket_of(before))
                .await?;
        }
        Ok(())
    }
}

/// Shared by the engine and its background tasks.
pub(crate) type Usage = Arc<UsageRecorder>;

#[cfg(test)]
mod tests {
    use super::*;

    /// The streaming read operations and read bytes counted so far.
    fn streaming_reads(recorder: &UsageRecorder) -> (u64, u64) {
        let pending = recorder.pending.lock();
        let sum = |series: (&str, &str)| -> u64 {
            let matching = pending
                .counts
                .values()
                .flatten()
                .filter(|(key, _)| (key.metric, key.series) == series);
            matching.map(|(_, n)| *n).sum()
        };
        (
            sum((metric::READ_OPS, "streaming")),
            sum((metric::READ_THROUGHPUT, metric::READ_THROUGHPUT)),
        )
    }

    #[test]
    fn a_read_session_is_one_operation_a_minute_on_its_connection_and_stream() {
        let basin = BasinName::new("usage-basin").unwrap();
        let (one, two) = (Some(ConnectionId(1)), Some(ConnectionId(2)));
        // Counts are per minute: a run that straddles a minute's end is run again.
        for _ in 0..3 {
            let minute = Resolution::Minute.bucket_of(now_secs());
            let recorder = UsageRecorder::default();
            let (mut session, mut other_session) = (None, None);
            for _ in 0..3 {
                recorder.streaming_read(&basin, 7, 10, one, &mut session);
            }
            let remembered = session;
            // Another session on the same connection and stream is the same operation.
            recorder.streaming_read(&basin, 7, 10, one, &mut other_session);
            // A session that remembers an earlier minute asks the shared set again.
            let mut stale = Some(minute.wrapping_sub(60));
            recorder.streaming_read(&basin, 7, 10, one, &mut stale);
            let same_operation = streaming_reads(&recorder);
            // Another stream, or another connection, is another operation.
            recorder.streaming_read(&basin, 8, 10, one, &mut None);
            recorder.streaming_read(&basin, 7, 10, two, &mut None);
            let others = streaming_reads(&recorder);
            if Resolution::Minute.bucket_of(now_secs()) != minute {
                continue;
            }
            assert_eq!(remembered, Some(minute));
            assert_eq!(stale, Some(minute));
            assert_eq!(same_operation, (1, 50), "every batch's bytes count");
            assert_eq!(others, (3, 70));
            return;
        }
        panic!("three runs in a row straddled a minute's end");
    }
}
