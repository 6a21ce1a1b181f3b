//! The record store: where durable records are read back from. Recent batches come from
//! cached WAL chunks (or a range of one), history from segments through the segment
//! index and a bounded cache. Readers depend on this, not on the engine.

use std::sync::Arc;

use bytes::Bytes;

use crate::cache::ChunkCache;
use crate::error::{Error, Result};
use crate::read_ahead::{self, ReadAheadBudget};
use crate::record::SequencedRecord;
use crate::segment::{parse_segment_key, SegmentRecord};
use crate::segment_lookups::SegmentLookups;
use crate::storage::{MetadataStore, ObjectStore};
use crate::stream::{BatchLocation, Retained, Stored};
use crate::wal::{decode_entry, EntrySpan};

/// How much of a stream a read lists: batches until they hold `max_records` records
/// from `start_seq` and, for read-ahead, until they hold `min_bytes` (but no more than
/// [`MAX_LISTED_AHEAD`] batches, from at most [`MAX_SEGMENTS_AHEAD`] more segments, past
/// the records wanted).
pub(crate) struct Listing {
    start_seq: u64,
    max_records: u64,
    min_bytes: u64,
    records: u64,
    bytes: u64,
    batches_ahead: usize,
    segments_ahead: usize,
}

/// Read-ahead lists at most this many batches past the records a read wants, so a
/// stream of tiny batches does not make every read list thousands of them.
const MAX_LISTED_AHEAD: usize = 256;
/// Read-ahead looks up at most this many segments past the records a read wants (one
/// metadata query each), so a history of small segments costs no more queries per read.
const MAX_SEGMENTS_AHEAD: usize = 1;

impl Listing {
    pub fn new(start_seq: u64, max_records: u64, min_bytes: u64) -> Self {
        Self {
            start_seq,
            max_records,
            min_bytes,
            records: 0,
            bytes: 0,
            batches_ahead: 0,
            segments_ahead: 0,
        }
    }

    /// Whether to look up one more segment's batches (counted if it is past the records
    /// wanted).
    pub fn wants_another_segment(&mut self) -> bool {
        if !self.wants_more() {
            return false;
        }
        if self.records >= self.max_records {
            self.segments_ahead += 1;
        }
        self.segments_ahead <= MAX_SEGMENTS_AHEAD
    }

    pub fn wants_more(&self) -> bool {
        self.records < self.max_records
            || (self.bytes < self.min_bytes && self.batches_ahead < MAX_LISTED_AHEAD)
    }

    /// Counts `batch` in if the listing still wants more; whether it did.
    pub fn take(&mut self, batch: &BatchLocation) -> bool {
        if !self.wants_more() {
            return false;
        }
        if self.records >= self.max_records {
            self.batches_ahead += 1;
        }
        self.records += batch.end_seq - batch.start_seq.max(self.start_seq);
        self.bytes += batch.span.len;
        true
    }
}

/// How many times a read looks a batch up again when its segment keeps being merged
/// away under it.
const MAX_SEGMENT_LOOKS: usize = 3;

pub(crate) struct RecordStore {
    metadata: Arc<dyn MetadataStore>,
    objects: Arc<dyn ObjectStore>,
    /// Recently written WAL chunks (the writer fills it).
    wal_cache: Arc<ChunkCache>,
    segment_cache: ChunkCache,
    /// The segment index, as readers ask it: lookups shared between them.
    segments: SegmentLookups,
    /// What read sessions together may hold read ahead.
    read_ahead_budget: ReadAheadBudget,
}

impl RecordStore {
    pub fn new(
        metadata: Arc<dyn MetadataStore>,
        objects: Arc<dyn ObjectStore>,
        wal_cache: Arc<ChunkCache>,
        segment_cache_bytes: usize,
    ) -> Self {
        Self {
            segments: SegmentLookups::new(metadata.clone()),
            metadata,
            objects,
            wal_cache,
            segment_cache: ChunkCache::new(segment_cache_bytes),
            read_ahead_budget: read_ahead::budget(),
        }
    }

    pub fn read_ahead_budget(&self) -> ReadAheadBudget {
        self.read_ahead_budget.clone()
    }

    /// Whether reading `location` needs no storage read: its WAL chunk or its segment is
    /// in a cache.
    pub fn is_cached(&self, location: &BatchLocation) -> bool {
        match location.stored {
            Stored::WalChunk => self.wal_cache.contains(&location.object),
            Stored::Segment => self.segment_cache.contains(&location.object),
        }
    }

    /// The bytes at `range` of a WAL chunk or a segment, straight from the object store
    /// (for read-ahead, which keeps what it reads out of the shared caches).
    pub async fn fetch_range(&self, key: &str, range: std::ops::Range<u64>) -> Result<Bytes> {
        self.objects.get_range(key, range).await
    }

    /// The records of one durable batch: from a cached WAL chunk or a range of it, or
    /// from its segment, which is fetched whole and cached (a read of history goes on to
    /// the next batches of the same segment). A segment that is gone was trimmed, expired
    /// or deleted meanwhile, so its records are no longer readable: none are returned.
    pub async fn load(&self, location: &BatchLocation) -> Result<Vec<SequencedRecord>> {
        let span = location.span;
        let key = &location.object;
        let bytes = match location.stored {
            Stored::WalChunk => match self.wal_cache.get(key) {
                Some(chunk) => span.cut(key, &chunk)?,
                None => self.objects.get_range(key, span.range()).await?,
            },
            Stored::Segment => match self.segment_entry(key, span).await? {
                Some(bytes) => bytes,
                None => return self.vanished_segment(location).await,
            },
        };
        Ok(decode_entry(key, bytes)?.1)
    }

    /// The bytes at `span` of segment `key`, which is fetched whole and cached; `None` if
    /// the object is gone.
    async fn segment_entry(&self, key: &Arc<str>, span: EntrySpan) -> Result<Option<Bytes>> {
        if let Some(segment) = self.segment_cache.get(key) {
            return span.cut(key, &segment).map(Some);
        }
        match self.objects.get(key).await? {
            Some(segment) if segment.len() as u64 >= span.range().end => {
                self.segment_cache.insert(key.clone(), segment.clone());
                span.cut(key, &segment).map(Some)
            }
            Some(_) => Err(Error::storage(format!(
                "segment `{key}` is shorter than its index says"
            ))),
            None => Ok(None),
        }
    }

    /// A segment object that is not there: if the index merged it into another segment
    /// meanwhile, the batch is read from there (merging keeps batches whole); if the
    /// index dropped it (trimmed, expired or deleted records are no longer readable), no
    /// records. If the index still has it, records that must be readable are missing.
    async fn vanished_segment(&self, location: &BatchLocation) -> Result<Vec<SequencedRecord>> {
        let key = &location.object;
        let stream_id = parse_segment_key(key)
            .ok_or_else(|| Error::storage(format!("`{key}` is not a segment key")))?
            .0;
        // Each look finds the segment that holds the batch now, in the index itself (not
        // what readers were told lately, which may be this very segment); a merged
        // segment can itself be merged and deleted before it is read, so the look is
        // repeated.
        self.segments.forget(stream_id, key);
        let mut missing: Arc<str> = key.clone();
        for _ in 0..MAX_SEGMENT_LOOKS {
            let Some(segment) = self
                .metadata
                .segment_at(stream_id, location.start_seq)
                .await?
            else {
                return Ok(Vec::new());
            };
            if segment.key == *missing {
                let key = &missing;
                return Err(Error::storage(format!(
                    "segment `{key}` is in the index but missing from the object store; \
                     restore it from a backup"
                )));
            }
            let Some(entry) = segment
                .entries
                .iter()
                .find(|e| e.start_seq == location.start_seq)
            else {
                return Ok(Vec::new()); // trimmed: the segment starts after the batch
            };
            let merged_key: Arc<str> = segment.key.as_str().into();
            if let Some(bytes) = self.segment_entry(&merged_key, entry.span).await? {
                return Ok(decode_entry(&merged_key, bytes)?.1);
            }
            missing = merged_key;
        }
        Err(Error::Unavailable(format!(
            "the segment holding records from {} of stream {stream_id} kept changing while \
             being read; retry",
            location.start_seq
        )))
    }

    /// The segment of a stream that keeps `retained` that holds `seq`, or else the first
    /// one after it (as found moments ago: see `segment_lookups`).
    pub async fn segment_at(
        &self,
        stream_id: u64,
        seq: u64,
        retained: Retained,
    ) -> Result<Option<Arc<SegmentRecord>>> {
        self.segments.segment_at(stream_id, seq, retained).await
    }

    /// Where the batches of a stream that keeps `retained` from `from` up to `until` (the
    /// end of its compacted records) lie in segments, as many as `listing` wants. Batches
    /// that were trimmed or expired are not there: the first one returned may start later.
    pub async fn segment_locations(
        &self,
        stream_id: u64,
        retained: Retained,
        mut from: u64,
        until: u64,
        listing: &mut Listing,
    ) -> Result<Vec<BatchLocation>> {
        let mut locations = Vec::new();
        while from < until && listing.wants_another_segment() {
            let Some(segment) = self.segment_at(stream_id, from, retained).await? else {
                break;
            };
            // A segment committed after the caller looked at `until` holds records the
            // caller finds in memory: they are not taken twice.
            if segment.start_seq() >= until {
                break;
            }
            let key: Arc<str> = segment.key.as_str().into();
            let entries = segment.entries.iter();
            for entry in entries.filter(|e| e.end_seq > from && e.start_seq < until) {
                let location = BatchLocation::in_segment(key.clone(), entry);
                if !listing.take(&location) {
                    break;
                }
                locations.push(location);
            }
            from = segment.end_seq();
        }
        Ok(locations)
    }

    /// The sequence number of a stream's first record with a timestamp of at least
    /// `timestamp` among its segments, if they hold one.
    pub async fn seq_at_timestamp_in_segments(
        &self,
        stream_id: u64,
        timestamp: u64,
    ) -> Result<Option<u64>> {
        let Some(segment) = self
            .metadata
            .segment_at_timestamp(stream_id, timestamp)
            .await?
        else {
            return Ok(None);
        };
        let Some(entry) = segment
            .entries
            .iter()
            .find(|e| e.last_timestamp >= timestamp)
        else {
            return Ok(None);
        };
        let location = BatchLocation::in_segment(segment.key.as_str().into(), entry);
        let records = self.load(&location).await?;
        Ok(records
            .iter()
            .find(|r| r.timestamp >= timestamp)
            .map(|r| r.seq_num))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment::{segment_key, CompactionCommit, SegmentEntry};
    use crate::storage::memory::MemoryObjectStore;
    use crate::storage::metadata::create_basin_and_stream;
    use crate::storage::sql::SqlMetadataStore;
    use crate::stream::BatchLocation;
    use crate::wal::{ChunkBuilder, StoredRecord};
    use time::OffsetDateTime;

    /// A segment of stream `id` holding one one-record batch per body, from `start`.
    fn segment(id: u64, start: u64, bodies: &[&str]) -> (SegmentRecord, Bytes) {
        let mut builder = ChunkBuilder::with_capacity(64);
        for (seq, body) in (start..).zip(bodies) {
            let record = StoredRecord {
                timestamp: seq,
                headers: vec![],
                body: Bytes::copy_from_slice(body.as_bytes()),
            };
            builder.push(id, seq, &[record]);
        }
        let (bytes, spans) = builder.finish();
        let entries = (start..)
            .zip(spans)
            .map(|(seq, span)| SegmentEntry {
                start_seq: seq,
                end_seq: seq + 1,
                last_timestamp: seq,
                span,
            })
            .collect();
        let record = SegmentRecord {
            stream_id: id,
            key: segment_key(id, start, 1),
            written_at_ms: 1,
            entries,
        };
        (record, bytes)
    }

    fn bodies(records: &[SequencedRecord]) -> Vec<&[u8]> {
        records.iter().map(|r| r.body.as_ref()).collect()
    }

    /// A stream whose records "a", "b" lie in a first segment and "c" in a second, both
    /// stored and indexed: the stores (and the metadata's directory), the stream's id,
    /// the two segments, and when they were committed.
    type TwoSegments = (
        Arc<SqlMetadataStore>,
        Arc<MemoryObjectStore>,
        tempfile::TempDir,
        u64,
        (SegmentRecord, SegmentRecord),
        OffsetDateTime,
    );

    async fn two_segments(basin: &str) -> TwoSegments {
        let (metadata, _dir) = SqlMetadataStore::temporary().await;
        let metadata = Arc::new(metadata);
        let objects = Arc::new(MemoryObjectStore::default());
        let now = OffsetDateTime::now_utc();
        let stream = create_basin_and_stream(metadata.as_ref(), basin, "s", now).await;
        let (first, first_bytes) = segment(stream.id, 0, &["a", "b"]);
        let (second, second_bytes) = segment(stream.id, 2, &["c"]);
        objects.put(&first.key, first_bytes).await.unwrap();
        objects.put(&second.key, second_bytes).await.unwrap();
        let commit = CompactionCommit {
            segments: vec![first.clone(), second.clone()],
            ..Default::default()
        };
        metadata.commit_compaction(&commit, now).await.unwrap();
        (metadata, objects, _dir, stream.id, (first, second), now)
    }

    /// A reader that found a batch in a segment before it was merged away (and deleted)
    /// reads the batch from the merged segment; once the batch is trimmed, nothing.
    #[tokio::test]
    async fn a_batch_of_a_merged_away_segment_is_read_from_the_merged_one() {
        let (metadata, objects, _dir, stream_id, (first, second), now) =
            two_segments("merge-test").await;
        let store = |cache| RecordStore::new(metadata.clone(), objects.clone(), cache, 1 << 20);
        let wal_cache = Arc::new(ChunkCache::new(1 << 20));
        let location = BatchLocation::in_segment(second.key.as_str().into(), &second.entries[0]);
        assert_eq!(
            bodies(&store(wal_cache.clone()).load(&location).await.unwrap()),
            [b"c"]
        );

        // Merged, the old objects deleted: a fresh store (nothing cached) reads "c" from
        // the merged segment, where the batch lies at another offset.
        let (mut merged, merged_bytes) = segment(stream_id, 0, &["a", "b", "c"]);
        merged.key = "segments/merged".into();
        objects.put(&merged.key, merged_bytes).await.unwrap();
        let replaced = [first.key.clone(), second.key.clone()];
        assert!(metadata
            .merge_segments(&merged, &replaced, None, now)
            .await
            .unwrap());
        for key in &replaced {
            objects.delete(key).await.unwrap();
        }
        assert_ne!(merged.entries[2].span, second.entries[0].span);
        assert_eq!(
            bodies(&store(wal_cache.clone()).load(&location).await.unwrap()),
            [b"c"]
        );

        // Trimmed past it: the merged segment goes too, and the batch reads as nothing.
        assert_eq!(
            metadata
                .drop_segments(stream_id, 3, 0, 10, now)
                .await
                .unwrap(),
            1
        );
        objects.delete(&merged.key).await.unwrap();
        assert!(store(wal_cache).load(&location).await.unwrap().is_empty());
    }

    /// A reader told where a batch lies by a lookup kept lately, whose segment is gone by
    /// the time it reads (its object missing: an operator's mistake, or a grace period
    /// cut short): the read finds nothing there, and the next listing asks the index
    /// again rather than being told the same, which would read the same nothing for as
    /// long as the answer was kept.
    #[tokio::test]
    async fn a_dropped_segment_is_listed_no_more_once_found_gone() {
        let (metadata, objects, _dir, stream_id, (first, second), now) =
            two_segments("dropped-test").await;
        let wal_cache = Arc::new(ChunkCache::new(1 << 20));
        let store = RecordStore::new(metadata.clone(), objects.clone(), wal_cache, 1 << 20);
        let listed = || async {
            let mut listing = Listing::new(0, 1, 0);
            store
                .segment_locations(stream_id, Retained::default(), 0, 3, &mut listing)
                .await
                .unwrap()
        };
        let before = listed().await;
        assert_eq!(&*before[0].object, first.key.as_str());

        assert_eq!(
            metadata
                .drop_segments(stream_id, 2, 0, 10, now)
                .await
                .unwrap(),
            1
        );
        objects.delete(&first.key).await.unwrap();
        assert!(store.load(&before[0]).await.unwrap().is_empty());
        let after = listed().await;
        assert_eq!(&*after[0].object, second.key.as_str());
    }
}
