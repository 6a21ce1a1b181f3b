//! The three OTLP signals and what the front end needs to know about each: the names
//! its export request uses, and how to find a resource group's target stream and count
//! its items (for `partial_success`).

use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::metrics::v1::{
    metric::Data, Metric, ResourceMetrics, ScopeMetrics,
};
pub(crate) use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;
use streamgate_core::names::StreamName;

/// The resource attribute that names a group's stream.
pub const STREAM_ATTRIBUTE: &str = "s2.stream";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Traces,
    Metrics,
    Logs,
}

impl Signal {
    /// The path segment and the `s2-otlp.signal` record header value.
    pub fn name(self) -> &'static str {
        match self {
            Signal::Traces => "traces",
            Signal::Metrics => "metrics",
            Signal::Logs => "logs",
        }
    }

    /// JSON key of the resource groups in an export request (protobuf field 1).
    pub(crate) fn groups_key(self) -> &'static str {
        match self {
            Signal::Traces => "resourceSpans",
            Signal::Metrics => "resourceMetrics",
            Signal::Logs => "resourceLogs",
        }
    }

    /// JSON key of the scopes in a resource group (protobuf field 2).
    pub(crate) fn scopes_key(self) -> &'static str {
        match self {
            Signal::Traces => "scopeSpans",
            Signal::Metrics => "scopeMetrics",
            Signal::Logs => "scopeLogs",
        }
    }

    /// JSON key of the items in a scope (protobuf field 2).
    pub(crate) fn items_key(self) -> &'static str {
        match self {
            Signal::Traces => "spans",
            Signal::Metrics => "metrics",
            Signal::Logs => "logRecords",
        }
    }

    /// JSON key of the rejected count in the response's `partialSuccess`.
    pub(crate) fn rejected_key(self) -> &'static str {
        match self {
            Signal::Traces => "rejectedSpans",
            Signal::Metrics => "rejectedDataPoints",
            Signal::Logs => "rejectedLogRecords",
        }
    }

    /// What the rejected count counts, for messages.
    pub(crate) fn item_noun(self) -> &'static str {
        match self {
            Signal::Traces => "spans",
            Signal::Metrics => "data points",
            Signal::Logs => "log records",
        }
    }

    /// The resource of a protobuf group's head (the group without its scopes), decoded
    /// (which checks it is well-formed).
    pub(crate) fn protobuf_resource(self, head: &[u8]) -> Result<Option<Resource>, String> {
        let undecodable = |e: prost::DecodeError| format!("undecodable protobuf: {e}");
        Ok(match self {
            Signal::Traces => ResourceSpans::decode(head).map_err(undecodable)?.resource,
            Signal::Metrics => ResourceMetrics::decode(head).map_err(undecodable)?.resource,
            Signal::Logs => ResourceLogs::decode(head).map_err(undecodable)?.resource,
        })
    }

    /// Checks a protobuf scope's head (the scope without its items) is well-formed.
    pub(crate) fn check_protobuf_scope(self, head: &[u8]) -> Result<(), String> {
        let checked = match self {
            Signal::Traces => ScopeSpans::decode(head).map(drop),
            Signal::Metrics => ScopeMetrics::decode(head).map(drop),
            Signal::Logs => ScopeLogs::decode(head).map(drop),
        };
        checked.map_err(|e| format!("undecodable protobuf: {e}"))
    }

    /// Checks a protobuf item is well-formed; how many items it counts for.
    pub(crate) fn check_protobuf_item(self, item: &[u8]) -> Result<u64, String> {
        let counted = match self {
            Signal::Traces => Span::decode(item).map(|_| 1),
            Signal::Metrics => Metric::decode(item).map(|metric| data_points(&metric)),
            Signal::Logs => LogRecord::decode(item).map(|_| 1),
        };
        counted.map_err(|e| format!("undecodable protobuf: {e}"))
    }

    /// The resource of a JSON group's head, decoded by the OTLP JSON mapping (which
    /// checks hex ids, 64-bit integers as strings or numbers, and integer enums).
    pub(crate) fn json_resource(self, head: &str) -> Result<Option<Resource>, String> {
        let invalid = |e: serde_json::Error| format!("invalid OTLP JSON: {e}");
        Ok(match self {
            Signal::Traces => {
                serde_json::from_str::<ResourceSpans>(head)
                    .map_err(invalid)?
                    .resource
            }
            Signal::Metrics => {
                serde_json::from_str::<ResourceMetrics>(head)
                    .map_err(invalid)?
                    .resource
            }
            Signal::Logs => {
                serde_json::from_str::<ResourceLogs>(head)
                    .map_err(invalid)?
                    .resource
            }
        })
    }

    /// Checks a JSON scope's head follows the mapping.
    pub(crate) fn check_json_scope(self, head: &str) -> Result<(), String> {
        let checked = match self {
            Signal::Traces => serde_json::from_str::<ScopeSpans>(head).map(drop),
            Signal::Metrics => serde_json::from_str::<ScopeMetrics>(head).map(drop),
            Signal::Logs => serde_json::from_str::<ScopeLogs>(head).map(drop),
        };
        checked.map_err(|e| format!("invalid OTLP JSON: {e}"))
    }

    /// Checks a JSON item follows the mapping; how many items it counts for.
    pub(crate) fn check_json_item(self, item: &str) -> Result<u64, String> {
        let counted = match self {
            Signal::Traces => serde_json::from_str::<Span>(item).map(|_| 1),
            Signal::Metrics => serde_json::from_str::<Metric>(item).map(|m| data_points(&m)),
            Signal::Logs => serde_json::from_str::<LogRecord>(item).map(|_| 1),
        };
        counted.map_err(|e| format!("invalid OTLP JSON: {e}"))
    }
}

/// The data points of a metric: what `partial_success` counts for metrics.
fn data_points(metric: &Metric) -> u64 {
    let points = match &metric.data {
        None => 0,
        Some(Data::Gauge(g)) => g.data_points.len(),
        Some(Data::Sum(s)) => s.data_points.len(),
        Some(Data::Histogram(h)) => h.data_points.len(),
        Some(Data::ExponentialHistogram(h)) => h.data_points.len(),
        Some(Data::Summary(s)) => s.data_points.len(),
    };
    points as u64
}

pub(crate) fn target_stream(resource: Option<&Resource>) -> Result<StreamName, String> {
    let value = resource
        .into_iter()
        .flat_map(|r| &r.attributes)
        .find(|kv| kv.key == STREAM_ATTRIBUTE)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
        .ok_or_else(|| {
            format!("the resource has no `{STREAM_ATTRIBUTE}` attribute naming its stream")
        })?;
    match value {
        AnyValue::StringValue(name) => StreamName::new(name.as_str())
            .map_err(|e| format!("`{STREAM_ATTRIBUTE}` does not name a valid stream: {e}")),
        _ => Err(format!("`{STREAM_ATTRIBUTE}` must be a string attribute")),
    }
}
