//! [`SegmentLookups`]: segment index lookups shared by the readers of a stream.
//!
//! Why: when compaction moves a stream's newest records into a segment, every follower
//! still a little behind the tail must look up the segment its next records are now in,
//! all at the same moment. `tail_bench` with 10,000 followers saw bursts of hundreds of
//! these queries within 0.1 s, and in one run 3,500 of them queued on the metadata pool
//! at once: deliveries waited 3 s behind them, and the node's own lease renewal went
//! unanswered for 2 s.
//!
//! So lookups are shared two ways:
//!
//! - While one is in flight for a stream, the others for that stream wait for it, and
//!   take its answer when the segment it found holds the position they want. (One that
//!   wants a position elsewhere then asks on its own: a reader of history far from the
//!   others may wait for one lookup before its own.)
//! - A segment found is kept for `KEEP_FOR` (the newest few per stream, within a bound
//!   on the whole), and lookups of positions it holds are answered from it.
//!
//! A kept answer is as good as a fresh one, because of what can happen to a segment
//! meanwhile:
//!
//! - Trimmed, or expired by retention: its index row is dropped at once, but a reader
//!   says what its stream keeps now ([`Retained`]), and a kept segment outside that is not
//!   answered; the index is asked.
//! - Merged into a larger one: it stays readable, with the same records in the same
//!   batches, until its object is deleted at least `MIN_OBSOLETE_GRACE` after the merge,
//!   longer than it is kept.
//! - Gone all the same (an object missing): the read that finds it so asks the index
//!   itself (`RecordStore::vanished_segment`), which also forgets the kept copy.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::error::Result;
use crate::segment::SegmentRecord;
use crate::single_flight::SingleFlight;
use crate::storage::MetadataStore;
use crate::stream::Retained;

/// How long a segment found is kept.
const KEEP_FOR: Duration = Duration::from_secs(5);
// A segment kept after a merge made it obsolete must still be readable when answered.
const _: () = assert!(KEEP_FOR.as_millis() <= crate::engine::MIN_OBSOLETE_GRACE.as_millis());
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

    /// The stream's segment that holds `seq`, or else the first one after it, for a
    /// reader of a stream that keeps `retained`.
    pub async fn segment_at(
        &self,
        stream_id: u64,
        seq: u64,
        retained: Retained,
    ) -> Result<Option<Arc<SegmentRecord>>> {
        let kept = self
            .kept
            .lock()
            .holding(stream_id, seq, retained, Instant::now());
        if let Some(segment) = kept {
            return Ok(Some(segment));
        }
        match self
            .flights
            .run(stream_id, self.look_up(stream_id, seq))
            .await?
        {
            Found { asked, segment } if asked == seq => Ok(segment),
            Found {
                segment: Some(segment),
                ..
            } if holds(&segment, seq) => Ok(Some(segment)),
            // An answer for another position says nothing about this one.
            _ => Ok(self.look_up(stream_id, seq).await?.segment),
        }
    }

    /// Forgets a kept segment whose object turned out to be gone.
    pub fn forget(&self, stream_id: u64, key: &str) {
        self.kept.lock().remove(stream_id, key);
    }

    /// Asks the index, and keeps the segment found.
    fn look_up(&self, stream_id: u64, seq: u64) -> impl Future<Output = Result<Found>> + 'static {
        let (metadata, kept) = (self.metadata.clone(), self.kept.clone());
        async move {
            let segment = metadata.segment_at(stream_id, seq).await?.map(Arc::new);
            if let Some(segment) = &segment {
                kept.lock().insert(segment.clone(), Instant::now());
            }
            Ok(Found {
                asked: seq,
                segment,
            })
        }
    }
}

fn holds(segment: &SegmentRecord, seq: u64) -> bool {
    segment.start_seq() <= seq && seq < segment.end_seq()
}

impl Kept {
    fn holding(
        &self,
        stream_id: u64,
        seq: u64,
        retained: Retained,
        now: Instant,
    ) -> Option<Arc<SegmentRecord>> {
        self.by_stream
            .get(&stream_id)?
            .iter()
            .find(|(segment, at)| {
                now.duration_since(*at) < KEEP_FOR
                    && holds(segment, seq)
                    && !retained.excludes(segment.end_seq(), segment.written_at_ms)
            })
            .map(|(segment, _)| segment.clone())
    }

    fn insert(&mut self, segment: Arc<SegmentRecord>, now: Instant) {
        let size = segment.entries.len();
        if size > MAX_KEPT_SEGMENT_ENTRIES {
            return;
        }
        let known = self.by_stream.contains_key(&segment.stream_id);
        let full = |kept: &Kept| {
            kept.entries + size > KEPT_ENTRIES || (!known && kept.by_stream.len() >= KEPT_STREAMS)
        };
        if full(self) {
            self.drop_expired(now);
            if full(self) {
                self.by_stream.clear();
                self.entries = 0;
            }
        }
        // A fresh answer replaces what was kept of the same segment.
        let stream = self.by_stream.entry(segment.stream_id).or_default();
        let mut dropped = take_out(stream, &segment.key);
        if stream.len() >= KEPT_PER_STREAM {
            dropped += stream.remove(0).0.entries.len();
        }
        self.entries = self.entries - dropped + size;
        stream.push((segment, now));
    }

    fn remove(&mut self, stream_id: u64, key: &str) {
        let Some(stream) = self.by_stream.get_mut(&stream_id) else {
            return;
        };
        let dropped = take_out(stream, key);
        if stream.is_empty() {
            self.by_stream.remove(&stream_id);
        }
        self.entries -= dropped;
    }

    fn drop_expired(&mut self, now: Instant) {
        self.by_stream.retain(|_, stream| {
            stream.retain(|(_, at)| now.duration_since(*at) < KEEP_FOR);
            !stream.is_empty()
        });
        self.entries = self
            .by_stream
            .values()
            .flatten()
            .map(|(segment, _)| segment.entries.len())
            .sum();
    }
}

/// Takes the segment `key` out of a stream's kept ones; the index entries it had.
fn take_out(stream: &mut Vec<(Arc<SegmentRecord>, Instant)>, key: &str) -> usize {
    match stream.iter().position(|(segment, _)| segment.key == key) {
        Some(at) => stream.remove(at).0.entries.len(),
        None => 0,
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
        let keeps_all = Retained::default();
        let answers =
            futures::future::join_all((0..100).map(|i| lookups.segment_at(id, i % 10, keeps_all)))
                .await;
        let first = answers[0].as_ref().unwrap().clone().unwrap();
        assert_eq!((first.start_seq(), first.end_seq()), (0, 10));
        for answer in &answers {
            assert!(Arc::ptr_eq(
                answer.as_ref().unwrap().as_ref().unwrap(),
                &first
            ));
        }
        // Kept: a later reader gets the same answer without asking.
        let later = lookups.segment_at(id, 9, keeps_all).await.unwrap().unwrap();
        assert!(Arc::ptr_eq(&later, &first));
        let next = lookups
            .segment_at(id, 10, keeps_all)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((next.start_seq(), next.end_seq()), (10, 20));
        assert!(lookups
            .segment_at(id, 20, keeps_all)
            .await
            .unwrap()
            .is_none());
    }

    /// Readers asking at once for positions in different segments: the one whose
    /// position the shared answer does not hold gets its own.
    #[tokio::test]
    async fn a_reader_elsewhere_gets_its_own_answer() {
        let (metadata, _dir, id) = indexed().await;
        let lookups = SegmentLookups::new(metadata);
        let keeps_all = Retained::default();
        let (low, high) = futures::join!(
            lookups.segment_at(id, 5, keeps_all),
            lookups.segment_at(id, 15, keeps_all)
        );
        assert_eq!(low.unwrap().unwrap().start_seq(), 0);
        assert_eq!(high.unwrap().unwrap().start_seq(), 10);
    }

    /// A segment trimmed or expired away is dropped from the index at once; what was
    /// kept of it is not answered to a reader whose stream no longer keeps it.
    #[tokio::test]
    async fn a_kept_segment_the_stream_no_longer_keeps_is_not_answered() {
        let (metadata, _dir, id) = indexed().await;
        let lookups = SegmentLookups::new(metadata.clone());
        let kept = lookups
            .segment_at(id, 3, Retained::default())
            .await
            .unwrap()
            .unwrap();
        let now = OffsetDateTime::now_utc();
        assert_eq!(metadata.drop_segments(id, 10, 0, 10, now).await.unwrap(), 1);
        // Trimmed to 10: the index is asked, and has the next segment.
        let trimmed = Retained {
            trim_point: 10,
            written_since_ms: 0,
        };
        let fresh = lookups.segment_at(id, 3, trimmed).await.unwrap().unwrap();
        assert_eq!(fresh.start_seq(), 10);
        // Expired by age (the segment was written at 1 ms): likewise.
        let expired = Retained {
            trim_point: 0,
            written_since_ms: 2,
        };
        let fresh = lookups.segment_at(id, 3, expired).await.unwrap().unwrap();
        assert_eq!(fresh.start_seq(), 10);
        // A reader that says it keeps everything is still answered from what was kept:
        // the bound is what tells a dropped segment from a live one.
        let again = lookups
            .segment_at(id, 3, Retained::default())
            .await
            .unwrap()
            .unwrap();
        assert!(Arc::ptr_eq(&again, &kept));
    }

    /// A kept segment found gone is forgotten: the next lookup asks the index.
    #[tokio::test]
    async fn a_forgotten_segment_is_looked_up_afresh() {
        let (metadata, _dir, id) = indexed().await;
        let lookups = SegmentLookups::new(metadata);
        let kept = lookups
            .segment_at(id, 3, Retained::default())
            .await
            .unwrap()
            .unwrap();
        lookups.forget(id, &kept.key);
        let fresh = lookups
            .segment_at(id, 3, Retained::default())
            .await
            .unwrap()
            .unwrap();
        assert!(!Arc::ptr_eq(&fresh, &kept));
        assert_eq!(*fresh, *kept);
    }

    #[test]
    fn a_segment_is_kept_for_a_while() {
        let mut kept = Kept::default();
        let found_at = Instant::now();
        kept.insert(Arc::new(segment(1, 0..10)), found_at);
        kept.insert(Arc::new(segment(2, 0..10)), found_at + KEEP_FOR / 2);
        let keeps_all = Retained::default();
        assert!(kept
            .holding(1, 5, keeps_all, found_at + KEEP_FOR / 2)
            .is_some());
        assert!(kept.holding(1, 5, keeps_all, found_at + KEEP_FOR).is_none());
        // Dropping the expired ones keeps the others, and the count of entries.
        kept.drop_expired(found_at + KEEP_FOR);
        assert!(!kept.by_stream.contains_key(&1));
        assert!(kept.holding(2, 5, keeps_all, found_at + KEEP_FOR).is_some());
        assert_eq!(kept.entries, 10);
    }

    #[test]
    fn what_is_kept_stays_within_its_bounds() {
        let mut kept = Kept::default();
        let now = Instant::now();
        let keeps_all = Retained::default();
        // Many streams, a few segments each.
        for stream_id in 0..(3 * KEPT_STREAMS as u64) {
            for start in [0, 10, 20] {
                kept.insert(Arc::new(segment(stream_id, start..start + 10)), now);
                assert!(kept.by_stream.len() <= KEPT_STREAMS);
                assert!(kept.entries <= KEPT_ENTRIES);
            }
        }
        let per_stream = kept.by_stream.values().map(Vec::len).max().unwrap();
        assert_eq!(per_stream, KEPT_PER_STREAM);
        // The newest of a stream's segments are the ones kept.
        let last = 3 * KEPT_STREAMS as u64 - 1;
        assert!(kept.holding(last, 25, keeps_all, now).is_some());
        assert!(kept.holding(last, 5, keeps_all, now).is_none());
        // With the streams at their bound, a stream already kept is added to, not
        // everything dropped.
        while kept.by_stream.len() < KEPT_STREAMS {
            let next = 10 * KEPT_STREAMS as u64 + kept.by_stream.len() as u64;
            kept.insert(Arc::new(segment(next, 0..1)), now);
        }
        kept.insert(Arc::new(segment(last, 30..40)), now);
        assert_eq!(kept.by_stream.len(), KEPT_STREAMS);
        // Large segments: the entries stay bounded, and one too large is not kept.
        for stream_id in 0..8 {
            kept.insert(
                Arc::new(segment(stream_id, 0..MAX_KEPT_SEGMENT_ENTRIES as u64)),
                now,
            );
            assert!(kept.entries <= KEPT_ENTRIES);
        }
        kept.insert(
            Arc::new(segment(99, 0..MAX_KEPT_SEGMENT_ENTRIES as u64 + 1)),
            now,
        );
        assert!(kept.holding(99, 0, keeps_all, now).is_none());
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
