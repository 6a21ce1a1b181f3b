//! Read-ahead for read sessions that are behind the tail: the batches a session will ask
//! for next are fetched while it encodes and sends the current ones, several at a time
//! and as few large ranges as their objects allow, so a catch-up keeps the disk (or S3)
//! busy instead of waiting on one read per batch.
//!
//! What is read ahead is the session's own: it never enters the shared caches, so a long
//! scan of history cannot evict what tailing readers and recent reads are served from.
//! Memory is bounded per session (about 16 MiB: the bound is checked before each batch)
//! and across the process; a session that finds the process's budget spent reads as it
//! would without read-ahead. A fetch given up on (its session ended, or its batches
//! moved) gives its budget back at once, though a local read under way finishes first.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use crate::error::Result;
use crate::record::SequencedRecord;
use crate::record_store::RecordStore;
use crate::stream::BatchLocation;
use crate::wal::{decode_entry, EntrySpan};

/// How far ahead of what it has taken one session reads, in bytes of stored batches
/// (and the gaps between them that its ranges take in).
pub(crate) const SESSION_READ_AHEAD_BYTES: u64 = 16 << 20;
/// What all sessions together may hold read ahead.
pub(crate) const PROCESS_READ_AHEAD_BYTES: usize = 256 << 20;
/// The largest single fetch: neighbouring batches of one object are read together up to
/// this size.
const MAX_FETCH_BYTES: u64 = 8 << 20;
/// Neighbouring batches of one object (a WAL chunk also holds other streams' batches) are
/// read in one range when at most this much lies between them.
const MAX_GAP_BYTES: u64 = 256 << 10;

/// The process-wide bound on read-ahead memory, shared by every session's [`ReadAhead`].
pub(crate) type ReadAheadBudget = Arc<Semaphore>;

pub(crate) fn budget() -> ReadAheadBudget {
    Arc::new(Semaphore::new(PROCESS_READ_AHEAD_BYTES))
}

/// One session's fetches under way or done and not yet taken, in stream order.
pub(crate) struct ReadAhead {
    store: Arc<RecordStore>,
    budget: ReadAheadBudget,
    fetches: VecDeque<Fetch>,
}

/// A range of one object holding whole batches of the stream.
struct Fetch {
    key: Arc<str>,
    range: Range<u64>,
    state: FetchState,
    /// The fetch's share of the process's budget, given back when it is dropped.
    _permit: OwnedSemaphorePermit,
}

enum FetchState {
    Running(JoinHandle<Result<Bytes>>),
    /// The bytes, or `None` if the fetch failed.
    Done(Option<Bytes>),
}

impl Drop for Fetch {
    fn drop(&mut self) {
        if let FetchState::Running(task) = &self.state {
            task.abort();
        }
    }
}

impl Fetch {
    fn covers(&self, key: &str, span: EntrySpan) -> bool {
        *self.key == *key && self.range.start <= span.offset && span.range().end <= self.range.end
    }

    /// The fetched bytes once they are there, or `None` if the fetch failed (the reason
    /// is found again by the store's own read).
    async fn bytes(&mut self) -> Option<Bytes> {
        if let FetchState::Running(task) = &mut self.state {
            let fetched = task.await.ok().and_then(|outcome| outcome.ok());
            self.state = FetchState::Done(fetched);
        }
        match &self.state {
            FetchState::Done(fetched) => fetched.clone(),
            FetchState::Running(_) => None,
        }
    }
}

impl ReadAhead {
    pub fn new(store: Arc<RecordStore>, budget: ReadAheadBudget) -> Self {
        Self {
            store,
            budget,
            fetches: VecDeque::new(),
        }
    }

    /// Plans the fetches for `upcoming`, the batches the session will take next (in
    /// stream order): fetches that hold none of them are dropped (taken already, or
    /// their batches moved into segments meanwhile), and those that no fetch holds and
    /// no shared cache has are fetched, until the session holds its bound (checked
    /// before each batch, so it may go over by one batch) or the process's budget is
    /// spent.
    pub fn start(&mut self, upcoming: &[BatchLocation]) {
        let mut needed = vec![false; self.fetches.len()];
        for location in upcoming {
            if let Some(i) = self.covering(location) {
                needed[i] = true;
            }
        }
        let mut needed = needed.into_iter();
        self.fetches.retain(|_| needed.next().unwrap_or(false));

        let mut ahead = self.held_bytes();
        let mut planned: Option<(Arc<str>, Range<u64>)> = None;
        for location in upcoming {
            if ahead >= SESSION_READ_AHEAD_BYTES {
                break;
            }
            if self.covering(location).is_some() || self.store.is_cached(location) {
                continue;
            }
            let span = location.span.range();
            if let Some((key, range)) = &mut planned {
                let joins = **key == *location.object
                    && span.start >= range.end
                    && span.start - range.end <= MAX_GAP_BYTES
                    && span.end - range.start <= MAX_FETCH_BYTES;
                if joins {
                    ahead += span.end - range.end;
                    range.end = span.end;
                    continue;
                }
            }
            if let Some(fetch) = planned.take() {
                if !self.launch(fetch) {
                    return;
                }
            }
            ahead += span.end - span.start;
            planned = Some((location.object.clone(), span));
        }
        if let Some(fetch) = planned {
            self.launch(fetch);
        }
    }

    /// Starts one fetch if the process's budget allows it; whether it did.
    fn launch(&mut self, (key, range): (Arc<str>, Range<u64>)) -> bool {
        let Ok(bytes) = u32::try_from(range.end - range.start) else {
            return false;
        };
        let Ok(permit) = self.budget.clone().try_acquire_many_owned(bytes) else {
            return false;
        };
        let store = self.store.clone();
        let (task_key, task_range) = (key.clone(), range.clone());
        let task = tokio::spawn(async move { store.fetch_range(&task_key, task_range).await });
        self.fetches.push_back(Fetch {
            key,
            range,
            state: FetchState::Running(task),
            _permit: permit,
        });
        true
    }

    /// The bytes the session's fetches hold or will hold.
    fn held_bytes(&self) -> u64 {
        self.fetches
            .iter()
            .map(|f| f.range.end - f.range.start)
            .sum()
    }

    /// The fetch holding the batch at `location`, if one does.
    fn covering(&self, location: &BatchLocation) -> Option<usize> {
        self.fetches
            .iter()
            .position(|f| f.covers(&location.object, location.span))
    }

    /// The records of a batch: from the fetch that holds it, or else (none does, or the
    /// fetch failed: say its WAL chunk was compacted away meanwhile) from the store,
    /// which knows where the batch is now.
    pub async fn load(&mut self, location: &BatchLocation) -> Result<Vec<SequencedRecord>> {
        let Some(i) = self.covering(location) else {
            return self.store.load(location).await;
        };
        let fetch = &mut self.fetches[i];
        let Some(bytes) = fetch.bytes().await else {
            self.fetches.remove(i);
            return self.store.load(location).await;
        };
        let within = EntrySpan {
            offset: location.span.offset - fetch.range.start,
            len: location.span.len,
        };
        let entry = within.cut(&location.object, &bytes)?;
        Ok(decode_entry(&location.object, entry)?.1)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use async_trait::async_trait;

    use super::*;
    use crate::cache::ChunkCache;
    use crate::storage::memory::MemoryObjectStore;
    use crate::storage::sql::SqlMetadataStore;
    use crate::storage::ObjectStore;
    use crate::stream::Stored;
    use crate::wal::{ChunkBuilder, StoredRecord};

    /// An in-memory object store that counts range reads.
    #[derive(Default)]
    struct CountingStore {
        inner: MemoryObjectStore,
        range_reads: AtomicUsize,
    }

    #[async_trait]
    impl ObjectStore for CountingStore {
        async fn put(&self, key: &str, data: Bytes) -> Result<()> {
            self.inner.put(key, data).await
        }
        async fn get(&self, key: &str) -> Result<Option<Bytes>> {
            self.inner.get(key).await
        }
        async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes> {
            self.range_reads.fetch_add(1, Ordering::SeqCst);
            self.inner.get_range(key, range).await
        }
        async fn list(&self, prefix: &str) -> Result<Vec<String>> {
            self.inner.list(prefix).await
        }
        async fn delete(&self, key: &str) -> Result<()> {
            self.inner.delete(key).await
        }
        fn describe(&self) -> String {
            "counting".into()
        }
    }

    struct Fixture {
        store: Arc<RecordStore>,
        objects: Arc<CountingStore>,
        wal_cache: Arc<ChunkCache>,
        _dir: tempfile::TempDir,
    }

    async fn fixture() -> Fixture {
        let (metadata, dir) = SqlMetadataStore::temporary().await;
        let objects = Arc::new(CountingStore::default());
        let wal_cache = Arc::new(ChunkCache::new(64 << 20));
        let store = Arc::new(RecordStore::new(
            Arc::new(metadata),
            objects.clone(),
            wal_cache.clone(),
            64 << 20,
        ));
        Fixture {
            store,
            objects,
            wal_cache,
            _dir: dir,
        }
    }

    /// A WAL chunk `key` where stream 1's one-record batches (bodies `body_len` bytes,
    /// from seq 0) alternate with another stream's; stream 1's locations.
    async fn chunk_with_two_streams(
        objects: &CountingStore,
        key: &str,
        batches: u64,
        body_len: usize,
    ) -> Vec<BatchLocation> {
        let mut builder = ChunkBuilder::with_capacity(64);
        let record = |seq: u64| StoredRecord {
            timestamp: seq,
            headers: vec![],
            body: Bytes::from(vec![seq as u8; body_len]),
        };
        for seq in 0..batches {
            builder.push(1, seq, &[record(seq)]);
            builder.push(2, seq, &[record(seq)]);
        }
        let (bytes, spans) = builder.finish();
        objects.put(key, bytes).await.unwrap();
        let key: Arc<str> = key.into();
        (0..batches)
            .map(|seq| BatchLocation {
                start_seq: seq,
                end_seq: seq + 1,
                last_timestamp: seq,
                object: key.clone(),
                stored: Stored::WalChunk,
                span: spans[2 * seq as usize],
            })
            .collect()
    }

    async fn load_all(ahead: &mut ReadAhead, locations: &[BatchLocation]) -> Vec<u64> {
        let mut seqs = Vec::new();
        for location in locations {
            for record in ahead.load(location).await.unwrap() {
                assert_eq!(record.body[0], record.seq_num as u8);
                seqs.push(record.seq_num);
            }
        }
        seqs
    }

    /// Neighbouring batches of one chunk are fetched in one range read (the other
    /// stream's batches between them included), and what is read ahead stays out of the
    /// shared caches.
    #[tokio::test]
    async fn neighbouring_batches_are_read_in_one_fetch_kept_out_of_the_caches() {
        let f = fixture().await;
        let locations = chunk_with_two_streams(&f.objects, "wal/1", 20, 100).await;
        let mut ahead = ReadAhead::new(f.store.clone(), budget());
        ahead.start(&locations);
        assert_eq!(
            load_all(&mut ahead, &locations).await,
            (0..20).collect::<Vec<_>>()
        );
        assert_eq!(f.objects.range_reads.load(Ordering::SeqCst), 1);
        assert!(!f.store.is_cached(&locations[0]));
        // Taken: a plan without them drops their fetch.
        ahead.start(&[]);
        assert!(ahead.fetches.is_empty());
    }

    /// A session reads at most its own bound ahead (plus one batch, and the gap before
    /// it), whether its batches lie far apart (a fetch each) or are joined into ranges,
    /// and nothing once the process's budget is spent; its batches are then read from
    /// the store as usual.
    #[tokio::test]
    async fn read_ahead_stays_within_the_session_and_process_bounds() {
        let f = fixture().await;
        // 40 batches of 1 MiB, 1 MiB apart: a fetch each, past the session's 16 MiB.
        let apart = chunk_with_two_streams(&f.objects, "wal/2", 40, 1 << 20).await;
        let mut ahead = ReadAhead::new(f.store.clone(), budget());
        ahead.start(&apart);
        assert_eq!(ahead.fetches.len(), 16);
        assert!(ahead.held_bytes() >= SESSION_READ_AHEAD_BYTES);
        assert!(ahead.held_bytes() <= SESSION_READ_AHEAD_BYTES + apart[0].span.len);
        assert_eq!(load_all(&mut ahead, &apart[..1]).await, vec![0]);

        // 600 batches of 64 KiB, 64 KiB apart: joined into ranges of up to 8 MiB.
        let joined = chunk_with_two_streams(&f.objects, "wal/5", 600, 64 << 10).await;
        let mut ahead = ReadAhead::new(f.store.clone(), budget());
        ahead.start(&joined);
        assert!(ahead.fetches.len() <= 3, "{}", ahead.fetches.len());
        assert!(ahead.held_bytes() >= SESSION_READ_AHEAD_BYTES);
        assert!(ahead.held_bytes() <= SESSION_READ_AHEAD_BYTES + 2 * joined[0].span.len);
        // The first 100 batches (12.5 MiB with their gaps) come out of those fetches:
        // no read of their own.
        let reads_before = f.objects.range_reads.load(Ordering::SeqCst);
        let first_hundred: Vec<u64> = (0..100).collect();
        assert_eq!(load_all(&mut ahead, &joined[..100]).await, first_hundred);
        let reads = f.objects.range_reads.load(Ordering::SeqCst) - reads_before;
        assert!(reads <= ahead.fetches.len(), "{reads} reads");

        let spent = Arc::new(Semaphore::new(0));
        let mut starved = ReadAhead::new(f.store.clone(), spent);
        starved.start(&apart);
        assert!(starved.fetches.is_empty());
        assert_eq!(
            load_all(&mut starved, &apart).await,
            (0..40).collect::<Vec<_>>()
        );
    }

    /// A fetch that fails (its chunk compacted away and deleted, say) is dropped and the
    /// batch is read from where the store has it now.
    #[tokio::test]
    async fn a_failed_fetch_falls_back_to_the_store() {
        let f = fixture().await;
        let locations = chunk_with_two_streams(&f.objects, "wal/3", 3, 10).await;
        let mut ahead = ReadAhead::new(f.store.clone(), budget());
        ahead.start(&locations);
        // The single-threaded test runtime has not run the fetch yet: the object goes
        // first, and only the cache has the chunk.
        let chunk = f.objects.get("wal/3").await.unwrap().unwrap();
        f.objects.delete("wal/3").await.unwrap();
        f.wal_cache.insert("wal/3".into(), chunk);
        assert_eq!(load_all(&mut ahead, &locations).await, vec![0, 1, 2]);
        assert!(ahead.fetches.is_empty());
    }
}
