//! The group-commit writer. Sequenced batches from all streams queue here; the writer cuts
//! them into WAL chunks and puts several chunks in flight at once. Chunks complete in any
//! order but are *released* strictly in the order they were cut: a batch is published to
//! readers and acknowledged only when its own chunk and every chunk before it are durable.
//! That keeps each stream's acknowledged prefix dense, and it is why recovery may drop
//! everything after the first missing chunk of an epoch: nothing there was acknowledged.
//!
//! In a cluster, a chunk is released only while this node's lease holds: past it (the
//! node could not renew), durable chunks are held back, and released once a renewal
//! succeeds, or failed if other nodes took the streams meanwhile. So no append is ever
//! acknowledged after another node may have taken its stream.
//!
//! A chunk that cannot be written is retried, with capped exponential backoff, for as
//! long as it takes: an object store outage delays acknowledgements but never ends the
//! log. While a chunk keeps failing, [`WalHealth`] says so, and the engine refuses new
//! appends (retryably) instead of queueing them behind the outage.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::Either;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::cache::ChunkCache;
use crate::error::{Error, Result};
use crate::in_order::InOrder;
use crate::membership::LeaseState;
use crate::record::AppendAck;
use crate::storage::ObjectStore;
use crate::stream::SequencedBatch;
use crate::wal::released::{self, ChunkRelease, ReleasedChunks};
use crate::wal::{chunk_key, ChunkBuilder, EntryKind, EntrySpan};

/// How many chunk files the writer keeps prepared ahead of the next chunk, and the level
/// at which it prepares more: one request (one directory fsync) about every 16 chunks.
const PREPARE_AHEAD: u64 = 32;
const PREPARE_LOW: u64 = 16;

/// How the writer groups and pipelines chunks.
#[derive(Debug, Clone, Copy)]
pub struct FlushSettings {
    /// How long a batch may wait for others to share its chunk. Zero flushes as soon as a
    /// flush slot is free, which is best for latency on a local disk.
    pub linger: Duration,
    /// A chunk is cut once it holds this many bytes of records.
    pub max_chunk_bytes: usize,
    /// Chunks being written at once.
    pub max_in_flight: usize,
    /// While a chunk is being written, another starts only once it holds this many
    /// bytes; smaller ones wait for the write in flight and then go out as one. On a
    /// local disk, concurrent small writes each wait for their own flush and slow one
    /// another, while one write carrying all of them costs a single flush: with 8 or
    /// 50 connections each sending one small append at a time, this gave 1.5-1.7× the
    /// appends per second of four small chunks in flight. Zero: any chunk may go
    /// alongside others (S3, where a request's latency, not the device, is the limit).
    pub parallel_min_bytes: usize,
}

impl Default for FlushSettings {
    fn default() -> Self {
        Self {
            linger: Duration::ZERO,
            max_chunk_bytes: 8 * 1024 * 1024,
            max_in_flight: 4,
            parallel_min_bytes: 256 * 1024,
        }
    }
}

pub(crate) struct PendingAppend {
    pub batch: SequencedBatch,
    pub done: oneshot::Sender<Result<AppendAck>>,
    /// This batch's share of the in-flight memory budget, returned when it is done.
    pub _budget: tokio::sync::OwnedSemaphorePermit,
}

/// The first and the longest wait between attempts at writing a chunk.
const FIRST_RETRY_BACKOFF: Duration = Duration::from_millis(100);
const MAX_RETRY_BACKOFF: Duration = Duration::from_secs(2);

/// Whether the log is being written: what readiness reports, and what appends check
/// before they are accepted.
#[derive(Debug, Clone, Default)]
pub struct WalStatus {
    /// Chunks whose write failed and is being retried.
    pub failing_chunks: usize,
    /// Since when some chunk has been failing, and the latest failure.
    pub failing_since: Option<std::time::Instant>,
    pub last_error: Option<String>,
    /// Set if a chunk can never be written (a bug, not an outage): from then on every
    /// append fails, because the in-memory state is ahead of what is durable. A restart
    /// recovers from the log.
    pub broken: Option<String>,
}

impl WalStatus {
    /// Why appends are refused now, if they are, with the store's error (for the client
    /// that made the append).
    pub fn refusal(&self) -> Option<String> {
        if let Some(reason) = &self.broken {
            return Some(reason.clone());
        }
        let since = self.failing_since.filter(|_| self.failing_chunks > 0)?;
        Some(format!(
            "the record store has been failing for {:.1} s ({}); appends are refused \
             until it answers again, which streamgate keeps trying; retry shortly",
            since.elapsed().as_secs_f64(),
            self.last_error.as_deref().unwrap_or("no answer")
        ))
    }

    /// Why the log cannot be written, if it cannot, without the store's error (for the
    /// readiness endpoint, which needs no token; the log has the details).
    pub fn unready_reason(&self) -> Option<String> {
        if self.broken.is_some() {
            return Some("the write-ahead log cannot be written; see the server log".into());
        }
        let since = self.failing_since.filter(|_| self.failing_chunks > 0)?;
        Some(format!(
            "the record store has been failing for {:.1} s; see the server log",
            since.elapsed().as_secs_f64()
        ))
    }
}

/// Shared between the writer, its flush tasks and the engine.
pub(crate) type WalHealth = Arc<watch::Sender<WalStatus>>;

pub(crate) struct WalWriter {
    store: Arc<dyn ObjectStore>,
    cache: Arc<ChunkCache>,
    settings: FlushSettings,
    epoch: u64,
    next_chunk: u64,
    /// Chunks below this number are prepared or being prepared.
    prepared_until: u64,
    preparing: Option<JoinHandle<()>>,
    /// The chunks of this epoch released so far (all durable, in order): compaction may
    /// take those.
    released: ChunkRelease,
    health: WalHealth,
    /// Whether this node's leases hold: chunks are released only while they do.
    lease: watch::Receiver<LeaseState>,
    /// Durable chunks waiting for the lease to hold again, in order.
    held: std::collections::VecDeque<(Flight, Bytes, Vec<EntrySpan>)>,
    /// Whether small chunks may be put on the writer's own thread (see `start_flush`):
    /// only where the runtime has other threads to serve everything else meanwhile.
    may_put_here: bool,
    /// Whether the chunk released last acknowledged more than one append.
    released_several: bool,
}

/// What the engine keeps of a running writer.
pub(crate) struct WalWriterHandle {
    pub appends: mpsc::Sender<PendingAppend>,
    pub task: JoinHandle<()>,
    pub released: ReleasedChunks,
}

/// A chunk being written, and the appends waiting for it.
struct Flight {
    key: Arc<str>,
    appends: Vec<PendingAppend>,
}

impl WalWriter {
    pub fn spawn(
        store: Arc<dyn ObjectStore>,
        cache: Arc<ChunkCache>,
        settings: FlushSettings,
        epoch: u64,
        health: WalHealth,
        lease: watch::Receiver<LeaseState>,
    ) -> WalWriterHandle {
        let (tx, rx) = mpsc::channel(1024);
        let (released, released_rx) = released::channel();
        let writer = WalWriter {
            store,
            cache,
            settings,
            epoch,
            next_chunk: 0,
            prepared_until: 0,
            preparing: None,
            released,
            health,
            lease,
            held: std::collections::VecDeque::new(),
            may_put_here: tokio::runtime::Handle::current().metrics().num_workers() >= 2,
            released_several: false,
        };
        WalWriterHandle {
            appends: tx,
            task: tokio::spawn(writer.run(rx)),
            released: released_rx,
        }
    }

    /// Runs until every sender is dropped and everything queued is durable (or failed).
    async fn run(mut self, mut rx: mpsc::Receiver<PendingAppend>) {
        let mut pending: Vec<PendingAppend> = Vec::new();
        let mut pending_bytes = 0usize;
        let mut first_pending_at = Instant::now();
        let mut in_flight = InOrder::default();
        let mut open = true;
        self.prepare_ahead();

        loop {
            let linger_over = first_pending_at + self.settings.linger <= Instant::now();
            let can_flush = in_flight.len() < self.settings.max_in_flight;
            // While a chunk is being written, small appends (below `parallel_min_bytes`)
            // and consumer-group ops (tiny, one per command, on any store) wait to share
            // the next one, so that many connections' single commands cost one write
            // between them rather than one each (a write each would bound their rate by
            // the disk's flushes).
            let only_group_ops = pending
                .iter()
                .all(|append| append.batch.kind == EntryKind::GroupOps);
            let small = pending_bytes < self.settings.parallel_min_bytes;
            let keep_company = !in_flight.is_empty() && open && (only_group_ops || small);
            if !pending.is_empty()
                && can_flush
                && !keep_company
                && (linger_over || pending_bytes >= self.settings.max_chunk_bytes || !open)
            {
                // A pipeline's group ops are sequenced one after another by its
                // connection, likely on the other core right now: let it go on for a
                // moment, so that they start one chunk together.
                //
                // Likewise when the chunk released last acknowledged several appends
                // (clients taking turns with the log, each sending its next command once
                // its last is acknowledged): the yield lets the tasks those
                // acknowledgements woke send their replies, and the runtime poll the
                // sockets, before the next small chunk is cut. Clients whose next
                // commands are in by then share it rather than wait a whole put for the
                // one after: with 50 connections sending one XADD at a time, 24 XADDs per
                // chunk instead of 15, and 13% more XADDs a second (BENCHMARKS.md). A
                // lone client's chunks hold one append each, so it never waits here.
                // (While the log is open, a small chunk is cut only with nothing in
                // flight: see `keep_company`.)
                let clients_take_turns = std::mem::take(&mut self.released_several) && small;
                if open && (only_group_ops || clients_take_turns) {
                    tokio::task::yield_now().await;
                }
                // Whatever queued meanwhile shares the chunk (appends pile up in the
                // channel while a chunk is put on this task's thread), up to the size
                // at which a chunk goes out alongside others anyway: larger appends
                // keep their chunks of their own, written in parallel.
                let gather_until = if only_group_ops {
                    self.settings.max_chunk_bytes
                } else {
                    self.settings.parallel_min_bytes
                };
                while pending_bytes < gather_until {
                    let Ok(append) = rx.try_recv() else { break };
                    pending_bytes += append_bytes(&append);
                    pending.push(append);
                }
                let appends = std::mem::take(&mut pending);
                let alone =
                    in_flight.is_empty() && pending_bytes < self.settings.parallel_min_bytes;
                pending_bytes = 0;
                in_flight.push_back(Box::pin(self.start_flush(appends, alone)));
                continue;
            }
            if !open && pending.is_empty() && in_flight.is_empty() && self.held.is_empty() {
                return;
            }
            let room = pending_bytes < self.settings.max_chunk_bytes;
            let linger_deadline = first_pending_at + self.settings.linger;
            tokio::select! {
                received = rx.recv(), if open && room => match received {
                    Some(append) => {
                        if pending.is_empty() {
                            first_pending_at = Instant::now();
                        }
                        pending_bytes += append_bytes(&append);
                        pending.push(append);
                    }
                    None => open = false,
                },
                Some((flight, outcome)) = in_flight.pop_front(), if !in_flight.is_empty() => {
                    self.finish_flight(flight, outcome);
                }
                changed = self.lease.changed(), if !self.held.is_empty() => {
                    if changed.is_err() {
                        self.fail_held(Error::LeaseLost);
                    } else {
                        self.release_held();
                    }
                }
                _ = tokio::time::sleep_until(linger_deadline), if !pending.is_empty() && can_flush && !linger_over => {}
            }
        }
    }

    /// Cuts the next chunk out of `appends` and starts writing it.
    ///
    /// A small chunk written `alone` (nothing else in flight) is put on this task's
    /// thread where the store can (see [`ObjectStore::put_prepared_blocking`]). The
    /// writer has nothing else to do until it is durable, and appends arriving meanwhile
    /// queue for the next chunk, as they would behind a chunk in flight. What it saves
    /// is the hand-off to a thread of the blocking pool and back, and the wake-ups of
    /// the runtime's threads around them: one client sending one XADD at a time got
    /// about 20% more XADDs a second (BENCHMARKS.md). The cost is one runtime thread
    /// blocked for a put's length (one at a time: nothing else is in flight), which is
    /// why it is done only where the runtime has another thread; should the disk stall,
    /// the others go on serving what needs no write.
    ///
    /// Any other chunk, and one whose blocking put failed, is written by a task of its
    /// own, retried until it is durable.
    fn start_flush(
        &mut self,
        appends: Vec<PendingAppend>,
        alone: bool,
    ) -> impl std::future::Future<Output = (Flight, Result<(Bytes, Vec<EntrySpan>)>)> {
        let key: Arc<str> = chunk_key(self.epoch, self.next_chunk).into();
        self.next_chunk += 1;
        self.prepare_ahead();
        let entries: Vec<_> = appends
            .iter()
            .map(|a| {
                (
                    a.batch.entry_stream_id(),
                    a.batch.first_seq,
                    a.batch.records.clone(),
                )
            })
            .collect();
        let mut built = None;
        if alone && self.may_put_here && self.health.borrow().broken.is_none() {
            let (chunk, spans) = build_chunk(&entries);
            let started = std::time::Instant::now();
            match self.store.put_prepared_blocking(&key, &chunk) {
                Some(Ok(())) => {
                    crate::telemetry::wal_flush(chunk.len(), started.elapsed());
                    let flight = Flight { key, appends };
                    return Either::Left(std::future::ready((flight, Ok((chunk, spans)))));
                }
                Some(Err(error)) => {
                    tracing::warn!(chunk = %key, error = %error, "WAL chunk write failed; writing it again the usual way");
                }
                None => {}
            }
            built = Some((chunk, spans));
        }
        let chunk = built.map_or(ChunkToWrite::Entries(entries), ChunkToWrite::Built);
        let task = self.spawn_write(key.clone(), chunk);
        Either::Right(async move {
            let outcome = match task.await {
                Ok(outcome) => outcome,
                Err(join) => Err(Error::internal("the WAL flush task did not finish", join)),
            };
            (Flight { key, appends }, outcome)
        })
    }

    /// A task that builds the chunk if need be and writes it, retrying until it is durable.
    fn spawn_write(
        &self,
        key: Arc<str>,
        chunk: ChunkToWrite,
    ) -> JoinHandle<Result<(Bytes, Vec<EntrySpan>)>> {
        let store = self.store.clone();
        let health = self.health.clone();
        tokio::spawn(async move {
            if let Some(reason) = health.borrow().broken.clone() {
                return Err(Error::Unavailable(reason));
            }
            let (chunk, spans) = match chunk {
                ChunkToWrite::Built(built) => built,
                ChunkToWrite::Entries(entries) => build_chunk(&entries),
            };
            write_until_durable(store.as_ref(), &key, &chunk, &health).await;
            Ok((chunk, spans))
        })
    }

    /// Asks the store to prepare the next chunks' keys when few are left, so that their
    /// puts are cheap (see [`ObjectStore::prepare`]); one request at a time.
    fn prepare_ahead(&mut self) {
        let busy = self
            .preparing
            .as_ref()
            .is_some_and(|task| !task.is_finished());
        if busy || self.prepared_until >= self.next_chunk + PREPARE_LOW {
            return;
        }
        let from = self.prepared_until.max(self.next_chunk);
        self.prepared_until = self.next_chunk + PREPARE_AHEAD;
        let keys: Vec<String> = (from..self.prepared_until)
            .map(|number| chunk_key(self.epoch, number))
            .collect();
        let store = self.store.clone();
        self.preparing = Some(tokio::spawn(async move {
            if let Err(err) = store.prepare(&keys).await {
                tracing::warn!(error = %err, "could not prepare WAL chunk files ahead; chunks are written the slower way");
            }
        }));
    }

    fn finish_flight(&mut self, flight: Flight, outcome: Result<(Bytes, Vec<EntrySpan>)>) {
        let broken = self.health.borrow().broken.clone();
        let outcome = match (broken, outcome) {
            // A chunk after one that can never be written may be durable, but it must not
            // be released: the lost chunk's batches came before it.
            (Some(reason), _) => Err(Error::Unavailable(reason)),
            (None, outcome) => outcome,
        };
        match outcome {
            Ok((chunk, spans)) => {
                self.held.push_back((flight, chunk, spans));
                self.release_held();
            }
            Err(err) => self.fail(flight, err),
        }
    }

    /// Releases held chunks in order while the lease holds; fails them all once it is
    /// lost.
    fn release_held(&mut self) {
        let state = *self.lease.borrow();
        if state == LeaseState::Lost {
            self.fail_held(Error::LeaseLost);
            return;
        }
        if !state.holds() {
            if let Some((flight, _, _)) = self.held.front() {
                tracing::debug!(chunk = %flight.key, "holding back acknowledgements: this node's lease does not surely hold");
            }
            return;
        }
        while let Some((flight, chunk, spans)) = self.held.pop_front() {
            self.release(flight, chunk, spans);
        }
    }

    fn fail_held(&mut self, err: Error) {
        while let Some((flight, _, _)) = self.held.pop_front() {
            self.fail(flight, err.clone());
        }
    }

    fn release(&mut self, flight: Flight, chunk: Bytes, spans: Vec<EntrySpan>) {
        self.cache.insert(flight.key.clone(), chunk);
        for (append, span) in flight.appends.iter().zip(spans) {
            append
                .batch
                .stream
                .publish(&append.batch, flight.key.clone(), span);
        }
        // Only now may compaction take the chunk: its batches are where readers
        // look, so compaction's hand-over to segments replaces them.
        self.released.release(
            flight
                .appends
                .iter()
                .map(|append| append.batch.stream.id)
                .collect(),
        );
        self.released_several = flight.appends.len() > 1;
        // Acknowledgements before followers: a stream with thousands of followers wakes
        // thousands of tasks, and the appender's own task would wait behind them all.
        // What is acknowledged is already visible: a read after the acknowledgement sees
        // it whether or not its followers were woken yet.
        let mut followed = Vec::with_capacity(flight.appends.len());
        for append in flight.appends {
            let ack = AppendAck {
                start: append.batch.start(),
                end: append.batch.end(),
                tail: append.batch.stream.tail(),
            };
            let _ = append.done.send(Ok(ack));
            followed.push(append.batch.stream);
        }
        for stream in followed {
            stream.wake_followers();
        }
    }

    /// Fails a chunk's appends, and every append after them: the log cannot go on past
    /// a chunk that was not released.
    fn fail(&mut self, flight: Flight, err: Error) {
        let reason = match err {
            Error::LeaseLost => err.to_string(),
            err => format!(
                "the write-ahead log could not be written ({err}); appends are refused \
                 until streamgate is restarted, which recovers every acknowledged record"
            ),
        };
        let first = self.health.borrow().broken.is_none();
        self.health.send_modify(|status| {
            status.broken.get_or_insert_with(|| reason.clone());
        });
        if first {
            tracing::error!("{reason}");
        }
        for append in flight.appends {
            let _ = append.done.send(Err(Error::Unavailable(reason.clone())));
        }
    }
}

/// An append's size as the writer counts it towards a chunk's.
fn append_bytes(append: &PendingAppend) -> usize {
    append.batch.records.iter().map(|r| r.body.len() + 16).sum()
}

/// The entries of a chunk: each batch's stream (as its entry names it), first sequence
/// number and records.
type ChunkEntries = Vec<(u64, u64, Arc<[crate::wal::StoredRecord]>)>;

/// A chunk to write: built already, or still to build (large ones are built by their
/// write task, off the writer's).
enum ChunkToWrite {
    Built((Bytes, Vec<EntrySpan>)),
    Entries(ChunkEntries),
}

fn build_chunk(entries: &ChunkEntries) -> (Bytes, Vec<EntrySpan>) {
    let size = entries
        .iter()
        .map(|(_, _, records)| records.iter().map(|r| r.body.len() + 32).sum::<usize>())
        .sum();
    let mut builder = ChunkBuilder::with_capacity(size);
    for (stream_id, first_seq, records) in entries {
        builder.push(*stream_id, *first_seq, records);
    }
    builder.finish()
}

/// Puts `chunk` under `key`, retrying with capped exponential backoff until the store
/// takes it. A put of the same key and bytes is idempotent, so a retry after an attempt
/// whose answer was lost is harmless. From the first failure until this chunk is written,
/// the log is reported failing, and new appends are refused meanwhile: a failed put has
/// already been retried by the store client (S3), or is a disk error (local directory).
async fn write_until_durable(
    store: &dyn ObjectStore,
    key: &str,
    chunk: &Bytes,
    health: &WalHealth,
) {
    let mut failing: Option<FailingChunk> = None;
    let mut backoff = FIRST_RETRY_BACKOFF;
    let mut attempts = 0u32;
    let started = std::time::Instant::now();
    loop {
        attempts += 1;
        let error = match store.put(key, chunk.clone()).await {
            Ok(()) => break,
            Err(error) => error,
        };
        let first_failing = failing.is_none() && health.borrow().failing_chunks == 0;
        failing
            .get_or_insert_with(|| FailingChunk::new(health))
            .failed(&error);
        if first_failing {
            tracing::error!(chunk = %key, error = %error, "the record store cannot be written: appends are refused until it answers again; retrying");
        } else if attempts == 1 || attempts.is_multiple_of(10) {
            tracing::warn!(chunk = %key, attempt = attempts, error = %error, "WAL chunk write failed; retrying");
        }
        // Jitter keeps the retries of several chunks (and nodes) from moving in step.
        let jitter = rand::random_range(0.8..1.2);
        tokio::time::sleep(backoff.mul_f64(jitter)).await;
        backoff = (backoff * 2).min(MAX_RETRY_BACKOFF);
    }
    crate::telemetry::wal_flush(chunk.len(), started.elapsed());
    if let Some(failing) = failing {
        drop(failing);
        if health.borrow().failing_chunks == 0 {
            tracing::info!(chunk = %key, attempts, "the record store answers again: appends are accepted again");
        }
    }
}

/// A chunk counted as failing in the log's health, until it is dropped: when the chunk
/// is written, or if its task ends any other way, so the count never sticks.
struct FailingChunk<'a> {
    health: &'a WalHealth,
}

impl<'a> FailingChunk<'a> {
    fn new(health: &'a WalHealth) -> FailingChunk<'a> {
        health.send_modify(|status| {
            status.failing_chunks += 1;
            status
                .failing_since
                .get_or_insert_with(std::time::Instant::now);
        });
        FailingChunk { health }
    }

    fn failed(&self, error: &Error) {
        self.health
            .send_modify(|status| status.last_error = Some(error.to_string()));
    }
}

impl Drop for FailingChunk<'_> {
    fn drop(&mut self) {
        self.health.send_modify(|status| {
            status.failing_chunks -= 1;
            if status.failing_chunks == 0 {
                status.failing_since = None;
                status.last_error = None;
            }
        });
    }
}
