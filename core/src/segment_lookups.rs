//! [`SegmentLookups`]: segment index lookups shared by the readers of a stream.
//!
//! Why: when compaction moves a stream's newest records into a segment, every follower
//! still a little behind the tail must look up where its next records are now, all at
//! the same moment. `tail_bench` with 10,000 followers saw bursts of hundreds of these
//! queries within 0.1 s, and in one run 3,500 of them queued on the metadata pool at
//! once: deliveries waited 3 s behind them, and the node's own lease renewal went
//! unanswered for 2 s.
//!
//! So lookups are shared two ways:
//!
//! - While one is in flight for a stream, the others for that stream wait for it, and
//!   take its answer when the segment it found holds the position they want (otherwise
//!   they ask for their own).
//! - A segment found is kept for `KEEP_FOR` (the newest few per stream, within a bound
//!   on the whole), and lookups of positions it holds are answered from it.
//!
//! A kept segment may meanwhile be merged into another or dropped (trimmed, expired).
//! A merged one stays readable, with the same records, for the grace period before its
//! object is deleted. Once the object is gone, the read that misses it asks the index
//! itself (`RecordStore::vanished_segment`) and has the kept copy forgotten.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::error::Result;
use crate::segment::SegmentRecord;
use crate::single_flight::SingleFlight;
use crate::storage::MetadataStore;

/// How long a segment found is kept, which bounds how stale a kept answer can be.
const KEEP_FOR: Duration = Duration::from_secs(5);
/// Segments kept per stream: the ones found last.
const KEPT_PER_STREAM: usize = 2;
/// Bounds on what is kept in all: streams, and segment index entries (40 bytes each).
/// Past either, expired segments are dropped, and if that is not enough, all of them.
const KEPT_STREAMS: usize = 1024;
const KEPT_ENTRIES: usize = 256 * 1024;
/// A segment with a larger index than this is not kept (it would crowd out the rest);
/// lookups of it are still shared while in flight.
const MAX_KEPT_SEGMENT_ENTRIES: usize = KEPT_ENTRIES / 4;

pub(crate) struct SegmentLookups {
    metadata: Arc<dyn MetadataStore>,
    flights: SingleFlight<u64, Found>,
    kept: Arc<Mutex<Kept>>,
}

/// A lookup's answer, and the position it was asked for.
#[derive(Clone)]
struct Found {
    asked: u64,
    segment: Option<Arc<SegmentRecord>>,
}

#[derive(Default)]
struct Kept {
    by_stream: HashMap<u64, Vec<(Arc<SegmentRecord>, Instant)>>,
    entries: usize,
}

impl SegmentLookups {
    pub fn new(metadata: Arc<dyn MetadataStore>) -> Self {
        Self {
            metadata,
            flights: SingleFlight::default(),
            kept: Arc::default(),
        }
    }

    /// The stream's segment that holds `seq`, or else the first one after it.
    pub async fn segment_at(&self, stream_id: u64, seq: u64) -> Result<Option<Arc<SegmentRecord>>> {
        if let Some(segment) = self.kept.lock().holding(stream_id, seq) {
            return Ok(Some(segment));
        }
        let lookup = look_up(self.metadata.clone(), self.kept.clone(), stream_id, seq);
        match self.flights.run(stream_id, lookup).await? {
            Found { asked, segment } if asked == seq => Ok(segment),
            Found {
                segment: Some(segment),
                ..
            } if holds(&segment, seq) => Ok(Some(segment)),
            // An answer for another position says nothing about this one.
            _ => {
                let lookup = look_up(self.metadata.clone(), self.kept.clone(), stream_id, seq);
                Ok(lookup.await?.segment)
            }
        }
    }

    /// Forgets a kept segment whose object turned out to be gone.
    pub fn forget(&self, stream_id: u64, key: &str) {
        self.kept.lock().remove(stream_id, key);
    }
}

/// Asks the index, and keeps the segment found.
async fn look_up(
    metadata: Arc<dyn MetadataStore>,
    kept: Arc<Mutex<Kept>>,
    stream_id: u64,
    seq: u64,
) -> Result<Found> {
    let segment = metadata.segment_at(stream_id, seq).await?.map(Arc::new);
    if let Some(segment) = &segment {
        kept.lock().insert(segment.clone());
    }
    Ok(Found {
        asked: seq,
        segment,
    })
}

fn holds(segment: &SegmentRecord, seq: u64) -> bool {
    segment.start_seq() <= seq && seq < segment.end_seq()
}

impl Kept {
    fn holding(&self, stream_id: u64, seq: u64) -> Option<Arc<SegmentRecord>> {
        self.by_stream
            .get(&stream_id)?
            .iter()
            .find(|(segment, at)| at.elapsed() < KEEP_FOR && holds(segment, seq))
            .map(|(segment, _)| segment.clone())
    }

    fn insert(&mut self, segment: Arc<SegmentRecord>) {
        let size = segment.entries.len();
        if size > MAX_KEPT_SEGMENT_ENTRIES {
            return;
        }
        let known = self.by_stream.contains_key(&segment.stream_id);
        if self.entries + size > KEPT_ENTRIES || (!known && self.by_stream.len() >= KEPT_STREAMS) {
            self.drop_expired();
            if self.entries + size > KEPT_ENTRIES || self.by_stream.len() >= KEPT_STREAMS {
                self.by_stream.clear();
                self.entries = 0;
            }
        }
        // A fresh answer replaces what was kept of the same segment.
        let stream = self.by_stream.entry(segment.stream_id).or_default();
        let mut dropped = 0;
        stream.retain(|(other, _)| {
            let same = other.key == segment.key;
            if same {
                dropped += other.entries.len();
            }
            !same
        });
        if stream.len() >= KEPT_PER_STREAM {
            dropped += stream.remove(0).0.entries.len();
        }
        self.entries = self.entries - dropped + size;
        stream.push((segment, Instant::now()));
    }

    fn remove(&mut self, stream_id: u64, key: &str) {
        if let Some(stream) = self.by_stream.get_mut(&stream_id) {
            stream.retain(|(segment, _)| segment.key != key);
        }
        self.recount();
    }

    fn drop_expired(&mut self) {
        for stream in self.by_stream.values_mut() {
            stream.retain(|(_, at)| at.elapsed() < KEEP_FOR);
        }
        self.recount();
    }

    /// Recounts the entries kept, and drops streams left with none.
    fn recount(&mut self) {
        self.by_stream.retain(|_, stream| !stream.is_empty());
        self.entries = self
            .by_stream
            .values()
            .flatten()
            .map(|(segment, _)| segment.entries.len())
            .sum();
    }
}

#[cfg(test)]
mod tests {
    use time::OffsetDateTime;

    use super::*;
    use crate::segment::{segment_key, CompactionCommit, SegmentEntry};
    use crate::storage::metadata::create_basin_and_stream;
    use crate::storage::sql::SqlMetadataStore;
    use crate::wal::EntrySpan;

    /// A segment of `stream_id` with one one-record batch per position in `seqs`.
    fn segment(stream_id: u64, seqs: std::ops::Range<u64>) -> SegmentRecord {
        SegmentRecord {
            stream_id,
            key: segment_key(stream_id, seqs.start, 1),
            written_at_ms: 1,
            entries: seqs
                .map(|seq| SegmentEntry {
                    start_seq: seq,
                    end_seq: seq + 1,
                    last_timestamp: seq,
                    span: EntrySpan {
                        offset: seq * 10,
                        len: 10,
                    },
                })
                .collect(),
        }
    }

    /// A metadata store with a stream whose segments hold 0..10 and 10..20.
    async fn indexed() -> (Arc<SqlMetadataStore>, tempfile::TempDir, u64) {
        let (metadata, dir) = SqlMetadataStore::temporary().await;
        let now = OffsetDateTime::now_utc();
        let stream = create_basin_and_stream(&metadata, "segment-lookups", "s", now).await;
        let commit = CompactionCommit {
            segments: vec![segment(stream.id, 0..10), segment(stream.id, 10..20)],
            ..Default::default()
        };
        metadata.commit_compaction(&commit, now).await.unwrap();
        (Arc::new(metadata), dir, stream.id)
    }

    /// The 10,000 followers case in small: readers at many positions of one segment,
    /// asking at once, get one answer between them (one lookup made it: each lookup
    /// makes an answer of its own), and a position past it gets the next segment.
    #[tokio::test]
    async fn readers_of_one_segment_share_one_answer() {
        let (metadata, _dir, id) = indexed().await;
        let lookups = SegmentLookups::new(metadata);
        let answers =
            futures::future::join_all((0..100).map(|i| lookups.segment_at(id, i % 10))).await;
        let first = answers[0].as_ref().unwrap().clone().unwrap();
        assert_eq!((first.start_seq(), first.end_seq()), (0, 10));
        for answer in &answers {
            assert!(Arc::ptr_eq(
                answer.as_ref().unwrap().as_ref().unwrap(),
                &first
            ));
        }
        // Kept: a later reader gets the same answer without asking.
        let later = lookups.segment_at(id, 9).await.unwrap().unwrap();
        assert!(Arc::ptr_eq(&later, &first));
        let next = lookups.segment_at(id, 10).await.unwrap().unwrap();
        assert_eq!((next.start_seq(), next.end_seq()), (10, 20));
        assert!(lookups.segment_at(id, 20).await.unwrap().is_none());
    }

    /// A segment dropped from the index is still answered from what was kept, until a
    /// reader finds its object gone and has it forgotten; then the index answers again.
    #[tokio::test]
    async fn a_kept_segment_is_forgotten_when_found_gone() {
        let (metadata, _dir, id) = indexed().await;
        let lookups = SegmentLookups::new(metadata.clone());
        let kept = lookups.segment_at(id, 3).await.unwrap().unwrap();
        let now = OffsetDateTime::now_utc();
        assert_eq!(metadata.drop_segments(id, 10, 0, 10, now).await.unwrap(), 1);
        let again = lookups.segment_at(id, 3).await.unwrap().unwrap();
        assert!(Arc::ptr_eq(&again, &kept));
        lookups.forget(id, &kept.key);
        let fresh = lookups.segment_at(id, 3).await.unwrap().unwrap();
        assert_eq!(
            fresh.start_seq(),
            10,
            "the first segment after the dropped one"
        );
    }

    #[test]
    fn what_is_kept_stays_within_its_bounds() {
        let mut kept = Kept::default();
        // Many streams, a few segments each.
        for stream_id in 0..(3 * KEPT_STREAMS as u64) {
            for start in [0, 10, 20] {
                kept.insert(Arc::new(segment(stream_id, start..start + 10)));
                assert!(kept.by_stream.len() <= KEPT_STREAMS);
                assert!(kept.entries <= KEPT_ENTRIES);
            }
        }
        let per_stream = kept.by_stream.values().map(Vec::len).max().unwrap();
        assert_eq!(per_stream, KEPT_PER_STREAM);
        // The newest of a stream's segments are the ones kept.
        let last = 3 * KEPT_STREAMS as u64 - 1;
        assert!(kept.holding(last, 25).is_some());
        assert!(kept.holding(last, 5).is_none());
        // Large segments: the entries stay bounded, and one too large is not kept.
        for stream_id in 0..8 {
            kept.insert(Arc::new(segment(
                stream_id,
                0..MAX_KEPT_SEGMENT_ENTRIES as u64,
            )));
            assert!(kept.entries <= KEPT_ENTRIES);
        }
        kept.insert(Arc::new(segment(
            99,
            0..MAX_KEPT_SEGMENT_ENTRIES as u64 + 1,
        )));
        assert!(kept.holding(99, 0).is_none());
        // What the count says is what is there.
        let counted: usize = kept
            .by_stream
            .values()
            .flatten()
            .map(|(s, _)| s.entries.len())
            .sum();
        assert_eq!(kept.entries, counted);
    }
}
