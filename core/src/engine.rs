//! The engine: the facade front ends (through `Caller`) call. It wires the parts
//! together — catalog, appender, record store, compaction, lifecycle — and owns the
//! background tasks; each part owns its own state.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use parking_lot::Mutex;
use tokio::task::JoinHandle;

use crate::access::TokenRegistry;
use crate::appender::GroupChange;
use crate::appender::{Appender, PendingAck, Submission};
use crate::cache::ChunkCache;
use crate::catalog::{AutoCreate, Catalog};
use crate::compaction::CompactionState;
use crate::compaction::{CompactionStats, Compactor};
use crate::config::{StorageClass, StreamConfig};
use crate::encryption::{EncryptionKey, StreamCrypto};
use crate::error::Error;
use crate::error::Result;
use crate::groups::{Durable, GroupOp, GroupTurn, GroupView, Groups};
use crate::lifecycle::Lifecycle;
use crate::membership::{ClusterSettings, Membership};
use crate::names::{BasinName, StreamName};
use crate::ownership::{Ownership, Placement};
use crate::read::ReadMeter;
use crate::read::{ReadBatch, ReadRequest, ReadStart, StreamReader};
use crate::record::{AppendInput, StreamPosition};
use crate::record_store::RecordStore;
use crate::registry::StreamRegistry;
use crate::remote::RemoteStreams;
use crate::storage::{MetadataStore, ObjectStore};
use crate::usage::{ConnectionId, Usage, UsageRecorder};
use crate::wal::recovery::{chunks_of, legacy_epochs};
use crate::wal::writer::{FlushSettings, WalHealth, WalStatus, WalWriter};

#[derive(Debug, Clone)]
pub struct EngineSettings {
    pub flush: FlushSettings,
    /// Memory for recently written WAL chunks, which serve recent reads.
    pub cache_bytes: usize,
    /// How often deleted basins and streams are reaped; until then their names stay taken.
    pub reap_interval: Duration,
    /// Bytes of appends accepted but not yet durable, across all streams; past this,
    /// appends wait (and sessions stop reading), instead of buffering without bound.
    pub max_inflight_bytes: usize,
    /// How often WAL chunks are compacted into per-stream segments. Longer means fewer,
    /// larger segment objects (fewer requests) and more WAL kept and replayed at start.
    pub compaction_interval: Duration,
    /// Memory for segments, which serve reads of history.
    pub segment_cache_bytes: usize,
    /// The one location this server offers.
    pub location: String,
    /// Storage class of streams that do not choose one.
    pub default_storage_class: StorageClass,
    /// This node's identity, address and lease time in the cluster.
    pub cluster: ClusterSettings,
    /// How often the stored bytes of every stream are read for the storage metrics.
    pub storage_metrics_interval: Duration,
    /// Whether runs of small segments are merged after each compaction round (see
    /// `segment_merge`), so that a slow stream's history costs few object reads.
    pub merge_segments: bool,
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            flush: FlushSettings::default(),
            cache_bytes: 256 * 1024 * 1024,
            reap_interval: Duration::from_secs(5),
            max_inflight_bytes: 256 * 1024 * 1024,
            compaction_interval: Duration::from_secs(30),
            segment_cache_bytes: 256 * 1024 * 1024,
            location: "local".into(),
            default_storage_class: StorageClass::Express,
            cluster: ClusterSettings::default(),
            storage_metrics_interval: Duration::from_secs(60),
            merge_segments: true,
        }
    }
}

/// How far back (ms, by the metadata store's clock) each look for stream changes reaches
/// before the previous look: a change whose transaction read the clock earlier but
/// committed later is still seen.
const CHANGE_CLOCK_SLACK_MS: i64 = 5_000;

/// The longest a hand-off may take (waiting for a compaction round or a takeover to
/// finish, for the accepted appends to become durable, for the metadata store): past
/// it, the shutdown goes on without, so `SIGTERM` always stops the node.
const HAND_OFF_LIMIT: Duration = Duration::from_secs(15);

/// The pauses between attempts to take this node's streams back at start while a store
/// is away: the first, and the longest.
const START_RETRY_FIRST: Duration = Duration::from_millis(500);
const START_RETRY_MAX: Duration = Duration::from_secs(10);

/// The least time obsolete objects stay after the commit that made them obsolete.
pub(crate) const MIN_OBSOLETE_GRACE: Duration = Duration::from_secs(5);

/// Where an append went.
pub(crate) enum Submitted {
    /// Sequenced here: its acknowledgement, to await.
    Here(PendingAck),
    /// Not appended: the node at `advertise_url` sequences the stream.
    Elsewhere {
        advertise_url: String,
        input: AppendInput,
    },
}

/// What a request brings besides its token: the key of an encrypted stream, and the
/// client connection it came on (for the usage counts).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Access<'a> {
    pub key: Option<&'a EncryptionKey>,
    pub connection: Option<ConnectionId>,
}

/// How a request on a stream reached this node, which decides where it may go next.
/// Routed this way, a request makes two hops at most; it goes further only from a node
/// that has just handed the stream over (see `Engine::forwards_on`), each such hop
/// following a newer lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// From a client: served here, or passed on to the node that holds the stream (or
    /// that the placement rule gives, if none does).
    Client,
    /// Passed on by another node, which may have gone by an owner it remembered or
    /// looked before a hand-over was recorded: served here (taking the stream over if no
    /// live node holds it), or passed on once more to the node found holding it now.
    Forwarded,
    /// Passed on twice already, or by a node that looked the owner up itself just
    /// before: served here, or refused as retryable.
    LastHop,
}

/// Where a request on a stream is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Here,
    /// At the node with this advertised URL, which sequences the stream.
    Node(String),
}

#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    settings: EngineSettings,
    epoch: u64,
    metadata: Arc<dyn MetadataStore>,
    objects: Arc<dyn ObjectStore>,
    tokens: TokenRegistry,
    catalog: Arc<Catalog>,
    appender: Arc<Appender>,
    membership: Arc<Membership>,
    ownership: Arc<Ownership>,
    /// The metadata store's clock at the last look for stream changes.
    changes_seen_at: Mutex<i64>,
    /// How calls reach the nodes that sequence other streams (set by the gateway).
    remote: std::sync::OnceLock<Arc<dyn RemoteStreams>>,
    records: Arc<RecordStore>,
    registry: Arc<StreamRegistry>,
    /// Usage counts for the metrics API, until written.
    usage: Usage,
    compactor: Arc<Compactor>,
    lifecycle: Lifecycle,
    /// Compaction and lifecycle work.
    background: Mutex<Vec<JoinHandle<()>>>,
    /// When old usage buckets were last dropped.
    usage_expired_at: Mutex<Option<std::time::Instant>>,
}

impl Engine {
    /// Joins the cluster (a cluster of one for the embedded default), takes over the
    /// streams an earlier run of this node sequenced (rebuilding them from the metadata
    /// and the write-ahead log), then starts the WAL writer's acknowledgements, lease
    /// renewals, compaction and lifecycle work. Serving starts only after this returns.
    pub async fn open(
        metadata: Arc<dyn MetadataStore>,
        objects: Arc<dyn ObjectStore>,
        settings: EngineSettings,
    ) -> Result<Engine> {
        let metadata: Arc<dyn MetadataStore> =
            Arc::new(crate::storage::deadline::Deadlines::new(metadata));
        let objects: Arc<dyn ObjectStore> =
            Arc::new(crate::telemetry::InstrumentedObjects::new(objects));
        let epoch = metadata.next_epoch().await?;
        let membership =
            Membership::join(metadata.clone(), epoch, settings.cluster.clone()).await?;
        let registry = Arc::new(StreamRegistry::default());
        let wal_cache = Arc::new(ChunkCache::new(settings.cache_bytes));
        let wal_health: WalHealth = Arc::new(tokio::sync::watch::Sender::new(WalStatus::default()));
        let writer = WalWriter::spawn(
            objects.clone(),
            wal_cache.clone(),
            settings.flush,
            epoch,
            wal_health.clone(),
            membership.state(),
        );
        let obsolete_grace = settings.compaction_interval.max(MIN_OBSOLETE_GRACE);
        let compactor = Compactor::new(
            metadata.clone(),
            objects.clone(),
            wal_cache.clone(),
            epoch,
            writer.released,
            obsolete_grace,
            CompactionState {
                checkpoints: Default::default(),
                logs: Default::default(),
            },
        );
        let compactor = Arc::new(match settings.merge_segments {
            true => compactor.merging_segments(),
            false => compactor,
        });
        let appender = Arc::new(Appender::new(
            writer.appends,
            writer.task,
            wal_health,
            settings.max_inflight_bytes,
            membership.clone(),
        ));
        let ownership = Arc::new(Ownership::new(
            metadata.clone(),
            objects.clone(),
            membership.clone(),
            registry.clone(),
            appender.clone(),
            compactor.clone(),
        ));
        let catalog = Arc::new(Catalog::new(
            metadata.clone(),
            registry.clone(),
            ownership.clone(),
            settings.location.clone(),
            settings.default_storage_class,
        ));
        let lifecycle = Lifecycle::new(
            metadata.clone(),
            objects.clone(),
            catalog.clone(),
            compactor.clone(),
            obsolete_grace,
            // Most of the time between two passes, so deletions keep up with a backlog
            // while the pass's other work still comes round.
            settings.reap_interval * 4,
        );
        let inner = Arc::new(Inner {
            appender,
            records: Arc::new(RecordStore::new(
                metadata.clone(),
                objects.clone(),
                wal_cache,
                settings.segment_cache_bytes,
            )),
            tokens: TokenRegistry::new(metadata.clone()),
            metadata,
            objects,
            catalog,
            registry,
            compactor,
            lifecycle,
            membership,
            ownership,
            settings,
            epoch,
            changes_seen_at: Mutex::new(0),
            remote: std::sync::OnceLock::new(),
            background: Mutex::new(Vec::new()),
            usage: Arc::new(UsageRecorder::default()),
            usage_expired_at: Mutex::new(None),
        });
        let engine = Engine { inner };
        // Renewals start before the takeover: replaying this node's earlier logs can
        // take longer than a lease, and a lease that lapsed meanwhile would refuse it
        // (the task ends by itself if start-up fails and the engine is dropped).
        let renewals = engine.spawn_renewals();
        let taken = engine.take_back_at_start().await?;
        if let Err(err) = engine.retire_legacy_logs().await {
            tracing::warn!(error = %err, "could not delete the logs from before clusters; trying again at the next start");
        }
        tracing::info!(
            epoch,
            streams = taken,
            "joined the cluster and took over the streams this node had before"
        );
        let background = vec![
            renewals,
            engine.every(engine.inner.settings.cluster.renew_interval(), |engine| {
                Box::pin(async move { engine.follow_cluster().await })
            }),
            engine.every(engine.inner.settings.compaction_interval, |engine| {
                Box::pin(async move { engine.compact().await.map(|_| ()) })
            }),
            engine.every(engine.inner.settings.reap_interval, |engine| {
                Box::pin(async move { engine.run_lifecycle().await })
            }),
            engine.every(crate::usage::FLUSH_INTERVAL, |engine| {
                Box::pin(async move { engine.flush_usage().await })
            }),
            engine.every(Duration::from_secs(1), |engine| {
                Box::pin(async move {
                    crate::telemetry::inflight_append_bytes(engine.inner.appender.inflight_bytes());
                    Ok(())
                })
            }),
            engine.every(engine.inner.settings.storage_metrics_interval, |engine| {
                Box::pin(async move { engine.record_storage().await })
            }),
        ];
        *engine.inner.background.lock() = background;
        crate::crash_point::pause_point("start-up-done").await;
        // Until now peers handed this node nothing: it would not have answered for it.
        engine.inner.membership.become_ready().await;
        crate::crash_point::start_up_done();
        Ok(engine)
    }

    /// Takes back the streams this node held before it started, and those written
    /// before clusters (the others nobody holds go to nodes that serve already, or to
    /// this one once it does: see `Ownership::take_orphans`). A store that is away
    /// meanwhile (`Unavailable`: S3 or PostgreSQL not answering) is waited for, the
    /// takeover tried again with a growing pause, rather than ending the process: what a
    /// failed attempt did is made again by the next (see `Ownership::take`). Other
    /// failures (a damaged log, a lost lease) end the start-up with their error.
    async fn take_back_at_start(&self) -> Result<usize> {
        let mut pause = START_RETRY_FIRST;
        let ownership = &self.inner.ownership;
        loop {
            // Streams a failed attempt claimed are this node's already: `take_owned`
            // takes them on the next.
            let attempt =
                async { Ok(ownership.take_orphans(true).await? + ownership.take_owned().await?) };
            match attempt.await {
                Err(Error::Unavailable(reason)) => {
                    tracing::warn!(
                        %reason,
                        retry_in_ms = pause.as_millis() as u64,
                        "could not take back this node's streams at start: a store is away; \
                         waiting for it (nothing is served until then)"
                    );
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(START_RETRY_MAX);
                }
                outcome => return outcome,
            }
        }
    }

    /// Renews this node's lease on a steady beat, apart from every other task so that
    /// slow work never delays a renewal.
    fn spawn_renewals(&self) -> JoinHandle<()> {
        let weak = Arc::downgrade(&self.inner);
        let interval = self.inner.settings.cluster.renew_interval();
        tokio::spawn(async move {
            let mut beat = tokio::time::interval(interval);
            beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                beat.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let membership = inner.membership.clone();
                drop(inner);
                match membership.renew().await {
                    Ok(()) => {}
                    Err(Error::LeaseLost) => {
                        tracing::error!(
                            "fenced: other nodes took over streams of this node after it \
                             could not renew its lease in time; it acknowledges nothing more \
                             and stops (restart it to rejoin the cluster as a new node)"
                        );
                        return;
                    }
                    Err(err) => {
                        let holds = membership.holds();
                        tracing::warn!(error = %err, lease_holds = holds, "could not renew this node's lease; retrying")
                    }
                }
            }
        })
    }

    /// What the cluster did since the last look: which nodes are live, changes to
    /// the streams this node sequences made through other nodes, and streams whose
    /// owner is gone (this node takes its share).
    async fn follow_cluster(&self) -> Result<()> {
        let inner = &self.inner;
        inner.membership.refresh_live_nodes().await?;
        let since = *inner.changes_seen_at.lock();
        let (changes, now) = inner.metadata.stream_changes(inner.epoch, since).await?;
        for change in changes {
            if change.deleted {
                inner.registry.remove_id(change.id);
            } else if let Some(state) = inner.registry.by_id().get(&change.id) {
                state.set_config(change.config);
            }
        }
        // A change committed a little after the clock it read is still seen next time.
        *inner.changes_seen_at.lock() = now - CHANGE_CLOCK_SLACK_MS;
        // A node that just renewed after a lapse waits a lease before taking others'
        // streams, so that every node can renew first after a metadata outage.
        if inner.membership.settled() {
            let taken = inner.ownership.take_orphans(false).await?;
            if taken > 0 {
                tracing::info!(streams = taken, "took over streams of nodes that are gone");
            }
            inner.ownership.rebalance().await?;
        }
        // Streams handed to this node are rebuilt here even if nobody asks for them,
        // so their previous owner's log is not held up for them.
        let taken = inner.ownership.take_owned().await?;
        if taken > 0 {
            tracing::info!(streams = taken, "took over streams handed to this node");
        }
        Ok(())
    }

    /// Once no stream needs the logs written before clusters, they are deleted.
    async fn retire_legacy_logs(&self) -> Result<()> {
        let inner = &self.inner;
        if inner.metadata.legacy_logs_needed().await? {
            return Ok(());
        }
        let epochs: Vec<u64> = legacy_epochs(inner.metadata.as_ref(), inner.objects.as_ref())
            .await?
            .into_iter()
            .filter(|epoch| *epoch < inner.epoch)
            .collect();
        if epochs.is_empty() {
            return Ok(());
        }
        let chunks = chunks_of(inner.objects.as_ref(), &epochs).await?;
        inner.lifecycle.retire_objects(chunks).await
    }

    /// Runs `work` every `interval` until the engine is dropped; failures are logged and
    /// retried at the next tick.
    fn every(
        &self,
        interval: Duration,
        work: fn(Engine) -> futures::future::BoxFuture<'static, Result<()>>,
    ) -> JoinHandle<()> {
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                let Some(inner) = weak.upgrade() else { return };
                // A panic is reported and retried like an error, never ends the loop.
                let outcome = std::panic::AssertUnwindSafe(work(Engine { inner }))
                    .catch_unwind()
                    .await;
                match outcome {
                    Ok(Ok(())) => {}
                    Ok(Err(err)) => {
                        tracing::warn!(error = %err, "background storage work failed; will retry")
                    }
                    Err(_) => tracing::error!("background storage work panicked; will retry"),
                }
            }
        })
    }

    /// Compacts the WAL chunks released so far into segments, in as many rounds as their
    /// size needs (the background task does this every `compaction_interval`); what the
    /// rounds did, summed.
    pub async fn compact(&self) -> Result<CompactionStats> {
        let mut total = CompactionStats::default();
        let membership = &self.inner.membership;
        if membership.is_leaving() || !membership.holds() {
            // Leaving: its streams went to other nodes, which rebuild them from this
            // node's log, so the log stays as it is until they have (and then goes with
            // this node). Not holding its leases: no commit would be accepted, and what
            // the store says meanwhile may be the work of a node that took its streams.
            return Ok(total);
        }
        loop {
            let round = self
                .inner
                .compactor
                .run_round(|| self.inner.registry.by_id())
                .await;
            crate::telemetry::compaction_round(&round);
            let round = round?;
            total.chunks += round.chunks;
            total.segments += round.segments;
            total.bytes += round.bytes;
            total.merges += round.merges;
            if !round.more_waiting {
                return Ok(total);
            }
        }
    }

    /// One lifecycle pass: retention, trim, delete-on-empty, deletions and obsolete
    /// objects (the background task runs one every `reap_interval`).
    pub async fn run_lifecycle(&self) -> Result<()> {
        // Acting on a stream (deleting it when empty, say) needs the lease on it.
        self.inner.membership.check()?;
        let leader = self.is_lifecycle_leader();
        let lease = self.inner.settings.cluster.lease;
        let outcome = self.inner.lifecycle.run_pass(leader.then_some(lease)).await;
        crate::telemetry::lifecycle_pass(outcome.is_ok());
        outcome
    }

    /// Whether this node does the cluster-wide lifecycle work: the live node with the
    /// lowest epoch among those that have started.
    fn is_lifecycle_leader(&self) -> bool {
        self.inner
            .membership
            .rank()
            .is_some_and(|(rank, _)| rank == 0)
    }

    /// Writes the usage counted so far (the background task does every few seconds).
    pub async fn flush_usage(&self) -> Result<()> {
        let inner = &self.inner;
        inner.usage.flush(inner.metadata.as_ref()).await
    }

    /// On the lifecycle leader: every stream's stored bytes as gauge readings, and
    /// (hourly) old usage buckets dropped.
    async fn record_storage(&self) -> Result<()> {
        let inner = &self.inner;
        if !self.is_lifecycle_leader() {
            return Ok(());
        }
        inner.usage.record_storage(inner.metadata.as_ref()).await?;
        let due = inner
            .usage_expired_at
            .lock()
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(3600));
        if due {
            inner.usage.expire(inner.metadata.as_ref()).await?;
            *inner.usage_expired_at.lock() = Some(std::time::Instant::now());
        }
        Ok(())
    }

    pub(crate) fn usage(&self) -> &UsageRecorder {
        &self.inner.usage
    }

    pub(crate) fn metadata(&self) -> &dyn MetadataStore {
        self.inner.metadata.as_ref()
    }

    // ---- the cluster ----

    /// Resolves once this node's leases were taken over by others (it was fenced): it
    /// must stop serving. Never resolves while it keeps them.
    pub async fn lease_lost(&self) {
        let mut state = self.inner.membership.state();
        while *state.borrow_and_update() != crate::membership::LeaseState::Lost {
            if state.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// This node: its epoch, identity and advertised URL.
    pub fn node(&self) -> &ClusterSettings {
        &self.inner.settings.cluster
    }

    /// Every node the metadata store knows, with its lease and the streams it holds.
    pub async fn cluster_nodes(&self) -> Result<Vec<crate::storage::cluster::NodeRecord>> {
        self.inner.metadata.cluster_nodes().await
    }

    /// Gives the engine a way to make calls at other nodes, for front ends that cannot
    /// forward whole requests (RESP, OTLP). Without it, such calls on streams another
    /// node sequences fail (retryably) with that node's address.
    pub fn set_remote(&self, remote: Arc<dyn RemoteStreams>) {
        let _ = self.inner.remote.set(remote);
    }

    pub(crate) fn remote(&self) -> Option<Arc<dyn RemoteStreams>> {
        self.inner.remote.get().cloned()
    }

    /// Whether this node is shutting down, having handed its streams over.
    pub(crate) fn is_leaving(&self) -> bool {
        self.inner.membership.is_leaving()
    }

    /// Whether a request another node forwarded here for this stream goes on to the
    /// stream's owner: only if this node handed the stream over (shutting down, or a
    /// moment ago for an even share), since the other node looked the owner up before
    /// the hand-over was recorded.
    pub(crate) fn forwards_on(&self, basin: &BasinName, name: &StreamName) -> bool {
        self.is_leaving() || self.inner.ownership.handed_over_recently(basin, name)
    }

    /// How many streams this node sequences now.
    pub fn streams_served(&self) -> usize {
        self.inner.registry.len()
    }

    /// Where a request on a stream should be served (see `Arrival`): here, taking the
    /// stream over if no live node holds it and it falls to this node (or the request
    /// was passed on here), or at another node's URL. An error is what the request
    /// itself would get.
    pub(crate) async fn route(
        &self,
        basin: &BasinName,
        name: &StreamName,
        create: Option<(AutoCreate, &StreamConfig)>,
        arrival: Arrival,
    ) -> Result<Route> {
        let placement = match arrival {
            Arrival::Client => Placement::Balanced,
            Arrival::Forwarded | Arrival::LastHop => Placement::Here,
        };
        match self
            .catalog()
            .stream_for(basin, name, create, placement)
            .await
        {
            Ok(_) => Ok(Route::Here),
            Err(Error::OwnedElsewhere { advertise_url }) if arrival != Arrival::LastHop => {
                Ok(Route::Node(advertise_url))
            }
            Err(err) => Err(err),
        }
    }

    /// Forgets where a stream was last found: its node did not take a request passed
    /// on to it (gone, unreachable, or unavailable), so the next request looks again.
    pub fn owner_unavailable(&self, basin: &BasinName, name: &StreamName) {
        self.inner.ownership.forget_owner(basin, name);
    }

    /// The access tokens this server honours.
    pub fn tokens(&self) -> &TokenRegistry {
        &self.inner.tokens
    }

    pub(crate) fn catalog(&self) -> &Catalog {
        &self.inner.catalog
    }

    /// This process's WAL epoch.
    pub fn epoch(&self) -> u64 {
        self.inner.epoch
    }

    pub fn settings(&self) -> &EngineSettings {
        &self.inner.settings
    }

    pub fn describe_storage(&self) -> String {
        self.inner.objects.describe()
    }

    /// Why the server should not be sent traffic now (readiness), if it should not: the
    /// write-ahead log cannot be written, or the server is draining.
    pub fn unready_reason(&self) -> Option<String> {
        self.inner.appender.unready_reason()
    }

    /// The first step of a shutdown in a cluster: hands every stream this node
    /// sequences to the other nodes (see `Ownership::hand_off`), so that no append
    /// fails for it; requests that reach this node afterwards are forwarded to them.
    /// If it cannot (the store is away), the shutdown goes on without: other nodes take
    /// the streams once this node has left, replaying its log. How many it handed over.
    pub async fn hand_off(&self) -> usize {
        let handed = tokio::time::timeout(HAND_OFF_LIMIT, self.inner.ownership.hand_off())
            .await
            .unwrap_or_else(|_| {
                Err(Error::Unavailable(format!(
                    "the hand-off did not finish within {} s",
                    HAND_OFF_LIMIT.as_secs()
                )))
            });
        match handed {
            Ok(0) => 0,
            Ok(streams) => {
                tracing::info!(streams, "handed this node's streams to the other nodes");
                streams
            }
            Err(err) => {
                tracing::warn!(error = %err, "could not hand this node's streams over; other nodes take them over once it has left");
                0
            }
        }
    }

    /// Starts draining: new appends are refused with `server_draining` (accepted ones
    /// go on), and readiness says the server is shutting down.
    pub fn begin_drain(&self) {
        self.inner.appender.begin_drain();
    }

    /// Stops taking appends, waits until everything already accepted is durable and
    /// acknowledged, and stops background work.
    pub async fn shutdown(&self) {
        self.inner.appender.close().await;
        for task in self.inner.background.lock().drain(..) {
            task.abort();
        }
        if let Err(err) = self.flush_usage().await {
            tracing::warn!(error = %err, "could not write the last usage counts; the metrics API will miss them");
        }
        // Nothing more is written: other nodes may take this node's streams at once.
        if !self.inner.membership.is_lost() {
            match self.inner.metadata.leave_cluster(self.inner.epoch).await {
                Ok(()) => tracing::info!("left the cluster: other nodes take over its streams now"),
                Err(err) => {
                    tracing::warn!(error = %err, "could not leave the cluster; other nodes take over its streams once its lease runs out")
                }
            }
        }
    }

    /// Whether an append of `metered` bytes would have to wait now because the bytes
    /// already on their way to durability use up the in-flight budget. Front ends whose
    /// clients retry by protocol (OTLP exporters) answer "retry later" instead of queueing.
    pub fn is_congested(&self, metered: u64) -> bool {
        self.inner.appender.is_congested(metered)
    }

    // ---- records ----

    /// Makes sure a stream can take appends, creating it if the basin creates streams on
    /// append: what an append session checks before it starts.
    pub(crate) async fn open_for_append(
        &self,
        basin: &BasinName,
        name: &StreamName,
        create_config: Option<&StreamConfig>,
        access: Access<'_>,
    ) -> Result<()> {
        let stream = self.stream_for_append(basin, name, create_config).await?;
        StreamCrypto::for_stream(stream.cipher, stream.id, access.key).map(|_| ())
    }

    /// The stream an append goes to, created if the basin creates streams on append
    /// (with `create_config`, or the defaults).
    async fn stream_for_append(
        &self,
        basin: &BasinName,
        name: &StreamName,
        create_config: Option<&StreamConfig>,
    ) -> Result<Arc<crate::stream::StreamState>> {
        let create_config = create_config.copied().unwrap_or_default();
        self.catalog()
            .stream_for(
                basin,
                name,
                Some((AutoCreate::OnAppend, &create_config)),
                Placement::Here,
            )
            .await
    }

    /// Checks and sequences a batch now, and returns its acknowledgement to await, or
    /// gives it back with the node that sequences the stream. Batches submitted one
    /// after another are sequenced, made durable and acknowledged in that order, so a
    /// session can keep many in flight. An error here (a failed condition, bad input)
    /// means the batch was not appended.
    pub(crate) async fn submit_append(
        &self,
        basin: &BasinName,
        name: &StreamName,
        input: AppendInput,
        create_config: Option<&StreamConfig>,
        access: Access<'_>,
    ) -> Result<Submitted> {
        crate::crash_point::panic_point(&input.records);
        let mut valid = input.validate()?;
        let mut input = input;
        let appender = &self.inner.appender;
        // Refused early while the log cannot take it, before a stream is taken over for
        // it; not when leaving, for then the stream is served elsewhere.
        if !self.is_leaving() {
            appender.check_accepting()?;
        }
        loop {
            let stream = match self.stream_for_append(basin, name, create_config).await {
                Ok(stream) => stream,
                Err(Error::OwnedElsewhere { advertise_url }) => {
                    return Ok(Submitted::Elsewhere {
                        advertise_url,
                        input,
                    })
                }
                Err(err) => return Err(err),
            };
            let now_ms = crate::record::now_ms();
            let metered = valid.metered;
            let submission = match StreamCrypto::for_stream(stream.cipher, stream.id, access.key)? {
                None => appender.submit(&stream, input, valid, now_ms).await?,
                // Sealed before it reaches the sequencer, so only ciphertext is written;
                // the plaintext is kept in case the batch has to go to another node.
                Some(crypto) => {
                    let sealed = crypto.seal_input(&input);
                    match appender.submit(&stream, sealed, valid, now_ms).await? {
                        Submission::Moved(_, valid) => Submission::Moved(input, valid),
                        sequenced => sequenced,
                    }
                }
            };
            match submission {
                Submission::Sequenced(ack) => {
                    let class = stream
                        .config()
                        .storage_class
                        .unwrap_or(self.inner.settings.default_storage_class);
                    let usage = &self.inner.usage;
                    usage.append(basin, stream.id, class, metered, access.connection);
                    return Ok(Submitted::Here(ack));
                }
                // Handed over meanwhile: the stream is looked up again, and is no longer
                // here (the hand-off took it out of the registry before marking it).
                Submission::Moved(back, checked) => (input, valid) = (back, checked),
            }
        }
    }

    pub(crate) async fn check_tail(
        &self,
        basin: &BasinName,
        name: &StreamName,
        create_config: Option<&StreamConfig>,
    ) -> Result<StreamPosition> {
        // The tail is only this node's to tell while its leases surely hold.
        self.inner.membership.check()?;
        let create_config = create_config.copied().unwrap_or_default();
        let stream = self
            .catalog()
            .stream_for(
                basin,
                name,
                Some((AutoCreate::OnRead, &create_config)),
                Placement::Here,
            )
            .await?;
        Ok(stream.tail())
    }

    /// Opens a reader at a start selector, creating the stream if the basin allows it.
    /// A start beyond the tail is `RangeNotSatisfiable`, unless `clamp` moves it to the
    /// tail. Starts below the trim point move up to it.
    /// Reads through it are metered as a streaming read (a read session).
    pub(crate) async fn open_reader(
        &self,
        basin: &BasinName,
        name: &StreamName,
        start: ReadStart,
        clamp: bool,
        create_config: Option<&StreamConfig>,
        access: Access<'_>,
    ) -> Result<StreamReader> {
        self.open_local_reader(basin, name, (start, clamp), create_config, access, true)
            .await
    }

    async fn open_local_reader(
        &self,
        basin: &BasinName,
        name: &StreamName,
        (start, clamp): (ReadStart, bool),
        create_config: Option<&StreamConfig>,
        access: Access<'_>,
        streaming: bool,
    ) -> Result<StreamReader> {
        self.inner.membership.check()?;
        let create_config = create_config.copied().unwrap_or_default();
        let stream = self
            .catalog()
            .stream_for(
                basin,
                name,
                Some((AutoCreate::OnRead, &create_config)),
                Placement::Here,
            )
            .await?;
        let crypto = StreamCrypto::for_stream(stream.cipher, stream.id, access.key)?;
        let meter = ReadMeter {
            usage: self.inner.usage.clone(),
            basin: basin.clone(),
            connection: access.connection,
            streaming,
            counted_minute: None,
        };
        StreamReader::open(
            self.inner.records.clone(),
            stream,
            (start, clamp),
            crypto,
            meter,
        )
        .await
    }

    /// Whether other nodes may sequence streams: this node is not the only live one
    /// (or does not know, having lost its place among them).
    pub fn has_peers(&self) -> bool {
        self.inner.membership.may_have_peers()
    }

    /// The stream a consumer-group command works on: here, or `OwnedElsewhere`.
    pub(crate) async fn stream_for_groups(
        &self,
        basin: &BasinName,
        name: &StreamName,
    ) -> Result<Arc<crate::stream::StreamState>> {
        self.inner.membership.check()?;
        self.catalog()
            .stream_for(basin, name, None, Placement::Here)
            .await
    }

    /// Changes a stream's consumer groups (see `Appender::change_groups`): `plan` sees
    /// the groups and the stream as it is. The answer is to be given once `Durable`
    /// resolves.
    pub(crate) async fn change_groups<R>(
        &self,
        basin: &BasinName,
        name: &StreamName,
        plan: impl FnOnce(&Groups, &GroupView) -> Result<(Vec<GroupOp>, R)>,
    ) -> Result<(R, Durable)> {
        let stream = self.stream_for_groups(basin, name).await?;
        let view = GroupView::of(&stream);
        let change = self
            .inner
            .appender
            .change_groups(&stream, |groups| plan(groups, &view))
            .await?;
        Ok(match change {
            GroupChange::Sequenced { ack, answer } => {
                (answer, Durable::new(async move { ack.await.map(|_| ()) }))
            }
            GroupChange::Unchanged { durable_at, answer } => (
                answer,
                Durable::new(async move { stream.group_ops_durable_through(durable_at).await }),
            ),
        })
    }

    /// Waits for the stream's turn at a group change decided from records read first.
    pub(crate) async fn group_turn(
        &self,
        basin: &BasinName,
        name: &StreamName,
    ) -> Result<GroupTurn> {
        Ok(self
            .stream_for_groups(basin, name)
            .await?
            .group_turn()
            .await)
    }

    /// Reads a stream's consumer groups as sequenced so far: the answer is to be given
    /// once `Durable` resolves (every change it saw is durable then), so it survives a
    /// crash.
    pub(crate) async fn read_groups<R>(
        &self,
        basin: &BasinName,
        name: &StreamName,
        read: impl FnOnce(&Groups, &GroupView) -> R,
    ) -> Result<(R, Durable)> {
        let stream = self.stream_for_groups(basin, name).await?;
        let (groups, sequenced) = {
            let sequencer = stream.sequencer().lock().await;
            (sequencer.groups.clone(), sequencer.next_group_op)
        };
        let answer = read(&groups, &GroupView::of(&stream));
        Ok((
            answer,
            Durable::new(async move { stream.group_ops_durable_through(sequenced).await }),
        ))
    }

    /// A single-batch read with the documented semantics: start selection, the 416
    /// rules, bounds capped at 1000 records / 1 MiB, and an optional wait at the tail.
    pub(crate) async fn read(
        &self,
        basin: &BasinName,
        name: &StreamName,
        request: ReadRequest,
        create_config: Option<&StreamConfig>,
        access: Access<'_>,
    ) -> Result<ReadBatch> {
        request.validate()?;
        let start = (request.start, request.clamp);
        let mut reader = self
            .open_local_reader(basin, name, start, create_config, access, false)
            .await?;
        let batch = reader.read_one_batch(&request).await?;
        self.inner.usage.unary_read(basin);
        Ok(batch)
    }
}
