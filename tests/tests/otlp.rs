//! The OTLP/HTTP front end of the real binary: routing by `s2.stream`, the record
//! format, `partial_success`, and the documented failures, in both encodings.

use std::io::Write;

use base64::Engine as _;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};
use streamgate_tests::Server;

const PROTOBUF: &str = "application/x-protobuf";

fn group(stream: Option<&str>, spans: &[&str]) -> ResourceSpans {
    let attribute = |key: &str, value: &str| KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
        ..Default::default()
    };
    let mut attributes = vec![attribute("service.name", "shop")];
    attributes.extend(stream.map(|s| attribute("s2.stream", s)));
    ResourceSpans {
        resource: Some(Resource {
            attributes,
            ..Default::default()
        }),
        scope_spans: vec![ScopeSpans {
            spans: spans
                .iter()
                .enumerate()
                .map(|(i, name)| Span {
                    trace_id: vec![7; 16],
                    span_id: vec![i as u8 + 1; 8],
                    name: name.to_string(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn request(groups: Vec<ResourceSpans>) -> Vec<u8> {
    ExportTraceServiceRequest {
        resource_spans: groups,
    }
    .encode_to_vec()
}

struct Otlp {
    client: Client,
    endpoint: String,
}

impl Otlp {
    async fn export(
        &self,
        basin: Option<&str>,
        content_type: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> (StatusCode, reqwest::header::HeaderMap, Vec<u8>) {
        let mut request = self
            .client
            .post(format!("{}/otlp/v1/traces", self.endpoint))
            .header("content-type", content_type)
            .body(body);
        if let Some(basin) = basin {
            request = request.header("s2-basin", basin);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        (status, headers, response.bytes().await.unwrap().to_vec())
    }

    async fn create_basin(&self, basin: &str, create_on_append: bool) {
        let response = self
            .client
            .post(format!("{}/v1/basins", self.endpoint))
            .json(&json!({"basin": basin, "config": {"create_stream_on_append": create_on_append}}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
    }

    /// Every record of a stream as (headers, body bytes).
    async fn records(&self, basin: &str, stream: &str) -> Vec<(Vec<(String, String)>, Vec<u8>)> {
        let response = self
            .client
            .get(format!(
                "{}/v1/streams/{stream}/records?seq_num=0",
                self.endpoint
            ))
            .header("s2-basin", basin)
            .header("s2-format", "base64")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "reading {stream}");
        let batch: Value = response.json().await.unwrap();
        let b64 = |v: &Value| {
            base64::engine::general_purpose::STANDARD
                .decode(v.as_str().unwrap())
                .unwrap()
        };
        batch["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let headers = r["headers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|h| {
                        (
                            String::from_utf8(b64(&h[0])).unwrap(),
                            String::from_utf8(b64(&h[1])).unwrap(),
                        )
                    })
                    .collect();
                (headers, b64(&r["body"]))
            })
            .collect()
    }
}

fn start() -> (tempfile::TempDir, Server, Otlp) {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let otlp = Otlp {
        client: streamgate_tests::client(),
        endpoint: server.endpoint.clone(),
    };
    (dir, server, otlp)
}

fn headers_for(content_type: &str) -> Vec<(String, String)> {
    vec![
        ("s2-otlp.signal".into(), "traces".into()),
        ("content-type".into(), content_type.into()),
    ]
}

/// `google.rpc.Status` as OTLP error bodies carry it, written from the spec's field
/// numbers rather than taken from the server.
#[derive(Clone, PartialEq, Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

#[tokio::test]
async fn protobuf_exports_land_one_record_per_group_in_their_streams() {
    let (_dir, _server, otlp) = start();
    otlp.create_basin("otlp-proto", true).await;
    let orders = group(Some("orders"), &["a", "b"]);
    let payments = group(Some("payments"), &["c"]);
    let (status, headers, body) = otlp
        .export(
            Some("otlp-proto"),
            PROTOBUF,
            &[],
            request(vec![orders.clone(), payments.clone()]),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], PROTOBUF);
    let response = ExportTraceServiceResponse::decode(&body[..]).unwrap();
    assert_eq!(response.partial_success, None);

    // A second export to `orders` lands after the first.
    let later = group(Some("orders"), &["d"]);
    let (status, _, _) = otlp
        .export(
            Some("otlp-proto"),
            PROTOBUF,
            &[],
            request(vec![later.clone()]),
        )
        .await;
    assert_eq!(status, 200);

    for (stream, expected) in [
        ("orders", vec![orders, later]),
        ("payments", vec![payments]),
    ] {
        let records = otlp.records("otlp-proto", stream).await;
        assert_eq!(records.len(), expected.len(), "{stream}");
        for ((headers, body), group) in records.iter().zip(expected) {
            assert_eq!(*headers, headers_for(PROTOBUF));
            let stored = ExportTraceServiceRequest::decode(&body[..]).unwrap();
            assert_eq!(stored.resource_spans, vec![group]);
        }
    }
}

#[tokio::test]
async fn json_exports_report_rejected_groups_and_keep_the_rest() {
    let (_dir, _server, otlp) = start();
    otlp.create_basin("otlp-json", true).await;
    let export = json!({"resourceSpans": [
        {"resource": {"attributes": [{"key": "s2.stream", "value": {"stringValue": "web"}}]},
         "scopeSpans": [{"spans": [{"traceId": "0af7651916cd43dd8448eb211c80319c",
                                     "spanId": "b7ad6b7169203331", "name": "GET /",
                                     "startTimeUnixNano": "1700000000000000000"}]}]},
        {"resource": {"attributes": []},
         "scopeSpans": [{"spans": [{"name": "lost-1"}, {"name": "lost-2"}]}]}
    ]});
    let (status, headers, body) = otlp
        .export(
            Some("otlp-json"),
            "application/json",
            &[],
            serde_json::to_vec(&export).unwrap(),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "application/json");
    let response: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(response["partialSuccess"]["rejectedSpans"], "2");
    let message = response["partialSuccess"]["errorMessage"].as_str().unwrap();
    assert!(message.contains("s2.stream"), "{message}");

    let records = otlp.records("otlp-json", "web").await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].0, headers_for("application/json"));
    let stored: Value = serde_json::from_slice(&records[0].1).unwrap();
    assert_eq!(
        stored,
        json!({"resourceSpans": [export["resourceSpans"][0]]})
    );

    // Nothing acceptable at all: 400 with a google.rpc.Status in JSON.
    let only_bad = json!({"resourceSpans": [export["resourceSpans"][1]]});
    let (status, _, body) = otlp
        .export(
            Some("otlp-json"),
            "application/json",
            &[],
            serde_json::to_vec(&only_bad).unwrap(),
        )
        .await;
    assert_eq!(status, 400);
    let rpc: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(rpc["code"], 3);
    assert!(rpc["message"].as_str().unwrap().contains("s2.stream"));
}

#[tokio::test]
async fn missing_streams_are_rejected_when_the_basin_does_not_create_them() {
    let (_dir, _server, otlp) = start();
    otlp.create_basin("otlp-strict", false).await;
    streamgate_tests::create_streams(&otlp.endpoint, "otlp-strict", &["exists"]).await;
    let (status, _, body) = otlp
        .export(
            Some("otlp-strict"),
            PROTOBUF,
            &[],
            request(vec![
                group(Some("exists"), &["a"]),
                group(Some("absent"), &["b", "c"]),
            ]),
        )
        .await;
    assert_eq!(status, 200);
    let partial = ExportTraceServiceResponse::decode(&body[..])
        .unwrap()
        .partial_success
        .expect("partial success");
    assert_eq!(partial.rejected_spans, 2);
    assert!(
        partial.error_message.contains("absent"),
        "{}",
        partial.error_message
    );
    assert_eq!(otlp.records("otlp-strict", "exists").await.len(), 1);
}

#[tokio::test]
async fn gzip_deflate_and_zstd_bodies_are_accepted() {
    let (_dir, _server, otlp) = start();
    otlp.create_basin("otlp-gzip", true).await;
    let original = group(Some("zipped"), &["compressed"]);
    let plain = request(vec![original.clone()]);
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gzip.write_all(&plain).unwrap();
    // HTTP's `deflate` is the zlib format.
    let mut deflate = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    deflate.write_all(&plain).unwrap();
    let zstd = zstd::encode_all(&plain[..], 3).unwrap();
    for (encoding, body) in [
        ("gzip", gzip.finish().unwrap()),
        ("deflate", deflate.finish().unwrap()),
        ("zstd", zstd),
    ] {
        let (status, _, _) = otlp
            .export(
                Some("otlp-gzip"),
                PROTOBUF,
                &[("content-encoding", encoding)],
                body,
            )
            .await;
        assert_eq!(status, 200, "{encoding}");
    }
    let records = otlp.records("otlp-gzip", "zipped").await;
    assert_eq!(records.len(), 3);
    for (_, body) in records {
        let stored = ExportTraceServiceRequest::decode(&body[..]).unwrap();
        assert_eq!(stored.resource_spans, vec![original.clone()]);
    }
}

#[tokio::test]
async fn bad_requests_get_the_documented_failures() {
    let (_dir, _server, otlp) = start();
    otlp.create_basin("otlp-errors", true).await;
    let good = request(vec![group(Some("s"), &["a"])]);

    // Undecodable protobuf: 400 with a protobuf google.rpc.Status.
    let (status, headers, body) = otlp
        .export(Some("otlp-errors"), PROTOBUF, &[], vec![0x0a, 0x05, 0x01])
        .await;
    assert_eq!(status, 400);
    assert_eq!(headers["content-type"], PROTOBUF);
    let rpc = RpcStatus::decode(&body[..]).unwrap();
    assert_eq!(rpc.code, 3);
    assert!(rpc.message.contains("protobuf"), "{}", rpc.message);

    // Not an OTLP encoding.
    let (status, _, _) = otlp
        .export(Some("otlp-errors"), "text/plain", &[], good.clone())
        .await;
    assert_eq!(status, 415);

    // No basin named, and a basin that does not exist.
    let (status, _, _) = otlp.export(None, PROTOBUF, &[], good.clone()).await;
    assert_eq!(status, 400);
    let (status, _, body) = otlp
        .export(Some("no-such-basin"), PROTOBUF, &[], good.clone())
        .await;
    assert_eq!(status, 404);
    assert_eq!(RpcStatus::decode(&body[..]).unwrap().code, 5);

    // Nothing was stored by any of these.
    let response = otlp
        .client
        .get(format!("{}/v1/streams/s/records/tail", otlp.endpoint))
        .header("s2-basin", "otlp-errors")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
}

/// With the in-flight budget spent (appends filling it wait for a store that does not
/// answer), an export is turned away at once with `503` and `Retry-After`, which
/// exporters retry, and stores nothing; once the store answers, the appends are
/// acknowledged and exports are taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_get_503_with_retry_after_while_the_in_flight_budget_is_spent() {
    use streamgate_tests::proxy::{server_with_objects_behind_proxy_and_flags, Mode};
    let dir = tempfile::tempdir().unwrap();
    let bucket = format!("streamgate-test-otlp-{}", std::process::id());
    // The smallest budget the server takes, 2 MiB; no compaction, so the only requests
    // to the store are the WAL's.
    let (proxy, server) = server_with_objects_behind_proxy_and_flags(
        &streamgate_tests::backends::s3_endpoint(),
        dir.path(),
        &bucket,
        &[
            "--max-inflight-mib",
            "2",
            "--compaction-interval-ms",
            "3600000",
        ],
    )
    .await;
    let otlp = Otlp {
        // The bound only keeps a broken build (one that took the export and waits for
        // the store) from hanging.
        client: streamgate_tests::client_builder()
            .timeout(std::time::Duration::from_secs(60))
            .build()
            .unwrap(),
        endpoint: server.endpoint.clone(),
    };
    otlp.create_basin("otlp-busy", true).await;
    streamgate_tests::create_streams(&otlp.endpoint, "otlp-busy", &["big"]).await;

    // The store stops answering. Its pooled connections are cut first, so the chunk of
    // each append below needs a new one, which the black hole accepts and counts.
    proxy.cut().await;
    proxy.set(Mode::BlackHole);
    let mut fillers = Vec::new();
    for filler in 1..=2 {
        let client = otlp.client.clone();
        let url = format!("{}/v1/streams/big/records", otlp.endpoint);
        // 8 bytes of metering overhead: exactly 1 MiB, half the budget.
        let body = "x".repeat(1024 * 1024 - 8);
        fillers.push(tokio::spawn(async move {
            client
                .post(url)
                .header("s2-basin", "otlp-busy")
                .json(&json!({"records": [{"body": body}]}))
                .send()
                .await
                .unwrap()
                .status()
        }));
        // Once its chunk is on its way to the store, the append holds its budget.
        for _ in 0..3000 {
            if proxy.faulted_connections() >= filler {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(
            proxy.faulted_connections() >= filler,
            "the chunk of append {filler} went to the store"
        );
    }

    let export = |span: &str| request(vec![group(Some("spans"), &[span])]);
    let (status, headers, body) = otlp
        .export(Some("otlp-busy"), PROTOBUF, &[], export("turned-away"))
        .await;
    assert_eq!(status, 503, "{}", String::from_utf8_lossy(&body));
    assert!(
        headers.contains_key("retry-after"),
        "a 503 says when to retry: {headers:?}"
    );
    let rpc = RpcStatus::decode(&body[..]).unwrap();
    assert_eq!(rpc.code, 14, "UNAVAILABLE: {}", rpc.message);
    assert!(
        fillers.iter().all(|filler| !filler.is_finished()),
        "the appends holding the budget wait for the store"
    );

    // The store answers again: the appends are durable, the budget free, exports taken.
    proxy.set(Mode::Forward);
    for filler in fillers {
        assert_eq!(filler.await.unwrap(), 200);
    }
    let (status, _, _) = otlp
        .export(Some("otlp-busy"), PROTOBUF, &[], export("taken"))
        .await;
    assert_eq!(status, 200);
    let records = otlp.records("otlp-busy", "spans").await;
    let spans: Vec<String> = records
        .iter()
        .map(|(_, body)| {
            let stored = ExportTraceServiceRequest::decode(&body[..]).unwrap();
            stored.resource_spans[0].scope_spans[0].spans[0]
                .name
                .clone()
        })
        .collect();
    assert_eq!(spans, ["taken"], "the export turned away stored nothing");
}
