//! Compaction: moves records out of the write-ahead log into per-stream segments.
//!
//! A round takes the oldest WAL chunks that are not compacted yet (older epochs first,
//! then the released chunks of this one), copies each live stream's entries out of them
//! into segment objects, and then commits in one metadata transaction the segment index
//! rows, every touched stream's checkpoint, the new WAL watermark and the compacted
//! chunks as obsolete objects. Only then do readers switch to the segments. A crash
//! before the commit leaves the log as it was (the segments are rewritten next time);
//! a crash after it leaves obsolete chunks below the watermark, which recovery skips and
//! the lifecycle task deletes.
//!
//! A chunk of this node's epoch whose streams are all gone from it (deleted, or handed
//! to another node) is taken without being read: the writer said which streams it holds
//! when it released it (`wal::released`).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::stream::{self, StreamExt, TryStreamExt};
use time::OffsetDateTime;
use tokio::sync::Mutex;

use crate::cache::ChunkCache;
use crate::crash_point::crash_point;
use crate::error::{Error, Result};
use crate::record::StreamPosition;
use crate::segment::{
    segment_key, CompactionCommit, SegmentEntry, SegmentRecord, StreamCheckpoint,
    MAX_SEGMENT_BYTES, MAX_SEGMENT_ENTRIES,
};
use crate::segment_merge::SegmentMerger;
use crate::storage::{MetadataStore, ObjectStore};
use crate::stream::{SequencerState, StreamState};
use crate::wal::released::ReleasedChunks;
use crate::wal::{chunk_key, decode_chunk, ChunkBuilder, EntryKind};

/// At most this many WAL chunks (and about this many bytes of them) per round, so a
/// round's memory stays bounded however far behind compaction is.
const MAX_CHUNKS_PER_ROUND: usize = 1024;
const MAX_BYTES_PER_ROUND: usize = 128 * 1024 * 1024;
/// Objects read or written at once.
const PARALLEL_REQUESTS: usize = 16;

/// One epoch's write-ahead log as far as compaction is concerned.
#[derive(Debug, Clone, Default)]
pub(crate) struct EpochLog {
    /// The first chunk not compacted yet.
    pub next: u64,
    /// For an earlier epoch: where its replayable log ends (chunks from here on were
    /// never acknowledged), and the keys of those chunks, deleted once the rest is
    /// compacted. `None` for the running epoch, whose end is what the writer released.
    pub end: Option<(u64, Vec<String>)>,
}

/// What compaction knows between rounds.
pub(crate) struct CompactionState {
    /// Each stream's state at the end of its compacted records.
    pub checkpoints: HashMap<u64, SequencerState>,
    pub logs: BTreeMap<u64, EpochLog>,
}

pub(crate) struct Compactor {
    metadata: Arc<dyn MetadataStore>,
    objects: Arc<dyn ObjectStore>,
    wal_cache: Arc<ChunkCache>,
    epoch: u64,
    released: ReleasedChunks,
    /// How long compacted chunks stay after the commit, for reads already under way.
    obsolete_grace: Duration,
    state: Mutex<CompactionState>,
    /// A commit failed without an answer (a connection cut mid-commit): it may have
    /// landed, so the next round first learns from the store how far compaction got.
    uncertain: AtomicBool,
    /// Some commit of this node failed without an answer. Its transaction may land
    /// even after the store was asked how far compaction got, naming segments that a
    /// later round from the same position writes again under the same keys; so from
    /// then on a refused round's segments are left in place, never removed.
    had_unknown_outcome: AtomicBool,
    /// Merges small segments after each round; `None` when merging is off.
    merger: Option<Mutex<SegmentMerger>>,
    /// Since when commits have been refused because a stream this node handed to
    /// another one still has its records in this node's log (see `run_round`).
    waiting_for_hand_over: parking_lot::Mutex<Option<Instant>>,
}

/// How long compaction may wait for a handed-over stream to be taken up by its new
/// owner before it says so at `WARN`: a hand-over takes a moment, not minutes.
const HAND_OVER_WAIT_WARNING: Duration = Duration::from_secs(60);

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompactionStats {
    pub chunks: usize,
    pub segments: usize,
    pub bytes: usize,
    /// Whether the round stopped at its size limit with more chunks waiting.
    pub more_waiting: bool,
    /// Runs of small segments merged into one after the round.
    pub merges: usize,
}

/// One stream's share of a round: its entries in order, and its checkpoint after them.
struct StreamRun {
    entries: Vec<(Bytes, SegmentEntry)>,
    checkpoint: SequencerState,
}

impl Compactor {
    pub fn new(
        metadata: Arc<dyn MetadataStore>,
        objects: Arc<dyn ObjectStore>,
        wal_cache: Arc<ChunkCache>,
        epoch: u64,
        released: ReleasedChunks,
        obsolete_grace: Duration,
        mut state: CompactionState,
    ) -> Self {
        state.logs.insert(epoch, EpochLog::default());
        Self {
            metadata,
            objects,
            wal_cache,
            epoch,
            released,
            obsolete_grace,
            state: Mutex::new(state),
            uncertain: AtomicBool::new(false),
            had_unknown_outcome: AtomicBool::new(false),
            merger: None,
            waiting_for_hand_over: parking_lot::Mutex::new(None),
        }
    }

    /// Merges small segments after each round from now on (see `segment_merge`).
    pub fn merging_segments(mut self) -> Self {
        let merger = SegmentMerger::new(self.metadata.clone(), self.objects.clone(), self.epoch);
        self.merger = Some(Mutex::new(merger));
        self
    }

    /// Runs one round. `live_streams` gives the live streams by id; it is asked only
    /// after the round's chunks are chosen, so every stream with records in them is
    /// there unless it was deleted. Rounds never overlap.
    pub async fn run_round(
        &self,
        live_streams: impl Fn() -> HashMap<u64, Arc<StreamState>>,
    ) -> Result<CompactionStats> {
        let mut state = self.state.lock().await;
        if self.uncertain.load(Ordering::SeqCst) {
            self.relearn(&mut state, &live_streams()).await?;
        }
        if let Some(log) = state.logs.get(&self.epoch) {
            self.released.forget_below(log.next);
        }
        let (chunks, finished_epochs) = self.next_chunks(&state);
        if chunks.is_empty() && finished_epochs.is_empty() {
            return Ok(CompactionStats::default());
        }
        let live = &live_streams();

        // Read the chunks (in order) and gather each live stream's entries.
        let mut runs: BTreeMap<u64, StreamRun> = BTreeMap::new();
        let mut read_bytes = 0usize;
        let mut taken = Vec::new();
        let mut not_served = std::collections::BTreeSet::new();
        let mut fetched = stream::iter(chunks.iter().copied())
            .map(|(epoch, number)| self.fetch_chunk(epoch, number, live))
            .buffered(PARALLEL_REQUESTS);
        while let Some(fetched) = fetched.next().await {
            let ((epoch, number), key, chunk) = fetched?;
            let chunk = match chunk {
                FetchedChunk::Read(chunk) => chunk,
                FetchedChunk::AllGone(streams) => {
                    not_served.extend(streams.iter().copied());
                    taken.push((epoch, number, key));
                    continue;
                }
            };
            for entry in decode_chunk(&key, &chunk)? {
                if !live.contains_key(&entry.stream_id) {
                    not_served.insert(entry.stream_id); // deleted, checked below
                    continue;
                }
                let run = runs.entry(entry.stream_id).or_insert_with(|| StreamRun {
                    entries: Vec::new(),
                    checkpoint: state
                        .checkpoints
                        .get(&entry.stream_id)
                        .cloned()
                        .unwrap_or_default(),
                });
                // A copy of what the checkpoint already holds: a takeover that failed
                // part way had relogged it before the takeover that succeeded did again.
                let end = entry.records[0].seq_num + entry.records.len() as u64;
                let compacted_end = match entry.kind {
                    EntryKind::Records => run.checkpoint.next_seq,
                    EntryKind::GroupOps => run.checkpoint.next_group_op,
                };
                if end <= compacted_end {
                    continue;
                }
                if entry.kind == EntryKind::GroupOps {
                    // Into the checkpoint only: group ops have no place in segments.
                    let first = entry.records[0].seq_num;
                    if first != run.checkpoint.next_group_op {
                        return Err(Error::storage(format!(
                            "WAL chunk `{key}` continues the consumer group ops of stream {} \
                             at {first}, but the compacted ones end at {}; compaction stops here",
                            entry.stream_id, run.checkpoint.next_group_op
                        )));
                    }
                    run.checkpoint.replay_group_ops(&entry.records)?;
                    continue;
                }
                let first_seq = entry.records[0].seq_num;
                if first_seq != run.checkpoint.next_seq {
                    return Err(Error::storage(format!(
                        "WAL chunk `{key}` continues stream {} at {first_seq}, but its \
                         compacted records end at {}; compaction stops here",
                        entry.stream_id, run.checkpoint.next_seq
                    )));
                }
                run.checkpoint.replay(&entry.records);
                let span = entry.span;
                let bytes = span.cut(&key, &chunk)?;
                run.entries.push((
                    bytes,
                    SegmentEntry {
                        start_seq: first_seq,
                        end_seq: run.checkpoint.next_seq,
                        last_timestamp: run.checkpoint.last_timestamp,
                        span,
                    },
                ));
            }
            read_bytes += chunk.len();
            taken.push((epoch, number, key));
            if read_bytes >= MAX_BYTES_PER_ROUND {
                break;
            }
        }
        drop(fetched);

        // Cut each stream's entries into segments and write them.
        let mut segments = Vec::new();
        for (stream_id, run) in &runs {
            segments.extend(cut_segments(*stream_id, self.epoch, &run.entries));
        }
        let written: usize = segments.iter().map(|(_, bytes)| bytes.len()).sum();
        let puts: Vec<(String, Bytes)> = segments
            .iter()
            .map(|(record, bytes)| (record.key.clone(), bytes.clone()))
            .collect();
        stream::iter(puts)
            .map(|(key, bytes)| async move { self.objects.put(&key, bytes).await })
            .buffer_unordered(PARALLEL_REQUESTS)
            .try_collect::<Vec<()>>()
            .await?;
        crash_point("compaction:segments-written");

        // Commit: index rows, checkpoints, watermarks, obsolete chunks.
        let mut watermarks: BTreeMap<u64, u64> = BTreeMap::new();
        let mut obsolete: Vec<String> = Vec::new();
        for (epoch, number, key) in &taken {
            watermarks.insert(*epoch, number + 1);
            obsolete.push(key.clone());
        }
        let mut finished = Vec::new();
        for epoch in finished_epochs
            .into_iter()
            .chain(watermarks.keys().copied())
        {
            let log = &state.logs[&epoch];
            let next = watermarks.get(&epoch).copied().unwrap_or(log.next);
            if let Some((end, leftovers)) = &log.end {
                if next >= *end {
                    obsolete.extend(leftovers.iter().cloned());
                    finished.push(epoch);
                }
            }
        }
        let commit = CompactionCommit {
            segments: segments.iter().map(|(record, _)| record.clone()).collect(),
            checkpoints: runs
                .iter()
                .map(|(id, run)| (*id, StreamCheckpoint::from(&run.checkpoint)))
                .collect(),
            wal_watermarks: watermarks.iter().map(|(e, n)| (*e, *n)).collect(),
            obsolete_objects: obsolete,
            // Records of streams this node does not serve (deleted ones, or copies made
            // for a takeover that did not complete) go with their chunks, unless the
            // metadata store says their records are in this node's log: then the commit
            // is refused rather than lose them.
            committed_by: Some(self.epoch),
            skipped_streams: not_served.into_iter().collect(),
        };
        let obsolete_after = OffsetDateTime::now_utc() + self.obsolete_grace;
        // Uncertain until the answer arrives (also if this round is cancelled meanwhile).
        self.uncertain.store(true, Ordering::SeqCst);
        let committed = self
            .metadata
            .commit_compaction(&commit, obsolete_after)
            .await;
        if let Err(Error::StreamMoved) = committed {
            // Refused, and nothing written: a stream of the round was handed to another
            // node (shutting down, or evening out shares) while the round ran, or it
            // still has records in this node's log, which the new owner reads when it
            // takes the stream up. That takes a moment; a later round goes through.
            self.uncertain.store(false, Ordering::SeqCst);
            if !self.had_unknown_outcome.load(Ordering::SeqCst) {
                self.remove_unindexed(&segments).await;
            }
            let since = *self
                .waiting_for_hand_over
                .lock()
                .get_or_insert_with(Instant::now);
            if since.elapsed() >= HAND_OVER_WAIT_WARNING {
                tracing::warn!(
                    waited_secs = since.elapsed().as_secs(),
                    "compaction is waiting for a stream this node handed over to be taken up \
                     by its new owner; this node's log is kept (and grows) meanwhile"
                );
            } else {
                tracing::debug!(
                    "compaction waits for a handed-over stream to be taken up by its new owner"
                );
            }
            return Ok(CompactionStats::default());
        }
        if let Err(err) = committed {
            self.had_unknown_outcome.store(true, Ordering::SeqCst);
            if self.relearn(&mut state, live).await.is_ok() {
                tracing::warn!(error = %err, "a compaction commit failed; learned from the metadata store whether it landed");
            }
            return Err(err);
        }
        self.uncertain.store(false, Ordering::SeqCst);
        *self.waiting_for_hand_over.lock() = None;
        crash_point("compaction:committed");

        // Readers switch to the segments only now that the index has them.
        for (epoch, next) in &watermarks {
            if let Some(log) = state.logs.get_mut(epoch) {
                log.next = *next;
            }
        }
        for epoch in finished {
            state.logs.remove(&epoch);
        }
        for (id, run) in runs {
            if let Some(stream) = live.get(&id) {
                stream.mark_compacted(StreamPosition {
                    seq_num: run.checkpoint.next_seq,
                    timestamp: run.checkpoint.last_timestamp,
                });
            }
            state.checkpoints.insert(id, run.checkpoint);
        }
        // Not under the state lock: a takeover or a hand-off need not wait for merges,
        // whose own transaction checks that nothing they replace has changed.
        drop(state);
        let merges = match &self.merger {
            Some(merger) => {
                merger
                    .lock()
                    .await
                    .after_round(&commit.segments, self.obsolete_grace)
                    .await
            }
            None => 0,
        };
        let stats = CompactionStats {
            chunks: taken.len(),
            segments: segments.len(),
            bytes: written,
            more_waiting: taken.len() < chunks.len() || chunks.len() == MAX_CHUNKS_PER_ROUND,
            merges,
        };
        if stats.chunks > 0 {
            tracing::debug!(?stats, "compacted WAL chunks into segments");
        }
        Ok(stats)
    }

    /// Removes the segments of a round whose commit was refused (and whose keys no
    /// commit of unknown outcome may name: see `had_unknown_outcome`). No index row
    /// names them, so no reader can know of them; left there, nothing would ever delete them
    /// once their streams have moved to another node (a later round of this node from
    /// the same position would overwrite them, but for a moved stream none comes).
    /// Still under the round's lock, so that no later round rewrites one meanwhile. A
    /// segment that cannot be removed now stays, as before: logged, not retried.
    async fn remove_unindexed(&self, segments: &[(SegmentRecord, Bytes)]) {
        let keys: Vec<String> = segments
            .iter()
            .map(|(record, _)| record.key.clone())
            .collect();
        let removed = stream::iter(keys)
            .map(|key| async move {
                let removed = self.objects.delete(&key).await;
                if let Err(err) = &removed {
                    tracing::warn!(%key, error = %err, "could not remove a segment of a refused compaction round; it stays in the object store unused");
                }
                removed.is_ok()
            })
            .buffer_unordered(PARALLEL_REQUESTS)
            .filter(|removed| std::future::ready(*removed))
            .count()
            .await;
        if removed > 0 {
            tracing::debug!(
                removed,
                "removed the segments of a refused compaction round"
            );
        }
    }

    /// Holds compaction still (no round runs meanwhile) and gives its state, for a
    /// takeover: it copies streams' records into this node's log and records their
    /// checkpoints here before any round may see those records.
    pub async fn pause(&self) -> tokio::sync::MutexGuard<'_, CompactionState> {
        self.state.lock().await
    }

    /// Takes the watermarks and checkpoints as the store has them, after a commit whose
    /// outcome is unknown: if it landed, its chunks must not be compacted again (they may
    /// be deleted already), and readers go to its segments.
    async fn relearn(
        &self,
        state: &mut CompactionState,
        live: &HashMap<u64, Arc<StreamState>>,
    ) -> Result<()> {
        let watermarks = self.metadata.wal_watermarks().await?;
        let checkpoints = self.metadata.stream_checkpoints().await?;
        for (epoch, log) in state.logs.iter_mut() {
            if let Some(next) = watermarks.get(epoch) {
                log.next = log.next.max(*next);
            }
        }
        for (id, checkpoint) in checkpoints {
            let known = state.checkpoints.entry(id).or_default();
            if checkpoint.next_seq > known.next_seq {
                *known = SequencerState::from(&checkpoint);
                if let Some(stream) = live.get(&id) {
                    stream.mark_compacted(StreamPosition {
                        seq_num: checkpoint.next_seq,
                        timestamp: checkpoint.last_timestamp,
                    });
                }
            }
        }
        self.uncertain.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Whether a commit's outcome is unknown: obsolete objects must not be deleted then,
    /// since this process may still read the chunks that commit made obsolete.
    pub fn is_uncertain(&self) -> bool {
        self.uncertain.load(Ordering::SeqCst)
    }

    /// The chunks the next round takes, in log order, and the earlier epochs with
    /// nothing left to compact.
    fn next_chunks(&self, state: &CompactionState) -> (Vec<(u64, u64)>, Vec<u64>) {
        let mut chunks = Vec::new();
        let mut finished = Vec::new();
        for (epoch, log) in &state.logs {
            let end = match &log.end {
                Some((end, _)) => *end,
                None if *epoch == self.epoch => self.released.count(),
                None => log.next,
            };
            if log.next >= end && log.end.is_some() {
                finished.push(*epoch);
            }
            for number in log.next..end {
                if chunks.len() == MAX_CHUNKS_PER_ROUND {
                    return (chunks, finished);
                }
                chunks.push((*epoch, number));
            }
        }
        (chunks, finished)
    }

    /// Reads a chunk, unless it is one of this epoch's whose streams are all known to be
    /// gone from `live`: its entries would all be skipped.
    async fn fetch_chunk(
        &self,
        epoch: u64,
        number: u64,
        live: &HashMap<u64, Arc<StreamState>>,
    ) -> Result<((u64, u64), String, FetchedChunk)> {
        let key = chunk_key(epoch, number);
        if epoch == self.epoch {
            if let Some(streams) = self.released.streams_of(number) {
                if !streams.iter().any(|id| live.contains_key(id)) {
                    return Ok(((epoch, number), key, FetchedChunk::AllGone(streams)));
                }
            }
        }
        let chunk = match self.wal_cache.get(&key) {
            Some(chunk) => chunk,
            None => self.objects.get(&key).await?.ok_or_else(|| {
                Error::storage(format!(
                    "WAL chunk `{key}` is missing although it is not compacted yet"
                ))
            })?,
        };
        Ok(((epoch, number), key, FetchedChunk::Read(chunk)))
    }
}

/// A chunk as a round takes it.
enum FetchedChunk {
    Read(Bytes),
    /// Not read: every stream it holds entries of (these) is gone from this node.
    AllGone(Box<[u64]>),
}

/// Splits one stream's entries into segments of about `MAX_SEGMENT_BYTES` and at most
/// `MAX_SEGMENT_ENTRIES` entries, copying each
/// entry's bytes verbatim.
fn cut_segments(
    stream_id: u64,
    epoch: u64,
    entries: &[(Bytes, SegmentEntry)],
) -> Vec<(SegmentRecord, Bytes)> {
    let mut segments = Vec::new();
    let written_at_ms = crate::record::now_ms();
    let mut rest = entries;
    while !rest.is_empty() {
        let key = segment_key(stream_id, rest[0].1.start_seq, epoch);
        let mut builder = ChunkBuilder::with_capacity(
            MAX_SEGMENT_BYTES.min(rest.iter().map(|(bytes, _)| bytes.len()).sum::<usize>()),
        );
        let mut index = Vec::new();
        for (bytes, entry) in rest {
            let full = builder.len() + bytes.len() > MAX_SEGMENT_BYTES
                || index.len() == MAX_SEGMENT_ENTRIES;
            if !builder.is_empty() && full {
                break;
            }
            let span = builder.push_encoded(bytes);
            index.push(SegmentEntry { span, ..*entry });
        }
        rest = &rest[index.len()..];
        let (bytes, _) = builder.finish();
        segments.push((
            SegmentRecord {
                stream_id,
                key,
                written_at_ms,
                entries: index,
            },
            bytes,
        ));
    }
    segments
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::memory::MemoryObjectStore;
    use crate::wal::{decode_entry, EntrySpan, StoredRecord};

    /// Stream 9's entries of one record each, with these body sizes, as compaction
    /// gathers them (bytes cut out of a WAL chunk, seq numbers from 0).
    fn entries_of(body_sizes: &[usize]) -> Vec<(Bytes, SegmentEntry)> {
        let mut source = ChunkBuilder::with_capacity(0);
        for (i, size) in body_sizes.iter().enumerate() {
            let record = StoredRecord {
                timestamp: i as u64,
                headers: vec![],
                body: Bytes::from(vec![7u8; *size]),
            };
            source.push(9, i as u64, &[record]);
        }
        let (chunk, spans) = source.finish();
        spans
            .iter()
            .zip(0u64..)
            .map(|(span, i): (&EntrySpan, u64)| {
                let entry = SegmentEntry {
                    start_seq: i,
                    end_seq: i + 1,
                    last_timestamp: i,
                    span: *span,
                };
                (span.cut("c", &chunk).unwrap(), entry)
            })
            .collect()
    }

    /// Every entry of every segment reads back by its span, and the segments are
    /// contiguous; the (start, end) of each.
    fn check_readable(segments: &[(SegmentRecord, Bytes)]) -> Vec<(u64, u64)> {
        let mut next = 0;
        for (record, bytes) in segments {
            assert_eq!(record.key, segment_key(9, record.start_seq(), 1));
            assert_eq!(record.start_seq(), next, "segments are contiguous");
            next = record.end_seq();
            assert_eq!(
                decode_chunk(&record.key, bytes).unwrap().len(),
                record.entries.len()
            );
            for entry in &record.entries {
                let (stream_id, records) =
                    decode_entry(&record.key, entry.span.cut(&record.key, bytes).unwrap()).unwrap();
                assert_eq!((stream_id, records[0].seq_num), (9, entry.start_seq));
            }
        }
        segments
            .iter()
            .map(|(r, _)| (r.start_seq(), r.end_seq()))
            .collect()
    }

    #[test]
    fn segments_are_cut_by_size_and_keep_every_entry_readable() {
        // Three entries of ~3 MiB each: the first two share a segment, the third starts
        // the next one.
        let entries = entries_of(&[3 << 20; 3]);
        assert_eq!(
            check_readable(&cut_segments(9, 1, &entries)),
            [(0, 2), (2, 3)]
        );
    }

    #[test]
    fn segments_are_cut_by_entry_count_so_index_rows_stay_small() {
        let entries = entries_of(&[10; 5000]);
        let segments = cut_segments(9, 1, &entries);
        assert_eq!(check_readable(&segments), [(0, 4096), (4096, 5000)]);
        assert!(segments[0].0.encode_entries().len() <= 4096 * 40);
    }

    /// A SQLite metadata store with these streams (each in a basin of its own), and a
    /// node joined, ready and holding them all; the store (with the directory it lives
    /// in), the streams' ids and the node's epoch.
    async fn node_with_streams(
        names: &[&str],
    ) -> (Arc<dyn MetadataStore>, tempfile::TempDir, Vec<u64>, u64) {
        use crate::storage::metadata::create_basin_and_stream;
        use crate::storage::sql::SqlMetadataStore;

        let (store, dir) = SqlMetadataStore::temporary().await;
        let metadata: Arc<dyn MetadataStore> = Arc::new(store);
        let now = OffsetDateTime::now_utc();
        let mut ids = Vec::new();
        for name in names {
            let basin = format!("compaction-{name}");
            ids.push(
                create_basin_and_stream(&*metadata, &basin, name, now)
                    .await
                    .id,
            );
        }
        let epoch = join(&*metadata, "node-a").await;
        let claimed = metadata.claim_streams(epoch, &ids).await.unwrap();
        let leases: Vec<(u64, u64)> = claimed
            .iter()
            .map(|c| (c.stream.id, c.lease_epoch))
            .collect();
        metadata.commit_takeover(epoch, &leases).await.unwrap();
        (metadata, dir, ids, epoch)
    }

    /// A node joined and ready; its epoch.
    async fn join(metadata: &dyn MetadataStore, name: &str) -> u64 {
        let epoch = metadata.next_epoch().await.unwrap();
        let url = format!("http://{name}");
        metadata
            .join_cluster(epoch, name, &url, 60_000)
            .await
            .unwrap();
        assert!(metadata.renew_lease(epoch, 60_000, true).await.unwrap());
        epoch
    }

    /// A WAL chunk with one record for each `(stream, seq_num)`.
    fn chunk_of(entries: &[(u64, u64)]) -> Bytes {
        let mut chunk = ChunkBuilder::with_capacity(0);
        for (stream_id, seq_num) in entries {
            let record = StoredRecord {
                timestamp: *seq_num,
                headers: vec![],
                body: Bytes::from_static(b"a record"),
            };
            chunk.push(*stream_id, *seq_num, &[record]);
        }
        chunk.finish().0
    }

    fn compactor(
        metadata: &Arc<dyn MetadataStore>,
        objects: Arc<dyn ObjectStore>,
        epoch: u64,
        released: ReleasedChunks,
    ) -> Compactor {
        let state = CompactionState {
            checkpoints: HashMap::new(),
            logs: BTreeMap::new(),
        };
        let cache = Arc::new(ChunkCache::new(0));
        Compactor::new(
            metadata.clone(),
            objects,
            cache,
            epoch,
            released,
            Duration::ZERO,
            state,
        )
    }

    fn live_stream(id: u64) -> Arc<StreamState> {
        StreamState::new(
            id,
            crate::names::StreamName::new("live").unwrap(),
            Default::default(),
            None,
            SequencerState::default(),
            StreamPosition::default(),
            Vec::new(),
        )
    }

    /// Node a hands one of its two streams to node b, whose takeover has not committed
    /// yet: a's round over the chunk with both streams' records commits nothing, and
    /// that is a round with nothing done (no error, nothing uncertain to relearn), not a
    /// failure; the segment it wrote for the stream it keeps, indexed nowhere, is
    /// removed, unless a commit of a's had an unknown outcome. Once b has taken the
    /// stream up, the same chunk is compacted away.
    #[tokio::test]
    async fn a_round_waits_for_a_handed_over_stream_to_be_taken_up() {
        let (metadata, _dir, ids, a) = node_with_streams(&["handed-over", "kept"]).await;
        let (handed, kept) = (ids[0], ids[1]);
        let b = join(&*metadata, "node-b").await;
        // a's log: one released chunk holding the first record of each stream.
        let objects = Arc::new(MemoryObjectStore::default());
        objects
            .put(&chunk_key(a, 0), chunk_of(&[(handed, 0), (kept, 0)]))
            .await
            .unwrap();
        let (release, released) = crate::wal::released::channel();
        release.release(vec![handed, kept]);
        let compactor = compactor(&metadata, objects.clone(), a, released);
        assert_eq!(
            metadata
                .release_streams(a, &[handed], Some(b))
                .await
                .unwrap(),
            1
        );
        // a serves the handed-over stream no more.
        let served_by_a = HashMap::from([(kept, live_stream(kept))]);
        let kept_prefix = crate::segment::segment_prefix(kept);
        let kept_segments = || objects.list(&kept_prefix);

        // After a commit of unknown outcome the same refusal leaves the segment: that
        // commit may yet land and name it.
        compactor.had_unknown_outcome.store(true, Ordering::SeqCst);
        let round = compactor.run_round(|| served_by_a.clone()).await.unwrap();
        assert_eq!(round, CompactionStats::default());
        assert_eq!(
            kept_segments().await.unwrap(),
            [segment_key(kept, 0, a)],
            "kept after a commit of unknown outcome"
        );
        compactor.had_unknown_outcome.store(false, Ordering::SeqCst);

        let round = compactor.run_round(|| served_by_a.clone()).await.unwrap();
        assert_eq!(round, CompactionStats::default());
        assert!(!compactor.is_uncertain(), "the store's answer was certain");
        assert!(compactor.waiting_for_hand_over.lock().is_some());
        assert_eq!(metadata.wal_watermarks().await.unwrap().get(&a), None);
        assert_eq!(
            kept_segments().await.unwrap(),
            Vec::<String>::new(),
            "the refused round's segment is removed"
        );

        let taken = metadata.claim_streams(b, &[handed]).await.unwrap();
        metadata
            .commit_takeover(b, &[(handed, taken[0].lease_epoch)])
            .await
            .unwrap();
        let round = compactor.run_round(|| served_by_a.clone()).await.unwrap();
        assert_eq!((round.chunks, round.segments), (1, 1));
        assert!(compactor.waiting_for_hand_over.lock().is_none());
        assert_eq!(metadata.wal_watermarks().await.unwrap().get(&a), Some(&1));
        assert_eq!(
            kept_segments().await.unwrap(),
            [segment_key(kept, 0, a)],
            "the round that commits writes the kept stream's segment again"
        );
        assert_eq!(
            metadata.stream_checkpoints().await.unwrap()[&kept].next_seq,
            1
        );
    }

    /// A chunk that holds only a deleted stream's records is taken without being read
    /// (it is not even in the store here: reading it would fail the round); a chunk
    /// that holds a live stream's records too is read, and those records compacted.
    #[tokio::test]
    async fn a_chunk_whose_streams_are_all_gone_is_taken_without_being_read() {
        let (metadata, _dir, ids, a) = node_with_streams(&["deleted", "live"]).await;
        let (deleted, live) = (ids[0], ids[1]);
        metadata
            .mark_stream_deleted(deleted, OffsetDateTime::now_utc())
            .await
            .unwrap();
        let objects = Arc::new(MemoryObjectStore::default());
        let (release, released) = crate::wal::released::channel();
        // Chunk 0, the deleted stream's alone, never reaches the store.
        release.release(vec![deleted]);
        objects
            .put(&chunk_key(a, 1), chunk_of(&[(live, 0)]))
            .await
            .unwrap();
        release.release(vec![live]);
        let both = chunk_of(&[(deleted, 1), (live, 1)]);
        objects.put(&chunk_key(a, 2), both).await.unwrap();
        release.release(vec![deleted, live]);
        let compactor = compactor(&metadata, objects, a, released);
        let live_streams = HashMap::from([(live, live_stream(live))]);

        let round = compactor.run_round(|| live_streams.clone()).await.unwrap();
        assert_eq!((round.chunks, round.segments), (3, 1));
        assert_eq!(metadata.wal_watermarks().await.unwrap().get(&a), Some(&3));
        let checkpoints = metadata.stream_checkpoints().await.unwrap();
        assert_eq!(
            checkpoints[&live].next_seq, 2,
            "both of its records are in a segment"
        );
        assert_eq!(
            compactor.released.streams_of(2).as_deref(),
            Some(&[deleted, live][..])
        );
        // The next round forgets what it no longer needs.
        compactor.run_round(|| live_streams.clone()).await.unwrap();
        assert_eq!(compactor.released.streams_of(2), None);
    }
}
