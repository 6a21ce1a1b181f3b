//! streamgate-core: the engine behind every streamgate front end.
//!
//! Front ends call [`Engine`]; they never touch storage. See DESIGN.md for the promises
//! every path keeps: acknowledged appends are durable, streams are linearizable, batches
//! are atomic, and bad input gets a clear error and changes nothing.

pub mod access;
pub mod cache;
pub mod caller;
mod compaction;
pub mod config;
pub mod connections;
mod crash_point;
pub mod engine;
pub mod error;
#[cfg(feature = "fuzz")]
pub mod fuzz;
mod lifecycle;
pub mod names;
pub mod read;
pub mod record;
pub mod segment;
pub mod storage;
mod stream;
pub mod wal;
mod wal_writer;

pub use caller::Caller;
pub use compaction::CompactionStats;
pub use engine::{Engine, EngineSettings, PendingAck, Provisioned};
pub use error::{Error, Result};
pub use wal_writer::FlushSettings;
