//! Operator metrics: what the server does, for Prometheus (the gateway serves them on
//! `--metrics-listen`). Every metric is recorded here, through the `metrics` facade, so
//! names and labels live in one place; when no exporter is installed the facade drops
//! them at the cost of a branch. Usage per account, basin and stream for the S2 metrics
//! API is another matter (`usage`).

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};

use crate::error::Result;
use crate::storage::ObjectStore;

/// Names each metric once with its help text (shown by Prometheus), and records the
/// build. Called once the exporter is installed.
pub fn describe() {
    describe_gauge!(
        "streamgate_build_info",
        "The running build (its version is a label); always 1."
    );
    describe_counter!(
        "streamgate_requests_total",
        "Requests answered, by front end (rest, resp, otlp), operation and outcome."
    );
    describe_histogram!(
        "streamgate_request_duration_seconds",
        "Time to answer a request (for a session or SSE, until it started), by front end and operation."
    );
    describe_histogram!(
        "streamgate_wal_flush_duration_seconds",
        "Time to write a WAL chunk durably (all retries included)."
    );
    describe_counter!(
        "streamgate_wal_flushed_bytes_total",
        "Bytes of WAL chunks written."
    );
    describe_counter!("streamgate_wal_flushes_total", "WAL chunks written.");
    describe_counter!(
        "streamgate_object_store_requests_total",
        "Object store requests, by operation and outcome."
    );
    describe_histogram!(
        "streamgate_object_store_request_duration_seconds",
        "Object store request latency, by operation."
    );
    describe_counter!(
        "streamgate_metadata_requests_total",
        "Metadata store calls, by operation and outcome."
    );
    describe_histogram!(
        "streamgate_metadata_request_duration_seconds",
        "Metadata store call latency, by operation."
    );
    describe_counter!(
        "streamgate_compaction_rounds_total",
        "Compaction rounds, by outcome."
    );
    describe_counter!(
        "streamgate_compaction_chunks_total",
        "WAL chunks compacted into segments."
    );
    describe_counter!("streamgate_compaction_segments_total", "Segments written.");
    describe_counter!(
        "streamgate_compaction_bytes_total",
        "Bytes moved from WAL chunks into segments."
    );
    describe_counter!(
        "streamgate_takeovers_total",
        "Takeovers: replays of a log (another node's, or this node's own) that rebuilt streams to serve them here."
    );
    describe_counter!(
        "streamgate_taken_over_streams_total",
        "Streams rebuilt by takeovers."
    );
    describe_counter!(
        "streamgate_takeover_failures_total",
        "Takeovers that failed part way; the streams they claimed are taken by the next attempt."
    );
    describe_counter!(
        "streamgate_handovers_total",
        "Hand-overs of streams to other nodes (for an even share, or at shutdown)."
    );
    describe_counter!(
        "streamgate_handed_over_streams_total",
        "Streams handed to other nodes."
    );
    describe_counter!(
        "streamgate_lifecycle_passes_total",
        "Lifecycle passes (retention, trims, deletions), by outcome."
    );
    describe_gauge!(
        "streamgate_inflight_append_bytes",
        "Bytes of appends accepted and not yet durable (bounded by --max-inflight-mib)."
    );
    describe_gauge!(
        "streamgate_open_sessions",
        "Open S2S sessions and SSE reads, by kind."
    );
    describe_gauge!("streamgate_resp_connections", "Open RESP connections.");
    describe_gauge!(
        "streamgate_wal_log_chunks",
        "WAL chunks held in the local directory's chunk log, not yet compacted away."
    );
    describe_counter!(
        "streamgate_otlp_exports_total",
        "OTLP exports, by signal and outcome (ok: stored, in whole or in part)."
    );
    gauge!("streamgate_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
}

/// A request a front end answered: `frontend` is `rest`, `resp` or `otlp`.
pub fn request(frontend: &'static str, operation: String, outcome: &'static str, took: Duration) {
    requests(frontend, operation, outcome, took, 1);
}

/// `count` requests answered alike at once (the XADDs of one pipelined append): one
/// lookup of the labelled series for all of them, not one each.
pub fn requests(
    frontend: &'static str,
    operation: String,
    outcome: &'static str,
    took: Duration,
    count: usize,
) {
    counter!(
        "streamgate_requests_total",
        "frontend" => frontend,
        "operation" => operation.clone(),
        "outcome" => outcome
    )
    .increment(count as u64);
    histogram!(
        "streamgate_request_duration_seconds",
        "frontend" => frontend,
        "operation" => operation
    )
    .record_many(took.as_secs_f64(), count);
}

pub(crate) fn wal_flush(bytes: usize, took: Duration) {
    counter!("streamgate_wal_flushes_total").increment(1);
    counter!("streamgate_wal_flushed_bytes_total").increment(bytes as u64);
    histogram!("streamgate_wal_flush_duration_seconds").record(took.as_secs_f64());
}

pub(crate) fn wal_log_chunks(count: usize) {
    gauge!("streamgate_wal_log_chunks").set(count as f64);
}

pub(crate) fn metadata_call(operation: &'static str, ok: bool, took: Duration) {
    counter!(
        "streamgate_metadata_requests_total",
        "operation" => operation,
        "outcome" => outcome(ok)
    )
    .increment(1);
    histogram!("streamgate_metadata_request_duration_seconds", "operation" => operation)
        .record(took.as_secs_f64());
}

pub(crate) fn compaction_round(outcome: &Result<crate::CompactionStats>) {
    counter!("streamgate_compaction_rounds_total", "outcome" => self::outcome(outcome.is_ok()))
        .increment(1);
    if let Ok(stats) = outcome {
        counter!("streamgate_compaction_chunks_total").increment(stats.chunks as u64);
        counter!("streamgate_compaction_segments_total").increment(stats.segments as u64);
        counter!("streamgate_compaction_bytes_total").increment(stats.bytes as u64);
    }
}

/// Streams this node rebuilt in one takeover.
pub(crate) fn takeover(streams: usize) {
    counter!("streamgate_takeovers_total").increment(1);
    counter!("streamgate_taken_over_streams_total").increment(streams as u64);
}

/// A takeover that claimed streams and failed before serving them.
pub(crate) fn takeover_failed() {
    counter!("streamgate_takeover_failures_total").increment(1);
}

/// Streams this node handed to others in one hand-over.
pub(crate) fn hand_over(streams: usize) {
    counter!("streamgate_handovers_total").increment(1);
    counter!("streamgate_handed_over_streams_total").increment(streams as u64);
}

pub(crate) fn lifecycle_pass(ok: bool) {
    counter!("streamgate_lifecycle_passes_total", "outcome" => outcome(ok)).increment(1);
}

pub(crate) fn inflight_append_bytes(bytes: usize) {
    gauge!("streamgate_inflight_append_bytes").set(bytes as f64);
}

/// Counts an open session (`s2s-append`, `s2s-read`, `sse`) or RESP connection
/// (`resp`) while it lives.
pub struct OpenGuard {
    kind: &'static str,
}

impl OpenGuard {
    pub fn new(kind: &'static str) -> OpenGuard {
        open_gauge(kind).increment(1.0);
        OpenGuard { kind }
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        open_gauge(self.kind).decrement(1.0);
    }
}

fn open_gauge(kind: &'static str) -> metrics::Gauge {
    match kind {
        "resp" => gauge!("streamgate_resp_connections"),
        kind => gauge!("streamgate_open_sessions", "kind" => kind),
    }
}

pub fn otlp_export(signal: &'static str, ok: bool) {
    counter!("streamgate_otlp_exports_total", "signal" => signal, "outcome" => outcome(ok))
        .increment(1);
}

fn outcome(ok: bool) -> &'static str {
    if ok {
        "ok"
    } else {
        "error"
    }
}

/// An `ObjectStore` whose every request is counted and timed.
pub(crate) struct InstrumentedObjects {
    store: Arc<dyn ObjectStore>,
}

impl InstrumentedObjects {
    pub fn new(store: Arc<dyn ObjectStore>) -> InstrumentedObjects {
        InstrumentedObjects { store }
    }
}

async fn timed<T>(
    operation: &'static str,
    call: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    let started = Instant::now();
    let outcome = call.await;
    object_store_request(operation, outcome.is_ok(), started.elapsed());
    outcome
}

fn object_store_request(operation: &'static str, ok: bool, took: Duration) {
    counter!(
        "streamgate_object_store_requests_total",
        "operation" => operation,
        "outcome" => self::outcome(ok)
    )
    .increment(1);
    histogram!("streamgate_object_store_request_duration_seconds", "operation" => operation)
        .record(took.as_secs_f64());
}

#[async_trait]
impl ObjectStore for InstrumentedObjects {
    async fn put(&self, key: &str, data: Bytes) -> Result<()> {
        timed("put", self.store.put(key, data)).await
    }

    async fn get(&self, key: &str) -> Result<Option<Bytes>> {
        timed("get", self.store.get(key)).await
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes> {
        timed("get_range", self.store.get_range(key, range)).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        timed("list", self.store.list(prefix)).await
    }

    async fn delete(&self, key: &str) -> Result<()> {
        timed("delete", self.store.delete(key)).await
    }

    async fn sync_deletes(&self, keys: &[String]) -> Result<()> {
        timed("sync_deletes", self.store.sync_deletes(keys)).await
    }

    fn describe(&self) -> String {
        self.store.describe()
    }

    fn put_prepared_blocking(&self, key: &str, data: &[u8]) -> Option<Result<()>> {
        let started = Instant::now();
        let outcome = self.store.put_prepared_blocking(key, data)?;
        object_store_request("put", outcome.is_ok(), started.elapsed());
        Some(outcome)
    }

    async fn prepare(&self, keys: &[String]) -> Result<()> {
        timed("prepare", self.store.prepare(keys)).await
    }
}
