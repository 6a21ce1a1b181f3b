//! What the metadata store keeps of the cluster: the nodes, each with a lease it renews,
//! and which node sequences each stream, under a lease epoch that only ever grows.
//!
//! A node's leases on its streams all hang on its node lease, so one statement renews
//! them all. A node whose lease has run out (by the store's clock) may have its streams
//! taken; taking one marks the node's leases as lost, in the same row lock that its
//! renewal takes, so a renewal either comes first (and the take fails) or finds the
//! mark (and the node knows it is out).

use time::OffsetDateTime;

use super::StreamRecord;

/// A node as the metadata store has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    /// The node's epoch: unique to one run of one process, and the name of its WAL.
    pub epoch: u64,
    /// Stable across restarts of the node (kept in its data directory).
    pub identity: String,
    pub advertise_url: String,
    pub started_at: OffsetDateTime,
    /// Time since its last renewal, by the store's clock.
    pub heartbeat_age_ms: u64,
    /// Whether its lease holds now, by the store's clock.
    pub live: bool,
    /// Whether it is shutting down (handing its streams to the others).
    pub leaving: bool,
    /// Whether it has finished starting (taken back its streams) and serves: only then
    /// are streams handed to it.
    pub ready: bool,
    pub streams_owned: u64,
}

/// A node whose lease holds and that is not leaving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveNode {
    pub epoch: u64,
    pub advertise_url: String,
    /// Whether it has finished starting: streams are placed only on such nodes (one
    /// still starting answers no request yet).
    pub ready: bool,
}

/// Where the records of a stream that are not in segments yet are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamLog {
    /// Nowhere: the stream was never appended to since it was created.
    Nowhere,
    /// In the write-ahead log of the node of this epoch.
    Epoch(u64),
    /// Written before streamgate had clusters: in the logs of any epochs without a node.
    Legacy,
}

impl StreamLog {
    pub(crate) fn from_column(value: i64) -> StreamLog {
        match value {
            0 => StreamLog::Nowhere,
            v if v < 0 => StreamLog::Legacy,
            v => StreamLog::Epoch(v as u64),
        }
    }
}

/// A stream lease a node has just taken.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamClaim {
    pub stream: StreamRecord,
    pub lease_epoch: u64,
    /// Where its records after its checkpoint are, so the new owner can rebuild its tail.
    pub log: StreamLog,
}

/// Who sequences a stream now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamOwner {
    /// Nobody: the first node that needs it may take it.
    Nobody,
    /// A node whose lease holds.
    Live { epoch: u64, advertise_url: String },
    /// A node whose lease ran out: any node may take the stream.
    Lapsed { epoch: u64 },
}

/// A stream that needs a new owner, and the identity of the node that had it (if known).
#[derive(Debug, Clone, PartialEq)]
pub struct OrphanedStream {
    pub stream: StreamRecord,
    pub previous_identity: Option<String>,
    /// Written before clusters and never taken since.
    pub legacy: bool,
}

/// A change to a stream a node sequences, made through any node.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamChange {
    pub id: u64,
    pub config: crate::config::StreamConfig,
    pub deleted: bool,
}
