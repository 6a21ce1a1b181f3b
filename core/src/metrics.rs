//! The S2 metrics API: which sets exist at which level, the checks on their time range
//! and interval, and how each set's answer is built from the usage buckets (see
//! `usage` for how they are recorded).

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::storage::usage::{Resolution, UsagePoint, UsageQuery};
use crate::storage::MetadataStore;
use crate::usage::metric;

/// The longest period one query may span.
pub const MAX_SPAN_SECS: u64 = 90 * 86_400;
/// How far past the server's clock `end` may lie (clocks differ a little).
pub const END_LEEWAY_SECS: u64 = 300;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Bytes,
    Operations,
}

impl Unit {
    pub fn name(self) -> &'static str {
        match self {
            Unit::Bytes => "bytes",
            Unit::Operations => "operations",
        }
    }
}

/// One metric of an answer, of one of the documented types.
#[derive(Debug, Clone, PartialEq)]
pub enum Metric {
    /// A value per bucket of `interval` that had any (`(bucket start, value)`).
    Accumulation {
        name: String,
        unit: Unit,
        interval: Resolution,
        values: Vec<(u64, f64)>,
    },
    /// A reading at every step of the period.
    Gauge {
        name: String,
        unit: Unit,
        values: Vec<(u64, f64)>,
    },
    Label {
        name: String,
        values: Vec<String>,
    },
}

/// What a metrics request asks for, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricSet {
    ActiveBasins,
    AccountOps,
    EstimatedBillableUsage,
    BasinStorage,
    AppendOps,
    ReadOps,
    ReadThroughput,
    AppendThroughput,
    BasinOps,
    StreamStorage,
}

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricLevel {
    Account,
    Basin,
    Stream,
}

impl MetricSet {
    /// The set `name` of `level`; `invalid` naming the sets there are otherwise.
    pub fn parse(level: MetricLevel, name: &str) -> Result<MetricSet> {
        use MetricSet::*;
        let sets: &[(&str, MetricSet)] = match level {
            MetricLevel::Account => &[
                ("active-basins", ActiveBasins),
                ("account-ops", AccountOps),
                ("estimated-billable-usage", EstimatedBillableUsage),
            ],
            MetricLevel::Basin => &[
                ("storage", BasinStorage),
                ("append-ops", AppendOps),
                ("read-ops", ReadOps),
                ("read-throughput", ReadThroughput),
                ("append-throughput", AppendThroughput),
                ("basin-ops", BasinOps),
            ],
            MetricLevel::Stream => &[("storage", StreamStorage)],
        };
        sets.iter()
            .find(|(n, _)| *n == name)
            .map(|(_, set)| *set)
            .ok_or_else(|| {
                let names: Vec<&str> = sets.iter().map(|(n, _)| *n).collect();
                Error::invalid(format!(
                    "unknown metric set `{name}` here; the sets are {}",
                    names.join(", ")
                ))
            })
    }

    /// The bucket length of the answer: the one asked for where the set takes one.
    fn interval(self, asked: Option<&str>) -> Result<Resolution> {
        use MetricSet::*;
        let asked = match asked {
            None => None,
            Some(text) => Some(Resolution::parse(text).ok_or_else(|| {
                Error::invalid(format!(
                    "unknown interval `{text}`; use minute, hour or day"
                ))
            })?),
        };
        let (default, allowed): (Resolution, &[Resolution]) = match self {
            AccountOps | BasinOps => (Resolution::Hour, &Resolution::ALL),
            AppendOps | ReadOps | ReadThroughput | AppendThroughput => {
                (Resolution::Minute, &Resolution::ALL)
            }
            EstimatedBillableUsage => (Resolution::Hour, &[Resolution::Hour, Resolution::Day]),
            BasinStorage => (Resolution::Hour, &[Resolution::Hour]),
            StreamStorage => (Resolution::Minute, &[Resolution::Minute]),
            ActiveBasins => return Ok(Resolution::Hour),
        };
        match asked {
            None => Ok(default),
            Some(interval) if allowed.contains(&interval) => Ok(interval),
            Some(interval) => Err(Error::invalid(format!(
                "this metric set does not take interval `{}`; it takes {}",
                interval.name(),
                allowed
                    .iter()
                    .map(|r| r.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }
}

/// A checked period: `start` to `end`, seconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeRange {
    pub start: u64,
    pub end: u64,
}

impl TimeRange {
    /// Both are required; `start` not after `end`, at most 90 days apart, `end` not
    /// in the future (beyond a small leeway).
    pub fn new(start: Option<u64>, end: Option<u64>, now: u64) -> Result<TimeRange> {
        let (Some(start), Some(end)) = (start, end) else {
            return Err(Error::invalid(
                "`start` and `end` are required (seconds since the Unix epoch)",
            ));
        };
        if start > end {
            return Err(Error::invalid(format!(
                "`start` ({start}) is after `end` ({end})"
            )));
        }
        if end - start > MAX_SPAN_SECS {
            return Err(Error::invalid(format!(
                "the period may span at most 90 days; {start} to {end} spans {} days",
                (end - start).div_ceil(86_400)
            )));
        }
        if end > now + END_LEEWAY_SECS {
            return Err(Error::invalid(format!(
                "`end` ({end}) lies in the future (the server's clock reads {now})"
            )));
        }
        Ok(TimeRange { start, end })
    }
}

/// The series of a set as stored, and how they are shown.
fn accumulation_of(set: MetricSet) -> Option<(&'static str, Unit)> {
    use MetricSet::*;
    Some(match set {
        AccountOps => (metric::ACCOUNT_OPS, Unit::Operations),
        BasinOps => (metric::BASIN_OPS, Unit::Operations),
        AppendOps => (metric::APPEND_OPS, Unit::Operations),
        ReadOps => (metric::READ_OPS, Unit::Operations),
        AppendThroughput => (metric::APPEND_THROUGHPUT, Unit::Bytes),
        ReadThroughput => (metric::READ_THROUGHPUT, Unit::Bytes),
        _ => return None,
    })
}

/// The answer to one metrics request. `basin` and `stream` are as stored (empty for
/// the account); `active_basins` lists the basins with streams in the period that
/// the caller may see.
pub(crate) async fn answer(
    metadata: &dyn MetadataStore,
    set: MetricSet,
    basin: &str,
    stream: &str,
    range: TimeRange,
    interval: Option<&str>,
    active_basins: impl FnOnce(Vec<String>) -> Vec<String>,
) -> Result<Vec<Metric>> {
    let resolution = set.interval(interval)?;
    if let Some((metric, unit)) = accumulation_of(set) {
        return accumulations(metadata, metric, basin, resolution, range, unit).await;
    }
    match set {
        MetricSet::ActiveBasins => {
            let basins = metadata
                .basins_with_streams(range.start as i64 * 1000, range.end as i64 * 1000 + 999)
                .await?;
            Ok(vec![Metric::Label {
                name: "active_basins".into(),
                values: active_basins(basins),
            }])
        }
        MetricSet::EstimatedBillableUsage => Err(Error::invalid(
            "estimated-billable-usage needs prices, and this server has no price sheet: \
             streamgate does not bill; use the storage, ops and throughput sets for usage",
        )),
        MetricSet::BasinStorage | MetricSet::StreamStorage => {
            storage_gauge(metadata, basin, stream, resolution, range).await
        }
        _ => unreachable!("accumulations are answered above"),
    }
}

/// One accumulation per series with any value in the period.
async fn accumulations(
    metadata: &dyn MetadataStore,
    metric: &'static str,
    basin: &str,
    interval: Resolution,
    range: TimeRange,
    unit: Unit,
) -> Result<Vec<Metric>> {
    let points = metadata
        .usage(&UsageQuery {
            resolution: interval,
            basin: basin.to_owned(),
            stream: String::new(),
            metric,
            from: interval.bucket_of(range.start),
            to: range.end + 1,
        })
        .await?;
    let mut series: BTreeMap<String, Vec<(u64, f64)>> = BTreeMap::new();
    for UsagePoint {
        bucket,
        series: name,
        value,
    } in points
    {
        if value > 0 {
            series.entry(name).or_default().push((bucket, value as f64));
        }
    }
    Ok(series
        .into_iter()
        .map(|(name, values)| Metric::Accumulation {
            name,
            unit,
            interval,
            values,
        })
        .collect())
}

/// Stored bytes at every `step` of the period: the last reading at or before each
/// step (readings are written when they change and at least hourly), 0 before any.
async fn storage_gauge(
    metadata: &dyn MetadataStore,
    basin: &str,
    stream: &str,
    step: Resolution,
    range: TimeRange,
) -> Result<Vec<Metric>> {
    let first = step.bucket_of(range.start);
    let from = first.saturating_sub(2 * 3600);
    let query = |resolution: Resolution| UsageQuery {
        resolution,
        basin: basin.to_owned(),
        stream: stream.to_owned(),
        metric: metric::STORAGE,
        from: resolution.bucket_of(from),
        to: range.end + 1,
    };
    let pairs = |points: Vec<UsagePoint>| -> Vec<(u64, u64)> {
        points.into_iter().map(|p| (p.bucket, p.value)).collect()
    };
    let mut readings = pairs(metadata.usage(&query(step)).await?);
    if step == Resolution::Minute {
        // Minute readings are kept two days, hour readings longer. An hour reading
        // holds the hour's last value, so it stands in only for hours that have no
        // minute readings (older than two days).
        let hours = pairs(metadata.usage(&query(Resolution::Hour)).await?);
        let covered: std::collections::HashSet<u64> = readings
            .iter()
            .map(|(bucket, _)| Resolution::Hour.bucket_of(*bucket))
            .collect();
        readings.extend(
            hours
                .into_iter()
                .filter(|(hour, _)| !covered.contains(hour)),
        );
        readings.sort_by_key(|(bucket, _)| *bucket);
    }
    let mut values = Vec::new();
    let mut next = readings.iter().peekable();
    let mut current = 0u64;
    let mut at = first;
    while at <= range.end {
        while let Some((bucket, value)) = next.peek() {
            if *bucket > at {
                break;
            }
            current = *value;
            next.next();
        }
        values.push((at, current as f64));
        at += step.secs();
    }
    Ok(vec![Metric::Gauge {
        name: metric::STORAGE.into(),
        unit: Unit::Bytes,
        values,
    }])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_ranges_follow_the_documented_rules() {
        let now = 1_800_000_000;
        assert!(TimeRange::new(Some(now - 3600), Some(now), now).is_ok());
        assert!(TimeRange::new(Some(0), Some(3600), now).is_ok());
        for (start, end, says) in [
            (None, Some(now), "required"),
            (Some(now), Some(now - 3600), "after `end`"),
            (Some(now - 3600), Some(now + 600), "future"),
            (Some(now - 91 * 86_400), Some(now), "at most 90 days"),
        ] {
            let err = TimeRange::new(start, end, now).unwrap_err();
            assert_eq!(err.code(), "invalid");
            assert!(err.to_string().contains(says), "{err}");
        }
        assert!(TimeRange::new(Some(now + 60 - 90 * 86_400), Some(now + 60), now).is_ok());
    }

    #[test]
    fn sets_and_intervals_are_checked_per_level() {
        assert_eq!(
            MetricSet::parse(MetricLevel::Basin, "storage").unwrap(),
            MetricSet::BasinStorage
        );
        let err = MetricSet::parse(MetricLevel::Stream, "append-ops").unwrap_err();
        assert!(err.to_string().contains("the sets are storage"), "{err}");
        assert_eq!(
            MetricSet::AccountOps.interval(None).unwrap(),
            Resolution::Hour
        );
        assert_eq!(
            MetricSet::ReadOps.interval(None).unwrap(),
            Resolution::Minute
        );
        assert_eq!(
            MetricSet::AppendOps.interval(Some("day")).unwrap(),
            Resolution::Day
        );
        assert!(MetricSet::BasinStorage.interval(Some("minute")).is_err());
        assert!(MetricSet::StreamStorage.interval(Some("hour")).is_err());
        assert!(MetricSet::EstimatedBillableUsage
            .interval(Some("minute"))
            .is_err());
        assert!(MetricSet::AccountOps.interval(Some("week")).is_err());
    }
}
