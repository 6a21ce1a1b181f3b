//! The engine: every operation a front end can perform is one method here.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::FutureExt;
use time::OffsetDateTime;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::access::{Principal, TokenRegistry};
use crate::cache::ChunkCache;
use crate::caller::Caller;
use crate::compaction::{CompactionState, CompactionStats, Compactor, EpochLog};
use crate::config::{
    BasinConfig, BasinReconfiguration, StorageClass, StreamConfig, StreamReconfiguration,
};
use crate::error::{Error, Result};
use crate::lifecycle::EmptySince;
use crate::names::{BasinName, StreamName};
use crate::read::{ReadBatch, ReadRequest, ReadStart, StreamReader, MAX_UNARY_WAIT};
use crate::record::{AppendAck, AppendInput, SequencedRecord, StreamPosition};
use crate::segment::parse_segment_key;
use crate::storage::metadata::{Created, ListRange};
use crate::storage::{BasinRecord, ListPage, MetadataStore, ObjectStore, StreamRecord};
use crate::stream::{BatchLocation, SequencerState, Stored, StreamState};
use crate::wal::{decode_chunk, decode_entry, parse_chunk_key};
use crate::wal_writer::{FlushSettings, PendingAppend, WalHealth, WalStatus, WalWriter};

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
        }
    }
}

/// The least time obsolete objects stay after the commit that made them obsolete.
const MIN_OBSOLETE_GRACE: Duration = Duration::from_secs(5);

/// The longest an append waits for room in the in-flight budget before it is refused
/// with a retryable error.
const MAX_BUDGET_WAIT: Duration = Duration::from_secs(10);

/// How long a shutdown waits for accepted appends to become durable. Past it (the store
/// is away), the process exits with them unacknowledged: nothing acknowledged is lost.
const MAX_SHUTDOWN_WAIT: Duration = Duration::from_secs(20);

/// What an ensure (PUT) call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provisioned {
    Created,
    Updated,
    Unchanged,
}

type StreamKey = (BasinName, StreamName);

#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    metadata: Arc<dyn MetadataStore>,
    tokens: TokenRegistry,
    objects: Arc<dyn ObjectStore>,
    cache: Arc<ChunkCache>,
    segment_cache: ChunkCache,
    compactor: Compactor,
    settings: EngineSettings,
    epoch: u64,
    /// Live streams by name. Every live stream is here from start-up on.
    streams: RwLock<HashMap<StreamKey, Arc<StreamState>>>,
    wal: RwLock<Option<mpsc::Sender<PendingAppend>>>,
    wal_task: Mutex<Option<JoinHandle<()>>>,
    /// Compaction and lifecycle work.
    background: Mutex<Vec<JoinHandle<()>>>,
    empty_since: EmptySince,
    wal_health: WalHealth,
    draining: AtomicBool,
    /// The in-flight byte budget, in KiB permits.
    inflight: Arc<tokio::sync::Semaphore>,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn now_utc() -> OffsetDateTime {
    let now = OffsetDateTime::now_utc();
    now.replace_nanosecond(now.millisecond() as u32 * 1_000_000)
        .unwrap_or(now)
}

/// What makes two create calls "the same call": the request token and the requested
/// configuration. A retry with the same token but another body is a conflict.
fn idempotency_key<T: serde::Serialize>(token: Option<&str>, requested: &T) -> Option<String> {
    token.map(|t| {
        format!(
            "{t}\n{}",
            serde_json::to_string(requested).unwrap_or_default()
        )
    })
}

impl Engine {
    /// Recovers every stream from the metadata and the write-ahead log, then starts the
    /// WAL writer and the deletion reaper. Serving starts only after this returns.
    pub async fn open(
        metadata: Arc<dyn MetadataStore>,
        objects: Arc<dyn ObjectStore>,
        settings: EngineSettings,
    ) -> Result<Engine> {
        let settings_inflight_kib = settings.max_inflight_bytes / 1024;
        let metadata: Arc<dyn MetadataStore> =
            Arc::new(crate::storage::deadline::Deadlines::new(metadata));
        let epoch = metadata.next_epoch().await?;
        let (streams, compaction) = recover(metadata.as_ref(), objects.as_ref()).await?;
        let cache = Arc::new(ChunkCache::new(settings.cache_bytes));
        let wal_health: WalHealth = Arc::new(tokio::sync::watch::Sender::new(WalStatus::default()));
        let writer = WalWriter::spawn(
            objects.clone(),
            cache.clone(),
            settings.flush,
            epoch,
            wal_health.clone(),
        );
        let compactor = Compactor::new(
            metadata.clone(),
            objects.clone(),
            cache.clone(),
            epoch,
            writer.released,
            settings.compaction_interval.max(MIN_OBSOLETE_GRACE),
            compaction,
        );
        let inner = Arc::new(Inner {
            tokens: TokenRegistry::new(metadata.clone()),
            metadata,
            objects,
            cache,
            segment_cache: ChunkCache::new(settings.segment_cache_bytes),
            compactor,
            settings,
            epoch,
            streams: RwLock::new(streams),
            wal: RwLock::new(Some(writer.appends)),
            wal_task: Mutex::new(Some(writer.task)),
            background: Mutex::new(Vec::new()),
            empty_since: EmptySince::default(),
            inflight: Arc::new(tokio::sync::Semaphore::new((settings_inflight_kib).max(1))),
            wal_health,
            draining: AtomicBool::new(false),
        });
        let engine = Engine { inner };
        let background = vec![
            engine.every(engine.inner.settings.compaction_interval, |engine| {
                Box::pin(async move { engine.compact().await.map(|_| ()) })
            }),
            engine.every(engine.inner.settings.reap_interval, |engine| {
                Box::pin(async move { engine.run_lifecycle().await })
            }),
        ];
        *engine.inner.background.lock() = background;
        Ok(engine)
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
        loop {
            let round = self
                .inner
                .compactor
                .run_round(|| {
                    let streams = self.inner.streams.read();
                    streams.values().map(|s| (s.id, s.clone())).collect()
                })
                .await?;
            total.chunks += round.chunks;
            total.segments += round.segments;
            total.bytes += round.bytes;
            if !round.more_waiting {
                return Ok(total);
            }
        }
    }

    pub(crate) fn metadata(&self) -> &dyn MetadataStore {
        self.inner.metadata.as_ref()
    }

    pub(crate) fn empty_since(&self) -> &EmptySince {
        &self.inner.empty_since
    }

    pub(crate) fn compactor(&self) -> &Compactor {
        &self.inner.compactor
    }

    /// How long objects made obsolete stay: reads that found them just before stay able
    /// to finish.
    pub(crate) fn obsolete_grace(&self) -> Duration {
        self.inner
            .settings
            .compaction_interval
            .max(MIN_OBSOLETE_GRACE)
    }

    pub(crate) fn objects(&self) -> &dyn ObjectStore {
        self.inner.objects.as_ref()
    }

    /// The live streams with their basins.
    pub(crate) fn live_streams(&self) -> Vec<(BasinName, Arc<StreamState>)> {
        let streams = self.inner.streams.read();
        streams
            .iter()
            .map(|((basin, _), state)| (basin.clone(), state.clone()))
            .collect()
    }

    /// The access tokens this server honours.
    pub fn tokens(&self) -> &TokenRegistry {
        &self.inner.tokens
    }

    /// The engine as the holder of `bearer` (an access token's secret) sees it.
    /// `client` is the peer's address, when the front end knows it: failed attempts are
    /// throttled per address.
    pub async fn authenticate(
        &self,
        bearer: &str,
        client: Option<std::net::IpAddr>,
    ) -> Result<Caller> {
        let (principal, digest) = self.inner.tokens.authenticate(bearer, client).await?;
        Ok(Caller::new(self.clone(), principal, Some(digest)))
    }

    /// The engine with full access, for the server's own work and for tests.
    pub fn as_root(&self) -> Caller {
        Caller::new(self.clone(), Arc::new(Principal::root()), None)
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
        if self.inner.draining.load(Ordering::SeqCst) {
            return Some("the server is shutting down".into());
        }
        if self.wal_writer_stopped() {
            return Some("the write-ahead log writer stopped; see the server log".into());
        }
        self.inner.wal_health.borrow().unready_reason()
    }

    /// Whether the WAL writer ended while the server was not shutting down (it
    /// panicked): no append can be made durable any more.
    fn wal_writer_stopped(&self) -> bool {
        self.inner
            .wal_task
            .lock()
            .as_ref()
            .is_some_and(JoinHandle::is_finished)
    }

    /// Starts draining: new appends are refused with `server_draining` (accepted ones
    /// go on), and readiness says the server is shutting down.
    pub fn begin_drain(&self) {
        self.inner.draining.store(true, Ordering::SeqCst);
    }

    /// Stops taking appends, waits until everything already accepted is durable and
    /// acknowledged, and stops background work.
    pub async fn shutdown(&self) {
        self.begin_drain();
        self.inner.wal.write().take();
        let task = self.inner.wal_task.lock().take();
        if let Some(task) = task {
            if tokio::time::timeout(MAX_SHUTDOWN_WAIT, task).await.is_err() {
                tracing::error!(
                    "the record store did not take the last appends within {} s; exiting \
                     without them (they were never acknowledged)",
                    MAX_SHUTDOWN_WAIT.as_secs()
                );
            }
        }
        for task in self.inner.background.lock().drain(..) {
            task.abort();
        }
    }

    // ---- basins ----

    pub(crate) async fn create_basin(
        &self,
        name: BasinName,
        config: BasinConfig,
        request_token: Option<&str>,
    ) -> Result<BasinRecord> {
        config.validate()?;
        let record = BasinRecord {
            name,
            location: self.inner.settings.location.clone(),
            idempotency_key: idempotency_key(request_token, &config),
            config,
            created_at: now_utc(),
            deleted_at: None,
        };
        match self.inner.metadata.create_basin(record).await? {
            Created::New(basin) | Created::Existing(basin) => Ok(basin),
        }
    }

    /// Creates the basin, or replaces its whole configuration if it exists.
    pub(crate) async fn ensure_basin(
        &self,
        name: BasinName,
        config: BasinConfig,
    ) -> Result<(BasinRecord, Provisioned)> {
        config.validate()?;
        match self.inner.metadata.get_basin(&name).await? {
            Some(existing) if existing.deleted_at.is_some() => {
                Err(Error::BasinDeletionPending(name.to_string()))
            }
            Some(existing) if existing.config == config => Ok((existing, Provisioned::Unchanged)),
            Some(mut existing) => {
                self.inner.metadata.set_basin_config(&name, &config).await?;
                existing.config = config;
                Ok((existing, Provisioned::Updated))
            }
            None => Ok((
                self.create_basin(name, config, None).await?,
                Provisioned::Created,
            )),
        }
    }

    pub(crate) async fn basin(&self, name: &BasinName) -> Result<BasinRecord> {
        self.inner
            .metadata
            .get_basin(name)
            .await?
            .ok_or_else(|| Error::BasinNotFound(name.to_string()))
    }

    /// A basin that exists and is not being deleted.
    async fn active_basin(&self, name: &BasinName) -> Result<BasinRecord> {
        let basin = self.basin(name).await?;
        if basin.deleted_at.is_some() {
            return Err(Error::BasinDeletionPending(name.to_string()));
        }
        Ok(basin)
    }

    pub(crate) async fn reconfigure_basin(
        &self,
        name: &BasinName,
        change: &BasinReconfiguration,
    ) -> Result<BasinConfig> {
        let basin = self.active_basin(name).await?;
        let config = change.apply(&basin.config)?;
        self.inner.metadata.set_basin_config(name, &config).await?;
        Ok(config)
    }

    pub(crate) async fn list_basins(&self, range: &ListRange) -> Result<ListPage<BasinRecord>> {
        self.inner.metadata.list_basins(range).await
    }

    pub(crate) async fn delete_basin(&self, name: &BasinName) -> Result<()> {
        let basin = self.basin(name).await?;
        let engine = self.clone();
        let name = name.clone();
        self.detached(async move {
            // Already marked (perhaps by an earlier call whose answer was lost): its
            // streams still leave the live set below.
            if basin.deleted_at.is_none() {
                engine
                    .inner
                    .metadata
                    .mark_basin_deleted(&name, now_utc())
                    .await?;
            }
            let mut streams = engine.inner.streams.write();
            streams.retain(|(basin, _), state| {
                if *basin == name {
                    state.mark_deleted();
                    false
                } else {
                    true
                }
            });
            Ok(())
        })
        .await
    }

    // ---- streams ----

    fn resolve_config(&self, basin: &BasinRecord, requested: &StreamConfig) -> StreamConfig {
        requested.resolve(
            &basin.config.default_stream_config.unwrap_or_default(),
            self.inner.settings.default_storage_class,
        )
    }

    pub(crate) async fn create_stream(
        &self,
        basin: &BasinName,
        name: StreamName,
        config: StreamConfig,
        request_token: Option<&str>,
    ) -> Result<StreamRecord> {
        config.validate()?;
        let basin = self.active_basin(basin).await?;
        let record = StreamRecord {
            id: 0,
            basin: basin.name.clone(),
            name,
            config: self.resolve_config(&basin, &config),
            created_at: now_utc(),
            deleted_at: None,
            idempotency_key: idempotency_key(request_token, &config),
        };
        let engine = self.clone();
        self.detached(async move {
            let created = engine.inner.metadata.create_stream(record).await?;
            Ok(engine.register(created))
        })
        .await
    }

    /// Adds a newly created stream to the live set (idempotent for retried creates).
    fn register(&self, created: Created<StreamRecord>) -> StreamRecord {
        let record = match created {
            Created::New(record) | Created::Existing(record) => record,
        };
        let key = (record.basin.clone(), record.name.clone());
        let mut streams = self.inner.streams.write();
        let current = streams.get(&key).map(|state| state.id);
        if current != Some(record.id) {
            // A different id under this name is a deleted stream whose removal from the
            // map never ran: it must not receive the new stream's records.
            let fresh = StreamState::new(
                record.id,
                record.name.clone(),
                record.config,
                SequencerState::default(),
                StreamPosition::default(),
                Vec::new(),
            );
            if let Some(stale) = streams.insert(key, fresh) {
                stale.mark_deleted();
            }
        }
        record
    }

    /// Runs a metadata change to completion even if the caller stops waiting (a client
    /// hanging up), so the metadata and the live-stream map never disagree.
    async fn detached<T: Send + 'static>(
        &self,
        change: impl std::future::Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        tokio::spawn(change)
            .await
            .map_err(|e| Error::storage(format!("metadata change failed: {e}")))?
    }

    pub(crate) async fn ensure_stream(
        &self,
        basin: &BasinName,
        name: StreamName,
        config: StreamConfig,
    ) -> Result<(StreamRecord, Provisioned)> {
        config.validate()?;
        let basin_record = self.active_basin(basin).await?;
        let resolved = self.resolve_config(&basin_record, &config);
        match self.inner.metadata.get_stream(basin, &name).await? {
            Some(existing) if existing.deleted_at.is_some() => {
                Err(Error::StreamDeletionPending(name.to_string()))
            }
            Some(existing) if existing.config == resolved => Ok((existing, Provisioned::Unchanged)),
            Some(mut existing) => {
                self.inner
                    .metadata
                    .set_stream_config(existing.id, &resolved)
                    .await?;
                if let Some(state) = self.live_stream(basin, &name) {
                    state.set_config(resolved);
                }
                existing.config = resolved;
                Ok((existing, Provisioned::Updated))
            }
            None => match self.create_stream(basin, name.clone(), config, None).await {
                Ok(record) => Ok((record, Provisioned::Created)),
                // Lost a race with another creator: the stream now exists as asked.
                Err(Error::AlreadyExists(_)) => {
                    Box::pin(self.ensure_stream(basin, name, config)).await
                }
                Err(err) => Err(err),
            },
        }
    }

    fn live_stream(&self, basin: &BasinName, name: &StreamName) -> Option<Arc<StreamState>> {
        self.inner
            .streams
            .read()
            .get(&(basin.clone(), name.clone()))
            .cloned()
    }

    /// Explains why a stream is not live: its basin or it is missing or being deleted.
    async fn missing_stream_error(&self, basin: &BasinName, name: &StreamName) -> Error {
        match self.active_basin(basin).await {
            Err(err) => err,
            Ok(_) => match self.inner.metadata.get_stream(basin, name).await {
                Ok(Some(record)) if record.deleted_at.is_some() => {
                    Error::StreamDeletionPending(name.to_string())
                }
                Ok(_) => Error::StreamNotFound(name.to_string()),
                Err(err) => err,
            },
        }
    }

    /// A live stream, from the map or else from the metadata: one the map does not know
    /// yet (its registration was cut short, or a concurrent creator has not registered
    /// it yet) holds no records yet, so registering it here is safe.
    async fn known_stream(
        &self,
        basin: &BasinName,
        name: &StreamName,
    ) -> Result<Option<Arc<StreamState>>> {
        if let Some(state) = self.live_stream(basin, name) {
            return Ok(Some(state));
        }
        match self.inner.metadata.get_stream(basin, name).await? {
            Some(record) if record.deleted_at.is_none() => {
                self.register(Created::Existing(record));
                Ok(self.live_stream(basin, name))
            }
            _ => Ok(None),
        }
    }

    /// A live stream, created on the spot if the basin allows it for this kind of access
    /// (`create_config` is `Some` for accesses that may create, with the requested config).
    async fn stream_for(
        &self,
        basin: &BasinName,
        name: &StreamName,
        create: Option<(AutoCreate, &StreamConfig)>,
    ) -> Result<Arc<StreamState>> {
        if let Some(state) = self.known_stream(basin, name).await? {
            return Ok(state);
        }
        if let Some((kind, config)) = create {
            let basin_record = self.active_basin(basin).await?;
            let allowed = match kind {
                AutoCreate::OnAppend => basin_record.config.create_stream_on_append,
                AutoCreate::OnRead => basin_record.config.create_stream_on_read,
            };
            if allowed {
                config.validate()?;
                match self.create_stream(basin, name.clone(), *config, None).await {
                    Ok(_) | Err(Error::AlreadyExists(_)) => {}
                    Err(err) => return Err(err),
                }
                // `AlreadyExists`: a concurrent auto-creation won, and may not have
                // registered the stream yet.
                if let Some(state) = self.known_stream(basin, name).await? {
                    return Ok(state);
                }
            }
        }
        Err(self.missing_stream_error(basin, name).await)
    }

    pub(crate) async fn stream_config(
        &self,
        basin: &BasinName,
        name: &StreamName,
    ) -> Result<StreamConfig> {
        Ok(self.stream_for(basin, name, None).await?.config())
    }

    pub(crate) async fn reconfigure_stream(
        &self,
        basin: &BasinName,
        name: &StreamName,
        change: &StreamReconfiguration,
    ) -> Result<StreamConfig> {
        let state = self.stream_for(basin, name, None).await?;
        let basin_record = self.active_basin(basin).await?;
        let config = self.resolve_config(&basin_record, &change.apply(&state.config())?);
        self.inner
            .metadata
            .set_stream_config(state.id, &config)
            .await?;
        state.set_config(config);
        Ok(config)
    }

    pub(crate) async fn list_streams(
        &self,
        basin: &BasinName,
        range: &ListRange,
    ) -> Result<ListPage<StreamRecord>> {
        self.basin(basin).await?;
        self.inner.metadata.list_streams(basin, range).await
    }

    pub(crate) async fn delete_stream(&self, basin: &BasinName, name: &StreamName) -> Result<()> {
        let record = match self.inner.metadata.get_stream(basin, name).await? {
            Some(record) => record,
            None => return Err(self.missing_stream_error(basin, name).await),
        };
        let engine = self.clone();
        let key = (basin.clone(), name.clone());
        self.detached(async move {
            // Already marked (perhaps by an earlier call whose answer was lost): the
            // stream still leaves the live set below.
            if record.deleted_at.is_none() {
                engine
                    .inner
                    .metadata
                    .mark_stream_deleted(record.id, now_utc())
                    .await?;
            }
            let mut streams = engine.inner.streams.write();
            if streams.get(&key).is_some_and(|state| state.id == record.id) {
                if let Some(state) = streams.remove(&key) {
                    state.mark_deleted();
                }
            }
            Ok(())
        })
        .await
    }

    // ---- records ----

    /// Makes sure a stream can take appends, creating it if the basin creates streams on
    /// append: what an append session checks before it starts.
    pub(crate) async fn open_for_append(
        &self,
        basin: &BasinName,
        name: &StreamName,
        create_config: Option<&StreamConfig>,
    ) -> Result<()> {
        let create_config = create_config.copied().unwrap_or_default();
        self.stream_for(basin, name, Some((AutoCreate::OnAppend, &create_config)))
            .await
            .map(|_| ())
    }

    /// Checks and sequences a batch now, and returns its acknowledgement to await. Batches
    /// submitted one after another are sequenced, made durable and acknowledged in that
    /// order, so a session can keep many in flight. An error here (a failed condition,
    /// bad input) means the batch was not appended.
    pub(crate) async fn submit_append(
        &self,
        basin: &BasinName,
        name: &StreamName,
        input: AppendInput,
        create_config: Option<&StreamConfig>,
    ) -> Result<PendingAck> {
        crate::crash_point::panic_point(&input.records);
        let valid = input.validate()?;
        self.check_accepting()?;
        let create_config = create_config.copied().unwrap_or_default();
        let state = self
            .stream_for(basin, name, Some((AutoCreate::OnAppend, &create_config)))
            .await?;
        // Waiting for budget changes nothing, so a request dropped here leaves no trace.
        // A budget that stays spent this long means the store is not keeping up (or is
        // away): the client is told to retry rather than left waiting without end.
        let budget = tokio::time::timeout(
            MAX_BUDGET_WAIT,
            self.inner
                .inflight
                .clone()
                .acquire_many_owned(self.budget_kib(valid.metered)),
        )
        .await
        .map_err(|_| {
            Error::Unavailable(format!(
                "the server's {} MiB of memory for appends on their way to durability \
                 stayed full for {} s; retry shortly",
                self.inner.settings.max_inflight_bytes / (1024 * 1024),
                MAX_BUDGET_WAIT.as_secs()
            ))
        })?
        .map_err(|_| Error::ServerDraining)?;
        // The store may have started failing while this append waited.
        self.check_accepting()?;
        let (done, ack) = oneshot::channel();
        // Holding a sender keeps the writer running until this batch is in its queue.
        let wal = self.inner.wal.read().clone();
        let wal = wal.ok_or(Error::ServerDraining)?;
        let mut sequencer = state.sequencer().lock().await;
        // The queue slot is reserved before anything is sequenced: if this future is
        // dropped while waiting (a client hanging up under load), nothing has changed.
        // Once sequenced, the hand-off below cannot wait or fail, and it happens while
        // the sequencer is held, so batches enter the log in sequence order.
        let slot = wal
            .reserve()
            .await
            .map_err(|_| Error::Unavailable("the write-ahead log writer stopped".into()))?;
        let batch = state.sequence(&mut sequencer, input, &valid.commands, now_ms())?;
        slot.send(PendingAppend {
            batch,
            done,
            _budget: budget,
        });
        Ok(PendingAck(ack))
    }

    /// The share of the in-flight byte budget a batch of `metered` bytes takes, in KiB.
    fn budget_kib(&self, metered: u64) -> u32 {
        let total = self.inner.settings.max_inflight_bytes / 1024;
        (metered.div_ceil(1024) as usize).clamp(1, total.max(1)) as u32
    }

    /// Whether an append of `metered` bytes would have to wait now because the bytes
    /// already on their way to durability use up the in-flight budget. Front ends whose
    /// clients retry by protocol (OTLP exporters) answer "retry later" instead of queueing.
    pub fn is_congested(&self, metered: u64) -> bool {
        self.inner.inflight.available_permits() < self.budget_kib(metered) as usize
    }

    fn check_accepting(&self) -> Result<()> {
        if let Some(reason) = self.inner.wal_health.borrow().refusal() {
            return Err(Error::Unavailable(reason));
        }
        if self.wal_writer_stopped() {
            return Err(Error::Unavailable(
                "the write-ahead log writer stopped unexpectedly (see the server log); \
                 restart streamgate, which recovers every acknowledged record"
                    .into(),
            ));
        }
        if self.inner.draining.load(Ordering::SeqCst) {
            return Err(Error::ServerDraining);
        }
        Ok(())
    }

    pub(crate) async fn check_tail(
        &self,
        basin: &BasinName,
        name: &StreamName,
        create_config: Option<&StreamConfig>,
    ) -> Result<StreamPosition> {
        let create_config = create_config.copied().unwrap_or_default();
        let state = self
            .stream_for(basin, name, Some((AutoCreate::OnRead, &create_config)))
            .await?;
        Ok(state.tail())
    }

    /// Opens a reader at a start selector, creating the stream if the basin allows it.
    /// A start beyond the tail is `RangeNotSatisfiable`, unless `clamp` moves it to the
    /// tail. Starts below the trim point move up to it.
    pub(crate) async fn open_reader(
        &self,
        basin: &BasinName,
        name: &StreamName,
        start: ReadStart,
        clamp: bool,
        create_config: Option<&StreamConfig>,
    ) -> Result<StreamReader> {
        let create_config = create_config.copied().unwrap_or_default();
        let state = self
            .stream_for(basin, name, Some((AutoCreate::OnRead, &create_config)))
            .await?;
        StreamReader::open(self.clone(), state, start, clamp).await
    }

    /// A single-batch read with the documented semantics: start selection, the 416
    /// rules, bounds capped at 1000 records / 1 MiB, and an optional wait at the tail.
    pub(crate) async fn read(
        &self,
        basin: &BasinName,
        name: &StreamName,
        request: ReadRequest,
        create_config: Option<&StreamConfig>,
    ) -> Result<ReadBatch> {
        request.validate()?;
        let mut reader = self
            .open_reader(basin, name, request.start, request.clamp, create_config)
            .await?;
        let wait = request.wait.min(MAX_UNARY_WAIT);
        if wait.is_zero() && reader.at_tail() {
            return Err(Error::RangeNotSatisfiable {
                tail: reader.tail(),
            });
        }
        let limits = request.limits.for_one_batch();
        if limits.count == Some(0) || limits.bytes == Some(0) {
            return Ok(ReadBatch::default());
        }
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let (batch, bounded) = reader.next_batch(limits).await?;
            if !batch.records.is_empty() || bounded {
                return Ok(batch);
            }
            if !reader.wait_for_records(Some(deadline)).await? {
                return Ok(ReadBatch::default());
            }
        }
    }

    /// The records of one durable batch: from a cached WAL chunk or a range of it, or
    /// from its segment, which is fetched whole and cached (a read of history goes on to
    /// the next batches of the same segment). A segment that is gone was trimmed, expired
    /// or deleted meanwhile, so its records are no longer readable: none are returned.
    pub(crate) async fn load(&self, location: &BatchLocation) -> Result<Vec<SequencedRecord>> {
        let span = location.span;
        let key = &location.object;
        let bytes = match location.stored {
            Stored::WalChunk => match self.inner.cache.get(key) {
                Some(chunk) => span.cut(&chunk),
                None => self.inner.objects.get_range(key, span.range()).await?,
            },
            Stored::Segment => match self.inner.segment_cache.get(key) {
                Some(segment) => span.cut(&segment),
                None => match self.inner.objects.get(key).await? {
                    Some(segment) if segment.len() as u64 >= span.range().end => {
                        self.inner
                            .segment_cache
                            .insert(key.clone(), segment.clone());
                        span.cut(&segment)
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
            .inner
            .metadata
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

    /// Where the batches of a stream from `from` up to `until` (the end of its compacted
    /// records) lie in segments, enough of them to hold `max_count` records. Batches that
    /// were trimmed or expired are not there: the first one returned may start later.
    pub(crate) async fn segment_locations(
        &self,
        stream_id: u64,
        mut from: u64,
        until: u64,
        max_count: u64,
    ) -> Result<Vec<BatchLocation>> {
        let mut locations = Vec::new();
        let mut covered = 0u64;
        while from < until && covered < max_count {
            let Some(segment) = self.inner.metadata.segment_at(stream_id, from).await? else {
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
    pub(crate) async fn seq_at_timestamp_in_segments(
        &self,
        stream_id: u64,
        timestamp: u64,
    ) -> Result<Option<u64>> {
        let Some(segment) = self
            .inner
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

/// The acknowledgement of a submitted append: resolves once the batch is durable.
pub struct PendingAck(oneshot::Receiver<Result<AppendAck>>);

impl std::future::Future for PendingAck {
    type Output = Result<AppendAck>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx).map(|outcome| {
            outcome
                .unwrap_or_else(|_| Err(Error::Unavailable("the write-ahead log stopped".into())))
        })
    }
}

#[derive(Debug, Clone, Copy)]
enum AutoCreate {
    OnAppend,
    OnRead,
}

/// A crash can lose or tear only the chunks that were being written: at most this many
/// (the largest `--flush-in-flight` accepted) end an epoch. A missing or unreadable
/// chunk with more after it is corruption, not a crash.
pub const MAX_TORN_TAIL: usize = 64;

/// Rebuilds every live stream from its checkpoint (where its segments end) and the WAL
/// chunks after the compacted ones: its tail, last timestamp, fencing token, trim point,
/// and where each batch still in the WAL lies. Within each epoch, chunks are replayed in
/// order from the watermark up to the first missing one; chunks after a gap were never
/// acknowledged (see the writer).
async fn recover(
    metadata: &dyn MetadataStore,
    objects: &dyn ObjectStore,
) -> Result<(HashMap<StreamKey, Arc<StreamState>>, CompactionState)> {
    let live = metadata.live_streams().await?;
    let checkpoints = metadata.stream_checkpoints().await?;
    let watermarks = metadata.wal_watermarks().await?;
    let mut replay: HashMap<u64, (SequencerState, Vec<BatchLocation>)> = live
        .iter()
        .map(|s| {
            let state = checkpoints.get(&s.id).map(SequencerState::from);
            (s.id, (state.unwrap_or_default(), Vec::new()))
        })
        .collect();

    let mut epochs: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for key in objects.list("wal/").await? {
        if let Some((epoch, number)) = parse_chunk_key(&key) {
            epochs.entry(epoch).or_default().push(number);
        }
    }
    let mut logs = BTreeMap::new();
    let mut chunks_replayed = 0usize;
    for (epoch, mut numbers) in epochs {
        numbers.sort_unstable();
        let watermark = watermarks.get(&epoch).copied().unwrap_or(0);
        // Chunks below the watermark are compacted, waiting to be deleted.
        numbers.retain(|n| *n >= watermark);
        let mut end = watermark;
        for (expected, number) in (watermark..).zip(numbers.iter()) {
            let key: Arc<str> = crate::wal::chunk_key(epoch, expected).into();
            // A chunk that is missing, or reads as absent (torn), was being written when
            // the process died, so neither it nor any chunk after it was acknowledged: it
            // ends this epoch's log. Only a few chunks are ever written at once, so many
            // complete ones after it mean a damaged log, not a crash.
            let chunk = if *number == expected {
                objects.get(&key).await?
            } else {
                None
            };
            let Some(chunk) = chunk else {
                let from_here = numbers.len() - (expected - watermark) as usize;
                let after = from_here - usize::from(*number == expected);
                if after > MAX_TORN_TAIL {
                    return Err(Error::storage(format!(
                        "WAL chunk `{key}` is missing or unreadable but {after} chunks follow it, \
                         so it was not lost to a crash: the log is corrupt; restore the data \
                         directory from a backup"
                    )));
                }
                tracing::warn!(
                    epoch,
                    ignored = after,
                    "a WAL chunk lost to a crash ends this epoch; ignoring the chunks after it"
                );
                break;
            };
            for entry in decode_chunk(&key, &chunk)? {
                let Some((sequencer, batches)) = replay.get_mut(&entry.stream_id) else {
                    continue; // a deleted stream
                };
                let first_seq = entry.records[0].seq_num;
                if first_seq != sequencer.next_seq {
                    return Err(Error::storage(format!(
                        "WAL chunk `{key}` continues stream {} at {first_seq}, but recovery \
                         expected {}; refusing to serve from an inconsistent log",
                        entry.stream_id, sequencer.next_seq
                    )));
                }
                sequencer.replay(&entry.records);
                batches.push(BatchLocation {
                    start_seq: first_seq,
                    end_seq: sequencer.next_seq,
                    last_timestamp: sequencer.last_timestamp,
                    object: key.clone(),
                    stored: Stored::WalChunk,
                    span: entry.span,
                });
            }
            chunks_replayed += 1;
            end = number + 1;
        }
        let leftovers = numbers
            .iter()
            .filter(|n| **n >= end)
            .map(|n| crate::wal::chunk_key(epoch, *n))
            .collect();
        logs.insert(
            epoch,
            EpochLog {
                next: watermark,
                end: Some((end, leftovers)),
            },
        );
    }
    tracing::info!(
        streams = live.len(),
        checkpoints = checkpoints.len(),
        chunks = chunks_replayed,
        "recovered streams from their checkpoints and the write-ahead log"
    );
    let streams = live
        .into_iter()
        .map(|record| {
            let (sequencer, batches) = replay.remove(&record.id).unwrap_or_default();
            let compacted = checkpoints
                .get(&record.id)
                .map(|c| StreamPosition {
                    seq_num: c.next_seq,
                    timestamp: c.last_timestamp,
                })
                .unwrap_or_default();
            let state = StreamState::new(
                record.id,
                record.name.clone(),
                record.config,
                sequencer,
                compacted,
                batches,
            );
            ((record.basin, record.name), state)
        })
        .collect();
    let compaction = CompactionState {
        checkpoints: checkpoints
            .iter()
            .map(|(id, c)| (*id, SequencerState::from(c)))
            .collect(),
        logs,
    };
    Ok((streams, compaction))
}
