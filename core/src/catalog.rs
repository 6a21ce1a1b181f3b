//! The catalog: basins and streams as the metadata store keeps them — create (with
//! idempotent retries), ensure, configure, list and delete — kept in step with the
//! stream registry, and the lookup of a live stream (creating it when the basin says
//! so) that every append and read starts with.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use time::OffsetDateTime;

use crate::config::{
    BasinConfig, BasinReconfiguration, StorageClass, StreamConfig, StreamReconfiguration,
};
use crate::error::{Error, Resource, Result};
use crate::names::{BasinName, StreamName};
use crate::ownership::{Ownership, Placement};
use crate::registry::StreamRegistry;
use crate::single_flight::SingleFlight;
use crate::storage::metadata::{Created, ListRange};
use crate::storage::{BasinRecord, ListPage, MetadataStore, StreamRecord};
use crate::stream::StreamState;

/// What an ensure (PUT) call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provisioned {
    Created,
    Updated,
    Unchanged,
}

/// Which kind of access may create a missing stream (`create_stream_on_append|read`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum AutoCreate {
    OnAppend,
    OnRead,
}

pub(crate) struct Catalog {
    metadata: Arc<dyn MetadataStore>,
    registry: Arc<StreamRegistry>,
    /// Which streams this node sequences; lookups for appends and reads take a stream
    /// over through it when no live node holds it.
    ownership: Arc<Ownership>,
    /// The one location this server offers.
    location: String,
    /// Storage class of streams that do not choose one.
    default_storage_class: StorageClass,
    /// Where streams this node does not sequence are found: one lookup per stream (and
    /// placement) at a time, shared by the requests that arrive meanwhile.
    lookups: SingleFlight<(BasinName, StreamName, Placement), Looked>,
    /// Orders the requests that look streams up and the lookups themselves (see
    /// `Looked::answer_for`).
    lookup_clock: Arc<AtomicU64>,
}

/// What a lookup of a stream found, and when it began (by `lookup_clock`). Always
/// `Ok` as a flight's outcome, with what was found inside, so that an error too tells
/// when it was found.
#[derive(Clone)]
struct Looked {
    began: u64,
    found: Result<Option<Arc<StreamState>>>,
}

impl Looked {
    /// What a request that arrived at `arrived` (by `lookup_clock`) may take from this
    /// lookup: the whole answer if the lookup began after the request arrived (its own,
    /// or one another request started meanwhile). An earlier one may have missed a stream created,
    /// deleted or taken over since the request arrived; from it the request takes only
    /// that another node serves the stream, or that this one serves nothing more: a
    /// moment stale at most, as a remembered owner may be (`OwnerCache`), which costs
    /// a detour and no wrong answer. `None`: look again.
    fn answer_for(self, arrived: u64) -> Option<Result<Option<Arc<StreamState>>>> {
        match self.found {
            found if self.began > arrived => Some(found),
            Err(
                err @ (Error::OwnedElsewhere { .. } | Error::ServerDraining | Error::LeaseLost),
            ) => Some(Err(err)),
            _ => None,
        }
    }
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

/// Runs a metadata change to completion even if the caller stops waiting (a client
/// hanging up), so the metadata and the stream registry never disagree.
async fn detached<T: Send + 'static>(
    change: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    tokio::spawn(change)
        .await
        .map_err(|e| Error::internal("a metadata change did not finish", e))?
}

/// A live stream's record, from the metadata.
async fn live_record(
    metadata: &dyn MetadataStore,
    basin: &BasinName,
    name: &StreamName,
) -> Result<Option<StreamRecord>> {
    Ok(metadata
        .get_stream(basin, name)
        .await?
        .filter(|record| record.deleted_at.is_none()))
}

impl Catalog {
    pub fn new(
        metadata: Arc<dyn MetadataStore>,
        registry: Arc<StreamRegistry>,
        ownership: Arc<Ownership>,
        location: String,
        default_storage_class: StorageClass,
    ) -> Self {
        Self {
            metadata,
            registry,
            ownership,
            location,
            default_storage_class,
            lookups: SingleFlight::default(),
            lookup_clock: Arc::default(),
        }
    }

    /// The live streams with their basins.
    pub fn live_streams(&self) -> Vec<(BasinName, Arc<StreamState>)> {
        self.registry.with_basins()
    }

    // ---- basins ----

    pub async fn create_basin(
        &self,
        name: BasinName,
        config: BasinConfig,
        request_token: Option<&str>,
    ) -> Result<BasinRecord> {
        config.validate()?;
        let record = BasinRecord {
            name,
            location: self.location.clone(),
            idempotency_key: idempotency_key(request_token, &config),
            config,
            created_at: now_utc(),
            deleted_at: None,
        };
        match self.metadata.create_basin(record).await? {
            Created::New(basin) | Created::Existing(basin) => Ok(basin),
        }
    }

    /// Creates the basin, or replaces its whole configuration if it exists.
    pub async fn ensure_basin(
        &self,
        name: BasinName,
        config: BasinConfig,
    ) -> Result<(BasinRecord, Provisioned)> {
        config.validate()?;
        match self.metadata.get_basin(&name).await? {
            Some(existing) if existing.deleted_at.is_some() => {
                Err(Error::DeletionPending(Resource::Basin(name.to_string())))
            }
            Some(existing) if existing.config == config => Ok((existing, Provisioned::Unchanged)),
            Some(mut existing) => {
                self.metadata.set_basin_config(&name, &config).await?;
                existing.config = config;
                Ok((existing, Provisioned::Updated))
            }
            None => Ok((
                self.create_basin(name, config, None).await?,
                Provisioned::Created,
            )),
        }
    }

    pub async fn basin(&self, name: &BasinName) -> Result<BasinRecord> {
        self.metadata
            .get_basin(name)
            .await?
            .ok_or_else(|| Error::NotFound(Resource::Basin(name.to_string())))
    }

    /// A basin that exists and is not being deleted.
    async fn active_basin(&self, name: &BasinName) -> Result<BasinRecord> {
        let basin = self.basin(name).await?;
        if basin.deleted_at.is_some() {
            return Err(Error::DeletionPending(Resource::Basin(name.to_string())));
        }
        Ok(basin)
    }

    pub async fn reconfigure_basin(
        &self,
        name: &BasinName,
        change: &BasinReconfiguration,
    ) -> Result<BasinConfig> {
        let basin = self.active_basin(name).await?;
        let config = change.apply(&basin.config)?;
        self.metadata.set_basin_config(name, &config).await?;
        Ok(config)
    }

    pub async fn list_basins(&self, range: &ListRange) -> Result<ListPage<BasinRecord>> {
        self.metadata.list_basins(range).await
    }

    pub async fn delete_basin(&self, name: &BasinName) -> Result<()> {
        let basin = self.basin(name).await?;
        let metadata = self.metadata.clone();
        let registry = self.registry.clone();
        let name = name.clone();
        detached(async move {
            // Already marked (perhaps by an earlier call whose answer was lost): its
            // streams still leave the registry below.
            if basin.deleted_at.is_none() {
                metadata.mark_basin_deleted(&name, now_utc()).await?;
            }
            registry.remove_basin(&name);
            Ok(())
        })
        .await
    }

    // ---- streams ----

    fn resolve_config(&self, basin: &BasinRecord, requested: &StreamConfig) -> StreamConfig {
        requested.resolve(
            &basin.config.default_stream_config.unwrap_or_default(),
            self.default_storage_class,
        )
    }

    pub async fn create_stream(
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
            cipher: basin.config.stream_cipher,
            created_at: now_utc(),
            deleted_at: None,
            idempotency_key: idempotency_key(request_token, &config),
        };
        let metadata = self.metadata.clone();
        detached(async move {
            match metadata.create_stream(record).await? {
                Created::New(record) | Created::Existing(record) => Ok(record),
            }
        })
        .await
    }

    pub async fn ensure_stream(
        &self,
        basin: &BasinName,
        name: StreamName,
        config: StreamConfig,
    ) -> Result<(StreamRecord, Provisioned)> {
        config.validate()?;
        let basin_record = self.active_basin(basin).await?;
        let resolved = self.resolve_config(&basin_record, &config);
        match self.metadata.get_stream(basin, &name).await? {
            Some(existing) if existing.deleted_at.is_some() => {
                Err(Error::DeletionPending(Resource::Stream(name)))
            }
            Some(existing) if existing.config == resolved => Ok((existing, Provisioned::Unchanged)),
            Some(mut existing) => {
                self.metadata
                    .set_stream_config(existing.id, &resolved)
                    .await?;
                if let Some(state) = self.registry.get(basin, &name) {
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

    /// Explains why a stream is not live: its basin or it is missing or being deleted.
    async fn missing_stream_error(&self, basin: &BasinName, name: &StreamName) -> Error {
        match self.active_basin(basin).await {
            Err(err) => err,
            Ok(_) => match self.metadata.get_stream(basin, name).await {
                Ok(Some(record)) if record.deleted_at.is_some() => {
                    Error::DeletionPending(Resource::Stream(name.clone()))
                }
                Ok(_) => Error::NotFound(Resource::Stream(name.clone())),
                Err(err) => err,
            },
        }
    }

    /// A live stream this node sequences, from the registry, or else taken over (see
    /// `Ownership::acquire`; `OwnedElsewhere` if another node serves it).
    async fn known_stream(
        &self,
        basin: &BasinName,
        name: &StreamName,
        placement: Placement,
    ) -> Result<Option<Arc<StreamState>>> {
        if let Some(state) = self.registry.get(basin, name) {
            return Ok(Some(state));
        }
        // Only a client's request, which may be passed on, goes by a remembered owner;
        // the node it reaches looks for itself.
        if placement == Placement::Balanced {
            if let Some(advertise_url) = self.ownership.remembered_owner(basin, name) {
                return Err(Error::OwnedElsewhere { advertise_url });
            }
        }
        // Requests for a stream another node sequences arrive together (sessions
        // opening through this node, each request once the remembered owner has aged
        // out): without sharing, each would make the two round trips of its own, and
        // thousands of them queue on the metadata store's few connections.
        let arrived = self.lookup_clock.fetch_add(1, Ordering::SeqCst);
        let key = (basin.clone(), name.clone(), placement);
        loop {
            // Boxed: held inline, the lookup's state would enlarge the future of every
            // request that finds its stream (a read session holds it for its lifetime).
            let lookup = Box::pin(
                self.lookups
                    .run(key.clone(), self.look_up(basin, name, placement)),
            );
            let looked = lookup.await?;
            // A lookup leaves `lookups` before its answer is seen. So the next round
            // starts a lookup, or joins one that began after that one ended, which was
            // after this request arrived: the second round answers at the latest.
            if let Some(answer) = looked.answer_for(arrived) {
                return answer;
            }
        }
    }

    /// The stream's record, then the stream taken over or found held elsewhere (see
    /// `Ownership::acquire`).
    fn look_up(
        &self,
        basin: &BasinName,
        name: &StreamName,
        placement: Placement,
    ) -> impl std::future::Future<Output = Result<Looked>> + Send + 'static {
        let (metadata, ownership) = (self.metadata.clone(), self.ownership.clone());
        let clock = self.lookup_clock.clone();
        let (basin, name) = (basin.clone(), name.clone());
        async move {
            let began = clock.fetch_add(1, Ordering::SeqCst);
            let found = match live_record(&*metadata, &basin, &name).await {
                Ok(Some(record)) => ownership.acquire(&record, placement).await.map(Some),
                Ok(None) => Ok(None),
                Err(err) => Err(err),
            };
            Ok(Looked { began, found })
        }
    }

    /// A live stream, created on the spot if the basin allows it for this kind of access
    /// (`create` is `Some` for accesses that may create, with the requested config).
    pub async fn stream_for(
        &self,
        basin: &BasinName,
        name: &StreamName,
        create: Option<(AutoCreate, &StreamConfig)>,
        placement: Placement,
    ) -> Result<Arc<StreamState>> {
        if let Some(state) = self.known_stream(basin, name, placement).await? {
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
                // `AlreadyExists`: a concurrent auto-creation won.
                if let Some(state) = self.known_stream(basin, name, placement).await? {
                    return Ok(state);
                }
            }
        }
        Err(self.missing_stream_error(basin, name).await)
    }

    pub async fn stream_config(
        &self,
        basin: &BasinName,
        name: &StreamName,
    ) -> Result<StreamConfig> {
        if let Some(state) = self.registry.get(basin, name) {
            return Ok(state.config());
        }
        match live_record(&*self.metadata, basin, name).await? {
            Some(record) => Ok(record.config),
            None => Err(self.missing_stream_error(basin, name).await),
        }
    }

    pub async fn reconfigure_stream(
        &self,
        basin: &BasinName,
        name: &StreamName,
        change: &StreamReconfiguration,
    ) -> Result<StreamConfig> {
        let Some(record) = live_record(&*self.metadata, basin, name).await? else {
            return Err(self.missing_stream_error(basin, name).await);
        };
        let basin_record = self.active_basin(basin).await?;
        let config = self.resolve_config(&basin_record, &change.apply(&record.config)?);
        self.metadata.set_stream_config(record.id, &config).await?;
        // The node that sequences it (if another) learns of it from the metadata store.
        if let Some(state) = self.registry.get_id(basin, name, record.id) {
            state.set_config(config);
        }
        Ok(config)
    }

    pub async fn list_streams(
        &self,
        basin: &BasinName,
        range: &ListRange,
    ) -> Result<ListPage<StreamRecord>> {
        self.basin(basin).await?;
        self.metadata.list_streams(basin, range).await
    }

    pub async fn delete_stream(&self, basin: &BasinName, name: &StreamName) -> Result<()> {
        let record = match self.metadata.get_stream(basin, name).await? {
            Some(record) => record,
            None => return Err(self.missing_stream_error(basin, name).await),
        };
        let metadata = self.metadata.clone();
        let registry = self.registry.clone();
        detached(async move {
            // Already marked (perhaps by an earlier call whose answer was lost): the
            // stream still leaves the registry below.
            if record.deleted_at.is_none() {
                metadata.mark_stream_deleted(record.id, now_utc()).await?;
            }
            registry.remove(&record.basin, &record.name, record.id);
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn looked(began: u64, found: Result<Option<Arc<StreamState>>>) -> Looked {
        Looked { began, found }
    }

    fn not_found() -> Error {
        Error::NotFound(Resource::Stream(StreamName::new("s").unwrap()))
    }

    #[test]
    fn a_lookup_begun_after_a_request_arrived_answers_it_whatever_it_found() {
        assert!(matches!(looked(8, Ok(None)).answer_for(7), Some(Ok(None))));
        let answer = looked(8, Err(not_found())).answer_for(7);
        assert!(matches!(answer, Some(Err(Error::NotFound(_)))));
        let answer = looked(8, Err(Error::Unavailable("busy".into()))).answer_for(7);
        assert!(matches!(answer, Some(Err(Error::Unavailable(_)))));
    }

    #[test]
    fn from_an_earlier_lookup_a_request_takes_only_that_the_stream_is_served_elsewhere() {
        let elsewhere = Error::OwnedElsewhere {
            advertise_url: "http://node-b:8080".into(),
        };
        let answer = looked(7, Err(elsewhere)).answer_for(8);
        assert!(
            matches!(&answer, Some(Err(Error::OwnedElsewhere { advertise_url })) if advertise_url == "http://node-b:8080")
        );
        // Nor does this node serve any stream any more.
        for ended in [Error::ServerDraining, Error::LeaseLost] {
            assert!(looked(7, Err(ended)).answer_for(8).unwrap().is_err());
        }
        // A stream found missing may have been created since the request arrived, and
        // a lookup that failed (a timeout, say) is one the request did not make: it
        // looks again.
        assert!(looked(7, Ok(None)).answer_for(8).is_none());
        assert!(looked(7, Err(not_found())).answer_for(8).is_none());
        let timeout = Error::Unavailable("metadata store: no answer within 5 s".into());
        assert!(looked(7, Err(timeout)).answer_for(8).is_none());
        assert!(looked(8, Err(Error::Invalid("no".into())))
            .answer_for(8)
            .is_none());
    }
}
