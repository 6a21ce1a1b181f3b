//! `otlp_bench`: OTLP/HTTP ingest rate of streamgate — spans/s and log records/s, in
//! protobuf and JSON — with export requests of the size the docs recommend for the
//! Collector's batches (256–512 KiB). Prints numbers; asserts nothing.
//!
//!   cargo run --release -p streamgate-compat --bin otlp_bench -- [--seconds N] [--request-kib K]
//!
//! The server is the release binary on a fresh data directory; each client sends one
//! export at a time (the docs' `num_consumers: 1` keeps order), each to its own stream.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;
use streamgate_compat::Server;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "target/otlp-bench-data")]
    data_dir: PathBuf,
    /// Duration of each phase.
    #[arg(long, default_value_t = 8)]
    seconds: u64,
    /// Approximate size of each export request (protobuf encoding).
    #[arg(long, default_value_t = 384)]
    request_kib: usize,
}

fn string(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
        ..Default::default()
    }
}

fn resource(stream: &str) -> Option<Resource> {
    Some(Resource {
        attributes: vec![string("s2.stream", stream), string("service.name", "bench")],
        ..Default::default()
    })
}

fn scope() -> Option<InstrumentationScope> {
    Some(InstrumentationScope {
        name: "otlp-bench".into(),
        version: "1.0".into(),
        ..Default::default()
    })
}

/// A span like an HTTP server's: ids, times, a handful of attributes (~250 bytes).
fn span(i: u64) -> Span {
    Span {
        trace_id: (u128::from(i) * 0x9e37_79b9_7f4a_7c15)
            .to_be_bytes()
            .to_vec(),
        span_id: (i + 1).to_be_bytes().to_vec(),
        name: "GET /api/orders/{id}".into(),
        kind: 2,
        start_time_unix_nano: 1_700_000_000_000_000_000 + i * 1000,
        end_time_unix_nano: 1_700_000_000_000_000_000 + i * 1000 + 750_000,
        attributes: vec![
            string("http.request.method", "GET"),
            string("url.path", &format!("/api/orders/{i}")),
            string("http.route", "/api/orders/{id}"),
            string("server.address", "orders.internal"),
            string("user_agent.original", "curl/8.5.0"),
        ],
        ..Default::default()
    }
}

/// A log record like an application's (~200 bytes).
fn log(i: u64) -> LogRecord {
    LogRecord {
        time_unix_nano: 1_700_000_000_000_000_000 + i * 1000,
        severity_number: 9,
        severity_text: "INFO".into(),
        body: Some(AnyValue {
            value: Some(any_value::Value::StringValue(format!(
                "order {i} accepted: 3 items, total 42.50 EUR, shipping to warehouse 7"
            ))),
        }),
        attributes: vec![
            string("code.function", "accept_order"),
            string("order.id", &i.to_string()),
        ],
        ..Default::default()
    }
}

struct Workload {
    path: &'static str,
    noun: &'static str,
    items: usize,
    protobuf: Vec<u8>,
    json: Vec<u8>,
}

/// One export request of about `kib` KiB for `stream`, in both encodings.
fn traces(stream: &str, kib: usize) -> Workload {
    let per_item = span(0).encoded_len() + 3;
    let items = kib * 1024 / per_item;
    let request = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: resource(stream),
            scope_spans: vec![ScopeSpans {
                scope: scope(),
                spans: (0..items as u64).map(span).collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    Workload {
        path: "traces",
        noun: "spans",
        items,
        protobuf: request.encode_to_vec(),
        json: serde_json::to_vec(&request).unwrap(),
    }
}

fn logs(stream: &str, kib: usize) -> Workload {
    let per_item = log(0).encoded_len() + 3;
    let items = kib * 1024 / per_item;
    let request = ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: resource(stream),
            scope_logs: vec![ScopeLogs {
                scope: scope(),
                log_records: (0..items as u64).map(log).collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    Workload {
        path: "logs",
        noun: "log records",
        items,
        protobuf: request.encode_to_vec(),
        json: serde_json::to_vec(&request).unwrap(),
    }
}

/// Sends `body` back to back for `seconds`; returns (requests, latencies).
async fn drive(
    endpoint: String,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
    seconds: u64,
) -> Vec<Duration> {
    let client = streamgate_tests::client();
    let url = format!("{endpoint}/otlp/v1/{path}");
    let body = bytes::Bytes::from(body);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut latencies = Vec::new();
    while Instant::now() < deadline {
        let start = Instant::now();
        let response = client
            .post(&url)
            .header("s2-basin", "otlp-bench")
            .header("content-type", content_type)
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let status = response.status();
        let reply = response.bytes().await.unwrap();
        assert!(status.is_success(), "export failed: {status} {reply:?}");
        latencies.push(start.elapsed());
    }
    latencies
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let _ = std::fs::remove_dir_all(&args.data_dir);
    std::fs::create_dir_all(&args.data_dir).unwrap();
    let server = Server::start(&args.data_dir.join("server"));
    let http = streamgate_tests::client();
    let created = http
        .post(format!("{}/v1/basins", server.endpoint))
        .json(&serde_json::json!({"basin": "otlp-bench", "config": {"create_stream_on_append": true}}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);

    println!(
        "OTLP/HTTP ingest, export requests of ~{} KiB (protobuf size), {} s per phase",
        args.request_kib, args.seconds
    );
    for make in [traces as fn(&str, usize) -> Workload, logs] {
        for clients in [1usize, 4] {
            for encoding in ["protobuf", "json"] {
                let content_type = if encoding == "json" {
                    "application/json"
                } else {
                    "application/x-protobuf"
                };
                let mut tasks = Vec::new();
                let mut shape = None;
                for c in 0..clients {
                    let workload = make(&format!("{encoding}-{clients}-{c}"), args.request_kib);
                    let body = if encoding == "json" {
                        workload.json
                    } else {
                        workload.protobuf
                    };
                    shape = Some((workload.path, workload.noun, workload.items, body.len()));
                    tasks.push(tokio::spawn(drive(
                        server.endpoint.clone(),
                        workload.path,
                        content_type,
                        body,
                        args.seconds,
                    )));
                }
                let mut latencies = Vec::new();
                for task in tasks {
                    latencies.extend(task.await.unwrap());
                }
                let (path, noun, items, size) = shape.unwrap();
                latencies.sort();
                let requests = latencies.len() as f64 / args.seconds as f64;
                println!(
                    "{path:6} {encoding:8} {clients} client(s): {:>9.0} {noun}/s, {:>6.1} MiB/s of requests ({} {noun} in {} KiB each), p50 {:.1} ms",
                    requests * items as f64,
                    requests * size as f64 / (1 << 20) as f64,
                    items,
                    size / 1024,
                    latencies[latencies.len() / 2].as_secs_f64() * 1e3,
                );
            }
        }
    }
}
