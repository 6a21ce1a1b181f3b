//! The three OTLP signals and what the front end needs to know about each: the names
//! its export request uses, and how to find a resource group's target stream and count
//! its items (for `partial_success`).

use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::logs::v1::ResourceLogs;
use opentelemetry_proto::tonic::metrics::v1::{metric::Data, ResourceMetrics};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::ResourceSpans;
use prost::Message;
use serde::de::DeserializeOwned;
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

    /// Decodes one protobuf resource group (which checks it is well-formed).
    pub(crate) fn inspect_protobuf(self, group: &[u8]) -> Result<GroupInfo, String> {
        fn decode<G: ResourceGroup>(group: &[u8]) -> Result<GroupInfo, String> {
            G::decode(group)
                .map(|g| g.info())
                .map_err(|e| format!("undecodable protobuf: {e}"))
        }
        match self {
            Signal::Traces => decode::<ResourceSpans>(group),
            Signal::Metrics => decode::<ResourceMetrics>(group),
            Signal::Logs => decode::<ResourceLogs>(group),
        }
    }

    /// Decodes one resource group of the OTLP JSON mapping (which checks hex ids,
    /// 64-bit integers as strings or numbers, and integer enums).
    pub(crate) fn inspect_json(self, group: &str) -> Result<GroupInfo, String> {
        fn decode<G: ResourceGroup>(group: &str) -> Result<GroupInfo, String> {
            serde_json::from_str::<G>(group)
                .map(|g| g.info())
                .map_err(|e| format!("invalid OTLP JSON: {e}"))
        }
        match self {
            Signal::Traces => decode::<ResourceSpans>(group),
            Signal::Metrics => decode::<ResourceMetrics>(group),
            Signal::Logs => decode::<ResourceLogs>(group),
        }
    }
}

/// What routing needs to know about a resource group.
pub(crate) struct GroupInfo {
    /// The stream its `s2.stream` attribute names, or why it names none.
    pub stream: Result<StreamName, String>,
    /// Spans, metric data points or log records in it.
    pub items: u64,
}

trait ResourceGroup: Message + Default + DeserializeOwned {
    fn resource(&self) -> Option<&Resource>;
    fn items(&self) -> u64;

    fn info(&self) -> GroupInfo {
        GroupInfo {
            stream: target_stream(self.resource()),
            items: self.items(),
        }
    }
}

impl ResourceGroup for ResourceSpans {
    fn resource(&self) -> Option<&Resource> {
        self.resource.as_ref()
    }
    fn items(&self) -> u64 {
        self.scope_spans.iter().map(|s| s.spans.len() as u64).sum()
    }
}

impl ResourceGroup for ResourceLogs {
    fn resource(&self) -> Option<&Resource> {
        self.resource.as_ref()
    }
    fn items(&self) -> u64 {
        self.scope_logs
            .iter()
            .map(|s| s.log_records.len() as u64)
            .sum()
    }
}

impl ResourceGroup for ResourceMetrics {
    fn resource(&self) -> Option<&Resource> {
        self.resource.as_ref()
    }
    fn items(&self) -> u64 {
        let points = |data: &Data| match data {
            Data::Gauge(g) => g.data_points.len(),
            Data::Sum(s) => s.data_points.len(),
            Data::Histogram(h) => h.data_points.len(),
            Data::ExponentialHistogram(h) => h.data_points.len(),
            Data::Summary(s) => s.data_points.len(),
        };
        self.scope_metrics
            .iter()
            .flat_map(|s| &s.metrics)
            .filter_map(|m| m.data.as_ref())
            .map(|d| points(d) as u64)
            .sum()
    }
}

fn target_stream(resource: Option<&Resource>) -> Result<StreamName, String> {
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
