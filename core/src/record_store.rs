//! The record store: where durable records are read back from. Recent batches come from
//! cached WAL chunks (or a range of one), history from segments through the segment
//! index and a bounded cache. Readers depend on this, not on the engine.

use std::sync::Arc;

use crate::cache::ChunkCache;
use crate::error::{Error, Result};
use crate::record::SequencedRecord;
use crate::segment::{parse_segment_key, SegmentRecord};
use crate::storage::{MetadataStore, ObjectStore};
use crate::stream::{BatchLocation, Stored};
use crate::wal::decode_entry;

pub(crate) struct RecordStore {
    metadata: Arc<dyn MetadataStore>,
    objects: Arc<dyn ObjectStore>,
    /// Recently written WAL chunks (the writer fills it).
    wal_cache: Arc<ChunkCache>,
    segment_cache: ChunkCache,
}

impl RecordStore {
    pub fn new(
        metadata: Arc<dyn MetadataStore>,
        objects: Arc<dyn ObjectStore>,
        wal_cache: Arc<ChunkCache>,
        segment_cache_bytes: usize,
    ) -> Self {
        Self {
            metadata,
            objects,
            wal_cache,
            segment_cache: ChunkCache::new(segment_cache_bytes),
        }
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
            Stored::Segment => match self.segment_cache.get(key) {
                Some(segment) => span.cut(key, &segment)?,
                None => match self.objects.get(key).await? {
                    Some(segment) if segment.len() as u64 >= span.range().end => {
                        self.segment_cache.insert(key.clone(), segment.clone());
                        span.cut(key, &segment)?
                    }
                    Some(_) => {
                        return Err(Error::storage(format!(
                            "segment `{key}` is shorter than its index says"
                        )))
                    }
                    None => return self.vanished_segment(location).await,
                },
            },
        };
        Ok(decode_entry(key, bytes)?.1)
    }

    /// A segment object that is not there is fine if the index dropped it meanwhile
    /// (trimmed, expired or deleted records are no longer readable): no records. If the
    /// index still has it, records that must be readable are missing.
    async fn vanished_segment(&self, location: &BatchLocation) -> Result<Vec<SequencedRecord>> {
        let key = &location.object;
        let stream_id = parse_segment_key(key)
            .ok_or_else(|| Error::storage(format!("`{key}` is not a segment key")))?
            .0;
        let indexed = self
            .segment_at(stream_id, location.start_seq)
            .await?
            .is_some_and(|segment| segment.key == **key);
        if indexed {
            return Err(Error::storage(format!(
                "segment `{key}` is in the index but missing from the object store; \
                 restore it from a backup"
            )));
        }
        Ok(Vec::new())
    }

    /// The stream's segment that holds `seq`, or else the first one after it.
    pub async fn segment_at(&self, stream_id: u64, seq: u64) -> Result<Option<SegmentRecord>> {
        self.metadata.segment_at(stream_id, seq).await
    }

    /// Where the batches of a stream from `from` up to `until` (the end of its compacted
    /// records) lie in segments, enough of them to hold `max_count` records. Batches that
    /// were trimmed or expired are not there: the first one returned may start later.
    pub async fn segment_locations(
        &self,
        stream_id: u64,
        mut from: u64,
        until: u64,
        max_count: u64,
    ) -> Result<Vec<BatchLocation>> {
        let mut locations = Vec::new();
        let mut covered = 0u64;
        while from < until && covered < max_count {
            let Some(segment) = self.segment_at(stream_id, from).await? else {
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
                if covered >= max_count {
                    break;
                }
                covered += entry.end_seq - entry.start_seq.max(from);
                locations.push(BatchLocation::in_segment(key.clone(), entry));
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
