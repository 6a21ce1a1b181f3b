//! The engine: the facade front ends (through `Caller`) call. It wires the parts
//! together — catalog, appender, record store, compaction, lifecycle — and owns the
//! background tasks; each part owns its own state.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use parking_lot::Mutex;
use tokio::task::JoinHandle;

use crate::access::TokenRegistry;
use crate::appender::{Appender, PendingAck};
use crate::cache::ChunkCache;
use crate::catalog::{AutoCreate, Catalog};
use crate::compaction::{CompactionStats, Compactor};
use crate::config::{StorageClass, StreamConfig};
use crate::error::Result;
use crate::lifecycle::Lifecycle;
use crate::names::{BasinName, StreamName};
use crate::read::{ReadBatch, ReadRequest, ReadStart, StreamReader};
use crate::record::{AppendInput, StreamPosition};
use crate::record_store::RecordStore;
use crate::registry::StreamRegistry;
use crate::storage::{MetadataStore, ObjectStore};
use crate::wal::recovery::recover;
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

#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    settings: EngineSettings,
    epoch: u64,
    objects: Arc<dyn ObjectStore>,
    tokens: TokenRegistry,
    catalog: Arc<Catalog>,
    appender: Appender,
    records: Arc<RecordStore>,
    registry: Arc<StreamRegistry>,
    compactor: Arc<Compactor>,
    lifecycle: Lifecycle,
    /// Compaction and lifecycle work.
    background: Mutex<Vec<JoinHandle<()>>>,
}

impl Engine {
    /// Recovers every stream from the metadata and the write-ahead log, then starts the
    /// WAL writer, compaction and the lifecycle task. Serving starts only after this
    /// returns.
    pub async fn open(
        metadata: Arc<dyn MetadataStore>,
        objects: Arc<dyn ObjectStore>,
        settings: EngineSettings,
    ) -> Result<Engine> {
        let metadata: Arc<dyn MetadataStore> =
            Arc::new(crate::storage::deadline::Deadlines::new(metadata));
        let epoch = metadata.next_epoch().await?;
        let (streams, compaction) = recover(metadata.as_ref(), objects.as_ref()).await?;
        let registry = Arc::new(StreamRegistry::new(streams));
        let wal_cache = Arc::new(ChunkCache::new(settings.cache_bytes));
        let wal_health: WalHealth = Arc::new(tokio::sync::watch::Sender::new(WalStatus::default()));
        let writer = WalWriter::spawn(
            objects.clone(),
            wal_cache.clone(),
            settings.flush,
            epoch,
            wal_health.clone(),
        );
        let obsolete_grace = settings.compaction_interval.max(MIN_OBSOLETE_GRACE);
        let compactor = Arc::new(Compactor::new(
            metadata.clone(),
            objects.clone(),
            wal_cache.clone(),
            epoch,
            writer.released,
            obsolete_grace,
            compaction,
        ));
        let catalog = Arc::new(Catalog::new(
            metadata.clone(),
            registry.clone(),
            settings.location.clone(),
            settings.default_storage_class,
        ));
        let lifecycle = Lifecycle::new(
            metadata.clone(),
            objects.clone(),
            catalog.clone(),
            compactor.clone(),
            obsolete_grace,
        );
        let inner = Arc::new(Inner {
            appender: Appender::new(
                writer.appends,
                writer.task,
                wal_health,
                settings.max_inflight_bytes,
            ),
            records: Arc::new(RecordStore::new(
                metadata.clone(),
                objects.clone(),
                wal_cache,
                settings.segment_cache_bytes,
            )),
            tokens: TokenRegistry::new(metadata),
            objects,
            catalog,
            registry,
            compactor,
            lifecycle,
            settings,
            epoch,
            background: Mutex::new(Vec::new()),
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
                .run_round(|| self.inner.registry.by_id())
                .await?;
            total.chunks += round.chunks;
            total.segments += round.segments;
            total.bytes += round.bytes;
            if !round.more_waiting {
                return Ok(total);
            }
        }
    }

    /// One lifecycle pass: retention, trim, delete-on-empty, deletions and obsolete
    /// objects (the background task runs one every `reap_interval`).
    pub async fn run_lifecycle(&self) -> Result<()> {
        self.inner.lifecycle.run_pass().await
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
    ) -> Result<()> {
        let create_config = create_config.copied().unwrap_or_default();
        self.catalog()
            .stream_for(basin, name, Some((AutoCreate::OnAppend, &create_config)))
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
        let appender = &self.inner.appender;
        appender.check_accepting()?;
        let create_config = create_config.copied().unwrap_or_default();
        let stream = self
            .catalog()
            .stream_for(basin, name, Some((AutoCreate::OnAppend, &create_config)))
            .await?;
        appender
            .submit(&stream, input, valid, crate::record::now_ms())
            .await
    }

    pub(crate) async fn check_tail(
        &self,
        basin: &BasinName,
        name: &StreamName,
        create_config: Option<&StreamConfig>,
    ) -> Result<StreamPosition> {
        let create_config = create_config.copied().unwrap_or_default();
        let stream = self
            .catalog()
            .stream_for(basin, name, Some((AutoCreate::OnRead, &create_config)))
            .await?;
        Ok(stream.tail())
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
        let stream = self
            .catalog()
            .stream_for(basin, name, Some((AutoCreate::OnRead, &create_config)))
            .await?;
        StreamReader::open(self.inner.records.clone(), stream, start, clamp).await
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
        reader.read_one_batch(&request).await
    }
}
