//! Read requests: where a read starts, what bounds it, and how long it waits.

use std::time::Duration;

use crate::record::{SequencedRecord, StreamPosition, MAX_BATCH_METERED_BYTES, MAX_BATCH_RECORDS};

/// Where a read starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadStart {
    /// The first record with a sequence number at least this.
    SeqNum(u64),
    /// The first record with a timestamp at least this.
    Timestamp(u64),
    /// This many records before the tail, saturating at the start of the stream.
    TailOffset(u64),
}

impl Default for ReadStart {
    fn default() -> Self {
        ReadStart::TailOffset(0)
    }
}

/// Bounds on what a read returns; the first one reached ends it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadLimits {
    pub count: Option<u64>,
    pub bytes: Option<u64>,
    /// Exclusive timestamp bound.
    pub until: Option<u64>,
}

impl ReadLimits {
    /// The limits of a single batch: the request's, capped at 1000 records and 1 MiB.
    pub fn for_one_batch(&self) -> ReadLimits {
        ReadLimits {
            count: Some(self.count.unwrap_or(u64::MAX).min(MAX_BATCH_RECORDS as u64)),
            bytes: Some(self.bytes.unwrap_or(u64::MAX).min(MAX_BATCH_METERED_BYTES)),
            until: self.until,
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct ReadRequest {
    pub start: ReadStart,
    /// Move a start beyond the tail to the tail instead of failing.
    pub clamp: bool,
    pub limits: ReadLimits,
    /// How long to wait at the tail for records (unary reads: at most 60 s).
    pub wait: Duration,
}

/// Longest a unary read may wait at the tail.
pub const MAX_UNARY_WAIT: Duration = Duration::from_secs(60);

/// One batch of a read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadBatch {
    pub records: Vec<SequencedRecord>,
    /// The tail, when the batch reaches it.
    pub tail: Option<StreamPosition>,
}
