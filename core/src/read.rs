//! Read requests: where a read starts, what bounds it, and how long it waits.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::encryption::{stored_metered_size, StreamCrypto};
use crate::error::{Error, Resource, Result};
use crate::follow::{ConnectionFollowers, FollowGroup, OwedDelivery};
use crate::names::BasinName;
use crate::read_ahead::{ReadAhead, SESSION_READ_AHEAD_BYTES};
use crate::record::{SequencedRecord, StreamPosition, MAX_BATCH_METERED_BYTES, MAX_BATCH_RECORDS};
use crate::record_store::{Listing, RecordStore};
use crate::remote::{RemoteStream, RemoteStreams};
use crate::stream::{BatchLocation, StreamState};
use crate::usage::{ConnectionId, Usage};

/// Where a read starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadStart {
    /// The first record with a sequence number at least this.
    SeqNum(u64),
    /// The first record with a timestamp at least this.
    Timestamp(u64),
    /// This many records before the tail, saturating at the start of the stream.
    TailOffset(u64),
}

impl Default for ReadStart {
    fn default() -> Self {
        ReadStart::TailOffset(0)
    }
}

/// Bounds on what a read returns; the first one reached ends it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadLimits {
    pub count: Option<u64>,
    pub bytes: Option<u64>,
    /// Exclusive timestamp bound.
    pub until: Option<u64>,
}

impl ReadLimits {
    /// The limits of a single batch: the request's, capped at 1000 records and 1 MiB.
    pub fn for_one_batch(&self) -> ReadLimits {
        ReadLimits {
            count: Some(self.count.unwrap_or(u64::MAX).min(MAX_BATCH_RECORDS as u64)),
            bytes: Some(self.bytes.unwrap_or(u64::MAX).min(MAX_BATCH_METERED_BYTES)),
            until: self.until,
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct ReadRequest {
    pub start: ReadStart,
    /// Move a start beyond the tail to the tail instead of failing.
    pub clamp: bool,
    pub limits: ReadLimits,
    /// How long to wait at the tail for records (unary reads: at most 60 s).
    pub wait: Duration,
}

impl ReadRequest {
    pub fn validate(&self) -> Result<()> {
        if let (ReadStart::Timestamp(start), Some(until)) = (self.start, self.limits.until) {
            if until <= start {
                return Err(Error::invalid(
                    "`until` must be greater than the start `timestamp`",
                ));
            }
        }
        Ok(())
    }
}

/// Longest a unary read may wait at the tail.
pub const MAX_UNARY_WAIT: Duration = Duration::from_secs(60);

/// One batch of a read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadBatch {
    pub records: Vec<SequencedRecord>,
    /// The tail, when the batch reaches it.
    pub tail: Option<StreamPosition>,
}

/// A cursor over one stream's durable records, shared by unary reads and read sessions:
/// over a stream this node sequences, or (for front ends that cannot forward whole
/// requests) one another node sequences, read from it batch by batch.
pub struct StreamReader {
    source: Source,
    /// The client connection a session follows on, whose followers of a stream are
    /// woken together (see `follow`).
    connection: Option<Arc<ConnectionFollowers>>,
}

enum Source {
    Local(LocalReader),
    Remote(RemoteReader),
}

impl StreamReader {
    pub(crate) async fn open(
        store: Arc<RecordStore>,
        state: Arc<StreamState>,
        (start, clamp): (ReadStart, bool),
        crypto: Option<StreamCrypto>,
        meter: ReadMeter,
    ) -> Result<StreamReader> {
        let local = LocalReader::open(store, state, start, clamp, crypto, meter).await?;
        Ok(StreamReader {
            source: Source::Local(local),
            connection: None,
        })
    }

    pub(crate) async fn open_remote(
        remote: Arc<dyn RemoteStreams>,
        at: RemoteStream,
        start: ReadStart,
        clamp: bool,
    ) -> Result<StreamReader> {
        let remote = RemoteReader::open(remote, at, start, clamp).await?;
        Ok(StreamReader {
            source: Source::Remote(remote),
            connection: None,
        })
    }

    /// Follows on `connection`: waits at the tail with the connection's other followers
    /// of the stream, so that they are woken together and its writer knows when they
    /// are done.
    pub fn follow_on(&mut self, connection: Arc<ConnectionFollowers>) {
        self.connection = Some(connection);
    }

    /// The same reader's position, read on through `replacement` (a stream handed to
    /// another node), on the same connection.
    pub fn replace_with(&mut self, replacement: StreamReader) {
        let connection = self.connection.take();
        *self = StreamReader {
            connection,
            ..replacement
        };
    }

    /// The sequence number of the next record this reader returns.
    pub fn position(&self) -> u64 {
        match &self.source {
            Source::Local(r) => r.position,
            Source::Remote(r) => r.position,
        }
    }

    /// The tail (for a remote stream, as last seen).
    pub fn tail(&self) -> StreamPosition {
        match &self.source {
            Source::Local(r) => r.state.tail(),
            Source::Remote(r) => r.tail,
        }
    }

    /// Whether another node sequences the stream: each batch, and each wait at the
    /// tail, is a read made there.
    pub fn is_remote(&self) -> bool {
        matches!(self.source, Source::Remote(_))
    }

    /// Whether the stream was handed to another node while this reader read it here
    /// (see `Caller::follow_move`).
    pub fn has_moved(&self) -> bool {
        match &self.source {
            Source::Local(r) => r.state.is_moved(),
            Source::Remote(_) => false,
        }
    }

    /// Whether every durable record has been read.
    pub fn at_tail(&self) -> bool {
        self.tail_if_reached().is_some()
    }

    /// The tail, if the reader has reached it: read once, so that what is decided and
    /// what is told agree however appends move the tail meanwhile.
    pub fn tail_if_reached(&self) -> Option<StreamPosition> {
        let tail = self.tail();
        (self.position() >= tail.seq_num).then_some(tail)
    }

    /// The refusal (416) of a read that does not wait, once the reader is at the tail,
    /// naming the tail it was decided against.
    pub fn refuse_at_tail(&self) -> Result<()> {
        match self.tail_if_reached() {
            Some(tail) => Err(Error::RangeNotSatisfiable { tail }),
            None => Ok(()),
        }
    }

    /// The next durable records within `limits` (count and bytes should be set), and
    /// whether a bound rather than the tail ended the batch. The batch carries the tail
    /// when it reaches it. Records trimmed meanwhile are skipped.
    pub async fn next_batch(&mut self, limits: ReadLimits) -> Result<(ReadBatch, bool)> {
        match &mut self.source {
            Source::Local(r) => r.next_batch(limits).await,
            Source::Remote(r) => r.next_batch(limits).await,
        }
    }

    /// Waits until records exist past the position (`true`), or until the deadline
    /// passes (`false`). A deleted stream ends the wait with an error.
    pub async fn wait_for_records(&mut self, deadline: Option<Instant>) -> Result<bool> {
        match &mut self.source {
            Source::Local(r) => r.wait_for_records(deadline, self.connection.as_ref()).await,
            Source::Remote(r) => r.wait_for_records(deadline).await,
        }
    }

    /// A single-batch (unary) read from here: the 416 rule for a read at the tail that
    /// does not wait, bounds capped at one batch, and a wait at the tail of at most
    /// `MAX_UNARY_WAIT`.
    pub async fn read_one_batch(&mut self, request: &ReadRequest) -> Result<ReadBatch> {
        let wait = request.wait.min(MAX_UNARY_WAIT);
        if wait.is_zero() {
            self.refuse_at_tail()?;
        }
        let limits = request.limits.for_one_batch();
        if limits.count == Some(0) || limits.bytes == Some(0) {
            return Ok(ReadBatch::default());
        }
        let deadline = Instant::now() + wait;
        loop {
            let (batch, bounded) = self.next_batch(limits).await?;
            if !batch.records.is_empty() || bounded {
                return Ok(batch);
            }
            match self.wait_for_records(Some(deadline)).await {
                Ok(true) => {}
                // Handed to another node while waiting: what a wait that ran out
                // answers (the client's next read reaches the new owner).
                Ok(false) | Err(Error::StreamMoved) => {
                    if !wait.is_zero() {
                        return Ok(ReadBatch::default());
                    }
                    // A read that does not wait answers records or 416, as at its
                    // start: the records it was to return were trimmed away under it
                    // (refused from where they ended), or others came just now (read).
                    self.refuse_at_tail()?;
                }
                Err(err) => return Err(err),
            }
        }
    }
}

/// A reader of a stream another node sequences: each batch is read from that node (a
/// wait at the tail is a read that waits there), and kept here until taken.
struct RemoteReader {
    remote: Arc<dyn RemoteStreams>,
    at: RemoteStream,
    position: u64,
    tail: StreamPosition,
    buffered: std::collections::VecDeque<SequencedRecord>,
}

impl RemoteReader {
    async fn open(
        remote: Arc<dyn RemoteStreams>,
        at: RemoteStream,
        start: ReadStart,
        clamp: bool,
    ) -> Result<RemoteReader> {
        let mut reader = RemoteReader {
            remote,
            at,
            position: 0,
            tail: StreamPosition::default(),
            buffered: Default::default(),
        };
        let first = ReadRequest {
            start,
            clamp,
            limits: ReadLimits::default().for_one_batch(),
            wait: Duration::ZERO,
        };
        // An owner refuses a read that does not wait at the tail (416) rather than
        // answer nothing, but one of an earlier version answered an empty batch when it
        // found its stream handed on (a read made again goes to the new owner) or
        // everything from the start trimmed meanwhile (a read made again is refused at
        // the tail). The first read is made again once rather than guessing where the
        // reader stands.
        let mut empty_answers = 0;
        loop {
            match reader.remote.read(&reader.at, first).await {
                Ok(batch) if batch.records.is_empty() && empty_answers == 0 => {
                    empty_answers += 1;
                }
                Ok(batch) => {
                    reader.tail = match batch.tail {
                        Some(tail) => tail,
                        None => reader.remote.check_tail(&reader.at).await?,
                    };
                    reader.position = match (batch.records.first(), start) {
                        (Some(first), _) => first.seq_num,
                        // Empty twice: a start by position stays where it was asked
                        // (the owner skips what is trimmed), one from the tail counts
                        // from the tail just looked up.
                        (None, ReadStart::SeqNum(seq)) => seq.min(reader.tail.seq_num),
                        (None, ReadStart::TailOffset(back)) => {
                            reader.tail.seq_num.saturating_sub(back)
                        }
                        (None, ReadStart::Timestamp(_)) => reader.tail.seq_num,
                    };
                    reader.buffered.extend(batch.records);
                    break;
                }
                // At the tail (or, with `clamp`, beyond it): the reader starts there.
                Err(Error::RangeNotSatisfiable { tail }) => {
                    // Beyond it without `clamp` is refused, as on the owner itself.
                    let beyond = match start {
                        ReadStart::SeqNum(seq) => seq > tail.seq_num,
                        ReadStart::Timestamp(timestamp) => timestamp > tail.timestamp,
                        ReadStart::TailOffset(_) => false,
                    };
                    if beyond && !clamp {
                        return Err(Error::RangeNotSatisfiable { tail });
                    }
                    reader.tail = tail;
                    reader.position = tail.seq_num;
                    break;
                }
                Err(err) => return Err(err),
            }
        }
        Ok(reader)
    }

    /// Reads the next batch from the owner into the buffer, waiting up to `wait` at the
    /// tail; whether it brought records.
    async fn fetch(&mut self, limits: ReadLimits, wait: Duration) -> Result<bool> {
        let request = ReadRequest {
            start: ReadStart::SeqNum(self.position),
            clamp: true,
            limits: limits.for_one_batch(),
            wait,
        };
        match self.remote.read(&self.at, request).await {
            Ok(batch) => {
                if let Some(tail) = batch.tail {
                    self.tail = tail;
                }
                if let Some(last) = batch.records.last() {
                    self.tail.seq_num = self.tail.seq_num.max(last.seq_num + 1);
                }
                let any = !batch.records.is_empty();
                self.buffered.extend(batch.records);
                Ok(any)
            }
            // Nothing from the position to the tail (a clamped read is refused only
            // there): whatever lay between was trimmed, and the reader moves past it.
            Err(Error::RangeNotSatisfiable { tail }) => {
                self.tail = tail;
                self.position = self.position.max(tail.seq_num);
                Ok(false)
            }
            Err(err) => Err(err),
        }
    }

    async fn next_batch(&mut self, limits: ReadLimits) -> Result<(ReadBatch, bool)> {
        if self.buffered.is_empty() {
            self.fetch(limits, Duration::ZERO).await?;
        }
        let max = limits.count.unwrap_or(u64::MAX) as usize;
        let take = self.buffered.len().min(max);
        let records: Vec<SequencedRecord> = self.buffered.drain(..take).collect();
        if let Some(last) = records.last() {
            self.position = last.seq_num + 1;
        }
        let bounded = records.len() == max && max > 0;
        let at_tail = self.buffered.is_empty() && self.position >= self.tail.seq_num;
        Ok((
            ReadBatch {
                records,
                tail: at_tail.then_some(self.tail),
            },
            bounded,
        ))
    }

    async fn wait_for_records(&mut self, deadline: Option<Instant>) -> Result<bool> {
        loop {
            if !self.buffered.is_empty() || self.position < self.tail.seq_num {
                return Ok(true);
            }
            let wait = match deadline {
                Some(deadline) => deadline.saturating_duration_since(Instant::now()),
                None => MAX_UNARY_WAIT,
            };
            if wait.is_zero() {
                return Ok(false);
            }
            let limits = ReadLimits::default().for_one_batch();
            if self.fetch(limits, wait.min(MAX_UNARY_WAIT)).await? {
                return Ok(true);
            }
        }
    }
}

/// A reader of a stream this node sequences. Waiting for new records uses the stream's
/// tail notifications, so idle followers cost no polling.
struct LocalReader {
    store: Arc<RecordStore>,
    state: Arc<StreamState>,
    position: u64,
    tail_changes: watch::Receiver<StreamPosition>,
    /// Opens the records of an encrypted stream with the reader's key.
    crypto: Option<StreamCrypto>,
    meter: ReadMeter,
    /// Sessions read ahead of what they have taken; unary reads do not.
    read_ahead: Option<ReadAhead>,
    /// The followers of this stream on the session's connection, once it has waited.
    group: Option<Arc<FollowGroup>>,
    /// Woken with its group, the reader owes its connection this delivery until its next
    /// batch is read.
    owed: Option<OwedDelivery>,
}

/// Counts what a reader delivers, for the metrics API.
pub(crate) struct ReadMeter {
    pub usage: Usage,
    pub basin: BasinName,
    pub connection: Option<ConnectionId>,
    /// A read session (one operation per minute on a connection), or a unary read
    /// (counted as one operation where it is made).
    pub streaming: bool,
    /// The minute the session's operation was last counted in (see `streaming_read`).
    pub counted_minute: Option<u64>,
}

impl ReadMeter {
    fn delivered(&mut self, stream_id: u64, records: &[SequencedRecord]) {
        if records.is_empty() {
            return;
        }
        let bytes = records.iter().map(SequencedRecord::metered_size).sum();
        if self.streaming {
            self.usage.streaming_read(
                &self.basin,
                stream_id,
                bytes,
                self.connection,
                &mut self.counted_minute,
            );
        } else {
            self.usage.read_throughput(&self.basin, bytes);
        }
    }
}

impl LocalReader {
    async fn open(
        store: Arc<RecordStore>,
        state: Arc<StreamState>,
        start: ReadStart,
        clamp: bool,
        crypto: Option<StreamCrypto>,
        meter: ReadMeter,
    ) -> Result<LocalReader> {
        // Subscribe before looking at the tail, so no append slips between the two.
        let tail_changes = state.subscribe();
        let tail = state.tail();
        let position = match start_seq(&store, &state, start, tail).await? {
            Some(seq) => seq,
            None if clamp => tail.seq_num,
            None => return Err(Error::RangeNotSatisfiable { tail }),
        };
        let (trim_point, compacted_through) = {
            let visible = state.visible();
            (visible.trim_point, visible.compacted.seq_num)
        };
        let mut position = position.max(trim_point);
        if position < compacted_through {
            // Past records that retention removed too, so `position` is the first
            // retained record (what XLEN counts from).
            position = match store
                .segment_at(state.id, position, state.retained())
                .await?
            {
                Some(segment) => position.max(segment.start_seq()).min(compacted_through),
                None => compacted_through,
            };
        }
        let read_ahead = meter
            .streaming
            .then(|| ReadAhead::new(store.clone(), store.read_ahead_budget()));
        Ok(LocalReader {
            position,
            store,
            state,
            tail_changes,
            crypto,
            meter,
            read_ahead,
            group: None,
            owed: None,
        })
    }

    fn tail(&self) -> StreamPosition {
        self.state.tail()
    }

    fn at_tail(&self) -> bool {
        self.position >= self.tail().seq_num
    }

    async fn next_batch(&mut self, limits: ReadLimits) -> Result<(ReadBatch, bool)> {
        // A stream handed to another node can still be read here up to its tail; only
        // waiting for more ends (`wait_for_records`).
        if self.state.is_deleted() {
            return Err(Error::DeletionPending(Resource::Stream(
                self.state.name.clone(),
            )));
        }
        let compacted_before = {
            let visible = self.state.visible();
            self.position = self.position.max(visible.trim_point);
            visible.compacted.seq_num
        };
        let (records, bounded, first_retained) = match self.collect(limits).await {
            // A WAL chunk read while compaction moved its records into segments may be
            // deleted under the read: the second look finds them in the segments.
            Err(_) if self.state.visible().compacted.seq_num > compacted_before => {
                self.collect(limits).await?
            }
            outcome => outcome?,
        };
        // Opened before the position moves past them: a wrong key reads nothing.
        let records: Vec<SequencedRecord> = match &self.crypto {
            None => records,
            Some(crypto) => records
                .into_iter()
                .map(|record| crypto.open(record))
                .collect::<Result<_>>()?,
        };
        self.meter.delivered(self.state.id, &records);
        self.position = match records.last() {
            Some(last) => last.seq_num + 1,
            // Records expired or trimmed away meanwhile are skipped for good.
            None => self.position.max(first_retained),
        };
        let tail = self.tail();
        let at_tail = records.last().map(|r| r.seq_num + 1) == Some(tail.seq_num);
        // Read: the connection's writer need not wait for this one any longer (the
        // frame is queued before the writer, woken now, next runs).
        self.owed = None;
        Ok((
            ReadBatch {
                records,
                tail: at_tail.then_some(tail),
            },
            bounded,
        ))
    }

    async fn wait_for_records(
        &mut self,
        deadline: Option<Instant>,
        connection: Option<&Arc<ConnectionFollowers>>,
    ) -> Result<bool> {
        if let Some(connection) = connection {
            return self.wait_with_group(deadline, connection).await;
        }
        loop {
            if let Some(closed) = self.state.closed() {
                return Err(closed);
            }
            if !self.at_tail() {
                return Ok(true);
            }
            let changed = self.tail_changes.changed();
            let outcome = match deadline {
                Some(deadline) => match tokio::time::timeout_at(deadline, changed).await {
                    Ok(outcome) => outcome,
                    Err(_) => return Ok(false),
                },
                None => changed.await,
            };
            if outcome.is_err() {
                return Ok(false);
            }
        }
    }

    /// `wait_for_records` with the session's connection's other followers of the stream.
    async fn wait_with_group(
        &mut self,
        deadline: Option<Instant>,
        connection: &Arc<ConnectionFollowers>,
    ) -> Result<bool> {
        let group = self
            .group
            .get_or_insert_with(|| self.state.followers().group(connection))
            .clone();
        loop {
            let state = &self.state;
            let position = self.position;
            let ready = || state.closed().is_some() || position < state.tail().seq_num;
            let woken = group.wait(deadline, ready, &mut self.owed).await;
            if let Some(closed) = self.state.closed() {
                return Err(closed);
            }
            if !self.at_tail() {
                return Ok(true);
            }
            if !woken {
                return Ok(false);
            }
        }
    }

    /// The records of the next batch, whether a bound ended it, and where the records
    /// still stored begin (past any removed by retention or a trim).
    async fn collect(&mut self, limits: ReadLimits) -> Result<(Vec<SequencedRecord>, bool, u64)> {
        let start_seq = self.position;
        let max_count = limits.count.unwrap_or(u64::MAX);
        let max_bytes = limits.bytes.unwrap_or(u64::MAX);
        // A session lists the batches past this one too, for its read-ahead.
        let ahead_bytes = match self.read_ahead {
            Some(_) => SESSION_READ_AHEAD_BYTES,
            None => 0,
        };
        let listing = || Listing::new(start_seq, max_count, ahead_bytes);
        // What is in memory is looked at first (one snapshot under the lock), so the
        // segments found next always reach where the in-memory batches begin. The
        // snapshot holds what the read could want of memory if no segment held any.
        let (compacted_through, in_memory) = {
            let visible = self.state.visible();
            let first = visible.batches.partition_point(|b| b.end_seq <= start_seq);
            let mut wanted = listing();
            let in_memory: Vec<BatchLocation> = visible.batches[first..]
                .iter()
                .take_while(|b| wanted.take(b))
                .cloned()
                .collect();
            (visible.compacted.seq_num, in_memory)
        };
        let mut wanted = listing();
        let mut locations = Vec::new();
        let mut first_retained = start_seq;
        if start_seq < compacted_through {
            let in_segments = self
                .store
                .segment_locations(
                    self.state.id,
                    self.state.retained(),
                    start_seq,
                    compacted_through,
                    &mut wanted,
                )
                .await?;
            first_retained = in_segments
                .first()
                .map_or(compacted_through, |b| b.start_seq.max(start_seq));
            locations = in_segments;
        }
        locations.extend(in_memory.into_iter().take_while(|b| wanted.take(b)));
        if let Some(read_ahead) = &mut self.read_ahead {
            read_ahead.start(&locations);
        }
        let mut records = Vec::new();
        let mut bytes = 0u64;
        for location in &locations {
            let loaded = match &mut self.read_ahead {
                Some(read_ahead) => read_ahead.load(location).await?,
                None => self.store.load(location).await?,
            };
            for record in loaded {
                // Only records after the ones taken: never one twice or out of order.
                let next = records
                    .last()
                    .map_or(start_seq, |r: &SequencedRecord| r.seq_num + 1);
                if record.seq_num < next {
                    continue;
                }
                if limits.until.is_some_and(|until| record.timestamp >= until) {
                    return Ok((records, true, first_retained));
                }
                let size = stored_metered_size(self.state.cipher, &record);
                if records.len() as u64 >= max_count || bytes + size > max_bytes {
                    return Ok((records, true, first_retained));
                }
                bytes += size;
                records.push(record);
            }
        }
        Ok((records, false, first_retained))
    }
}

/// The sequence number a start selector points at, or `None` if it lies beyond the
/// tail (`seq_num > tail` or `timestamp > tail timestamp`).
async fn start_seq(
    store: &RecordStore,
    state: &StreamState,
    start: ReadStart,
    tail: StreamPosition,
) -> Result<Option<u64>> {
    Ok(match start {
        ReadStart::SeqNum(seq) if seq > tail.seq_num => None,
        ReadStart::SeqNum(seq) => Some(seq),
        ReadStart::TailOffset(offset) => Some(tail.seq_num.saturating_sub(offset)),
        ReadStart::Timestamp(ts) if ts > tail.timestamp => None,
        ReadStart::Timestamp(ts) => {
            // Timestamps are monotonic, so batches are ordered by their last timestamp.
            let (compacted, location) = {
                let visible = state.visible();
                let i = visible.batches.partition_point(|b| b.last_timestamp < ts);
                (visible.compacted, visible.batches.get(i).cloned())
            };
            if compacted.seq_num > 0 && ts <= compacted.timestamp {
                if let Some(seq) = store.seq_at_timestamp_in_segments(state.id, ts).await? {
                    return Ok(Some(seq));
                }
                // Those segments are gone (trimmed or expired): the answer lies after them.
            }
            match location {
                None => Some(tail.seq_num),
                Some(location) => {
                    let records = store.load(&location).await?;
                    Some(
                        records
                            .iter()
                            .find(|r| r.timestamp >= ts)
                            .map_or(location.end_seq, |r| r.seq_num),
                    )
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::StreamName;
    use crate::record::{AppendAck, AppendInput};
    use bytes::Bytes;
    use std::sync::atomic::{AtomicU32, Ordering};

    const TAIL: StreamPosition = StreamPosition {
        seq_num: 10,
        timestamp: 10,
    };

    /// An owner of a stream whose records before `retained_from` are trimmed and which
    /// ends at `TAIL`. Its first `empty_answers` reads answer an empty batch without a
    /// tail, as an owner whose stream was handed on (or trimmed) under the read answers.
    struct Owner {
        retained_from: u64,
        empty_answers: AtomicU32,
    }

    #[async_trait::async_trait]
    impl RemoteStreams for Owner {
        async fn append(&self, _: &RemoteStream, _: AppendInput) -> Result<AppendAck> {
            unreachable!("the reader only reads")
        }

        async fn read(&self, _: &RemoteStream, request: ReadRequest) -> Result<ReadBatch> {
            let empty = self
                .empty_answers
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            if empty.is_ok() {
                return Ok(ReadBatch::default());
            }
            let from = match request.start {
                ReadStart::SeqNum(from) => from,
                ReadStart::Timestamp(t) if t > TAIL.timestamp => {
                    return Err(Error::RangeNotSatisfiable { tail: TAIL })
                }
                // Timestamps are sequence numbers here.
                ReadStart::Timestamp(t) => t,
                ReadStart::TailOffset(back) => TAIL.seq_num.saturating_sub(back),
            };
            let from = from.max(self.retained_from);
            if from >= TAIL.seq_num {
                return Err(Error::RangeNotSatisfiable { tail: TAIL });
            }
            let records = (from..TAIL.seq_num)
                .map(|seq_num| SequencedRecord {
                    seq_num,
                    timestamp: seq_num,
                    headers: Vec::new(),
                    body: Bytes::from(format!("r{seq_num}")),
                })
                .collect();
            Ok(ReadBatch {
                records,
                tail: Some(TAIL),
            })
        }

        async fn check_tail(&self, _: &RemoteStream) -> Result<StreamPosition> {
            Ok(TAIL)
        }

        async fn resp_command(
            &self,
            _: &RemoteStream,
            _: Bytes,
            _: bool,
            _: Duration,
        ) -> Result<Bytes> {
            unreachable!("the reader only reads")
        }
    }

    fn remote_stream() -> RemoteStream {
        RemoteStream {
            node_url: "http://owner".into(),
            bearer: String::new(),
            basin: BasinName::new("remote-basin").unwrap(),
            stream: StreamName::new("stream").unwrap(),
            encryption_key: None,
            connection: None,
        }
    }

    /// Opens a reader at 4 of `owner`'s stream: where it stands, what it reads next, and
    /// where it stands then.
    async fn open_at_4(owner: Owner) -> (u64, Vec<u64>, u64) {
        let at = remote_stream();
        let mut reader = StreamReader::open_remote(Arc::new(owner), at, ReadStart::SeqNum(4), true)
            .await
            .unwrap();
        let position = reader.position();
        let (batch, _) = reader
            .next_batch(ReadLimits::default().for_one_batch())
            .await
            .unwrap();
        let read = batch.records.iter().map(|r| r.seq_num).collect();
        (position, read, reader.position())
    }

    #[tokio::test]
    async fn a_remote_reader_opened_on_empty_answers_skips_nothing() {
        for empty_answers in [1, 2] {
            let owner = Owner {
                retained_from: 0,
                empty_answers: AtomicU32::new(empty_answers),
            };
            let (position, read, after) = open_at_4(owner).await;
            assert_eq!(position, 4, "{empty_answers} empty answer(s)");
            assert_eq!(read, (4..10).collect::<Vec<_>>(), "{empty_answers}");
            assert_eq!(after, TAIL.seq_num, "{empty_answers}");
        }
    }

    #[tokio::test]
    async fn a_remote_reader_moves_past_records_trimmed_up_to_the_tail() {
        for empty_answers in [0, 1, 2] {
            let owner = Owner {
                retained_from: TAIL.seq_num,
                empty_answers: AtomicU32::new(empty_answers),
            };
            let (position, read, after) = open_at_4(owner).await;
            if empty_answers < 2 {
                // The first read, or the one made again, is refused at the tail.
                assert_eq!(position, TAIL.seq_num, "{empty_answers} empty answer(s)");
            }
            assert!(read.is_empty(), "{empty_answers}");
            // Not left below the tail with nothing there, where a wait for records
            // would return at once, over and over.
            assert_eq!(after, TAIL.seq_num, "{empty_answers}");
        }
    }

    #[tokio::test]
    async fn a_remote_start_beyond_the_tail_is_refused_unless_clamped() {
        let past = [ReadStart::SeqNum(11), ReadStart::Timestamp(11)];
        for (start, clamp) in past.into_iter().flat_map(|s| [(s, false), (s, true)]) {
            let owner = Owner {
                retained_from: 0,
                empty_answers: AtomicU32::new(0),
            };
            let opened =
                StreamReader::open_remote(Arc::new(owner), remote_stream(), start, clamp).await;
            match opened {
                Err(Error::RangeNotSatisfiable { tail }) => {
                    assert!(!clamp, "{start:?} refused with clamp");
                    assert_eq!(tail, TAIL);
                }
                Ok(reader) => {
                    assert!(clamp, "{start:?} opened without clamp");
                    assert_eq!(reader.position(), TAIL.seq_num);
                }
                Err(err) => panic!("{err}"),
            }
        }
    }
}
