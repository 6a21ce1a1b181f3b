//! Lifecycle: the background work that keeps storage bounded. Each pass
//! - drops the segments of every live stream that lie below its trim point or whose
//!   records are all older than its retention age (readers skip what is gone at once);
//! - deletes streams with `delete_on_empty` that have been empty for `min_age_secs`;
//! - finishes the deletion of streams and basins: segments first, then the rows;
//! - deletes obsolete objects (compacted WAL chunks, dropped segments) once their grace
//!   period has passed.
//!
//! Every step is a metadata transaction of bounded size that records what is left to do,
//! so a crash anywhere leaves work that the next pass, after a restart too, picks up.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt, TryStreamExt};
use time::OffsetDateTime;

use crate::catalog::Catalog;
use crate::compaction::Compactor;
use crate::error::Result;
use crate::names::BasinName;
use crate::segment::segment_prefix;
use crate::storage::metadata::ListRange;
use crate::storage::{MetadataStore, ObjectStore};
use crate::stream::StreamState;

/// Segment rows removed per metadata transaction.
const SEGMENTS_PER_STEP: usize = 100;
/// Obsolete objects deleted per step.
const OBJECTS_PER_STEP: usize = 1000;
/// Steps of segment drops per stream in one pass.
const STEPS_PER_PASS: usize = 10;
/// Object deletions in flight at once.
const PARALLEL_DELETES: usize = 16;

/// The lifecycle task's view of the server: what it reads and changes, and its own
/// state (when each stream was first seen empty).
pub(crate) struct Lifecycle {
    metadata: Arc<dyn MetadataStore>,
    objects: Arc<dyn ObjectStore>,
    catalog: Arc<Catalog>,
    compactor: Arc<Compactor>,
    /// How long objects made obsolete stay: reads that found them just before stay able
    /// to finish.
    obsolete_grace: Duration,
    /// How long one pass may go on deleting obsolete objects while more are due.
    deletion_budget: Duration,
    /// When each stream was first seen empty, for delete-on-empty.
    empty_since: Mutex<HashMap<u64, Instant>>,
    /// Each stream's oldest segment as last read (see `oldest_segment`).
    oldest: Mutex<HashMap<u64, OldestSegment>>,
}

#[derive(Debug, Clone, Copy)]
enum OldestSegment {
    /// Ends at this sequence number; written at this time (ms).
    At(u64, u64),
    /// None, while the stream's records in segments end here.
    NoneUpTo(u64),
}

impl Lifecycle {
    pub fn new(
        metadata: Arc<dyn MetadataStore>,
        objects: Arc<dyn ObjectStore>,
        catalog: Arc<Catalog>,
        compactor: Arc<Compactor>,
        obsolete_grace: Duration,
        deletion_budget: Duration,
    ) -> Self {
        Self {
            metadata,
            objects,
            catalog,
            compactor,
            obsolete_grace,
            deletion_budget,
            empty_since: Mutex::default(),
            oldest: Mutex::default(),
        }
    }

    /// One lifecycle pass (the background task runs one every `reap_interval`). Every
    /// node bounds the streams it sequences; the work that is the cluster's, not any
    /// stream's (finishing deletions, deleting obsolete objects and the logs of gone
    /// nodes), runs on one node, the `leader`, so it is done once.
    pub async fn run_pass(&self, leader: Option<Duration>) -> Result<()> {
        self.apply_retention_and_trim().await?;
        if let Some(lease) = leader {
            self.finish_deletions().await?;
            self.retire_dead_logs(lease).await?;
            self.delete_obsolete_objects().await?;
        }
        Ok(())
    }

    /// Records objects as obsolete: deleted once their grace period has passed.
    pub async fn retire_objects(&self, keys: Vec<String>) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let commit = crate::segment::CompactionCommit {
            obsolete_objects: keys,
            ..Default::default()
        };
        self.metadata
            .commit_compaction(&commit, self.obsolete_after())
            .await
    }

    /// The logs of nodes gone for a while (`lease` several times over) whose streams
    /// all live in other logs now: their chunks become obsolete, then the node is
    /// forgotten.
    async fn retire_dead_logs(&self, lease: Duration) -> Result<()> {
        let dead_for = (lease * 6).as_millis() as u64;
        for epoch in self.metadata.dead_logs(dead_for).await? {
            let chunks = crate::wal::recovery::chunks_of(self.objects.as_ref(), &[epoch]).await?;
            let count = chunks.len();
            self.retire_objects(chunks).await?;
            self.metadata.forget_node(epoch).await?;
            tracing::info!(
                epoch,
                chunks = count,
                "deleting the log of a node that is gone; every stream it had is served elsewhere"
            );
        }
        Ok(())
    }

    fn obsolete_after(&self) -> OffsetDateTime {
        OffsetDateTime::now_utc() + self.obsolete_grace
    }

    /// Every live stream in turn; one stream's failure is logged and the others go on.
    async fn apply_retention_and_trim(&self) -> Result<()> {
        for (basin, stream) in self.catalog.live_streams() {
            if let Err(err) = self.bound_stream(&basin, &stream).await {
                tracing::warn!(basin = %basin, stream = %stream.name, error = %err,
                    "retention, trim or delete-on-empty failed for this stream; will retry");
            }
        }
        Ok(())
    }

    /// Retention, trim and delete-on-empty for one stream.
    async fn bound_stream(&self, basin: &BasinName, stream: &Arc<StreamState>) -> Result<()> {
        let config = stream.config();
        let retained = stream.retained();
        let compacted = stream.visible().compacted;
        // Only the oldest segment is looked at unless there is something to drop.
        let first = self.oldest_segment(stream.id, compacted.seq_num).await?;
        if first.is_some_and(|(end_seq, written_at_ms)| retained.excludes(end_seq, written_at_ms)) {
            self.oldest.lock().remove(&stream.id);
            self.drop_segments_in_steps(stream.id, retained.trim_point, retained.written_since_ms)
                .await?;
        }
        let min_age = config.delete_on_empty.map_or(0, |d| d.min_age_secs);
        if min_age > 0 {
            self.delete_if_empty_long_enough(basin, stream, Duration::from_secs(min_age))
                .await?;
        }
        Ok(())
    }

    /// A stream's oldest segment (where it ends, when it was written), as last read from
    /// the index: it changes only when this node drops segments (which forgets it), when
    /// a merge folds it into a later-written one (the remembered one then expires early:
    /// one drop finds nothing and forgets it) or, for a stream without segments, when
    /// compaction moves `compacted` on. So a pass
    /// reads the index for a stream only when something may have changed, and the
    /// metadata load does not grow with the number of streams.
    async fn oldest_segment(&self, stream_id: u64, compacted: u64) -> Result<Option<(u64, u64)>> {
        if compacted == 0 {
            return Ok(None);
        }
        let known = self.oldest.lock().get(&stream_id).copied();
        match known {
            Some(OldestSegment::At(end_seq, written_at_ms)) => {
                return Ok(Some((end_seq, written_at_ms)))
            }
            Some(OldestSegment::NoneUpTo(seen)) if seen == compacted => return Ok(None),
            _ => {}
        }
        let found = self.metadata.segment_at(stream_id, 0).await?;
        let entry = match &found {
            Some(segment) => OldestSegment::At(segment.end_seq(), segment.written_at_ms),
            None => OldestSegment::NoneUpTo(compacted),
        };
        self.oldest.lock().insert(stream_id, entry);
        Ok(found.map(|segment| (segment.end_seq(), segment.written_at_ms)))
    }

    /// Drops a stream's segments below `trim_point` or written before
    /// `written_before_ms`, a bounded step at a time, for at most one pass's worth of
    /// steps; whether none is left to drop.
    async fn drop_segments_in_steps(
        &self,
        stream_id: u64,
        trim_point: u64,
        written_before_ms: u64,
    ) -> Result<bool> {
        for _ in 0..STEPS_PER_PASS {
            let dropped = self
                .metadata
                .drop_segments(
                    stream_id,
                    trim_point,
                    written_before_ms,
                    SEGMENTS_PER_STEP,
                    self.obsolete_after(),
                )
                .await?;
            if dropped < SEGMENTS_PER_STEP {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// A stream is empty when no record of it is readable: everything is trimmed, or it
    /// has no records outside segments and no segments left.
    async fn is_empty(&self, stream: &StreamState) -> Result<bool> {
        let (tail, trim_point, compacted) = {
            let visible = stream.visible();
            (visible.tail, visible.trim_point, visible.compacted)
        };
        if trim_point >= tail.seq_num {
            return Ok(true);
        }
        Ok(compacted.seq_num == tail.seq_num
            && self
                .metadata
                .segment_at(stream.id, trim_point)
                .await?
                .is_none())
    }

    async fn delete_if_empty_long_enough(
        &self,
        basin: &BasinName,
        stream: &Arc<StreamState>,
        min_age: Duration,
    ) -> Result<()> {
        if !self.is_empty(stream).await? {
            self.empty_since.lock().remove(&stream.id);
            return Ok(());
        }
        let since = *self
            .empty_since
            .lock()
            .entry(stream.id)
            .or_insert_with(Instant::now);
        if since.elapsed() < min_age {
            return Ok(());
        }
        // Holding the sequencer lock, no append can slip in between the last check and
        // the deletion; appends waiting for it then find the stream deleted.
        let sequencer = stream.sequencer().lock().await;
        if stream.is_deleted()
            || sequencer.next_seq != stream.tail().seq_num
            || !self.is_empty(stream).await?
        {
            return Ok(());
        }
        tracing::info!(basin = %basin, stream = %stream.name, "deleting a stream that stayed empty (delete_on_empty)");
        self.catalog.delete_stream(basin, &stream.name).await?;
        drop(sequencer);
        self.empty_since.lock().remove(&stream.id);
        Ok(())
    }

    /// Streams marked deleted lose their segments, in bounded steps, then their rows;
    /// basins marked deleted go once no stream of theirs is left.
    async fn finish_deletions(&self) -> Result<()> {
        let metadata = &self.metadata;
        let (streams, basins) = metadata.pending_deletions().await?;
        for stream in &streams {
            // Records of deleted streams are skipped by reads, compaction and recovery
            // (their id is gone); their WAL bytes go with the chunks that hold them.
            if self
                .drop_segments_in_steps(stream.id, u64::MAX, u64::MAX)
                .await?
            {
                // Segments a crashed compaction round wrote but never indexed.
                let orphans = self.objects.list(&segment_prefix(stream.id)).await?;
                delete_objects(self.objects.as_ref(), orphans).await?;
                metadata.remove_stream(stream.id).await?;
            }
        }
        for basin in basins {
            let remaining = metadata
                .list_streams(
                    &basin,
                    &ListRange {
                        limit: 1,
                        ..Default::default()
                    },
                )
                .await?;
            if remaining.items.is_empty() {
                metadata.remove_basin(&basin).await?;
            }
        }
        Ok(())
    }

    async fn delete_obsolete_objects(&self) -> Result<()> {
        // Not while a commit's outcome is unknown: this process may still read the
        // chunks it made obsolete. Asked before every step, as a pass may go on a while.
        delete_due_objects(
            self.metadata.as_ref(),
            self.objects.as_ref(),
            self.deletion_budget,
            || !self.compactor.is_uncertain(),
        )
        .await?;
        Ok(())
    }
}

/// Deletes `keys` for good, several at a time: the metadata that names them is
/// forgotten next, so a removal a crash could undo would leave an orphan no one deletes.
async fn delete_objects(objects: &dyn ObjectStore, keys: Vec<String>) -> Result<()> {
    stream::iter(keys.clone())
        .map(|key| async move { objects.delete(&key).await })
        .buffer_unordered(PARALLEL_DELETES)
        .try_collect::<Vec<()>>()
        .await?;
    objects.sync_deletes(&keys).await
}

/// Deletes the obsolete objects that are due, a step at a time, while `may_delete`
/// says so, until none is left or `budget` is spent (a step is taken even with none
/// left); how many it deleted. Not a fixed
/// number of steps: that capped deletions at a rate (it was 10,000 per 5 s pass) that
/// small appends outrun, as every one can be a WAL chunk (3,000 a second with one Redis
/// client), and the log's directory and the obsolete list grew for as long as the load
/// lasted.
async fn delete_due_objects(
    metadata: &dyn MetadataStore,
    objects: &dyn ObjectStore,
    budget: Duration,
    may_delete: impl Fn() -> bool,
) -> Result<usize> {
    let started = Instant::now();
    let mut deleted = 0;
    loop {
        if !may_delete() {
            return Ok(deleted);
        }
        let now = OffsetDateTime::now_utc();
        let keys = metadata.obsolete_objects(now, OBJECTS_PER_STEP).await?;
        let step = keys.len();
        delete_objects(objects, keys.clone()).await?;
        metadata.forget_obsolete_objects(&keys).await?;
        deleted += step;
        if step < OBJECTS_PER_STEP || started.elapsed() >= budget {
            return Ok(deleted);
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::segment::CompactionCommit;
    use crate::storage::memory::MemoryObjectStore;
    use crate::storage::sql::SqlMetadataStore;

    /// Obsolete objects put in the store and recorded as due, `count` of them.
    async fn due_objects(metadata: &dyn MetadataStore, objects: &dyn ObjectStore, count: usize) {
        let keys: Vec<String> = (0..count).map(|n| format!("wal/9/{n:08}")).collect();
        for key in &keys {
            objects
                .put(key, Bytes::from_static(b"chunk"))
                .await
                .unwrap();
        }
        let commit = CompactionCommit {
            obsolete_objects: keys,
            ..Default::default()
        };
        let due = OffsetDateTime::now_utc() - time::Duration::seconds(1);
        metadata.commit_compaction(&commit, due).await.unwrap();
    }

    #[tokio::test]
    async fn a_pass_deletes_every_due_object_within_its_budget() {
        let (metadata, _dir) = SqlMetadataStore::temporary().await;
        let objects = MemoryObjectStore::default();
        // More than the ten steps a pass used to stop at.
        due_objects(&metadata, &objects, 12 * OBJECTS_PER_STEP + 7).await;
        let deleted = delete_due_objects(&metadata, &objects, Duration::from_secs(600), || true)
            .await
            .unwrap();
        assert_eq!(deleted, 12 * OBJECTS_PER_STEP + 7);
        assert!(objects.list("wal/").await.unwrap().is_empty());
        let now = OffsetDateTime::now_utc();
        assert!(metadata.obsolete_objects(now, 10).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_spent_budget_stops_after_one_step_and_leaves_the_rest_due() {
        let (metadata, _dir) = SqlMetadataStore::temporary().await;
        let objects = MemoryObjectStore::default();
        due_objects(&metadata, &objects, 2 * OBJECTS_PER_STEP + 1).await;
        let deleted = delete_due_objects(&metadata, &objects, Duration::ZERO, || true)
            .await
            .unwrap();
        assert_eq!(deleted, OBJECTS_PER_STEP);
        assert_left_due(&metadata, &objects, OBJECTS_PER_STEP + 1).await;
    }

    #[tokio::test]
    async fn deleting_stops_before_the_next_step_once_it_may_not_go_on() {
        let (metadata, _dir) = SqlMetadataStore::temporary().await;
        let objects = MemoryObjectStore::default();
        due_objects(&metadata, &objects, 3 * OBJECTS_PER_STEP).await;
        // Allowed once: as if a compaction commit's outcome became unknown meanwhile.
        let asked = std::cell::Cell::new(0);
        let may_delete = || {
            asked.set(asked.get() + 1);
            asked.get() == 1
        };
        let deleted = delete_due_objects(&metadata, &objects, Duration::from_secs(600), may_delete)
            .await
            .unwrap();
        assert_eq!(deleted, OBJECTS_PER_STEP);
        assert_eq!(asked.get(), 2, "asked before each step");
        assert_left_due(&metadata, &objects, 2 * OBJECTS_PER_STEP).await;
        // Not at all while it may not.
        let deleted = delete_due_objects(&metadata, &objects, Duration::from_secs(600), || false)
            .await
            .unwrap();
        assert_eq!(deleted, 0);
        assert_left_due(&metadata, &objects, 2 * OBJECTS_PER_STEP).await;
    }

    /// `count` objects are left in the store, and exactly those are still due.
    async fn assert_left_due(
        metadata: &dyn MetadataStore,
        objects: &dyn ObjectStore,
        count: usize,
    ) {
        let mut left = objects.list("wal/").await.unwrap();
        assert_eq!(left.len(), count);
        let now = OffsetDateTime::now_utc();
        let mut due = metadata.obsolete_objects(now, 5_000).await.unwrap();
        due.sort();
        left.sort();
        assert_eq!(due, left, "what is left is still recorded as due");
    }
}
