//! Forwarding: a request on a stream that another node sequences is passed on to that
//! node whole, its body and its answer streamed both ways, so a client may send any
//! request to any node: unary calls, S2S append and read sessions, SSE. The owner sees
//! the client's own headers (its token, too) and checks everything itself.
//!
//! A forwarded request carries `streamgate-forwarded-by`. Its receiver serves it itself
//! (taking the stream over if no live node holds it), or, if it finds another node
//! holding the stream (the sender went by an owner it remembered, or looked before a
//! hand-over), passes it on once more marked `streamgate-last-hop`. Past that, a
//! request goes on only from a node that has just handed the stream over, each such
//! hop following a newer lease, so none travels in circles.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{FromRequestParts, OriginalUri, Request, State};
use axum::http::{header, HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use streamgate_core::access::Operation;
use streamgate_core::{Arrival, Engine, Route};

use super::error::ApiError;
use super::extract::{stream_config_header, Authenticated, Basin, StreamPath};

/// Marks a request one node passed to another; its value is the sender's epoch.
pub const FORWARDED_BY: HeaderName = HeaderName::from_static("streamgate-forwarded-by");

/// Marks a request that must not be passed on again by its receiver's routing: its
/// second hop, or a call a node makes for a client after looking the owner up itself.
pub const LAST_HOP: HeaderName = HeaderName::from_static("streamgate-last-hop");

/// On the answer to a request on a stream: the advertised URL of the node that
/// sequences the stream and served it (for operators, and the benchmarks).
pub const SERVED_BY: HeaderName = HeaderName::from_static("streamgate-served-by");

/// Headers that belong to one connection, not to the request: never passed on. The
/// length and encoding go too: the body was decompressed on the way in, and is streamed.
const NOT_PASSED_ON: [HeaderName; 9] = [
    header::CONNECTION,
    header::HOST,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
    header::CONTENT_LENGTH,
    header::CONTENT_ENCODING,
];

/// The HTTP/2 client for the other nodes, over TLS for those whose advertised URL is
/// `https://`: one connection per node carries every call to it, streaming both ways.
/// Calls carry this node's epoch in `FORWARDED_BY`.
#[derive(Clone)]
pub struct PeerClient {
    client: Client<HttpsConnector<HttpConnector>, Body>,
    pub epoch: HeaderValue,
    /// This node's advertised URL, for `SERVED_BY`.
    advertise_url: HeaderValue,
}

impl PeerClient {
    pub fn new(engine: &Engine, tls: rustls::ClientConfig) -> PeerClient {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        connector.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http2()
            .wrap_connector(connector);
        // A node that stops answering (paused, partitioned) is noticed by its missed
        // pings within a lease: the calls to it fail (retryably) then, instead of
        // hanging while another node takes its streams over.
        let lease = engine.node().lease;
        let client = Client::builder(TokioExecutor::new())
            .timer(hyper_util::rt::TokioTimer::new())
            .http2_only(true)
            .http2_keep_alive_interval(Some((lease / 4).max(Duration::from_millis(250))))
            .http2_keep_alive_timeout(lease)
            .http2_keep_alive_while_idle(true)
            .http2_initial_stream_window_size(8 * 1024 * 1024)
            .http2_initial_connection_window_size(64 * 1024 * 1024)
            .build(connector);
        PeerClient {
            client,
            epoch: HeaderValue::from(engine.epoch()),
            advertise_url: HeaderValue::from_str(&engine.node().advertise_url)
                .unwrap_or(HeaderValue::from_static("unknown")),
        }
    }

    pub async fn request(
        &self,
        request: axum::http::Request<Body>,
    ) -> Result<axum::http::Response<hyper::body::Incoming>, String> {
        if !matches!(request.uri().scheme_str(), Some("http" | "https")) {
            return Err(format!(
                "`{}` is not an http:// or https:// URL this node can reach peers at",
                request.uri()
            ));
        }
        self.client.request(request).await.map_err(|e| {
            // The cause (a certificate not trusted, say) is what an operator needs.
            let mut text = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                text = format!("{text}: {cause}");
                source = cause.source();
            }
            // rustls' words for a certificate it does not trust.
            if text.contains("invalid peer certificate") {
                text.push_str(
                    "; start this node with --peer-ca naming the CA that issued its peers' \
                     certificates",
                );
            }
            text
        })
    }
}

/// Passes whole requests on to the nodes that sequence their streams.
#[derive(Clone)]
pub struct Forwarder {
    client: PeerClient,
}

impl Forwarder {
    pub fn new(client: PeerClient) -> Forwarder {
        Forwarder { client }
    }

    /// Passes a request that arrived as `arrival` to the node at `node_url`, and
    /// streams its answer back; `Err` holds the answer when that node did not take it.
    async fn forward(
        &self,
        node_url: &str,
        arrival: Arrival,
        request: Request,
    ) -> Result<Response, Response> {
        let (mut parts, body) = request.into_parts();
        let path = parts
            .extensions
            .get::<OriginalUri>()
            .map(|original| original.0.clone())
            .unwrap_or_else(|| parts.uri.clone());
        let path = path.path_and_query().map_or("/", |p| p.as_str());
        let target = format!("{}{path}", node_url.trim_end_matches('/'));
        let Ok(uri) = target.parse::<axum::http::Uri>() else {
            return Err(unreachable_owner(
                node_url,
                "its advertised URL is not a URL",
            ));
        };
        for name in NOT_PASSED_ON {
            parts.headers.remove(name);
        }
        parts
            .headers
            .insert(FORWARDED_BY, self.client.epoch.clone());
        // Set by this node alone: one a client sent is not passed on.
        parts.headers.remove(LAST_HOP);
        if arrival != Arrival::Client {
            parts
                .headers
                .insert(LAST_HOP, HeaderValue::from_static("1"));
        }
        let connection = parts
            .extensions
            .get::<streamgate_core::Caller>()
            .and_then(|caller| caller.connection());
        streamgate_http::pass_on_connection(&mut parts.headers, connection);
        let mut outgoing = axum::http::Request::new(body);
        *outgoing.method_mut() = parts.method;
        *outgoing.uri_mut() = uri;
        *outgoing.headers_mut() = parts.headers;
        match self.client.request(outgoing).await {
            Ok(answer) => {
                let (mut parts, body) = answer.into_parts();
                for name in [header::CONNECTION, header::TRANSFER_ENCODING] {
                    parts.headers.remove(name);
                }
                Ok(Response::from_parts(parts, Body::new(body)))
            }
            Err(err) => Err(unreachable_owner(node_url, &err)),
        }
    }
}

fn unreachable_owner(node_url: &str, why: &str) -> Response {
    let mut response = ApiError::from(streamgate_core::Error::Unavailable(format!(
        "the node that sequences this stream ({node_url}) did not take the request ({why}); \
         retry shortly (if that node is gone, another takes the stream over)"
    )))
    .into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// Middleware of the record routes: serves the request here, or forwards it to the
/// node that sequences the stream. Whatever would make the request fail is left to the
/// handler, except a failed authentication, answered here so it is counted once.
pub async fn route_records(
    State(engine): State<Engine>,
    axum::Extension(forwarder): axum::Extension<Forwarder>,
    request: Request,
    next: Next,
) -> Response {
    let (mut parts, body) = request.into_parts();
    let caller = match Authenticated::from_request_parts(&mut parts, &engine).await {
        Ok(Authenticated(caller)) => caller,
        Err(err) => return err.into_response(),
    };
    let arrival = match (
        parts.headers.contains_key(FORWARDED_BY),
        parts.headers.contains_key(LAST_HOP),
    ) {
        (false, _) => Arrival::Client,
        (true, false) => Arrival::Forwarded,
        (true, true) => Arrival::LastHop,
    };
    let op = match (&parts.method, parts.uri.path().ends_with("/tail")) {
        (&Method::POST, _) => Operation::Append,
        (_, true) => Operation::CheckTail,
        _ => Operation::Read,
    };
    let (route, stream) = match (
        Basin::from_request_parts(&mut parts, &engine).await,
        StreamPath::from_request_parts(&mut parts, &engine).await,
        stream_config_header(&parts.headers),
    ) {
        (Ok(Basin(basin)), Ok(StreamPath(stream)), Ok(create)) => (
            caller
                .route_stream(op, &basin, &stream, create.as_ref(), arrival)
                .await
                .ok(),
            Some((basin, stream)),
        ),
        _ => (None, None),
    };
    parts.extensions.insert(match arrival {
        Arrival::Client => caller,
        Arrival::Forwarded | Arrival::LastHop => caller.forwarded(),
    });
    let request = Request::from_parts(parts, body);
    match route {
        Some(Route::Node(url)) => {
            let answer = forwarder.forward(&url, arrival, request).await;
            // Not reached, or reached but unavailable (leaving, fenced, the stream
            // changing owner): the next request looks the owner up again.
            let refused = answer
                .as_ref()
                .map_or(true, |a| a.status() == StatusCode::SERVICE_UNAVAILABLE);
            if let (true, Some((basin, stream))) = (refused, stream) {
                engine.owner_unavailable(&basin, &stream);
            }
            answer.unwrap_or_else(|refusal| refusal)
        }
        Some(Route::Here) => {
            let mut response = next.run(request).await;
            response
                .headers_mut()
                .insert(SERVED_BY, forwarder.client.advertise_url.clone());
            response
        }
        None => next.run(request).await,
    }
}
