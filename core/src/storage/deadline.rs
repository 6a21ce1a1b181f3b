//! Deadlines on metadata calls. A database behind a network black hole (packets dropped,
//! no reset) never answers and no driver error ever comes: without a deadline, every
//! request that needs the metadata store would wait forever. With one, such a call fails
//! as `Unavailable` (retryable) and the engine goes on serving what needs no metadata.
//!
//! A call that passed its deadline may still have taken effect (its answer was lost), as
//! with any lost connection: every caller already treats `Unavailable` as "maybe".

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use time::OffsetDateTime;

use super::cluster::{
    LiveNode, NodeRecord, OrphanedStream, StreamChange, StreamClaim, StreamOwner,
};
use super::metadata::{BasinRecord, Created, ListPage, ListRange, MetadataStore, StreamRecord};
use crate::access::AccessTokenInfo;
use crate::config::{BasinConfig, StreamConfig};
use crate::error::{Error, Result};
use crate::names::{BasinName, StreamName};
use crate::segment::{CompactionCommit, SegmentRecord, StreamCheckpoint};
use crate::storage::usage::{Resolution, StoredBytes, UsagePoint, UsageQuery, UsageRow};

/// The deadline of calls made while serving requests: small reads and writes.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// The deadline of calls that may move a lot: a compaction commit, and the listings
/// that recovery reads once per start.
pub const BULK_DEADLINE: Duration = Duration::from_secs(60);

/// A `MetadataStore` whose every call ends within its deadline.
pub struct Deadlines {
    store: Arc<dyn MetadataStore>,
}

impl Deadlines {
    pub fn new(store: Arc<dyn MetadataStore>) -> Deadlines {
        Deadlines { store }
    }
}

/// Runs `call` with a deadline; past it, the call is dropped (its connection too, so a
/// retry starts afresh) and the answer is `Unavailable`, naming what got no answer.
pub(crate) async fn within<T>(
    deadline: Duration,
    unanswered: impl FnOnce() -> String,
    call: impl Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(deadline, call)
        .await
        .unwrap_or_else(|_| {
            Err(Error::Unavailable(format!(
                "{}: no answer within {}",
                unanswered(),
                readable(deadline)
            )))
        })
}

/// `5 s`, or `500 ms` for a deadline that is not whole seconds (a renewal's, a quarter
/// of a short lease: whole seconds would say "0 s").
fn readable(deadline: Duration) -> String {
    match deadline.subsec_millis() {
        0 => format!("{} s", deadline.as_secs()),
        _ => format!("{} ms", deadline.as_millis()),
    }
}

/// A metadata call within `deadline`.
async fn metadata_call<T>(
    deadline: Duration,
    what: &'static str,
    call: impl Future<Output = Result<T>>,
) -> Result<T> {
    let started = std::time::Instant::now();
    let outcome = within(deadline, || format!("metadata store, {what}"), call).await;
    crate::telemetry::metadata_call(what, outcome.is_ok(), started.elapsed());
    outcome
}

#[async_trait]
impl MetadataStore for Deadlines {
    async fn create_basin(&self, basin: BasinRecord) -> Result<Created<BasinRecord>> {
        metadata_call(
            REQUEST_DEADLINE,
            "creating a basin",
            self.store.create_basin(basin),
        )
        .await
    }

    async fn get_basin(&self, name: &BasinName) -> Result<Option<BasinRecord>> {
        metadata_call(
            REQUEST_DEADLINE,
            "reading a basin",
            self.store.get_basin(name),
        )
        .await
    }

    async fn list_basins(&self, range: &ListRange) -> Result<ListPage<BasinRecord>> {
        metadata_call(
            REQUEST_DEADLINE,
            "listing basins",
            self.store.list_basins(range),
        )
        .await
    }

    async fn set_basin_config(&self, name: &BasinName, config: &BasinConfig) -> Result<()> {
        let call = self.store.set_basin_config(name, config);
        metadata_call(REQUEST_DEADLINE, "reconfiguring a basin", call).await
    }

    async fn mark_basin_deleted(&self, name: &BasinName, at: OffsetDateTime) -> Result<()> {
        let call = self.store.mark_basin_deleted(name, at);
        metadata_call(REQUEST_DEADLINE, "deleting a basin", call).await
    }

    async fn remove_basin(&self, name: &BasinName) -> Result<()> {
        metadata_call(
            REQUEST_DEADLINE,
            "removing a basin",
            self.store.remove_basin(name),
        )
        .await
    }

    async fn create_stream(&self, stream: StreamRecord) -> Result<Created<StreamRecord>> {
        metadata_call(
            REQUEST_DEADLINE,
            "creating a stream",
            self.store.create_stream(stream),
        )
        .await
    }

    async fn get_stream(
        &self,
        basin: &BasinName,
        name: &StreamName,
    ) -> Result<Option<StreamRecord>> {
        let call = self.store.get_stream(basin, name);
        metadata_call(REQUEST_DEADLINE, "reading a stream", call).await
    }

    async fn list_streams(
        &self,
        basin: &BasinName,
        range: &ListRange,
    ) -> Result<ListPage<StreamRecord>> {
        let call = self.store.list_streams(basin, range);
        metadata_call(REQUEST_DEADLINE, "listing streams", call).await
    }

    async fn set_stream_config(&self, id: u64, config: &StreamConfig) -> Result<()> {
        let call = self.store.set_stream_config(id, config);
        metadata_call(REQUEST_DEADLINE, "reconfiguring a stream", call).await
    }

    async fn mark_stream_deleted(&self, id: u64, at: OffsetDateTime) -> Result<()> {
        let call = self.store.mark_stream_deleted(id, at);
        metadata_call(REQUEST_DEADLINE, "deleting a stream", call).await
    }

    async fn remove_stream(&self, id: u64) -> Result<()> {
        metadata_call(
            REQUEST_DEADLINE,
            "removing a stream",
            self.store.remove_stream(id),
        )
        .await
    }

    async fn pending_deletions(&self) -> Result<(Vec<StreamRecord>, Vec<BasinName>)> {
        let call = self.store.pending_deletions();
        metadata_call(BULK_DEADLINE, "listing pending deletions", call).await
    }

    async fn live_streams(&self) -> Result<Vec<StreamRecord>> {
        metadata_call(
            BULK_DEADLINE,
            "listing live streams",
            self.store.live_streams(),
        )
        .await
    }

    async fn stream_is_live(&self, id: u64) -> Result<bool> {
        metadata_call(
            REQUEST_DEADLINE,
            "checking a stream",
            self.store.stream_is_live(id),
        )
        .await
    }

    async fn next_epoch(&self) -> Result<u64> {
        metadata_call(REQUEST_DEADLINE, "taking an epoch", self.store.next_epoch()).await
    }

    async fn join_cluster(
        &self,
        epoch: u64,
        identity: &str,
        advertise_url: &str,
        lease_ms: u64,
    ) -> Result<()> {
        let call = self
            .store
            .join_cluster(epoch, identity, advertise_url, lease_ms);
        metadata_call(REQUEST_DEADLINE, "joining the cluster", call).await
    }

    async fn renew_lease(&self, epoch: u64, lease_ms: u64, ready: bool) -> Result<bool> {
        // Well inside the lease: a renewal that takes longer is useless anyway.
        let deadline =
            Duration::from_millis(lease_ms / 4).clamp(Duration::from_millis(100), REQUEST_DEADLINE);
        let call = self.store.renew_lease(epoch, lease_ms, ready);
        metadata_call(deadline, "renewing the node's lease", call).await
    }

    async fn leave_cluster(&self, epoch: u64) -> Result<()> {
        let call = self.store.leave_cluster(epoch);
        metadata_call(REQUEST_DEADLINE, "leaving the cluster", call).await
    }

    async fn begin_leaving(&self, epoch: u64) -> Result<()> {
        let call = self.store.begin_leaving(epoch);
        metadata_call(REQUEST_DEADLINE, "marking the node as leaving", call).await
    }

    async fn release_streams(
        &self,
        epoch: u64,
        stream_ids: &[u64],
        to: Option<u64>,
    ) -> Result<u64> {
        let call = self.store.release_streams(epoch, stream_ids, to);
        metadata_call(BULK_DEADLINE, "handing stream leases over", call).await
    }

    async fn streams_owned(&self, epoch: u64) -> Result<Vec<u64>> {
        let call = self.store.streams_owned(epoch);
        metadata_call(BULK_DEADLINE, "listing the streams this node holds", call).await
    }

    async fn cluster_nodes(&self) -> Result<Vec<NodeRecord>> {
        let call = self.store.cluster_nodes();
        metadata_call(REQUEST_DEADLINE, "listing the nodes", call).await
    }

    async fn live_nodes(&self) -> Result<Vec<LiveNode>> {
        let call = self.store.live_nodes();
        metadata_call(REQUEST_DEADLINE, "listing the live nodes", call).await
    }

    async fn stream_owner(&self, stream_id: u64) -> Result<StreamOwner> {
        let call = self.store.stream_owner(stream_id);
        metadata_call(REQUEST_DEADLINE, "looking up a stream's owner", call).await
    }

    async fn claim_streams(&self, epoch: u64, stream_ids: &[u64]) -> Result<Vec<StreamClaim>> {
        let call = self.store.claim_streams(epoch, stream_ids);
        metadata_call(BULK_DEADLINE, "taking stream leases", call).await
    }

    async fn commit_takeover(&self, epoch: u64, claims: &[(u64, u64)]) -> Result<()> {
        let call = self.store.commit_takeover(epoch, claims);
        metadata_call(BULK_DEADLINE, "committing a takeover", call).await
    }

    async fn orphaned_streams(&self, limit: usize) -> Result<Vec<OrphanedStream>> {
        let call = self.store.orphaned_streams(limit);
        metadata_call(BULK_DEADLINE, "listing streams without an owner", call).await
    }

    async fn stream_changes(&self, epoch: u64, since_ms: i64) -> Result<(Vec<StreamChange>, i64)> {
        let call = self.store.stream_changes(epoch, since_ms);
        metadata_call(REQUEST_DEADLINE, "reading stream changes", call).await
    }

    async fn dead_logs(&self, dead_for_ms: u64) -> Result<Vec<u64>> {
        let call = self.store.dead_logs(dead_for_ms);
        metadata_call(REQUEST_DEADLINE, "listing logs of gone nodes", call).await
    }

    async fn legacy_logs_needed(&self) -> Result<bool> {
        let call = self.store.legacy_logs_needed();
        metadata_call(REQUEST_DEADLINE, "looking for streams in old logs", call).await
    }

    async fn forget_node(&self, epoch: u64) -> Result<()> {
        let call = self.store.forget_node(epoch);
        metadata_call(REQUEST_DEADLINE, "forgetting a gone node", call).await
    }

    async fn commit_compaction(
        &self,
        commit: &CompactionCommit,
        obsolete_after: OffsetDateTime,
    ) -> Result<()> {
        let call = self.store.commit_compaction(commit, obsolete_after);
        metadata_call(BULK_DEADLINE, "committing a compaction round", call).await
    }

    async fn stream_checkpoints(&self) -> Result<BTreeMap<u64, StreamCheckpoint>> {
        let call = self.store.stream_checkpoints();
        metadata_call(BULK_DEADLINE, "reading stream checkpoints", call).await
    }

    async fn stream_checkpoint(&self, stream_id: u64) -> Result<Option<StreamCheckpoint>> {
        let call = self.store.stream_checkpoint(stream_id);
        metadata_call(REQUEST_DEADLINE, "reading a stream's checkpoint", call).await
    }

    async fn wal_watermarks(&self) -> Result<BTreeMap<u64, u64>> {
        metadata_call(
            BULK_DEADLINE,
            "reading WAL watermarks",
            self.store.wal_watermarks(),
        )
        .await
    }

    async fn segment_at(&self, stream_id: u64, seq_num: u64) -> Result<Option<SegmentRecord>> {
        let call = self.store.segment_at(stream_id, seq_num);
        metadata_call(REQUEST_DEADLINE, "looking up a segment", call).await
    }

    async fn segment_at_timestamp(
        &self,
        stream_id: u64,
        timestamp: u64,
    ) -> Result<Option<SegmentRecord>> {
        let call = self.store.segment_at_timestamp(stream_id, timestamp);
        metadata_call(REQUEST_DEADLINE, "looking up a segment", call).await
    }

    async fn newest_segments(&self, stream_id: u64, limit: usize) -> Result<Vec<SegmentRecord>> {
        let call = self.store.newest_segments(stream_id, limit);
        metadata_call(
            REQUEST_DEADLINE,
            "looking up a stream's newest segments",
            call,
        )
        .await
    }

    async fn merge_segments(
        &self,
        merged: &SegmentRecord,
        replaced: &[String],
        committed_by: Option<u64>,
        obsolete_after: OffsetDateTime,
    ) -> Result<bool> {
        let call = self
            .store
            .merge_segments(merged, replaced, committed_by, obsolete_after);
        metadata_call(REQUEST_DEADLINE, "merging segments", call).await
    }

    async fn drop_segments(
        &self,
        stream_id: u64,
        trim_point: u64,
        written_before_ms: u64,
        limit: usize,
        obsolete_after: OffsetDateTime,
    ) -> Result<usize> {
        let call = self.store.drop_segments(
            stream_id,
            trim_point,
            written_before_ms,
            limit,
            obsolete_after,
        );
        metadata_call(REQUEST_DEADLINE, "dropping segments", call).await
    }

    async fn obsolete_objects(&self, now: OffsetDateTime, limit: usize) -> Result<Vec<String>> {
        let call = self.store.obsolete_objects(now, limit);
        metadata_call(REQUEST_DEADLINE, "listing obsolete objects", call).await
    }

    async fn forget_obsolete_objects(&self, keys: &[String]) -> Result<()> {
        let call = self.store.forget_obsolete_objects(keys);
        metadata_call(REQUEST_DEADLINE, "forgetting obsolete objects", call).await
    }

    async fn put_access_token(
        &self,
        token: &AccessTokenInfo,
        secret_digest: &[u8],
        replace: bool,
    ) -> Result<()> {
        let call = self.store.put_access_token(token, secret_digest, replace);
        metadata_call(REQUEST_DEADLINE, "storing an access token", call).await
    }

    async fn access_token_by_digest(
        &self,
        digest: &[u8],
    ) -> Result<Option<(AccessTokenInfo, Vec<u8>)>> {
        let call = self.store.access_token_by_digest(digest);
        metadata_call(REQUEST_DEADLINE, "looking up an access token", call).await
    }

    async fn list_access_tokens(&self, range: &ListRange) -> Result<ListPage<AccessTokenInfo>> {
        let call = self.store.list_access_tokens(range);
        metadata_call(REQUEST_DEADLINE, "listing access tokens", call).await
    }

    async fn delete_access_token(&self, id: &str) -> Result<bool> {
        let call = self.store.delete_access_token(id);
        metadata_call(REQUEST_DEADLINE, "revoking an access token", call).await
    }

    async fn add_usage(&self, counts: &[UsageRow], gauges: &[UsageRow]) -> Result<()> {
        let call = self.store.add_usage(counts, gauges);
        metadata_call(BULK_DEADLINE, "recording usage", call).await
    }

    async fn usage(&self, query: &UsageQuery) -> Result<Vec<UsagePoint>> {
        metadata_call(REQUEST_DEADLINE, "reading usage", self.store.usage(query)).await
    }

    async fn expire_usage(&self, resolution: Resolution, before: u64) -> Result<()> {
        let call = self.store.expire_usage(resolution, before);
        metadata_call(BULK_DEADLINE, "dropping old usage", call).await
    }

    async fn stored_bytes(&self) -> Result<Vec<StoredBytes>> {
        let call = self.store.stored_bytes();
        metadata_call(BULK_DEADLINE, "summing stored bytes", call).await
    }

    async fn basins_with_streams(&self, from_ms: i64, to_ms: i64) -> Result<Vec<String>> {
        let call = self.store.basins_with_streams(from_ms, to_ms);
        metadata_call(REQUEST_DEADLINE, "listing active basins", call).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_call_without_an_answer_ends_as_unavailable() {
        let silent = metadata_call(
            REQUEST_DEADLINE,
            "a test call",
            std::future::pending::<Result<()>>(),
        );
        match silent.await {
            Err(Error::Unavailable(message)) => {
                assert_eq!(message, "metadata store, a test call: no answer within 5 s")
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
        let renewal = metadata_call(
            Duration::from_millis(500),
            "a renewal",
            std::future::pending::<Result<()>>(),
        );
        match renewal.await {
            Err(Error::Unavailable(message)) => {
                assert_eq!(
                    message,
                    "metadata store, a renewal: no answer within 500 ms"
                )
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
        let prompt = metadata_call(REQUEST_DEADLINE, "a test call", async { Ok(7) });
        assert_eq!(prompt.await.unwrap(), 7);
    }
}
