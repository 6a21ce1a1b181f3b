//! The two storage traits of the engine and their implementations.

mod chunk_log;
pub mod cluster;
pub mod deadline;
pub mod local_dir;
pub mod memory;
pub mod metadata;
pub mod objects;
pub mod s3;
pub mod sql;
pub mod usage;

pub use metadata::{BasinRecord, ListPage, MetadataStore, StreamRecord};
pub use objects::ObjectStore;
