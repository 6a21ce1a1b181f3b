//! streamgate-core: the engine behind every streamgate front end.
//!
//! Front ends call [`Caller`] (the engine as one principal sees it); they never touch
//! storage. See DESIGN.md for the promises every path keeps: acknowledged appends are
//! durable, streams are linearizable, batches are atomic, and bad input gets a clear
//! error and changes nothing.
//!
//! Module map (each part owns its state; arrows are "uses"):
//!
//! - `caller` — authorization and stream-name prefixing, the only way in → `engine`
//! - `engine` — the facade: wires the parts below together, runs background tasks
//! - `catalog` — basins and streams in the metadata, kept in step with → `registry`
//! - `registry` — the in-memory state of every live stream (`stream`)
//! - `appender` — admission (budget, draining, outages) and sequencing → `wal::writer`
//! - `wal` — the chunk format; `wal::writer` group commit; `wal::recovery` start-up replay
//! - `record_store` — reading durable batches back (WAL cache, segments, segment cache);
//!   `segment_lookups` — segment index lookups shared by a stream's readers
//! - `read` — `StreamReader`, the cursor unary reads and sessions share → `record_store`
//! - `compaction` — WAL chunks into segments; `lifecycle` — retention, trim, deletions
//! - `storage` — the `MetadataStore` and `ObjectStore` traits and their backends
//! - `usage` — usage counts for the metrics API, written off the append path;
//!   `metrics` — the metrics API's sets, checks and answers built from them
//! - `encryption` — sealing and opening records of encrypted streams
//! - `access` — tokens and scopes; `config`, `names`, `record`, `segment` — domain types
//! - `in_order` — a queue of waits taken out in order, polling only the front;
//!   `single_flight` — one lookup in flight per key, shared by those who ask meanwhile
//! - `error` — typed errors with a kind, which each front end maps through one table

pub mod access;
mod appender;
mod cache;
mod caller;
mod catalog;
mod compaction;
pub mod config;
pub mod connections;
mod crash_point;
pub mod encryption;
mod engine;
mod error;
pub mod follow;
#[cfg(feature = "fuzz")]
pub mod fuzz;
pub mod groups;
pub mod in_order;
mod lifecycle;
mod membership;
pub mod metrics;
pub mod names;
mod owner_cache;
mod ownership;
pub mod read;
mod read_ahead;
pub mod record;
mod record_store;
mod registry;
pub mod remote;
mod segment;
mod segment_lookups;
mod segment_merge;
mod single_flight;
pub mod storage;
mod stream;
pub mod telemetry;
pub mod usage;
/// Public for `chunk_key` (the crash tests damage a log on purpose) and `EntrySpan` (part
/// of the segment index the `MetadataStore` trait carries); the rest is crate-private.
pub mod wal;

pub use appender::PendingAck;
pub use caller::Caller;
pub use catalog::Provisioned;
pub use compaction::CompactionStats;
pub use engine::{Arrival, Engine, EngineSettings, Route};
pub use error::{Error, ErrorKind, Failure, Resource, Result};
pub use membership::ClusterSettings;
pub use wal::recovery::MAX_TORN_TAIL;
pub use wal::writer::FlushSettings;
