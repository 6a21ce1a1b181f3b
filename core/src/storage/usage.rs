//! What the metadata store keeps of usage (the S2 metrics API): counts and gauge
//! readings in time buckets of three lengths, so a query over a long period reads few
//! rows and old detail can be dropped (see `Resolution::retention`).

/// How long a bucket is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resolution {
    Minute,
    Hour,
    Day,
}

impl Resolution {
    pub const ALL: [Resolution; 3] = [Resolution::Minute, Resolution::Hour, Resolution::Day];

    pub fn secs(self) -> u64 {
        match self {
            Resolution::Minute => 60,
            Resolution::Hour => 3600,
            Resolution::Day => 86_400,
        }
    }

    /// How long buckets of this length are kept: minutes for two days, hours for 100
    /// days (past the 90 days one query may span), days for 400.
    pub fn retention_secs(self) -> u64 {
        match self {
            Resolution::Minute => 2 * 86_400,
            Resolution::Hour => 100 * 86_400,
            Resolution::Day => 400 * 86_400,
        }
    }

    /// The start of the bucket holding `secs`.
    pub fn bucket_of(self, secs: u64) -> u64 {
        secs - secs % self.secs()
    }

    pub fn name(self) -> &'static str {
        match self {
            Resolution::Minute => "minute",
            Resolution::Hour => "hour",
            Resolution::Day => "day",
        }
    }

    pub fn parse(text: &str) -> Option<Resolution> {
        Resolution::ALL.into_iter().find(|r| r.name() == text)
    }
}

/// One bucket's value of one series: an addition to a count, or a gauge reading.
/// `basin` and `stream` are empty for what is not about one (account operations;
/// basin-wide values).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRow {
    pub resolution: Resolution,
    pub bucket: u64,
    pub basin: String,
    pub stream: String,
    pub metric: &'static str,
    pub series: String,
    pub value: u64,
}

/// Which rows a query reads: one metric of one basin (or the account) and stream (or
/// the whole basin), buckets starting in `from..to`.
#[derive(Debug, Clone)]
pub struct UsageQuery {
    pub resolution: Resolution,
    pub basin: String,
    pub stream: String,
    pub metric: &'static str,
    pub from: u64,
    pub to: u64,
}

/// A bucket's value of one series, as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsagePoint {
    pub bucket: u64,
    pub series: String,
    pub value: u64,
}

/// The bytes of one stream's segments, for the storage gauges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBytes {
    pub basin: String,
    pub stream: String,
    pub bytes: u64,
}
