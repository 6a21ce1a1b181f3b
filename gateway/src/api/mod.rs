//! The S2 REST API v1, over HTTP/1.1 and cleartext HTTP/2.

mod basins;
pub(crate) mod error;
pub(crate) mod extract;
mod failure_log;
pub mod forward;
pub(crate) mod json;
mod metrics;
pub mod peers;
pub(crate) mod proto;
pub(crate) mod records;
pub mod sessions;
mod streams;
mod tokens;

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use serde::Deserialize;
use streamgate_core::storage::metadata::ListRange;
use streamgate_core::Engine;
use tower_http::catch_panic::{CatchPanic, CatchPanicLayer};
use tower_http::compression::predicate::{And, NotForContentType, Predicate, SizeAbove};
use tower_http::compression::{Compression, CompressionLayer};
use tower_http::cors::{Cors, CorsLayer};
use tower_http::decompression::{RequestDecompression, RequestDecompressionLayer};

use error::{ApiError, ApiResult};

/// The whole HTTP surface with the layers every request and response passes through:
/// panics answered with a 500, request bodies decompressed, responses compressed.
/// They wrap the router once, from outside: each `Router::layer` boxes the response
/// body again, and a read session's every frame went through six boxes (a tenth of
/// the server's CPU with 10,000 readers; BENCHMARKS.md, "Live readers").
/// With CORS, its layer is the outermost (`--cors-origins`).
pub type App = tower::util::Either<Cors<Layered>, Layered>;

type Layered = CatchPanic<RequestDecompression<Compression<Router, CompressWhen>>, PanicResponse>;

/// Compress responses over 1 KiB, never streaming ones.
type CompressWhen = And<And<SizeAbove, NotForContentType>, NotForContentType>;

type PanicResponse = fn(Box<dyn std::any::Any + Send>) -> Response;

/// A panic in a handler answers its own request with a 500; the panic hook logs it.
fn panic_response(_: Box<dyn std::any::Any + Send>) -> Response {
    ApiError::internal("the server failed while handling this request (it is logged); retry")
        .into_response()
}

/// The REST API, OTLP, the operator endpoints, and `pages` (the dashboard), in one
/// `App`. `peer_tls` is how calls to other nodes at `https://` URLs are made.
pub fn app(
    engine: Engine,
    drain: sessions::Drain,
    pages: Router,
    peer_tls: rustls::ClientConfig,
    cors: Option<CorsLayer>,
) -> App {
    let router = router(engine, drain, pages, peer_tls);
    let compress_when = SizeAbove::new(1024)
        .and(NotForContentType::const_new("text/event-stream"))
        .and(NotForContentType::const_new("s2s/proto"));
    tower::ServiceBuilder::new()
        .option_layer(cors)
        .layer(CatchPanicLayer::custom(panic_response as PanicResponse))
        .layer(RequestDecompressionLayer::new())
        .layer(CompressionLayer::new().compress_when(compress_when))
        .service(router)
}

/// Every route, behind the layers that need the router's own types.
fn router(
    engine: Engine,
    drain: sessions::Drain,
    pages: Router,
    peer_tls: rustls::ClientConfig,
) -> Router {
    // One client for the other nodes: whole requests forwarded, and the calls RESP and
    // OTLP make at the nodes that sequence other streams.
    let peers = forward::PeerClient::new(&engine, peer_tls);
    engine.set_remote(std::sync::Arc::new(peers::RestPeers::new(peers.clone())));
    // Record routes go through forwarding: served here, or by the stream's owner.
    let records = Router::new()
        .route(
            "/streams/{stream}/records",
            get(records::read).post(records::append),
        )
        .route("/streams/{stream}/records/tail", get(records::check_tail))
        .route_layer(axum::middleware::from_fn_with_state(
            engine.clone(),
            forward::route_records,
        ));
    let v1 = Router::new()
        .route("/basins", get(basins::list).post(basins::create))
        .route(
            "/basins/{basin}",
            get(basins::get_config)
                .put(basins::ensure)
                .patch(basins::reconfigure)
                .delete(basins::delete),
        )
        .route("/streams", get(streams::list).post(streams::create))
        .route(
            "/streams/{stream}",
            get(streams::get_config)
                .put(streams::ensure)
                .patch(streams::reconfigure)
                .delete(streams::delete),
        )
        .route("/locations", get(locations))
        .route(
            "/locations/default",
            put(set_default_location).get(default_location),
        )
        .route("/access-tokens", get(tokens::list).post(tokens::issue))
        .route("/access-tokens/{id}", axum::routing::delete(tokens::revoke))
        .route("/metrics", get(metrics::account))
        .route("/metrics/{basin}", get(metrics::basin))
        .route("/metrics/{basin}/{stream}", get(metrics::stream))
        .route(
            "/streams/{stream}/resp",
            axum::routing::post(peers::serve_resp_command),
        )
        .merge(records)
        .fallback(unknown_endpoint)
        .with_state(engine.clone());
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/ready",
            get({
                let engine = engine.clone();
                move || ready(engine.clone())
            }),
        )
        .nest("/v1", v1)
        .nest("/otlp", streamgate_otlp::router(engine.clone()))
        .merge(pages)
        .fallback(unknown_endpoint)
        .route(
            "/cluster",
            get({
                let engine = engine.clone();
                move || cluster_view(engine.clone())
            }),
        )
        .layer(axum::middleware::from_fn(
            crate::operator_metrics::track_requests,
        ))
        .layer(axum::Extension(drain))
        .layer(axum::Extension(forward::Forwarder::new(peers.clone())))
}

/// Readiness: `200` while the server takes traffic; `503` with the reason while it
/// cannot (the write-ahead log cannot be written, or it is shutting down). `/health`
/// stays a liveness check: the process answers.
async fn ready(engine: Engine) -> Response {
    match engine.unready_reason() {
        None => Json(serde_json::json!({ "ready": true })).into_response(),
        Some(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({ "ready": false, "reason": reason })),
        )
            .into_response(),
    }
}

/// The cluster as this node sees it: itself, and every node the metadata store knows
/// with its advertised URL, heartbeat age, whether its lease holds (whether it has
/// finished starting, and whether it is handing its streams over to shut down), and
/// how many streams it sequences. An operator endpoint, like `/ready`: it needs no token.
async fn cluster_view(engine: Engine) -> Response {
    let nodes = match engine.cluster_nodes().await {
        Ok(nodes) => nodes,
        Err(err) => return ApiError::from(err).into_response(),
    };
    let node = engine.node();
    let nodes: Vec<serde_json::Value> = nodes
        .iter()
        .map(|n| {
            serde_json::json!({
                "epoch": n.epoch,
                "identity": n.identity,
                "advertise_url": n.advertise_url,
                "started_at": n.started_at.format(&time::format_description::well_known::Rfc3339).unwrap_or_default(),
                "heartbeat_age_ms": n.heartbeat_age_ms,
                "live": n.live,
                "ready": n.ready,
                "leaving": n.leaving,
                "streams_owned": n.streams_owned,
            })
        })
        .collect();
    Json(serde_json::json!({
        "node": {
            "epoch": engine.epoch(),
            "identity": node.identity,
            "advertise_url": node.advertise_url,
            "lease_ms": node.lease.as_millis() as u64,
            "streams_served": engine.streams_served(),
            "ready": engine.unready_reason().is_none(),
        },
        "nodes": nodes,
    }))
    .into_response()
}

async fn unknown_endpoint() -> ApiError {
    ApiError::bad_path("no such endpoint; the S2 REST API lives under /v1")
}

fn location_info(settings: &streamgate_core::EngineSettings) -> serde_json::Value {
    serde_json::json!({
        "name": settings.location,
        "is_private": true,
        "storage_classes": ["standard", "express"],
        "default_storage_class": settings.default_storage_class,
    })
}

// Locations need a valid token, but no particular operation: they only describe
// this server.
async fn locations(extract::Authenticated(caller): extract::Authenticated) -> Response {
    Json(serde_json::json!([location_info(caller.settings())])).into_response()
}

async fn default_location(extract::Authenticated(caller): extract::Authenticated) -> Response {
    Json(location_info(caller.settings())).into_response()
}

async fn set_default_location(
    extract::Authenticated(caller): extract::Authenticated,
    headers: axum::http::HeaderMap,
    extract::UnaryBody(body): extract::UnaryBody,
) -> ApiResult<Response> {
    let requested: String = extract::json_body(&headers, &body)?
        .ok_or_else(|| ApiError::bad_json("expected the location name as a JSON string"))?;
    let settings = caller.settings();
    if requested != settings.location {
        return Err(ApiError::invalid(format!(
            "unknown location `{requested}`; this server offers `{}`",
            settings.location
        )));
    }
    Ok(Json(location_info(settings)).into_response())
}

/// `prefix`, `start_after` and `limit` of the list endpoints. A `limit` of 0 or over
/// 1000 means 1000, as documented.
#[derive(Debug, Deserialize)]
pub(crate) struct ListQuery {
    #[serde(default)]
    prefix: String,
    #[serde(default)]
    start_after: String,
    #[serde(default)]
    limit: Option<usize>,
}

impl ListQuery {
    pub(crate) fn range(self, max_name_len: usize) -> ApiResult<ListRange> {
        for (what, value) in [("prefix", &self.prefix), ("start_after", &self.start_after)] {
            streamgate_core::names::check_list_bound(what, value, max_name_len)
                .map_err(ApiError::bad_query)?;
        }
        let limit = match self.limit {
            None | Some(0) => 1000,
            Some(n) => n.min(1000),
        };
        Ok(ListRange {
            prefix: self.prefix,
            start_after: self.start_after,
            limit,
        })
    }
}

/// The `s2-provision-result` header of the ensure (PUT) calls, and their status.
fn provisioned(result: streamgate_core::Provisioned, body: impl serde::Serialize) -> Response {
    use streamgate_core::Provisioned;
    let (status, word) = match result {
        Provisioned::Created => (StatusCode::CREATED, "created"),
        Provisioned::Updated => (StatusCode::OK, "updated"),
        Provisioned::Unchanged => (StatusCode::OK, "noop"),
    };
    let mut response = (status, Json(body)).into_response();
    response
        .headers_mut()
        .insert("s2-provision-result", HeaderValue::from_static(word));
    response
}
