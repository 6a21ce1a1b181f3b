//! Taking an export request apart into its resource groups: each group's target stream,
//! its item count, and the record bodies it becomes.
//!
//! A record body is an export request holding exactly that one group, in the encoding
//! the request arrived in. For protobuf it is the group's bytes as sent (field 1 of the
//! request, unchanged); for JSON it is the group's JSON text as sent. A group larger
//! than one record is split by scope and item (see `split`).
//!
//! Memory stays proportional to the request whatever it holds: groups, scopes and items
//! are cut out of the request as slices of it (up to `MAX_GROUPS` groups and `MAX_ITEMS`
//! items per request), and each is checked by decoding it on its own: a group's head
//! (resource), each scope's head and each item, one at a time, never a whole group at
//! once (a decoded message can take tens of times the memory of its encoding).

use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use streamgate_core::names::StreamName;
use streamgate_http::protobuf;

use crate::signal::Signal;
use crate::split::{self, Group, Scope};

/// Resource groups one request may hold.
pub const MAX_GROUPS: usize = 10_000;
/// Items (spans, metrics, log records) one request may hold.
pub const MAX_ITEMS: usize = 200_000;
/// Scopes one request may hold.
pub const MAX_SCOPES: usize = 200_000;
/// Fields one JSON object of a group's or scope's head may have.
const MAX_HEAD_FIELDS: usize = 256;

/// The two OTLP/HTTP encodings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Protobuf,
    Json,
}

impl Encoding {
    /// The encoding a `Content-Type` names, if it is one OTLP/HTTP defines.
    pub fn from_content_type(value: &str) -> Option<Self> {
        let essence = value.split(';').next().unwrap_or_default().trim();
        if essence.eq_ignore_ascii_case("application/x-protobuf")
            || essence.eq_ignore_ascii_case("application/protobuf")
        {
            Some(Encoding::Protobuf)
        } else if essence.eq_ignore_ascii_case("application/json") {
            Some(Encoding::Json)
        } else {
            None
        }
    }

    /// The media type of responses and of the `content-type` record header.
    pub fn media_type(self) -> &'static str {
        match self {
            Encoding::Protobuf => "application/x-protobuf",
            Encoding::Json => "application/json",
        }
    }
}

/// One resource group of a request.
#[derive(Debug)]
pub(crate) struct ParsedGroup {
    /// Spans, data points or log records in it.
    pub items: u64,
    /// Its stream and record bodies, or why it cannot be stored.
    pub target: Result<(StreamName, Vec<Bytes>), String>,
}

/// Parses a request body; an error means it is not a decodable export request (or
/// holds more than a request may). `record_limit` is the largest record body allowed.
pub(crate) fn parse(
    signal: Signal,
    encoding: Encoding,
    body: &Bytes,
    record_limit: usize,
) -> Result<Vec<ParsedGroup>, String> {
    match encoding {
        Encoding::Protobuf => parse_protobuf(signal, body, record_limit),
        Encoding::Json => parse_json(signal, body, record_limit),
    }
}

fn too_large(signal: Signal, limit: usize) -> String {
    format!(
        "a single item of the resource group is larger than {limit} bytes, the most one record holds, so none of its {} could be stored",
        signal.item_noun()
    )
}

/// How one encoding's groups are checked: the size of a head or item as sent, and
/// decoding each on its own. `check_item` returns how many items it counts for
/// (`partial_success` counts metric data points, not metrics).
struct Checks<H, I> {
    head_len: fn(&H) -> usize,
    item_len: fn(&I) -> usize,
    resource: fn(Signal, &H) -> Result<Option<crate::signal::Resource>, String>,
    check_scope: fn(Signal, &H) -> Result<(), String>,
    check_item: fn(Signal, &I) -> Result<u64, String>,
}

/// Checks every part of a group, one at a time, and routes it: its item count, and its
/// target stream (or why it cannot be stored; parts too large for any record are not
/// decoded at all).
fn inspect<H, I>(
    signal: Signal,
    group: &Group<H, I>,
    limit: usize,
    checks: &Checks<H, I>,
) -> Result<(u64, Result<StreamName, String>), String> {
    let fits = (checks.head_len)(&group.head) <= limit
        && group.scopes.iter().all(|scope| {
            (checks.head_len)(&scope.head) <= limit
                && scope
                    .items
                    .iter()
                    .all(|item| (checks.item_len)(item) <= limit)
        });
    let count = group.scopes.iter().map(|s| s.items.len() as u64).sum();
    if !fits {
        return Ok((count, Err(too_large(signal, limit))));
    }
    let resource = (checks.resource)(signal, &group.head)?;
    let mut items = 0;
    for scope in &group.scopes {
        (checks.check_scope)(signal, &scope.head)?;
        for item in &scope.items {
            items += (checks.check_item)(signal, item)?;
        }
    }
    Ok((items, crate::signal::target_stream(resource.as_ref())))
}

/// Keeps count of what a request holds, against `MAX_GROUPS` and `MAX_ITEMS`.
#[derive(Default)]
struct Budget {
    groups: usize,
    scopes: usize,
    items: usize,
}

impl Budget {
    fn take_group(&mut self) -> Result<(), String> {
        take(&mut self.groups, MAX_GROUPS, "resource groups")
    }

    fn take_scope(&mut self) -> Result<(), String> {
        take(&mut self.scopes, MAX_SCOPES, "scopes")
    }

    fn take_item(&mut self) -> Result<(), String> {
        take(&mut self.items, MAX_ITEMS, "spans, metrics or log records")
    }
}

/// Counts one more of something a request may hold at most `max` of.
fn take(count: &mut usize, max: usize, what: &str) -> Result<(), String> {
    *count += 1;
    if *count > max {
        return Err(format!("a request may hold at most {max} {what}"));
    }
    Ok(())
}

// ---- protobuf ----

const PROTOBUF: Checks<Vec<u8>, Bytes> = Checks {
    head_len: Vec::len,
    item_len: Bytes::len,
    resource: |signal, head| signal.protobuf_resource(head),
    check_scope: |signal, head| signal.check_protobuf_scope(head),
    check_item: |signal, item| signal.check_protobuf_item(item),
};

fn parse_protobuf(signal: Signal, body: &Bytes, limit: usize) -> Result<Vec<ParsedGroup>, String> {
    let undecodable = |e: String| format!("undecodable protobuf: {e}");
    let mut budget = Budget::default();
    let mut groups = Vec::new();
    for field in protobuf::fields(body) {
        let field = field.map_err(undecodable)?;
        // Unknown fields are skipped, as protobuf readers do.
        if field.number != 1 {
            continue;
        }
        if !field.is_len {
            return Err(undecodable("a resource group is not a message".into()));
        }
        budget.take_group()?;
        let group = protobuf_group(&field.payload, &mut budget).map_err(undecodable)?;
        let (items, stream) = inspect(signal, &group, limit, &PROTOBUF)?;
        let target = stream.and_then(|stream| {
            let bodies = if field.raw.len() <= limit {
                vec![field.raw]
            } else {
                split::pieces(group, limit, &encode_protobuf)
                    .ok_or_else(|| too_large(signal, limit))?
            };
            Ok((stream, bodies))
        });
        groups.push(ParsedGroup { items, target });
    }
    Ok(groups)
}

/// A protobuf resource group: every scope is field 2 of the group, every item field 2
/// of its scope, in all three signals; heads keep the other fields' bytes as sent.
fn protobuf_group(group: &Bytes, budget: &mut Budget) -> Result<Group<Vec<u8>, Bytes>, String> {
    let mut head = Vec::new();
    let mut scopes = Vec::new();
    for field in protobuf::fields(group) {
        let field = field?;
        if field.number != 2 {
            head.extend_from_slice(&field.raw);
            continue;
        }
        budget.take_scope()?;
        let mut scope = Scope {
            head: Vec::new(),
            items: Vec::new(),
        };
        for field in protobuf::fields(&field.payload) {
            let field = field?;
            if field.number == 2 {
                budget.take_item()?;
                scope.items.push(field.payload);
            } else {
                scope.head.extend_from_slice(&field.raw);
            }
        }
        scopes.push(scope);
    }
    Ok(Group { head, scopes })
}

fn encode_protobuf(group: &Group<Vec<u8>, Bytes>) -> Vec<u8> {
    let mut inner = group.head.clone();
    for scope in &group.scopes {
        let mut encoded = scope.head.clone();
        for item in &scope.items {
            protobuf::put_len_field(&mut encoded, 2, item);
        }
        protobuf::put_len_field(&mut inner, 2, &encoded);
    }
    let mut request = Vec::with_capacity(inner.len() + 8);
    protobuf::put_len_field(&mut request, 1, &inner);
    request
}

// ---- JSON ----

/// A JSON object's fields, each value as the text the client sent.
type RawFields<'a> = Vec<(String, &'a RawValue)>;

fn json_head_len(fields: &RawFields<'_>) -> usize {
    fields
        .iter()
        .map(|(k, v)| k.len() + v.get().len() + 4)
        .sum::<usize>()
        + 2
}

fn parse_json(signal: Signal, body: &Bytes, limit: usize) -> Result<Vec<ParsedGroup>, String> {
    let text = std::str::from_utf8(body).map_err(|e| format!("invalid JSON: {e}"))?;
    let key = signal.groups_key();
    let groups = match request_groups(text, key)? {
        (Some(groups), _) if groups.get() == "null" => Vec::new(),
        (Some(groups), _) => bounded_list(groups.get(), MAX_GROUPS)
            .map_err(|_| format!("`{key}` must be an array of at most {MAX_GROUPS} groups"))?,
        // OTLP/JSON keys are lowerCamelCase; say so rather than store nothing.
        (None, Some(near_miss)) => {
            return Err(format!(
                "unknown key `{near_miss}`: OTLP/JSON uses lowerCamelCase `{key}`"
            ))
        }
        (None, None) => Vec::new(),
    };
    let mut budget = Budget::default();
    let mut parsed = Vec::with_capacity(groups.len());
    for group in groups {
        let text = group.get();
        if !text.starts_with('{') {
            return Err(format!("each element of `{key}` must be an object"));
        }
        let taken = json_group(signal, text, &mut budget)?;
        let (items, stream) = inspect(signal, &taken, limit, &json_checks())?;
        let target = stream.and_then(|stream| {
            let whole = json_request(signal, text);
            let bodies = if whole.len() <= limit {
                vec![whole.into()]
            } else {
                let encode = |g: &Group<RawFields<'_>, &RawValue>| {
                    json_request(signal, &assemble_json(signal, g))
                };
                split::pieces(taken, limit, &encode).ok_or_else(|| too_large(signal, limit))?
            };
            Ok((stream, bodies))
        });
        parsed.push(ParsedGroup { items, target });
    }
    Ok(parsed)
}

/// The checks of JSON groups (a function, for the lifetime of the text checked).
fn json_checks<'a>() -> Checks<RawFields<'a>, &'a RawValue> {
    Checks {
        head_len: json_head_len,
        item_len: |item| item.get().len(),
        resource: |signal, head| signal.json_resource(&object_text(head)),
        check_scope: |signal, head| signal.check_json_scope(&object_text(head)),
        check_item: |signal, item| signal.check_json_item(item.get()),
    }
}

/// A head's fields as one JSON object.
fn object_text(fields: &RawFields<'_>) -> String {
    let mut out = String::from("{");
    for (i, (key, value)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&serde_json::to_string(key).expect("a string always serializes"));
        out.push(':');
        out.push_str(value.get());
    }
    out.push('}');
    out
}

/// `{"<groups key>":[group]}` around a group's JSON text.
fn json_request(signal: Signal, group: &str) -> Vec<u8> {
    let key = signal.groups_key();
    let mut out = Vec::with_capacity(group.len() + key.len() + 8);
    out.extend_from_slice(b"{\"");
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\":[");
    out.extend_from_slice(group.as_bytes());
    out.extend_from_slice(b"]}");
    out
}

/// The groups of a request (the value of `key`), and otherwise a key that looks like
/// it but is spelled differently (snake_case, other capitals). Other keys are skipped
/// without being kept.
fn request_groups<'a>(
    text: &'a str,
    key: &'static str,
) -> Result<(Option<&'a RawValue>, Option<String>), String> {
    struct RequestVisitor(&'static str);
    impl<'de> Visitor<'de> for RequestVisitor {
        type Value = (Option<&'de RawValue>, Option<String>);
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an export request object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let (mut groups, mut near_miss) = (None, None);
            while let Some(name) = map.next_key::<Cow<'de, str>>()? {
                if name == self.0 {
                    groups = Some(map.next_value::<&'de RawValue>()?);
                } else {
                    if near_miss.is_none() && name.replace('_', "").eq_ignore_ascii_case(self.0) {
                        near_miss = Some(name.into_owned());
                    }
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok((groups, near_miss))
        }
    }
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let found = deserializer
        .deserialize_map(RequestVisitor(key))
        .map_err(|e| format!("invalid JSON: {e}"))?;
    deserializer
        .end()
        .map_err(|e| format!("invalid JSON: {e}"))?;
    Ok(found)
}

/// The elements of a JSON array as the text sent, refusing more than `max`.
fn bounded_list(text: &str, max: usize) -> Result<Vec<&RawValue>, String> {
    struct ListSeed(usize);
    impl<'de> DeserializeSeed<'de> for ListSeed {
        type Value = Vec<&'de RawValue>;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_seq(self)
        }
    }
    impl<'de> Visitor<'de> for ListSeed {
        type Value = Vec<&'de RawValue>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "an array of at most {} elements", self.0)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(element) = seq.next_element::<&'de RawValue>()? {
                if out.len() == self.0 {
                    return Err(de::Error::custom(format!(
                        "a list may hold at most {} elements here",
                        self.0
                    )));
                }
                out.push(element);
            }
            Ok(out)
        }
    }
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let list = ListSeed(max)
        .deserialize(&mut deserializer)
        .map_err(|e| format!("invalid OTLP JSON: {e}"))?;
    deserializer
        .end()
        .map_err(|e| format!("invalid OTLP JSON: {e}"))?;
    Ok(list)
}

/// The fields of a JSON object as the text sent, refusing more than `max`.
fn bounded_object(text: &str, max: usize) -> Result<RawFields<'_>, String> {
    struct ObjectVisitor(usize);
    impl<'de> Visitor<'de> for ObjectVisitor {
        type Value = RawFields<'de>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "an object of at most {} fields", self.0)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out: RawFields<'de> = Vec::new();
            while let Some(name) = map.next_key::<String>()? {
                if out.len() == self.0 {
                    return Err(de::Error::custom(format!(
                        "an object may have at most {} fields here",
                        self.0
                    )));
                }
                let value = map.next_value::<&'de RawValue>()?;
                // Like a JSON decoder, the last of repeated keys counts.
                out.retain(|(existing, _)| *existing != name);
                out.push((name, value));
            }
            Ok(out)
        }
    }
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let object = deserializer
        .deserialize_map(ObjectVisitor(max))
        .map_err(|e| format!("invalid OTLP JSON: {e}"))?;
    deserializer
        .end()
        .map_err(|e| format!("invalid OTLP JSON: {e}"))?;
    Ok(object)
}

/// A JSON resource group taken apart without copying: heads are the other fields of the
/// group and its scopes, items the raw text of each span, metric or log record.
fn json_group<'a>(
    signal: Signal,
    text: &'a str,
    budget: &mut Budget,
) -> Result<Group<RawFields<'a>, &'a RawValue>, String> {
    /// Removes the list under `key` from `fields`, counting each element with `take`.
    fn take_list<'a>(
        fields: &mut RawFields<'a>,
        key: &str,
        budget: &mut Budget,
        max: usize,
        take: fn(&mut Budget) -> Result<(), String>,
    ) -> Result<Vec<&'a RawValue>, String> {
        let Some(at) = fields.iter().position(|(k, _)| k == key) else {
            return Ok(Vec::new());
        };
        let (_, value) = fields.remove(at);
        if value.get() == "null" {
            return Ok(Vec::new());
        }
        let list = bounded_list(value.get(), max)?;
        for _ in &list {
            take(budget)?;
        }
        Ok(list)
    }
    let mut head = bounded_object(text, MAX_HEAD_FIELDS)?;
    let scopes = take_list(
        &mut head,
        signal.scopes_key(),
        budget,
        MAX_SCOPES,
        Budget::take_scope,
    )?;
    let mut taken = Vec::with_capacity(scopes.len());
    for scope in scopes {
        let mut scope_head = bounded_object(scope.get(), MAX_HEAD_FIELDS)?;
        let items = take_list(
            &mut scope_head,
            signal.items_key(),
            budget,
            MAX_ITEMS,
            Budget::take_item,
        )?;
        taken.push(Scope {
            head: scope_head,
            items,
        });
    }
    Ok(Group {
        head,
        scopes: taken,
    })
}

/// A (piece of a) group as one JSON object, written from the raw parts.
fn assemble_json(signal: Signal, group: &Group<RawFields<'_>, &RawValue>) -> String {
    fn open_with_fields(out: &mut String, fields: &RawFields<'_>) {
        out.push('{');
        for (key, value) in fields {
            out.push_str(&serde_json::to_string(key).expect("a string always serializes"));
            out.push(':');
            out.push_str(value.get());
            out.push(',');
        }
    }
    let mut out = String::new();
    open_with_fields(&mut out, &group.head);
    out.push_str(&format!("\"{}\":[", signal.scopes_key()));
    for (i, scope) in group.scopes.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        open_with_fields(&mut out, &scope.head);
        out.push_str(&format!("\"{}\":[", signal.items_key()));
        for (j, item) in scope.items.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            out.push_str(item.get());
        }
        out.push_str("]}");
    }
    out.push_str("]}");
    out
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
    use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
    use opentelemetry_proto::tonic::metrics::v1::{
        metric, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics,
        ScopeMetrics,
    };
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
    use prost::Message;
    use serde_json::Value;

    use super::*;

    const LIMIT: usize = 1 << 20;

    fn resource(stream: Option<&str>) -> Option<Resource> {
        let mut attributes = vec![KeyValue {
            key: "service.name".into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue("checkout".into())),
            }),
            ..Default::default()
        }];
        if let Some(stream) = stream {
            attributes.push(KeyValue {
                key: "s2.stream".into(),
                value: Some(AnyValue {
                    value: Some(any_value::Value::StringValue(stream.into())),
                }),
                ..Default::default()
            });
        }
        Some(Resource {
            attributes,
            ..Default::default()
        })
    }

    fn spans(
        stream: Option<&str>,
        scopes: usize,
        per_scope: usize,
        name_len: usize,
    ) -> ResourceSpans {
        ResourceSpans {
            resource: resource(stream),
            scope_spans: (0..scopes)
                .map(|s| ScopeSpans {
                    scope: None,
                    spans: (0..per_scope)
                        .map(|i| Span {
                            trace_id: vec![s as u8 + 1; 16],
                            span_id: (i as u64 + 1).to_be_bytes().to_vec(),
                            name: format!("{s}-{i}-{}", "x".repeat(name_len)),
                            kind: 2,
                            ..Default::default()
                        })
                        .collect(),
                    schema_url: format!("scope-{s}"),
                })
                .collect(),
            schema_url: "resource".into(),
        }
    }

    fn protobuf(groups: Vec<ResourceSpans>) -> Bytes {
        ExportTraceServiceRequest {
            resource_spans: groups,
        }
        .encode_to_vec()
        .into()
    }

    fn target(group: &ParsedGroup) -> (&str, &[Bytes]) {
        let (stream, bodies) = group.target.as_ref().expect("group accepted");
        (stream.as_str(), bodies)
    }

    #[test]
    fn protobuf_groups_become_single_group_requests_as_sent() {
        let a = spans(Some("orders"), 2, 3, 4);
        let b = spans(Some("payments"), 1, 1, 4);
        let groups = parse(
            Signal::Traces,
            Encoding::Protobuf,
            &protobuf(vec![a.clone(), b.clone()]),
            LIMIT,
        )
        .unwrap();
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].items, 6);
        assert_eq!(groups[1].items, 1);
        for (group, original, stream) in [(&groups[0], &a, "orders"), (&groups[1], &b, "payments")]
        {
            let (name, bodies) = target(group);
            assert_eq!(name, stream);
            assert_eq!(bodies.len(), 1);
            // Exactly the bytes a one-group request encodes to.
            assert_eq!(bodies[0], protobuf(vec![original.clone()]));
        }
    }

    #[test]
    fn groups_without_a_valid_stream_are_reported_not_dropped() {
        let request = protobuf(vec![
            spans(None, 1, 2, 1),
            spans(Some(""), 1, 3, 1),
            spans(Some("ok"), 1, 1, 1),
        ]);
        let groups = parse(Signal::Traces, Encoding::Protobuf, &request, LIMIT).unwrap();
        let missing = groups[0].target.as_ref().unwrap_err();
        assert!(missing.contains("s2.stream"), "{missing}");
        assert_eq!(groups[0].items, 2);
        let invalid = groups[1].target.as_ref().unwrap_err();
        assert!(invalid.contains("valid stream"), "{invalid}");
        assert_eq!(groups[1].items, 3);
        assert_eq!(target(&groups[2]).0, "ok");
    }

    #[test]
    fn a_non_string_stream_attribute_is_rejected() {
        let mut group = spans(Some("x"), 1, 1, 1);
        group.resource.as_mut().unwrap().attributes[1].value = Some(AnyValue {
            value: Some(any_value::Value::IntValue(7)),
        });
        let groups = parse(
            Signal::Traces,
            Encoding::Protobuf,
            &protobuf(vec![group]),
            LIMIT,
        )
        .unwrap();
        assert!(groups[0]
            .target
            .as_ref()
            .unwrap_err()
            .contains("must be a string"));
    }

    #[test]
    fn metrics_count_data_points_and_logs_count_records() {
        let point = NumberDataPoint::default;
        let request = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: resource(Some("m")),
                scope_metrics: vec![ScopeMetrics {
                    metrics: vec![
                        Metric {
                            name: "g".into(),
                            data: Some(metric::Data::Gauge(Gauge {
                                data_points: vec![point(), point()],
                            })),
                            ..Default::default()
                        },
                        Metric {
                            name: "h".into(),
                            data: Some(metric::Data::Histogram(Histogram {
                                data_points: vec![HistogramDataPoint::default(); 3],
                                aggregation_temporality: 2,
                            })),
                            ..Default::default()
                        },
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let groups = parse(
            Signal::Metrics,
            Encoding::Protobuf,
            &request.encode_to_vec().into(),
            LIMIT,
        )
        .unwrap();
        assert_eq!(groups[0].items, 5);

        let logs = ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                resource: resource(Some("l")),
                scope_logs: vec![ScopeLogs {
                    log_records: vec![LogRecord::default(); 4],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let groups = parse(
            Signal::Logs,
            Encoding::Protobuf,
            &logs.encode_to_vec().into(),
            LIMIT,
        )
        .unwrap();
        assert_eq!(groups[0].items, 4);
    }

    #[test]
    fn a_large_protobuf_group_is_split_by_scope_and_span_losing_nothing() {
        let original = spans(Some("big"), 3, 40, 1000);
        let request = protobuf(vec![original.clone()]);
        let limit = 16 * 1024;
        let groups = parse(Signal::Traces, Encoding::Protobuf, &request, limit).unwrap();
        let (_, bodies) = target(&groups[0]);
        assert!(bodies.len() > 3, "{} pieces", bodies.len());
        let mut seen = Vec::new();
        for body in bodies {
            assert!(body.len() <= limit);
            let piece = ExportTraceServiceRequest::decode(body.clone()).unwrap();
            assert_eq!(piece.resource_spans.len(), 1);
            let group = &piece.resource_spans[0];
            assert_eq!(group.resource, original.resource);
            assert_eq!(group.schema_url, "resource");
            for scope in &group.scope_spans {
                seen.extend(
                    scope
                        .spans
                        .iter()
                        .map(|s| (scope.schema_url.clone(), s.clone())),
                );
            }
        }
        let expected: Vec<_> = original
            .scope_spans
            .iter()
            .flat_map(|scope| {
                scope
                    .spans
                    .iter()
                    .map(|s| (scope.schema_url.clone(), s.clone()))
            })
            .collect();
        assert_eq!(seen, expected);
    }

    #[test]
    fn a_single_span_larger_than_a_record_is_rejected_with_a_reason() {
        let groups = parse(
            Signal::Traces,
            Encoding::Protobuf,
            &protobuf(vec![spans(Some("big"), 1, 1, 5000)]),
            1024,
        )
        .unwrap();
        let err = groups[0].target.as_ref().unwrap_err();
        assert!(err.contains("larger than 1024 bytes"), "{err}");
    }

    #[test]
    fn malformed_protobuf_is_an_error_and_unknown_fields_are_skipped() {
        let good = protobuf(vec![spans(Some("s"), 1, 1, 1)]);
        let truncated = good.slice(..good.len() - 1);
        assert!(parse(Signal::Traces, Encoding::Protobuf, &truncated, LIMIT).is_err());
        // Field 1 holding bytes that are not a ResourceSpans.
        let mut garbage = Vec::new();
        protobuf::put_len_field(&mut garbage, 1, &[0x0a, 0xff]);
        assert!(parse(Signal::Traces, Encoding::Protobuf, &garbage.into(), LIMIT).is_err());
        // Field 1 as a varint.
        assert!(parse(
            Signal::Traces,
            Encoding::Protobuf,
            &Bytes::from_static(&[0x08, 0x01]),
            LIMIT
        )
        .is_err());
        // An unknown field 9 next to a group.
        let mut extended = good.to_vec();
        protobuf::put_len_field(&mut extended, 9, b"future");
        let groups = parse(Signal::Traces, Encoding::Protobuf, &extended.into(), LIMIT).unwrap();
        assert_eq!(groups.len(), 1);
        assert!(
            parse(Signal::Traces, Encoding::Protobuf, &Bytes::new(), LIMIT)
                .unwrap()
                .is_empty()
        );
    }

    const JSON_TRACES: &str = r#"{
      "resourceSpans": [{
        "resource": {"attributes": [
          {"key": "s2.stream", "value": {"stringValue": "web"}},
          {"key": "pid", "value": {"intValue": "4242"}}
        ]},
        "scopeSpans": [{
          "scope": {"name": "lib", "version": "1.0"},
          "spans": [{
            "traceId": "5b8efff798038103d269b633813fc60c",
            "spanId": "eee19b7ec3c1b174",
            "parentSpanId": "",
            "name": "GET /",
            "kind": 2,
            "startTimeUnixNano": "1544712660000000000",
            "endTimeUnixNano": 1544712661000000000,
            "attributes": [{"key": "ok", "value": {"boolValue": true}}],
            "status": {"code": 1},
            "futureField": {"kept": true}
          }]
        }]
      }]
    }"#;

    #[test]
    fn json_groups_keep_their_json_and_follow_the_otlp_mapping() {
        let groups = parse(
            Signal::Traces,
            Encoding::Json,
            &Bytes::from_static(JSON_TRACES.as_bytes()),
            LIMIT,
        )
        .unwrap();
        let (stream, bodies) = target(&groups[0]);
        assert_eq!(stream, "web");
        assert_eq!(groups[0].items, 1);
        let stored: Value = serde_json::from_slice(&bodies[0]).unwrap();
        let sent: Value = serde_json::from_str(JSON_TRACES).unwrap();
        // Lossless, down to fields this server does not know.
        assert_eq!(stored, sent);
        // And a standard OTLP JSON decoder reads it.
        let decoded: ExportTraceServiceRequest = serde_json::from_slice(&bodies[0]).unwrap();
        let span = &decoded.resource_spans[0].scope_spans[0].spans[0];
        assert_eq!(span.trace_id, hex("5b8efff798038103d269b633813fc60c"));
        assert_eq!(span.start_time_unix_nano, 1_544_712_660_000_000_000);
        assert_eq!(span.end_time_unix_nano, 1_544_712_661_000_000_000);
    }

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn json_that_breaks_the_mapping_is_an_error() {
        let cases = [
            ("not JSON", "{".to_string()),
            ("not an object", "[]".to_string()),
            (
                "groups not an array",
                r#"{"resourceSpans": {}}"#.to_string(),
            ),
            ("snake_case key", r#"{"resource_spans": []}"#.to_string()),
            (
                "group not an object",
                r#"{"resourceSpans": [1]}"#.to_string(),
            ),
            (
                "trace id not hex",
                JSON_TRACES.replace("5b8efff798038103d269b633813fc60c", "not-hex"),
            ),
            (
                "enum by name",
                JSON_TRACES.replace(r#""kind": 2"#, r#""kind": "SPAN_KIND_SERVER""#),
            ),
            (
                "time not a number",
                JSON_TRACES.replace(r#""1544712660000000000""#, r#""soon""#),
            ),
        ];
        for (what, body) in cases {
            let result = parse(Signal::Traces, Encoding::Json, &Bytes::from(body), LIMIT);
            assert!(result.is_err(), "{what} should be refused");
        }
        // No groups at all is a valid, empty export.
        assert!(parse(
            Signal::Traces,
            Encoding::Json,
            &Bytes::from_static(b"{}"),
            LIMIT
        )
        .unwrap()
        .is_empty());
    }

    #[test]
    fn a_large_json_group_is_split_into_valid_requests() {
        let group = spans(Some("big"), 2, 30, 500);
        let request: Value = serde_json::to_value(ExportTraceServiceRequest {
            resource_spans: vec![group.clone()],
        })
        .unwrap();
        let body = Bytes::from(serde_json::to_vec(&request).unwrap());
        let limit = 8 * 1024;
        let groups = parse(Signal::Traces, Encoding::Json, &body, limit).unwrap();
        let (_, bodies) = target(&groups[0]);
        assert!(bodies.len() > 2);
        let mut names = Vec::new();
        for body in bodies {
            assert!(body.len() <= limit);
            let piece: ExportTraceServiceRequest = serde_json::from_slice(body).unwrap();
            assert_eq!(piece.resource_spans[0].resource, group.resource);
            names.extend(
                piece.resource_spans[0]
                    .scope_spans
                    .iter()
                    .flat_map(|s| s.spans.iter().map(|s| s.name.clone())),
            );
        }
        let expected: Vec<_> = group
            .scope_spans
            .iter()
            .flat_map(|s| s.spans.iter().map(|s| s.name.clone()))
            .collect();
        assert_eq!(names, expected);
    }

    #[test]
    fn what_a_request_holds_is_bounded_before_anything_is_decoded() {
        // MAX_ITEMS + 1 empty spans in one scope: two bytes each on the wire, hundreds
        // of bytes each once decoded.
        let mut scope = Vec::new();
        for _ in 0..=MAX_ITEMS {
            protobuf::put_len_field(&mut scope, 2, &[]);
        }
        let mut group = Vec::new();
        protobuf::put_len_field(&mut group, 2, &scope);
        let mut request = Vec::new();
        protobuf::put_len_field(&mut request, 1, &group);
        let refused = parse(Signal::Traces, Encoding::Protobuf, &request.into(), LIMIT);
        assert!(refused.unwrap_err().contains("at most"));

        let groups = vec!["{}"; MAX_GROUPS + 1].join(",");
        let request = format!(r#"{{"resourceLogs":[{groups}]}}"#);
        let refused = parse(Signal::Logs, Encoding::Json, &request.into(), LIMIT);
        assert!(refused.unwrap_err().contains("at most"));

        let items = vec!["{}"; MAX_ITEMS + 1].join(",");
        let request =
            format!(r#"{{"resourceLogs":[{{"scopeLogs":[{{"logRecords":[{items}]}}]}}]}}"#);
        let refused = parse(Signal::Logs, Encoding::Json, &request.into(), LIMIT);
        assert!(refused.unwrap_err().contains("at most"));

        let fields: Vec<String> = (0..300).map(|i| format!(r#""k{i}":0"#)).collect();
        let request = format!(r#"{{"resourceLogs":[{{{}}}]}}"#, fields.join(","));
        let refused = parse(Signal::Logs, Encoding::Json, &request.into(), LIMIT);
        assert!(refused.unwrap_err().contains("fields"));
    }
}
