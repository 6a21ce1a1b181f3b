//! Operator metrics in Prometheus' text format, on a listener of their own
//! (`--metrics-listen`), kept apart from the API so they can be reached without an
//! access token from where Prometheus runs and nowhere else. The engine and the front
//! ends record through `streamgate_core::telemetry`; this module installs the exporter,
//! counts and times the HTTP requests, and serves `GET /metrics`.

use std::net::SocketAddr;
use std::time::Instant;

use anyhow::Context;
use axum::extract::Request;
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use streamgate_core::telemetry;

/// Latency buckets (seconds): from a fast local append to a slow S3 request.
const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Installs the exporter (process-wide) and binds its listener; `serve` then answers.
pub async fn listen(
    address: SocketAddr,
) -> anyhow::Result<(tokio::net::TcpListener, PrometheusHandle)> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &LATENCY_BUCKETS)
        .context("configuring the Prometheus exporter")?
        .install_recorder()
        .context("installing the Prometheus exporter")?;
    telemetry::describe();
    let listener = tokio::net::TcpListener::bind(address).await.with_context(|| {
        format!("cannot listen for metrics on {address}; pick another with --metrics-listen, or `off`")
    })?;
    Ok((listener, handle))
}

/// Answers `GET /metrics` (anything else is 404) until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, handle: PrometheusHandle) {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let handle = handle.clone();
            async move {
                handle.run_upkeep();
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4",
                    )],
                    handle.render(),
                )
            }
        }),
    );
    if let Err(err) = axum::serve(listener, app).await {
        tracing::error!(error = %err, "the metrics listener stopped");
    }
}

/// Middleware of the HTTP server: counts and times each request (until its response
/// starts) by front end, operation and status class.
pub async fn track_requests(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let (frontend, operation) = operation_of(request.method(), request.uri().path());
    let response = next.run(request).await;
    let outcome = match response.status().as_u16() {
        200..=299 => "2xx",
        400..=499 => "4xx",
        500..=599 => "5xx",
        _ => "other",
    };
    telemetry::request(frontend, operation, outcome, started.elapsed());
    response
}

/// A request's front end and operation, from a fixed set (names in paths are replaced
/// by their parameter), so the labels stay few whatever clients send.
fn operation_of(method: &Method, path: &str) -> (&'static str, String) {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let route = match segments.as_slice() {
        ["otlp", "v1", signal @ ("traces" | "metrics" | "logs")] => {
            return ("otlp", (*signal).to_owned())
        }
        ["v1", "basins"] => "/v1/basins",
        ["v1", "basins", _] => "/v1/basins/{basin}",
        ["v1", "streams"] => "/v1/streams",
        ["v1", "streams", _] => "/v1/streams/{stream}",
        ["v1", "streams", _, "records"] => "/v1/streams/{stream}/records",
        ["v1", "streams", _, "records", "tail"] => "/v1/streams/{stream}/records/tail",
        ["v1", "access-tokens"] => "/v1/access-tokens",
        ["v1", "access-tokens", _] => "/v1/access-tokens/{id}",
        ["v1", "metrics"] => "/v1/metrics",
        ["v1", "metrics", _] => "/v1/metrics/{basin}",
        ["v1", "metrics", _, _] => "/v1/metrics/{basin}/{stream}",
        ["v1", "locations"] => "/v1/locations",
        ["v1", "locations", "default"] => "/v1/locations/default",
        ["health"] => "/health",
        ["ready"] => "/ready",
        ["cluster"] => "/cluster",
        ["dashboard", ..] => "/dashboard",
        _ => return ("rest", "other".to_owned()),
    };
    let method = match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        Method::HEAD => "HEAD",
        _ => "OTHER",
    };
    ("rest", format!("{method} {route}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_are_named_by_route_not_by_what_the_path_holds() {
        assert_eq!(
            operation_of(&Method::POST, "/v1/streams/a%2Fb/records"),
            ("rest", "POST /v1/streams/{stream}/records".into())
        );
        assert_eq!(
            operation_of(&Method::GET, "/v1/streams/s/records/tail"),
            ("rest", "GET /v1/streams/{stream}/records/tail".into())
        );
        assert_eq!(
            operation_of(&Method::POST, "/otlp/v1/logs"),
            ("otlp", "logs".into())
        );
        assert_eq!(
            operation_of(&Method::GET, "/v1/anything/at/all/x"),
            ("rest", "other".into())
        );
    }
}
