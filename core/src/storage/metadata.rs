//! `MetadataStore`: basins, streams, access tokens and the node epoch. Not on the append hot path: the
//! engine caches what it needs and only comes here to create, reconfigure, delete or list.

use async_trait::async_trait;
use time::OffsetDateTime;

use std::collections::BTreeMap;

use super::cluster::{
    LiveNode, NodeRecord, OrphanedStream, StreamChange, StreamClaim, StreamOwner,
};
use crate::access::AccessTokenInfo;
use crate::config::{BasinConfig, StreamConfig};
use crate::error::Result;
use crate::names::{BasinName, StreamName};
use crate::segment::{CompactionCommit, SegmentRecord, StreamCheckpoint};
use crate::storage::usage::{Resolution, StoredBytes, UsagePoint, UsageQuery, UsageRow};

#[derive(Debug, Clone, PartialEq)]
pub struct BasinRecord {
    pub name: BasinName,
    pub location: String,
    pub config: BasinConfig,
    pub created_at: OffsetDateTime,
    pub deleted_at: Option<OffsetDateTime>,
    /// What identifies the create call that made it (request token and requested config), so a retry of that call is answered with the existing resource.
    pub idempotency_key: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StreamRecord {
    /// Immutable and never reused: a recreated stream gets a new id, so it can never
    /// see records of the stream that had its name before.
    pub id: u64,
    pub basin: BasinName,
    pub name: StreamName,
    pub config: StreamConfig,
    /// The cipher its records are encrypted with: its basin's `stream_cipher` when it
    /// was created, fixed for its lifetime.
    pub cipher: Option<crate::encryption::Cipher>,
    pub created_at: OffsetDateTime,
    pub deleted_at: Option<OffsetDateTime>,
    pub idempotency_key: Option<String>,
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq)]
pub struct ListPage<T> {
    pub items: Vec<T>,
    pub has_more: bool,
}

/// Listing bounds: names starting with `prefix`, strictly after `start_after`.
#[derive(Debug, Clone, Default)]
pub struct ListRange {
    pub prefix: String,
    pub start_after: String,
    pub limit: usize,
}

/// What a create did: made the resource, or found the one an earlier call with the same
/// request token made.
#[derive(Debug, Clone, PartialEq)]
pub enum Created<T> {
    New(T),
    Existing(T),
}

#[async_trait]
pub trait MetadataStore: Send + Sync + 'static {
    /// Creates a basin. Fails with `AlreadyExists` (or `DeletionPending` while a
    /// basin of that name is being deleted), unless the existing basin was created with
    /// the same request token, which returns it as `Created::Existing`.
    async fn create_basin(&self, basin: BasinRecord) -> Result<Created<BasinRecord>>;
    /// A basin, including one being deleted.
    async fn get_basin(&self, name: &BasinName) -> Result<Option<BasinRecord>>;
    async fn list_basins(&self, range: &ListRange) -> Result<ListPage<BasinRecord>>;
    async fn set_basin_config(&self, name: &BasinName, config: &BasinConfig) -> Result<()>;
    /// Marks a basin and all its streams deleted at `at`; they stay listed until removed.
    async fn mark_basin_deleted(&self, name: &BasinName, at: OffsetDateTime) -> Result<()>;
    /// Forgets a basin whose deletion has completed.
    async fn remove_basin(&self, name: &BasinName) -> Result<()>;

    /// Creates a stream, with the same rules as `create_basin` (`DeletionPending`
    /// while a stream of that name is being deleted). The id is assigned by the store.
    async fn create_stream(&self, stream: StreamRecord) -> Result<Created<StreamRecord>>;
    async fn get_stream(
        &self,
        basin: &BasinName,
        name: &StreamName,
    ) -> Result<Option<StreamRecord>>;
    async fn list_streams(
        &self,
        basin: &BasinName,
        range: &ListRange,
    ) -> Result<ListPage<StreamRecord>>;
    async fn set_stream_config(&self, id: u64, config: &StreamConfig) -> Result<()>;
    async fn mark_stream_deleted(&self, id: u64, at: OffsetDateTime) -> Result<()>;
    /// Forgets a stream, its checkpoint, and any segment rows left (their objects become
    /// obsolete at once).
    async fn remove_stream(&self, id: u64) -> Result<()>;
    /// Every stream marked deleted, and every basin marked deleted, for the reaper.
    async fn pending_deletions(&self) -> Result<(Vec<StreamRecord>, Vec<BasinName>)>;
    /// Every stream that is not deleted, for recovery.
    async fn live_streams(&self) -> Result<Vec<StreamRecord>>;
    /// Whether a stream of this id exists and is not deleted.
    async fn stream_is_live(&self, id: u64) -> Result<bool>;

    /// Returns a number greater than every number it returned before, durably: each
    /// process start takes one, and names its write-ahead log after it.
    async fn next_epoch(&self) -> Result<u64>;

    // ---- the cluster (see `cluster`) ----

    /// Adds this node (`epoch`, from [`MetadataStore::next_epoch`]) with a lease of
    /// `lease_ms` from now, and ends the leases of earlier runs of the same `identity`
    /// (they are known to be gone: one data directory serves one process at a time).
    /// It is not ready yet: no stream is handed to it until a renewal says it is.
    async fn join_cluster(
        &self,
        epoch: u64,
        identity: &str,
        advertise_url: &str,
        lease_ms: u64,
    ) -> Result<()>;
    /// Renews this node's lease (and with it every stream lease it holds) to `lease_ms`
    /// from now, in one statement; `false` if any of its streams were taken meanwhile,
    /// or it left the cluster (or a later run of it joined), or it is unknown: it must
    /// stop, for its leases are gone. A renewal that arrives late never undoes a leave.
    /// `ready`: whether the node has finished starting and serves.
    async fn renew_lease(&self, epoch: u64, lease_ms: u64, ready: bool) -> Result<bool>;
    /// Ends this node's lease now, so others take its streams without waiting for it to
    /// run out: the last step of a shutdown, once nothing more is written.
    async fn leave_cluster(&self, epoch: u64) -> Result<()>;
    /// Marks node `epoch` as shutting down: no stream is placed on it any more (it is
    /// not among `live_nodes`), though it keeps serving until it has handed its streams
    /// over. Fails with `LeaseLost` if its leases are gone.
    async fn begin_leaving(&self, epoch: u64) -> Result<()>;
    /// Gives up node `epoch`'s leases on those of `stream_ids` it holds, once everything
    /// it accepted on them is durable in its log: to node `to`, which must be live, ready
    /// and not leaving (else nothing is given up), or with `None` to nobody. The node that
    /// takes one next rebuilds it from that log (which is why `log_epoch` stays). How
    /// many it gave up. Fails with `LeaseLost` if its leases are gone.
    async fn release_streams(&self, epoch: u64, stream_ids: &[u64], to: Option<u64>)
        -> Result<u64>;
    /// The live streams whose lease node `epoch` holds (served by it, being taken over
    /// by it, or handed to it by another node).
    async fn streams_owned(&self, epoch: u64) -> Result<Vec<u64>>;
    /// Every node known, in epoch order.
    async fn cluster_nodes(&self) -> Result<Vec<NodeRecord>>;
    /// The nodes whose lease holds now and that are not leaving, in epoch order.
    async fn live_nodes(&self) -> Result<Vec<LiveNode>>;
    /// Who sequences a stream now.
    async fn stream_owner(&self, stream_id: u64) -> Result<StreamOwner>;
    /// Takes the leases of those of `stream_ids` that are live and have no live owner,
    /// for node `epoch` (whose own lease must hold and be intact), with a lease epoch one
    /// above the last; what it took. Streams another live node holds are left alone.
    async fn claim_streams(&self, epoch: u64, stream_ids: &[u64]) -> Result<Vec<StreamClaim>>;
    /// Records that node `epoch` has rebuilt these streams (`(stream id, lease epoch)`)
    /// into its own log: from now on their records after the checkpoint are there.
    async fn commit_takeover(&self, epoch: u64, claims: &[(u64, u64)]) -> Result<()>;
    /// Up to `limit` live streams whose owner's lease ran out, or that were written
    /// before clusters and never taken since.
    async fn orphaned_streams(&self, limit: usize) -> Result<Vec<OrphanedStream>>;
    /// Changes to the configuration or deletion of the streams node `epoch` holds, made
    /// at or after `since_ms` (by the store's clock), and the store's clock now.
    async fn stream_changes(&self, epoch: u64, since_ms: i64) -> Result<(Vec<StreamChange>, i64)>;
    /// Nodes whose lease ran out over `dead_for_ms` ago and whose log no stream needs
    /// any more: their WAL chunks can go, and then the node itself.
    async fn dead_logs(&self, dead_for_ms: u64) -> Result<Vec<u64>>;
    /// Whether any stream still has records only in logs from before clusters.
    async fn legacy_logs_needed(&self) -> Result<bool>;
    /// Forgets a node whose log is gone, and its WAL watermark.
    async fn forget_node(&self, epoch: u64) -> Result<()>;

    /// Commits a compaction round atomically (see [`CompactionCommit`]). Segments of
    /// streams that are gone or being deleted by now are not indexed: their objects are
    /// recorded as obsolete instead. Obsolete objects may be deleted from `obsolete_after`.
    /// `StreamMoved`, committing nothing, when a stream of the round moved to another
    /// node: one of `skipped_streams` still has its records in the log of the
    /// committing node (handed over, not yet taken up), or a stream the round compacted
    /// is held by another node by now.
    async fn commit_compaction(
        &self,
        commit: &CompactionCommit,
        obsolete_after: OffsetDateTime,
    ) -> Result<()>;
    /// Every stream's checkpoint, by stream id.
    async fn stream_checkpoints(&self) -> Result<BTreeMap<u64, StreamCheckpoint>>;
    /// One stream's checkpoint.
    async fn stream_checkpoint(&self, stream_id: u64) -> Result<Option<StreamCheckpoint>>;
    /// Per epoch, the number of the first WAL chunk that is not compacted.
    async fn wal_watermarks(&self) -> Result<BTreeMap<u64, u64>>;
    /// The first segment of a stream that holds records at or after `seq_num`.
    async fn segment_at(&self, stream_id: u64, seq_num: u64) -> Result<Option<SegmentRecord>>;
    /// The first segment of a stream whose last timestamp is at least `timestamp`.
    async fn segment_at_timestamp(
        &self,
        stream_id: u64,
        timestamp: u64,
    ) -> Result<Option<SegmentRecord>>;
    /// A stream's newest `limit` segments, in sequence order.
    async fn newest_segments(&self, stream_id: u64, limit: usize) -> Result<Vec<SegmentRecord>>;
    /// Replaces the segment rows whose objects are `replaced` (in order, and exactly the
    /// stream's rows from `merged`'s start up to its end) with `merged`, in one
    /// transaction, and records their objects as obsolete from `obsolete_after`. Changes
    /// nothing and returns `false` when the rows are not exactly those any more, when the
    /// stream is gone, or when `committed_by` is given and another node holds the stream.
    async fn merge_segments(
        &self,
        merged: &SegmentRecord,
        replaced: &[String],
        committed_by: Option<u64>,
        obsolete_after: OffsetDateTime,
    ) -> Result<bool>;
    /// Removes up to `limit` of a stream's oldest segments that lie wholly below
    /// `trim_point` or were written before `written_before_ms` (expired), recording their
    /// objects as obsolete from `obsolete_after`; how many it removed.
    async fn drop_segments(
        &self,
        stream_id: u64,
        trim_point: u64,
        written_before_ms: u64,
        limit: usize,
        obsolete_after: OffsetDateTime,
    ) -> Result<usize>;
    /// Up to `limit` obsolete object keys that may be deleted at `now`.
    async fn obsolete_objects(&self, now: OffsetDateTime, limit: usize) -> Result<Vec<String>>;
    /// Forgets obsolete objects once they are deleted.
    async fn forget_obsolete_objects(&self, keys: &[String]) -> Result<()>;

    /// Stores a new token with the digest of its secret; `AlreadyExists` if the id is
    /// taken. With `replace`, an existing token of that id is overwritten instead (how
    /// `--root-token` sets the root token's secret).
    async fn put_access_token(
        &self,
        token: &AccessTokenInfo,
        secret_digest: &[u8],
        replace: bool,
    ) -> Result<()>;
    /// The token whose secret has this digest, with the digest as stored.
    async fn access_token_by_digest(
        &self,
        digest: &[u8],
    ) -> Result<Option<(AccessTokenInfo, Vec<u8>)>>;
    async fn list_access_tokens(&self, range: &ListRange) -> Result<ListPage<AccessTokenInfo>>;
    /// Deletes a token; whether it existed.
    async fn delete_access_token(&self, id: &str) -> Result<bool>;

    // ---- usage (the metrics API) ----

    /// Adds `counts` to their buckets and sets `gauges` (the last reading wins), in one
    /// transaction.
    async fn add_usage(&self, counts: &[UsageRow], gauges: &[UsageRow]) -> Result<()>;
    /// The buckets of one series set, in bucket order.
    async fn usage(&self, query: &UsageQuery) -> Result<Vec<UsagePoint>>;
    /// Drops the buckets of `resolution` that start before `before` (seconds).
    async fn expire_usage(&self, resolution: Resolution, before: u64) -> Result<()>;
    /// The bytes of each stream's segments (streams with none are left out).
    async fn stored_bytes(&self) -> Result<Vec<StoredBytes>>;
    /// The basins that had at least one stream at some time from `from_ms` to `to_ms`
    /// (among streams not yet reaped), in name order.
    async fn basins_with_streams(&self, from_ms: i64, to_ms: i64) -> Result<Vec<String>>;
}

/// Creates basin `basin` (default config) and stream `stream` in it, both at `now`, for
/// tests; the new stream.
#[cfg(test)]
pub(crate) async fn create_basin_and_stream(
    store: &dyn MetadataStore,
    basin: &str,
    stream: &str,
    now: OffsetDateTime,
) -> StreamRecord {
    let name = BasinName::new(basin).unwrap();
    store
        .create_basin(BasinRecord {
            name: name.clone(),
            location: "local".into(),
            config: BasinConfig::default(),
            created_at: now,
            deleted_at: None,
            idempotency_key: None,
        })
        .await
        .unwrap();
    let created = store
        .create_stream(StreamRecord {
            id: 0,
            basin: name,
            name: StreamName::new(stream).unwrap(),
            config: StreamConfig::default(),
            cipher: None,
            created_at: now,
            deleted_at: None,
            idempotency_key: None,
        })
        .await
        .unwrap();
    match created {
        Created::New(record) => record,
        Created::Existing(_) => panic!("stream {basin}/{stream} existed already"),
    }
}

/// The behaviour every `MetadataStore` must show; each backend's tests call this.
#[cfg(test)]
pub(crate) async fn conformance(store: &dyn MetadataStore) {
    use crate::error::{Error, Resource};

    let now = OffsetDateTime::now_utc().replace_nanosecond(0).unwrap();
    let basin = |name: &str, token: Option<&str>| BasinRecord {
        name: BasinName::new(name).unwrap(),
        location: "local".into(),
        config: BasinConfig::default(),
        created_at: now,
        deleted_at: None,
        idempotency_key: token.map(str::to_owned),
    };

    // Basins: create, idempotent retry, conflict, list with pagination.
    let created = store
        .create_basin(basin("basin-one", Some("t1")))
        .await
        .unwrap();
    assert!(matches!(created, Created::New(_)));
    let retried = store
        .create_basin(basin("basin-one", Some("t1")))
        .await
        .unwrap();
    assert!(matches!(retried, Created::Existing(b) if b.name.as_str() == "basin-one"));
    let conflict = store.create_basin(basin("basin-one", Some("t2"))).await;
    assert!(matches!(conflict, Err(Error::AlreadyExists(_))));
    for name in ["basin-two", "basin-three", "other-basin"] {
        store.create_basin(basin(name, None)).await.unwrap();
    }
    let page = store
        .list_basins(&ListRange {
            prefix: "basin-".into(),
            start_after: String::new(),
            limit: 2,
        })
        .await
        .unwrap();
    let names: Vec<_> = page.items.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["basin-one", "basin-three"]);
    assert!(page.has_more);
    let page = store
        .list_basins(&ListRange {
            prefix: "basin-".into(),
            start_after: "basin-three".into(),
            limit: 2,
        })
        .await
        .unwrap();
    let names: Vec<_> = page.items.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["basin-two"]);
    assert!(!page.has_more);

    let one = BasinName::new("basin-one").unwrap();
    let config = BasinConfig {
        create_stream_on_append: true,
        ..Default::default()
    };
    store.set_basin_config(&one, &config).await.unwrap();
    assert_eq!(store.get_basin(&one).await.unwrap().unwrap().config, config);

    // Streams: ids are never reused across delete and recreate.
    let stream = |name: &str| StreamRecord {
        id: 0,
        basin: one.clone(),
        name: StreamName::new(name).unwrap(),
        config: StreamConfig::default(),
        cipher: None,
        created_at: now,
        deleted_at: None,
        idempotency_key: None,
    };
    let Created::New(a) = store.create_stream(stream("a/1")).await.unwrap() else {
        panic!("expected a new stream")
    };
    // A stream's cipher is kept as it was created.
    let Created::New(sealed) = store
        .create_stream(StreamRecord {
            cipher: Some(crate::encryption::Cipher::Aes256Gcm),
            ..stream("sealed")
        })
        .await
        .unwrap()
    else {
        panic!("expected a new stream")
    };
    let found = store.get_stream(&one, &sealed.name).await.unwrap().unwrap();
    assert_eq!(found.cipher, Some(crate::encryption::Cipher::Aes256Gcm));
    assert_eq!(a.cipher, None);
    store.remove_stream(sealed.id).await.unwrap();
    let Created::New(b) = store.create_stream(stream("a/2")).await.unwrap() else {
        panic!("expected a new stream")
    };
    assert_ne!(a.id, b.id);
    assert!(matches!(
        store.create_stream(stream("a/1")).await,
        Err(Error::AlreadyExists(_))
    ));
    store.mark_stream_deleted(a.id, now).await.unwrap();
    assert!(matches!(
        store.create_stream(stream("a/1")).await,
        Err(Error::DeletionPending(Resource::Stream(_)))
    ));
    let listed = store
        .list_streams(
            &one,
            &ListRange {
                limit: 10,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 2);
    assert_eq!(listed.items[0].deleted_at, Some(now));
    let live: Vec<u64> = store
        .live_streams()
        .await
        .unwrap()
        .iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(live, vec![b.id]);
    assert!(store.stream_is_live(b.id).await.unwrap());
    assert!(!store.stream_is_live(a.id).await.unwrap(), "deleted");
    assert!(
        !store.stream_is_live(987_654).await.unwrap(),
        "never existed"
    );
    let (streams, basins) = store.pending_deletions().await.unwrap();
    assert_eq!(streams.iter().map(|s| s.id).collect::<Vec<_>>(), vec![a.id]);
    assert!(basins.is_empty());
    store.remove_stream(a.id).await.unwrap();
    let Created::New(again) = store.create_stream(stream("a/1")).await.unwrap() else {
        panic!("expected a new stream")
    };
    assert!(again.id > b.id, "stream ids must never be reused");

    // Streams can only be created in an existing basin that is not being deleted.
    let orphan = StreamRecord {
        basin: BasinName::new("no-such-basin").unwrap(),
        ..stream("x")
    };
    assert!(matches!(
        store.create_stream(orphan).await,
        Err(Error::NotFound(Resource::Basin(_)))
    ));

    // Deleting a basin marks its streams deleted too, and blocks the name until removed.
    store.mark_basin_deleted(&one, now).await.unwrap();
    assert!(matches!(
        store.create_stream(stream("late")).await,
        Err(Error::DeletionPending(Resource::Basin(_)))
    ));
    assert!(store.live_streams().await.unwrap().is_empty());
    assert!(matches!(
        store.create_basin(basin("basin-one", None)).await,
        Err(Error::DeletionPending(Resource::Basin(_)))
    ));
    let (streams, basins) = store.pending_deletions().await.unwrap();
    assert_eq!(streams.len(), 2);
    assert_eq!(basins, vec![one.clone()]);
    for s in streams {
        store.remove_stream(s.id).await.unwrap();
    }
    store.remove_basin(&one).await.unwrap();
    assert!(store.get_basin(&one).await.unwrap().is_none());
    store.create_basin(basin("basin-one", None)).await.unwrap();

    let Created::New(fresh) = store.create_stream(stream("segmented")).await.unwrap() else {
        panic!("expected a new stream")
    };
    segments_conformance(store, fresh.id).await;
    usage_conformance(store, now).await;

    let first = store.next_epoch().await.unwrap();
    assert!(store.next_epoch().await.unwrap() > first);

    cluster_conformance(store, &one).await;

    // Access tokens: stored with their digest, found by it, listed, replaced, deleted.
    let token = |id: &str| AccessTokenInfo {
        id: id.into(),
        expires_at: Some(now),
        auto_prefix_streams: false,
        scope: crate::access::Scope::everything(),
    };
    for (id, digest) in [
        ("svc/a", [1u8; 32]),
        ("svc/b", [2; 32]),
        ("user/c", [3; 32]),
    ] {
        store
            .put_access_token(&token(id), &digest, false)
            .await
            .unwrap();
    }
    let duplicate = store
        .put_access_token(&token("svc/a"), &[9; 32], false)
        .await;
    assert!(matches!(duplicate, Err(Error::AlreadyExists(_))));
    let (found, digest) = store
        .access_token_by_digest(&[2; 32])
        .await
        .unwrap()
        .unwrap();
    assert_eq!((found, digest), (token("svc/b"), vec![2; 32]));
    assert!(store
        .access_token_by_digest(&[9; 32])
        .await
        .unwrap()
        .is_none());
    let page = store
        .list_access_tokens(&ListRange {
            prefix: "svc/".into(),
            start_after: String::new(),
            limit: 1,
        })
        .await
        .unwrap();
    assert_eq!(page.items, vec![token("svc/a")]);
    assert!(page.has_more);
    store
        .put_access_token(&token("svc/a"), &[7; 32], true)
        .await
        .unwrap();
    assert!(store
        .access_token_by_digest(&[1; 32])
        .await
        .unwrap()
        .is_none());
    assert!(store
        .access_token_by_digest(&[7; 32])
        .await
        .unwrap()
        .is_some());
    assert!(store.delete_access_token("svc/a").await.unwrap());
    assert!(!store.delete_access_token("svc/a").await.unwrap());
    assert!(store
        .access_token_by_digest(&[7; 32])
        .await
        .unwrap()
        .is_none());
}

/// Nodes, leases, claims and fencing; `basin` is an existing basin.
#[cfg(test)]
async fn cluster_conformance(store: &dyn MetadataStore, basin: &BasinName) {
    use super::cluster::{StreamLog, StreamOwner};
    use crate::error::Error;

    let now = OffsetDateTime::now_utc().replace_nanosecond(0).unwrap();
    let mut ids = Vec::new();
    for name in ["leased/1", "leased/2", "leased/3"] {
        let record = StreamRecord {
            id: 0,
            basin: basin.clone(),
            name: StreamName::new(name).unwrap(),
            config: StreamConfig::default(),
            cipher: None,
            created_at: now,
            deleted_at: None,
            idempotency_key: None,
        };
        let Created::New(record) = store.create_stream(record).await.unwrap() else {
            panic!("expected a new stream")
        };
        ids.push(record.id);
    }
    let minute = 60_000;
    let a = store.next_epoch().await.unwrap();
    let b = store.next_epoch().await.unwrap();
    store
        .join_cluster(a, "node-a", "http://a", minute)
        .await
        .unwrap();
    store
        .join_cluster(b, "node-b", "http://b", minute)
        .await
        .unwrap();
    // Joined, but not ready until a renewal says so (they are still starting).
    assert!(store
        .cluster_nodes()
        .await
        .unwrap()
        .iter()
        .all(|n| n.live && !n.ready));
    // Live, each said ready as its renewal says (streams are placed only on those).
    let live_and_ready = || async {
        let nodes = store.live_nodes().await.unwrap();
        nodes.iter().map(|n| (n.epoch, n.ready)).collect::<Vec<_>>()
    };
    assert_eq!(live_and_ready().await, [(a, false), (b, false)]);
    assert!(store.renew_lease(a, minute, true).await.unwrap());
    assert_eq!(live_and_ready().await, [(a, true), (b, false)]);
    assert!(store.renew_lease(b, minute, true).await.unwrap());
    assert!(store.cluster_nodes().await.unwrap().iter().all(|n| n.ready));
    assert_eq!(live_and_ready().await, [(a, true), (b, true)]);
    let urls: Vec<String> = store
        .live_nodes()
        .await
        .unwrap()
        .into_iter()
        .map(|n| n.advertise_url)
        .collect();
    assert_eq!(urls, ["http://a", "http://b"]);
    assert_eq!(
        store.stream_owner(ids[0]).await.unwrap(),
        StreamOwner::Nobody
    );

    // A new stream is claimed with lease epoch 1 and no log yet; a live owner keeps it.
    let claims = store.claim_streams(a, &ids[..2]).await.unwrap();
    assert_eq!(claims.len(), 2);
    assert!(claims
        .iter()
        .all(|c| c.lease_epoch == 1 && c.log == StreamLog::Nowhere));
    assert!(store.claim_streams(b, &ids[..2]).await.unwrap().is_empty());
    assert_eq!(
        store.stream_owner(ids[0]).await.unwrap(),
        StreamOwner::Live {
            epoch: a,
            advertise_url: "http://a".into()
        }
    );
    store
        .commit_takeover(a, &[(ids[0], 1), (ids[1], 1)])
        .await
        .unwrap();
    assert!(store.renew_lease(a, minute, true).await.unwrap());
    // Its owner may claim a stream again (it asks only when a takeover of the stream
    // failed part way): a new lease epoch, the same log to rebuild from.
    let again = store.claim_streams(a, &ids[1..2]).await.unwrap();
    assert_eq!(
        (again.len(), again[0].lease_epoch, again[0].log),
        (1, 2, StreamLog::Epoch(a))
    );

    // Node a's lease runs out (renewed to last 0 ms): b takes a stream, with a higher
    // lease epoch and a's log to rebuild from; from then on a can neither renew nor
    // commit anything, and its streams are orphans until taken.
    assert!(store.renew_lease(a, 0, true).await.unwrap());
    assert!(matches!(
        store.stream_owner(ids[0]).await.unwrap(),
        StreamOwner::Lapsed { epoch } if epoch == a
    ));
    let orphans = store.orphaned_streams(10).await.unwrap();
    let orphan_ids: Vec<u64> = orphans.iter().map(|o| o.stream.id).collect();
    assert_eq!(orphan_ids, &ids[..2]);
    assert_eq!(orphans[0].previous_identity.as_deref(), Some("node-a"));
    let taken = store.claim_streams(b, &ids[..1]).await.unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!(
        (taken[0].lease_epoch, taken[0].log),
        (2, StreamLog::Epoch(a))
    );
    assert!(
        !store.renew_lease(a, minute, true).await.unwrap(),
        "a lost a lease"
    );
    assert!(matches!(
        store.commit_takeover(a, &[(ids[2], 1)]).await,
        Err(Error::LeaseLost)
    ));
    let fenced = CompactionCommit {
        committed_by: Some(a),
        ..Default::default()
    };
    assert!(matches!(
        store.commit_compaction(&fenced, now).await,
        Err(Error::LeaseLost)
    ));
    assert!(matches!(
        store.claim_streams(a, &ids[2..]).await,
        Err(Error::LeaseLost)
    ));
    // A takeover commit only holds for the lease epoch that claimed.
    store.commit_takeover(b, &[(ids[0], 1)]).await.unwrap();
    store.commit_takeover(b, &[(ids[0], 2)]).await.unwrap();
    let c = store.next_epoch().await.unwrap();
    store
        .join_cluster(c, "node-c", "http://c", minute)
        .await
        .unwrap();
    store.renew_lease(b, 0, true).await.unwrap();
    let again = store.claim_streams(c, &ids[..1]).await.unwrap();
    assert_eq!(
        (again[0].lease_epoch, again[0].log),
        (3, StreamLog::Epoch(b))
    );

    // b's log is still needed by none once c commits; a's still by ids[1].
    store.commit_takeover(c, &[(ids[0], 3)]).await.unwrap();
    assert_eq!(store.dead_logs(0).await.unwrap(), [b]);
    let skipped = CompactionCommit {
        committed_by: Some(c),
        skipped_streams: vec![ids[0]],
        ..Default::default()
    };
    let held_elsewhere = CompactionCommit {
        committed_by: Some(c),
        checkpoints: vec![(ids[1], StreamCheckpoint::default())],
        ..Default::default()
    };
    for (commit, why) in [
        (
            skipped,
            "its records are in c's log, to be taken up by the stream's next owner",
        ),
        (held_elsewhere, "ids[1] is a's, not c's"),
    ] {
        let refused = store.commit_compaction(&commit, now).await;
        assert!(
            matches!(refused, Err(Error::StreamMoved)),
            "{why}: {refused:?}"
        );
    }

    // Changes to the streams a node holds are seen by it.
    let (_, clock) = store.stream_changes(c, 0).await.unwrap();
    store
        .set_stream_config(ids[0], &StreamConfig::default())
        .await
        .unwrap();
    store.mark_stream_deleted(ids[1], now).await.unwrap();
    let (changes, _) = store.stream_changes(c, clock - 1000).await.unwrap();
    assert_eq!(
        changes
            .iter()
            .map(|c| (c.id, c.deleted))
            .collect::<Vec<_>>(),
        [(ids[0], false)]
    );

    // A node that left can never renew again (a late renewal must not undo it), nor
    // claim or commit anything.
    let gone = store.next_epoch().await.unwrap();
    store
        .join_cluster(gone, "node-gone", "http://g", minute)
        .await
        .unwrap();
    assert!(store.renew_lease(gone, minute, true).await.unwrap());
    store.leave_cluster(gone).await.unwrap();
    assert!(!store.renew_lease(gone, minute, true).await.unwrap());
    assert!(matches!(
        store.claim_streams(gone, &ids[2..]).await,
        Err(Error::LeaseLost)
    ));

    // A node started again under the same identity ends its earlier run's lease.
    let c2 = store.next_epoch().await.unwrap();
    store
        .join_cluster(c2, "node-c", "http://c", minute)
        .await
        .unwrap();
    let nodes = store.cluster_nodes().await.unwrap();
    let view = |epoch: u64| nodes.iter().find(|n| n.epoch == epoch).unwrap().clone();
    assert!(!view(c).live && view(c2).live);
    assert_eq!(view(c).streams_owned, 1);

    // A node shutting down hands its streams over: while it does, nothing is placed on
    // it; it gives up its leases but not its log; once it has left, a stream of it that
    // nobody took since is an orphan, to be rebuilt from that log.
    let h = store.next_epoch().await.unwrap();
    store
        .join_cluster(h, "node-h", "http://h", minute)
        .await
        .unwrap();
    assert!(store.renew_lease(h, minute, true).await.unwrap());
    assert!(store
        .live_nodes()
        .await
        .unwrap()
        .iter()
        .any(|n| n.epoch == h));
    let claimed = store.claim_streams(h, &ids[2..]).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let first_lease = claimed[0].lease_epoch;
    store
        .commit_takeover(h, &[(ids[2], first_lease)])
        .await
        .unwrap();
    assert_eq!(store.streams_owned(h).await.unwrap(), [ids[2]]);

    // A node hands a stream to another live node (a fair share for a node that joined):
    // the lease is the other's at once, the log stays until the other has rebuilt it;
    // never to a node that is still starting, nor to one that has left.
    assert_eq!(
        store.release_streams(h, &ids[2..], Some(c2)).await.unwrap(),
        0,
        "a node still starting takes nothing"
    );
    assert!(store.renew_lease(c2, minute, true).await.unwrap());
    assert_eq!(
        store.release_streams(h, &ids[2..], Some(c2)).await.unwrap(),
        1
    );
    assert_eq!(
        store.stream_owner(ids[2]).await.unwrap(),
        StreamOwner::Live {
            epoch: c2,
            advertise_url: "http://c".into()
        }
    );
    assert!(store.streams_owned(h).await.unwrap().is_empty());
    assert!(store.streams_owned(c2).await.unwrap().contains(&ids[2]));
    let handed = store.claim_streams(c2, &ids[2..]).await.unwrap();
    assert_eq!(
        (handed[0].lease_epoch, handed[0].log),
        (first_lease + 1, StreamLog::Epoch(h))
    );
    assert_eq!(
        store
            .release_streams(c2, &ids[2..], Some(gone))
            .await
            .unwrap(),
        0,
        "a node that left takes nothing"
    );
    // Handed back before it was rebuilt: its records are still in h's own log.
    assert_eq!(
        store.release_streams(c2, &ids[2..], Some(h)).await.unwrap(),
        1
    );
    let back = store.claim_streams(h, &ids[2..]).await.unwrap();
    assert_eq!(
        (back[0].lease_epoch, back[0].log),
        (first_lease + 2, StreamLog::Epoch(h))
    );
    let lease_epoch = back[0].lease_epoch;
    store
        .commit_takeover(h, &[(ids[2], lease_epoch)])
        .await
        .unwrap();
    store.begin_leaving(h).await.unwrap();
    assert!(store
        .live_nodes()
        .await
        .unwrap()
        .iter()
        .all(|n| n.epoch != h));
    assert!(store
        .cluster_nodes()
        .await
        .unwrap()
        .iter()
        .any(|n| n.epoch == h && n.live && n.leaving));
    assert_eq!(
        store.release_streams(c2, &ids[2..], None).await.unwrap(),
        0,
        "only the owner gives a lease up"
    );
    assert_eq!(store.release_streams(h, &ids[2..], None).await.unwrap(), 1);
    let after_release = CompactionCommit {
        committed_by: Some(h),
        checkpoints: vec![(ids[2], StreamCheckpoint::default())],
        ..Default::default()
    };
    assert!(
        store.commit_compaction(&after_release, now).await.is_err(),
        "a node commits no compaction for a stream it handed over"
    );
    assert_eq!(
        store.stream_owner(ids[2]).await.unwrap(),
        StreamOwner::Nobody
    );
    let orphan_of_h =
        |orphans: Vec<OrphanedStream>| orphans.into_iter().find(|o| o.stream.id == ids[2]);
    assert!(
        orphan_of_h(store.orphaned_streams(10).await.unwrap()).is_none(),
        "not an orphan while the node with its log is live"
    );
    store.leave_cluster(h).await.unwrap();
    let orphan = orphan_of_h(store.orphaned_streams(10).await.unwrap())
        .expect("an orphan once the node with its log has left");
    assert_eq!(orphan.previous_identity.as_deref(), Some("node-h"));
    assert!(!orphan.legacy);
    let retaken = store.claim_streams(c2, &ids[2..]).await.unwrap();
    assert_eq!(
        (retaken[0].lease_epoch, retaken[0].log),
        (lease_epoch + 1, StreamLog::Epoch(h))
    );
    assert!(matches!(
        store.release_streams(h, &ids[2..], None).await,
        Err(Error::LeaseLost)
    ));

    store.forget_node(b).await.unwrap();
    assert!(store
        .cluster_nodes()
        .await
        .unwrap()
        .iter()
        .all(|n| n.epoch != b));
    for id in ids {
        store.remove_stream(id).await.unwrap();
    }
    for epoch in [a, c, c2, gone, h] {
        store.forget_node(epoch).await.unwrap();
    }
}

/// Segments, checkpoints, watermarks and obsolete objects; `live` is a live stream's id.
/// Usage buckets: counts add up, gauges keep the last reading, queries read one series
/// set within a range, old buckets go; basins with streams in a period.
#[cfg(test)]
async fn usage_conformance(store: &dyn MetadataStore, now: OffsetDateTime) {
    let row = |resolution, bucket, basin: &str, metric, series: &str, value| UsageRow {
        resolution,
        bucket,
        basin: basin.into(),
        stream: String::new(),
        metric,
        series: series.into(),
        value,
    };
    let counts = [
        row(Resolution::Minute, 60, "b", "append-ops", "express", 2),
        row(Resolution::Minute, 120, "b", "append-ops", "express", 1),
        row(Resolution::Minute, 60, "b", "append-ops", "standard", 5),
        row(Resolution::Minute, 60, "other", "append-ops", "express", 7),
        row(Resolution::Hour, 0, "b", "append-ops", "express", 3),
    ];
    store.add_usage(&counts, &[]).await.unwrap();
    store.add_usage(&counts[..1], &[]).await.unwrap();
    // Rows of one key in one call (two minutes' counts for one hour) add up.
    let twice = [
        row(Resolution::Hour, 3600, "b", "append-ops", "express", 2),
        row(Resolution::Hour, 3600, "b", "append-ops", "express", 5),
    ];
    store.add_usage(&twice, &[]).await.unwrap();
    let gauge = |value| {
        [row(
            Resolution::Minute,
            60,
            "b",
            "storage",
            "storage",
            value,
        )]
    };
    store.add_usage(&[], &gauge(100)).await.unwrap();
    store.add_usage(&[], &gauge(40)).await.unwrap();
    let query = |metric, from, to| UsageQuery {
        resolution: Resolution::Minute,
        basin: "b".into(),
        stream: String::new(),
        metric,
        from,
        to,
    };
    let point = |bucket, series: &str, value| UsagePoint {
        bucket,
        series: series.into(),
        value,
    };
    assert_eq!(
        store.usage(&query("append-ops", 0, 1000)).await.unwrap(),
        [
            point(60, "express", 4),
            point(60, "standard", 5),
            point(120, "express", 1)
        ]
    );
    assert_eq!(
        store.usage(&query("append-ops", 61, 1000)).await.unwrap(),
        [point(120, "express", 1)]
    );
    assert_eq!(
        store.usage(&query("storage", 0, 1000)).await.unwrap(),
        [point(60, "storage", 40)]
    );
    store.expire_usage(Resolution::Minute, 120).await.unwrap();
    assert_eq!(
        store.usage(&query("append-ops", 0, 1000)).await.unwrap(),
        [point(120, "express", 1)]
    );
    let hours = UsageQuery {
        resolution: Resolution::Hour,
        ..query("append-ops", 0, 3600)
    };
    assert_eq!(store.usage(&hours).await.unwrap(), [point(0, "express", 3)]);
    let later = UsageQuery {
        resolution: Resolution::Hour,
        ..query("append-ops", 3600, 7200)
    };
    assert_eq!(
        store.usage(&later).await.unwrap(),
        [point(3600, "express", 7)]
    );

    // A basin with a stream created now is active from now on, not before.
    create_basin_and_stream(store, "usage-basin", "metered", now).await;
    let ms = (now.unix_timestamp_nanos() / 1_000_000) as i64;
    let active = store
        .basins_with_streams(ms - 1000, ms + 86_400_000)
        .await
        .unwrap();
    assert!(active.contains(&"usage-basin".to_owned()), "{active:?}");
    assert!(store.basins_with_streams(0, 1000).await.unwrap().is_empty());
}

#[cfg(test)]
async fn segments_conformance(store: &dyn MetadataStore, live: u64) {
    use crate::segment::{segment_key, SegmentEntry};
    use crate::wal::EntrySpan;

    let now = OffsetDateTime::now_utc();
    // Written at `last_timestamp` too, so the test's times line up.
    let segment = |stream_id: u64, start: u64, end: u64, last_timestamp: u64| SegmentRecord {
        stream_id,
        key: segment_key(stream_id, start, 1),
        written_at_ms: last_timestamp,
        entries: vec![
            SegmentEntry {
                start_seq: start,
                end_seq: start + 1,
                last_timestamp: last_timestamp - 1,
                span: EntrySpan { offset: 8, len: 30 },
            },
            SegmentEntry {
                start_seq: start + 1,
                end_seq: end,
                last_timestamp,
                span: EntrySpan {
                    offset: 38,
                    len: 50,
                },
            },
        ],
    };
    // Consumer groups are checkpointed with the stream, pending entries included.
    let mut groups = crate::groups::Groups::default();
    let entry = crate::groups::EntryId::new(100, 5);
    groups.apply(&crate::groups::GroupOp::Create {
        group: "g".into(),
        last_id: entry,
        entries_read: Some(6),
    });
    groups.apply(&crate::groups::GroupOp::Redeliver {
        group: "g".into(),
        consumer: "c".into(),
        now_ms: 7,
        ids: vec![entry],
        delivered_ms: 7,
        deliveries: Some(2),
        count_up: false,
        create: true,
    });
    let groups = std::sync::Arc::new(groups);
    let checkpoint = |next_seq: u64| StreamCheckpoint {
        next_seq,
        last_timestamp: u64::MAX - 1, // restored exactly, even beyond i64
        fencing_token: "fen\0ce".into(), // NUL is valid UTF-8, so a valid token
        trim_point: 3,
        groups: groups.clone(),
        next_group_op: 4,
    };
    let gone = 999_999; // no such stream: its segment must not be indexed
    let commit = CompactionCommit {
        segments: vec![
            segment(live, 0, 10, 100),
            segment(live, 10, 20, 200),
            segment(live, 20, 30, 300),
            segment(gone, 0, 5, 100),
        ],
        checkpoints: vec![(live, checkpoint(30)), (gone, checkpoint(5))],
        wal_watermarks: vec![(1, 4), (2, 7)],
        obsolete_objects: vec!["wal/1/0".into(), "wal/1/1".into()],
        ..Default::default()
    };
    store.commit_compaction(&commit, now).await.unwrap();
    // The storage gauges sum the live stream's three segments of 80 bytes.
    let stored = store.stored_bytes().await.unwrap();
    assert_eq!(stored.iter().map(|s| s.bytes).collect::<Vec<_>>(), [240]);
    let checkpoints = store.stream_checkpoints().await.unwrap();
    assert_eq!(checkpoints.len(), 1);
    assert_eq!(checkpoints[&live], checkpoint(30));
    let watermarks = store.wal_watermarks().await.unwrap();
    assert_eq!(watermarks.into_iter().collect::<Vec<_>>(), [(1, 4), (2, 7)]);
    store
        .commit_compaction(
            &CompactionCommit {
                wal_watermarks: vec![(2, 9)],
                ..Default::default()
            },
            now,
        )
        .await
        .unwrap();
    assert_eq!(store.wal_watermarks().await.unwrap()[&2], 9);
    // Watermarks never move back.
    store
        .commit_compaction(
            &CompactionCommit {
                wal_watermarks: vec![(2, 3)],
                ..Default::default()
            },
            now,
        )
        .await
        .unwrap();
    assert_eq!(store.wal_watermarks().await.unwrap()[&2], 9);

    // Lookups by sequence number and by timestamp find the segment holding it.
    assert_eq!(
        store.segment_at(live, 0).await.unwrap(),
        Some(segment(live, 0, 10, 100))
    );
    assert_eq!(
        store
            .segment_at(live, 15)
            .await
            .unwrap()
            .unwrap()
            .start_seq(),
        10
    );
    assert!(store.segment_at(live, 30).await.unwrap().is_none());
    assert_eq!(
        store
            .segment_at_timestamp(live, 101)
            .await
            .unwrap()
            .unwrap()
            .start_seq(),
        10
    );
    assert!(store
        .segment_at_timestamp(live, 301)
        .await
        .unwrap()
        .is_none());

    // The orphan segment and the compacted chunks are obsolete, deletable from `now`.
    let earlier = now - time::Duration::seconds(1);
    assert!(store
        .obsolete_objects(earlier, 10)
        .await
        .unwrap()
        .is_empty());
    let mut obsolete = store.obsolete_objects(now, 10).await.unwrap();
    obsolete.sort();
    assert_eq!(
        obsolete,
        [
            "segments/00000000000000999999/00000000000000000000-00000000000000000001",
            "wal/1/0",
            "wal/1/1"
        ]
    );

    // Dropping by trim point and by age removes a prefix, in bounded steps.
    assert_eq!(store.drop_segments(live, 9, 0, 10, now).await.unwrap(), 0);
    assert_eq!(store.drop_segments(live, 25, 0, 10, now).await.unwrap(), 2);
    assert_eq!(
        store
            .segment_at(live, 0)
            .await
            .unwrap()
            .unwrap()
            .start_seq(),
        20
    );
    assert_eq!(store.drop_segments(live, 0, 301, 10, now).await.unwrap(), 1);
    assert!(store.segment_at(live, 0).await.unwrap().is_none());
    let obsolete = store.obsolete_objects(now, 10).await.unwrap();
    assert_eq!(obsolete.len(), 6);
    store.forget_obsolete_objects(&obsolete[..4]).await.unwrap();
    assert_eq!(
        store.obsolete_objects(now, 10).await.unwrap(),
        obsolete[4..]
    );
    store.forget_obsolete_objects(&obsolete[4..]).await.unwrap();

    // A compaction may retire more chunks than one statement binds; a key given twice
    // (in other statements, or in the same one: the SQL store binds 500 a statement)
    // is one object.
    let mut many: Vec<String> = (0..1_200).map(|n| format!("wal/3/{n:06}")).collect();
    let distinct = many.clone();
    many.push(many[3].clone());
    many.push(many[1_100].clone());
    store
        .commit_compaction(
            &CompactionCommit {
                obsolete_objects: many.clone(),
                ..Default::default()
            },
            now,
        )
        .await
        .unwrap();
    let mut obsolete = store.obsolete_objects(now, 5_000).await.unwrap();
    obsolete.sort();
    assert_eq!(obsolete, distinct);
    store
        .forget_obsolete_objects(&obsolete[..1_100])
        .await
        .unwrap();
    assert_eq!(
        store.obsolete_objects(now, 5_000).await.unwrap(),
        obsolete[1_100..]
    );
    store
        .forget_obsolete_objects(&obsolete[1_100..])
        .await
        .unwrap();
    assert!(store.obsolete_objects(now, 5_000).await.unwrap().is_empty());

    // Removing a stream retires what is left of it.
    store
        .commit_compaction(
            &CompactionCommit {
                segments: vec![segment(live, 30, 40, 400)],
                checkpoints: vec![(live, checkpoint(40))],
                ..Default::default()
            },
            now,
        )
        .await
        .unwrap();

    // Merging replaces exactly the rows it read with one, in one step.
    store
        .commit_compaction(
            &CompactionCommit {
                segments: vec![segment(live, 40, 50, 500), segment(live, 50, 60, 600)],
                checkpoints: vec![(live, checkpoint(60))],
                ..Default::default()
            },
            now,
        )
        .await
        .unwrap();
    let parts = store.newest_segments(live, 10).await.unwrap();
    let starts: Vec<u64> = parts.iter().map(|s| s.start_seq()).collect();
    assert_eq!(starts, [30, 40, 50]);
    assert_eq!(store.newest_segments(live, 2).await.unwrap(), parts[1..]);
    let merged = SegmentRecord {
        stream_id: live,
        key: "segments/merged".into(),
        written_at_ms: 600,
        entries: parts[1..].iter().flat_map(|s| s.entries.clone()).collect(),
    };
    let replaced = [parts[1].key.clone(), parts[2].key.clone()];
    // Not the rows the index has, or not a live stream: nothing changes.
    for (merged, replaced) in [
        (&merged, &replaced[..1]),
        (
            &SegmentRecord {
                stream_id: gone,
                ..merged.clone()
            },
            &replaced[..],
        ),
    ] {
        assert!(!store
            .merge_segments(merged, replaced, None, now)
            .await
            .unwrap());
    }
    assert_eq!(store.newest_segments(live, 10).await.unwrap(), parts);
    assert!(store
        .merge_segments(&merged, &replaced, None, now)
        .await
        .unwrap());
    assert_eq!(
        store.newest_segments(live, 10).await.unwrap(),
        [parts[0].clone(), merged.clone()]
    );
    assert_eq!(
        store.segment_at(live, 45).await.unwrap(),
        Some(merged.clone())
    );
    assert_eq!(
        store.segment_at(live, 55).await.unwrap(),
        Some(merged.clone())
    );
    // Done once: the same merge again finds other rows.
    assert!(!store
        .merge_segments(&merged, &replaced, None, now)
        .await
        .unwrap());
    let mut obsolete = store.obsolete_objects(now, 10).await.unwrap();
    obsolete.sort();
    assert_eq!(obsolete, replaced);
    store.forget_obsolete_objects(&obsolete).await.unwrap();

    store.remove_stream(live).await.unwrap();
    assert!(store.segment_at(live, 0).await.unwrap().is_none());
    assert!(store.stream_checkpoints().await.unwrap().is_empty());
    assert_eq!(
        store
            .obsolete_objects(OffsetDateTime::now_utc(), 10)
            .await
            .unwrap(),
        [segment_key(live, 30, 1), "segments/merged".into()]
    );
}
