//! Merging of small segments. Compaction gives a stream one segment per round with
//! records in it, so a stream appending a little at a time collects thousands of small
//! segments a day (one every 30 s), and a read of its history would fetch each one.
//! After each round the compactor merges the newest run of a stream's small segments
//! into one object, like a counter in base [`GROWTH`]: four segments of one round become
//! one of four rounds, four of those one of sixteen, and so on until a segment is
//! [closed](CLOSED_PERCENT). A record is so rewritten a few times at most (once per
//! step of growth while its segment is small, and once when it closes), and only
//! records of slow streams are: a stream that fills segments in one round never merges.
//!
//! The bound this gives (checked by `a_day_of_one_append_a_second_reads_in_a_few_dozen_gets`):
//! a day of a stream appending once a second, compacted every 30 s, ends in at most 40
//! segments, so a read of the whole day costs at most 40 object reads (not 2,880).
//!
//! A merge writes a new object (its key names the range it covers), then replaces the
//! merged index rows with one row in a single metadata transaction, which checks that
//! the rows are still the ones merged (retention, or a node that took the stream over,
//! may have changed them meanwhile) and that this node still holds the stream. The old
//! objects become obsolete and are deleted after the same grace as compacted chunks, so
//! reads already under way finish (and a read that comes later finds the batch in the
//! merged segment). A crash before the commit, or a commit whose outcome is unknown,
//! leaves the new object behind unindexed: nothing reads it, and it goes with its stream.
//!
//! Merges run after the round, outside the compaction state lock, at most
//! [`MAX_MERGES_PER_ROUND`] per round; streams whose merge had to wait go first in the
//! next round, whether or not they got new records.

use std::collections::{BTreeSet, HashMap};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;

use crate::crash_point::crash_point;
use crate::error::{Error, Result};
use crate::segment::{
    is_merged_segment_key, merged_segment_key, SegmentEntry, SegmentRecord, MAX_SEGMENT_BYTES,
    MAX_SEGMENT_ENTRIES,
};
use crate::storage::{MetadataStore, ObjectStore};
use crate::wal::{ChunkBuilder, CHUNK_HEADER_BYTES};

/// A run of segments merges only into one at least this many times larger than the
/// largest of them (or into a closed one): each record is rewritten at most about
/// log4(4096) = 6 times while its segment grows.
const GROWTH: u64 = 4;
/// A segment filled to this share of either limit (bytes or entries) is closed: it is
/// never merged again. A merge may close a segment with any run that fits.
const CLOSED_PERCENT: u64 = 75;
/// A merge never makes a segment whose writes (by compaction) lie further apart than
/// this. Retention ages a segment by its newest write, so a merged segment keeps its
/// oldest records up to this much longer than their age alone would.
pub const MAX_MERGE_SPAN_MS: u64 = 60 * 60 * 1000;
/// How many of a stream's newest segments the policy looks at.
const WINDOW: usize = 32;
/// Bytes and merges at most per compaction round; the rest waits for the next one.
const MAX_BYTES_PER_ROUND: u64 = 64 * 1024 * 1024;
pub const MAX_MERGES_PER_ROUND: usize = 32;
/// Streams whose open segments are remembered between rounds (up to a few KiB each: a
/// slow stream has a dozen or two open segments); past this the memory is cleared and
/// rebuilt from the index as streams are compacted again.
const MAX_REMEMBERED_STREAMS: usize = 50_000;

/// What the merge policy needs to know of a segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SegmentSummary {
    pub key: String,
    pub start_seq: u64,
    pub end_seq: u64,
    pub entries: u64,
    pub bytes: u64,
    /// When compaction wrote its newest part (what retention goes by).
    pub written_at_ms: u64,
    /// No later than when compaction wrote its oldest part.
    pub oldest_written_at_ms: u64,
}

impl SegmentSummary {
    /// A segment one round of compaction wrote.
    fn written(record: &SegmentRecord) -> Self {
        SegmentSummary {
            key: record.key.clone(),
            start_seq: record.start_seq(),
            end_seq: record.end_seq(),
            entries: record.entries.len() as u64,
            bytes: record.stored_bytes(),
            written_at_ms: record.written_at_ms,
            oldest_written_at_ms: record.written_at_ms,
        }
    }

    /// Consecutive segments as the index has them. The index keeps only a segment's
    /// newest write; for a merged one, the write of the segment before it bounds its
    /// oldest from below (its first records were compacted after those). The first one
    /// read, if merged, gets 0: it merges with nothing until it is closed or older
    /// than the span.
    fn indexed(records: &[SegmentRecord]) -> Vec<Self> {
        let mut previous_write = 0;
        records
            .iter()
            .map(|record| {
                let mut summary = SegmentSummary::written(record);
                if is_merged_segment_key(&record.key) {
                    summary.oldest_written_at_ms = previous_write;
                }
                previous_write = record.written_at_ms;
                summary
            })
            .collect()
    }

    /// The segment that merging `run` makes, under `key`.
    fn merged(key: String, run: &[SegmentSummary]) -> Self {
        SegmentSummary {
            key,
            start_seq: run[0].start_seq,
            end_seq: run[run.len() - 1].end_seq,
            entries: run.iter().map(|s| s.entries).sum(),
            bytes: run.iter().map(|s| s.bytes).sum(),
            written_at_ms: run
                .iter()
                .map(|s| s.written_at_ms)
                .max()
                .unwrap_or_default(),
            oldest_written_at_ms: run
                .iter()
                .map(|s| s.oldest_written_at_ms)
                .min()
                .unwrap_or_default(),
        }
    }
}

/// How full a segment of `entries` and `bytes` is, on a scale where [`FULL`] is a
/// segment at either limit.
fn fill(entries: u64, bytes: u64) -> u64 {
    (entries * MAX_SEGMENT_BYTES as u64).max(bytes * MAX_SEGMENT_ENTRIES as u64)
}

const FULL: u64 = MAX_SEGMENT_BYTES as u64 * MAX_SEGMENT_ENTRIES as u64;

fn is_closed(segment: &SegmentSummary) -> bool {
    fill(segment.entries, segment.bytes) * 100 >= FULL * CLOSED_PERCENT
}

/// Which of a stream's newest segments (`tail`, in sequence order) to merge now, if any:
/// the longest run at the end of `tail`, after its last closed segment, that is worth
/// merging (see [`worth_merging`]).
pub(crate) fn plan_merge(tail: &[SegmentSummary]) -> Option<Range<usize>> {
    let open_from = tail.iter().rposition(is_closed).map_or(0, |i| i + 1);
    (open_from..tail.len().saturating_sub(1))
        .find(|start| worth_merging(&tail[*start..]))
        .map(|start| start..tail.len())
}

/// Whether `run` (two or more segments) should become one: contiguous, fits in one
/// segment, written within [`MAX_MERGE_SPAN_MS`], and either [`GROWTH`] times its largest
/// member or closed.
fn worth_merging(run: &[SegmentSummary]) -> bool {
    let contiguous = run.windows(2).all(|w| w[0].end_seq == w[1].start_seq);
    let entries: u64 = run.iter().map(|s| s.entries).sum();
    let bytes: u64 = run.iter().map(|s| s.bytes).sum();
    let fits = entries <= MAX_SEGMENT_ENTRIES as u64
        && bytes + CHUNK_HEADER_BYTES as u64 <= MAX_SEGMENT_BYTES as u64;
    let newest = run
        .iter()
        .map(|s| s.written_at_ms)
        .max()
        .unwrap_or_default();
    let oldest = run
        .iter()
        .map(|s| s.oldest_written_at_ms)
        .min()
        .unwrap_or_default();
    let span = newest.saturating_sub(oldest);
    if run.len() < 2 || !contiguous || !fits || span > MAX_MERGE_SPAN_MS {
        return false;
    }
    let total = fill(entries, bytes);
    let largest = run.iter().map(|s| fill(s.entries, s.bytes)).max();
    largest.is_some_and(|largest| largest * GROWTH <= total) || total * 100 >= FULL * CLOSED_PERCENT
}

/// What the merger remembers of a stream: where its segments ended, and its open ones.
struct KnownTail {
    end_seq: u64,
    open: Vec<SegmentSummary>,
}

/// Merges segments after compaction rounds; remembers each stream's open segments so
/// that deciding whether to merge costs no index lookup for streams it has seen.
pub(crate) struct SegmentMerger {
    metadata: Arc<dyn MetadataStore>,
    objects: Arc<dyn ObjectStore>,
    epoch: u64,
    /// Per stream, where its segments ended when last seen, and those that may still
    /// merge (after its last closed one).
    tails: HashMap<u64, KnownTail>,
    /// Streams with a merge that waited for a later round (the round's budget was spent).
    deferred: BTreeSet<u64>,
}

impl SegmentMerger {
    pub fn new(
        metadata: Arc<dyn MetadataStore>,
        objects: Arc<dyn ObjectStore>,
        epoch: u64,
    ) -> Self {
        Self {
            metadata,
            objects,
            epoch,
            tails: HashMap::new(),
            deferred: BTreeSet::new(),
        }
    }

    /// After a round committed `written` (new segments, in order per stream): merges
    /// what the policy picks for the streams whose merges waited, then for each stream
    /// the segments belong to, within the round's budget; merged-away objects may be
    /// deleted `grace` after their merge. How many merges were committed. A merge that
    /// fails is logged and left for a later round; it never fails the compaction.
    pub async fn after_round(&mut self, written: &[SegmentRecord], grace: Duration) -> usize {
        if self.tails.len() > MAX_REMEMBERED_STREAMS {
            self.tails.clear();
            self.deferred.clear();
        }
        let mut fresh: Vec<(u64, Vec<SegmentSummary>)> = Vec::new();
        for record in written {
            match fresh.last_mut() {
                Some((id, new)) if *id == record.stream_id => {
                    new.push(SegmentSummary::written(record))
                }
                _ => fresh.push((record.stream_id, vec![SegmentSummary::written(record)])),
            }
        }
        // Streams whose merge waited go first (those with new segments go with them).
        let fresh_ids: BTreeSet<u64> = fresh.iter().map(|(id, _)| *id).collect();
        let waited = std::mem::take(&mut self.deferred)
            .into_iter()
            .filter(|id| !fresh_ids.contains(id))
            .map(|id| (id, Vec::new()));
        let candidates: Vec<(u64, Vec<SegmentSummary>)> = waited.chain(fresh).collect();
        let mut budget = MAX_BYTES_PER_ROUND;
        let mut merges = 0;
        for (stream_id, new) in candidates {
            if new.last().is_some_and(is_closed) {
                // Nothing before a closed segment merges: no need to look.
                self.remember(stream_id, new);
                continue;
            }
            let tail = match self.tail_with(stream_id, new).await {
                Ok(tail) => tail,
                Err(err) => {
                    tracing::warn!(stream_id, error = %err, "could not look up a stream's segments to merge them; will retry");
                    continue;
                }
            };
            let Some(range) = plan_merge(&tail) else {
                self.remember(stream_id, tail);
                continue;
            };
            let run = &tail[range.clone()];
            let bytes: u64 = run.iter().map(|s| s.bytes).sum();
            if bytes > budget || merges == MAX_MERGES_PER_ROUND {
                self.deferred.insert(stream_id);
                self.remember(stream_id, tail);
                continue;
            }
            budget -= bytes;
            match self.merge(stream_id, run, grace).await {
                Ok(Some(merged)) => {
                    let mut tail = tail;
                    tail.splice(range, [merged]);
                    self.remember(stream_id, tail);
                    merges += 1;
                }
                Ok(None) => {} // the index changed meanwhile: looked up afresh next time
                Err(err) => {
                    tracing::warn!(stream_id, error = %err, "merging small segments failed; will retry");
                }
            }
        }
        merges
    }

    /// Keeps the part of a stream's newest segments that may still merge: what follows
    /// its last closed segment.
    fn remember(&mut self, stream_id: u64, mut tail: Vec<SegmentSummary>) {
        let Some(end_seq) = tail.last().map(|s| s.end_seq) else {
            return;
        };
        let open_from = tail.iter().rposition(is_closed).map_or(0, |i| i + 1);
        tail.drain(..open_from);
        let known = KnownTail {
            end_seq,
            open: tail,
        };
        self.tails.insert(stream_id, known);
    }

    /// The stream's newest segments, ending with `new` (just committed; none for a
    /// stream whose merge waited): from memory when they continue it, else from the
    /// index.
    async fn tail_with(
        &mut self,
        stream_id: u64,
        new: Vec<SegmentSummary>,
    ) -> Result<Vec<SegmentSummary>> {
        let continues =
            |known: &KnownTail| new.first().is_none_or(|s| s.start_seq == known.end_seq);
        let mut tail = match self.tails.remove(&stream_id) {
            Some(known) if continues(&known) => {
                let mut tail = known.open;
                tail.extend(new);
                tail
            }
            _ => {
                // One more than the window: the first only bounds the next one's age.
                let records = self.metadata.newest_segments(stream_id, WINDOW + 1).await?;
                let mut tail = SegmentSummary::indexed(&records);
                tail.drain(..tail.len().saturating_sub(WINDOW));
                tail
            }
        };
        let excess = tail.len().saturating_sub(WINDOW);
        tail.drain(..excess);
        Ok(tail)
    }

    /// Writes the merge of `run` and swaps it into the index; the merged segment, or
    /// `None` if the index no longer holds exactly `run` (nothing changed then).
    async fn merge(
        &self,
        stream_id: u64,
        run: &[SegmentSummary],
        grace: Duration,
    ) -> Result<Option<SegmentSummary>> {
        let (start_seq, end_seq) = (run[0].start_seq, run[run.len() - 1].end_seq);
        let entries: u64 = run.iter().map(|s| s.entries).sum();
        let bytes: u64 = run.iter().map(|s| s.bytes).sum();
        let mut builder = ChunkBuilder::with_capacity(bytes as usize);
        let mut index: Vec<SegmentEntry> = Vec::with_capacity(entries as usize);
        for member in run {
            let Some(record) = self
                .metadata
                .segment_at(stream_id, member.start_seq)
                .await?
            else {
                return Ok(None);
            };
            if record.key != member.key {
                return Ok(None);
            }
            let object = self.objects.get(&record.key).await?.ok_or_else(|| {
                Error::storage(format!("segment `{}` is indexed but missing", record.key))
            })?;
            for entry in &record.entries {
                let span = builder.push_encoded(&entry.span.cut(&record.key, &object)?);
                index.push(SegmentEntry { span, ..*entry });
            }
        }
        let merged = SegmentRecord {
            stream_id,
            key: merged_segment_key(stream_id, start_seq, end_seq, self.epoch),
            written_at_ms: run
                .iter()
                .map(|s| s.written_at_ms)
                .max()
                .unwrap_or_default(),
            entries: index,
        };
        let (object, _) = builder.finish();
        self.objects.put(&merged.key, object).await?;
        crash_point("merge:written");
        let replaced: Vec<String> = run.iter().map(|s| s.key.clone()).collect();
        let obsolete_after = OffsetDateTime::now_utc() + grace;
        let committed = self
            .metadata
            .merge_segments(&merged, &replaced, Some(self.epoch), obsolete_after)
            .await?;
        if !committed {
            // Never indexed: no reader can know of it.
            if let Err(err) = self.objects.delete(&merged.key).await {
                tracing::debug!(key = %merged.key, error = %err, "could not remove an unused merged segment");
            }
            return Ok(None);
        }
        crash_point("merge:committed");
        tracing::debug!(
            stream_id,
            start_seq,
            end_seq,
            segments = run.len(),
            "merged small segments"
        );
        Ok(Some(SegmentSummary::merged(merged.key, run)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(start_seq: u64, entries: u64, bytes: u64, written_at_ms: u64) -> SegmentSummary {
        SegmentSummary {
            key: format!("s{start_seq}"),
            start_seq,
            end_seq: start_seq + entries,
            entries,
            bytes,
            written_at_ms,
            oldest_written_at_ms: written_at_ms,
        }
    }

    /// Applies the policy as the compactor does: after each round's new segment, at most
    /// one merge. Returns the final segments and the bytes rewritten by merges.
    fn simulate(
        rounds: u64,
        entries_per_round: u64,
        entry_bytes: u64,
        round_ms: u64,
    ) -> (Vec<SegmentSummary>, u64) {
        let mut tail: Vec<SegmentSummary> = Vec::new();
        let mut rewritten = 0;
        let mut next_seq = 0;
        for round in 0..rounds {
            tail.push(segment(
                next_seq,
                entries_per_round,
                entries_per_round * entry_bytes,
                round * round_ms,
            ));
            next_seq += entries_per_round;
            // Only the newest WINDOW are looked at, as in the merger.
            let window_from = tail.len().saturating_sub(WINDOW);
            if let Some(range) = plan_merge(&tail[window_from..]) {
                let range = range.start + window_from..range.end + window_from;
                let run = &tail[range.clone()];
                let merged = SegmentSummary::merged(format!("m{}", run[0].start_seq), run);
                rewritten += merged.bytes;
                tail.splice(range, [merged]);
            }
        }
        (tail, rewritten)
    }

    #[test]
    fn a_day_of_one_append_a_second_reads_in_a_few_dozen_gets() {
        // One 100-byte append a second, a round every 30 s: 2,880 rounds a day.
        let (segments, rewritten) = simulate(2880, 30, 120, 30_000);
        let written = 2880 * 30 * 120;
        assert!(segments.len() <= 40, "{} segments", segments.len());
        eprintln!(
            "a day: {} segments, {rewritten} bytes rewritten of {written}",
            segments.len()
        );
        assert!(
            rewritten <= 6 * written,
            "rewrote {rewritten} of {written} bytes"
        );
        assert_eq!(segments.iter().map(|s| s.entries).sum::<u64>(), 2880 * 30);
        assert!(segments.windows(2).all(|w| w[0].end_seq == w[1].start_seq));
    }

    #[test]
    fn a_slow_stream_merges_only_within_the_span_limit() {
        // One append every 30 s, one entry a round: merged segments hold at most an
        // hour of writes (120 rounds), so retention keeps records at most an hour longer.
        let (segments, _) = simulate(2880, 1, 120, 30_000);
        assert!(segments.len() <= 60, "{} segments", segments.len());
        for s in &segments {
            assert!(s.entries <= 121, "{s:?} spans more than an hour");
        }
    }

    #[test]
    fn merged_segments_never_span_more_than_an_hour_of_writes() {
        // 20 batches a round: merged segments chain (a merged one merges again), and
        // the span counts from the oldest part of each.
        for per_round in [1, 7, 20, 30, 100] {
            let (segments, _) = simulate(2880, per_round, 120, 30_000);
            for s in &segments {
                let span = s.written_at_ms - s.oldest_written_at_ms;
                assert!(span <= MAX_MERGE_SPAN_MS, "{per_round} a round: {s:?}");
            }
        }
    }

    #[test]
    fn a_merged_segment_read_from_the_index_is_no_older_than_the_one_before_it() {
        let record = |key: String, start: u64, written_at_ms: u64| SegmentRecord {
            stream_id: 7,
            key,
            written_at_ms,
            entries: vec![SegmentEntry {
                start_seq: start,
                end_seq: start + 1,
                last_timestamp: 0,
                span: crate::wal::EntrySpan { offset: 8, len: 10 },
            }],
        };
        let indexed = SegmentSummary::indexed(&[
            record(merged_segment_key(7, 0, 1, 1), 0, 100),
            record(crate::segment::segment_key(7, 1, 1), 1, 200),
            record(merged_segment_key(7, 2, 3, 1), 2, 900),
        ]);
        let oldest: Vec<u64> = indexed.iter().map(|s| s.oldest_written_at_ms).collect();
        assert_eq!(oldest, [0, 200, 200]);
    }

    #[test]
    fn streams_that_fill_segments_are_never_merged() {
        // 6 MiB a round: each segment is closed as it is written.
        let (segments, rewritten) = simulate(100, 1000, 6 * 1024, 30_000);
        assert_eq!(segments.len(), 100);
        assert_eq!(rewritten, 0);
        // Half-full ones merge only by closing: two 3 MiB segments make one 6 MiB one.
        let (segments, rewritten) = simulate(100, 512, 6 * 1024, 30_000);
        assert_eq!(segments.len(), 50);
        assert_eq!(rewritten, 100 * 512 * 6 * 1024);
    }

    #[test]
    fn runs_that_would_not_fit_or_are_not_contiguous_are_left_alone() {
        let big = MAX_SEGMENT_BYTES as u64 / 2;
        assert_eq!(
            plan_merge(&[segment(0, 1, big, 0), segment(1, 1, big, 0)]),
            None
        );
        let gap = [segment(0, 10, 100, 0), segment(11, 10, 100, 0)];
        assert_eq!(plan_merge(&gap), None);
        let small: Vec<_> = (0..4).map(|i| segment(i * 10, 10, 100, 0)).collect();
        assert_eq!(plan_merge(&small), Some(0..4));
        assert_eq!(plan_merge(&small[..1]), None);
    }
}
