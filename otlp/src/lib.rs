//! The OTLP/HTTP front end: OpenTelemetry exporters and the Collector send traces,
//! metrics and logs to `/otlp/v1/{traces,metrics,logs}`; each resource group lands in
//! the stream its `s2.stream` resource attribute names.
//!
//! Record format (version 1): one record per resource group per request (more only when
//! a group exceeds the 1 MiB record limit and is split by scope, then by item). Its body
//! is an `Export{Trace,Metrics,Logs}ServiceRequest` holding that one group, in the
//! encoding the request arrived in; its headers are `s2-otlp.signal` (`traces`,
//! `metrics` or `logs`) and `content-type` (`application/x-protobuf` or
//! `application/json`). Any OTLP decoder reads a body back as an export request.

mod export;
#[cfg(feature = "fuzz")]
pub mod fuzz;
mod request;
mod signal;
mod split;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use prost::Message;
use streamgate_core::{Engine, ErrorKind};

pub use export::{CONTENT_TYPE_HEADER, SIGNAL_HEADER};
pub use request::Encoding;
pub use signal::{Signal, STREAM_ATTRIBUTE};

use export::Outcome;

/// Largest request body accepted, after decompression. Exporters are advised to send
/// at most 512 KiB; a request may still carry several streams' worth.
pub const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;

/// The routes, to be mounted under `/otlp`.
pub fn router(engine: Engine) -> Router {
    let route = |signal: Signal| {
        post(move |State(engine): State<Engine>, request: Request| export(engine, signal, request))
    };
    Router::new()
        .route("/v1/traces", route(Signal::Traces))
        .route("/v1/metrics", route(Signal::Metrics))
        .route("/v1/logs", route(Signal::Logs))
        .with_state(engine)
}

async fn export(engine: Engine, signal: Signal, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let Some(encoding) = Encoding::from_content_type(content_type) else {
        return Failure {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            code: RpcCode::InvalidArgument,
            message: format!("Content-Type `{content_type}` is not an OTLP encoding: send application/x-protobuf or application/json"),
        }
        .respond(Encoding::Json);
    };
    let response = match accept(&engine, signal, encoding, &parts, body).await {
        Ok(response) => response,
        Err(failure) => failure.respond(encoding),
    };
    streamgate_core::telemetry::otlp_export(signal.name(), response.status().is_success());
    response
}

/// Checks, parses and stores one export; a `Failure` is answered in the request's
/// encoding.
async fn accept(
    engine: &Engine,
    signal: Signal,
    encoding: Encoding,
    parts: &axum::http::request::Parts,
    body: axum::body::Body,
) -> Result<Response, Failure> {
    let basin = streamgate_http::basin(parts).map_err(Failure::bad_request)?;
    let caller = streamgate_http::authenticate(engine, parts)
        .await
        .map_err(Failure::from)?;
    let body = streamgate_http::read_body(Body::new(body), MAX_REQUEST_BYTES)
        .await
        .map_err(|err| {
            let status = match err {
                streamgate_http::BodyError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
                streamgate_http::BodyError::TimedOut(_) => StatusCode::REQUEST_TIMEOUT,
                streamgate_http::BodyError::Unreadable(_) => StatusCode::BAD_REQUEST,
            };
            Failure {
                status,
                code: RpcCode::InvalidArgument,
                message: err.to_string(),
            }
        })?;
    let headers = export::record_headers(signal, encoding);
    let limit = export::record_body_limit(&headers);
    let groups = request::parse(signal, encoding, &body, limit).map_err(Failure::bad_request)?;
    let outcome = export::store(&caller, &basin, headers, groups)
        .await
        .map_err(Failure::from)?;
    if outcome.accepted_groups == 0 && outcome.rejected_groups > 0 {
        let reasons = outcome.messages.join("; ");
        // Refused only for the token's scope: 403; otherwise the data itself: 400.
        return Err(if outcome.denied_groups == outcome.rejected_groups {
            Failure {
                status: StatusCode::FORBIDDEN,
                code: RpcCode::PermissionDenied,
                message: reasons,
            }
        } else {
            Failure::bad_request(format!("nothing in the request could be stored: {reasons}"))
        });
    }
    Ok(success(signal, encoding, &outcome))
}

/// Why an export was refused as a whole: the HTTP status, and the `google.rpc.Status`
/// the body carries.
struct Failure {
    status: StatusCode,
    code: RpcCode,
    message: String,
}

impl Failure {
    fn bad_request(message: String) -> Failure {
        Failure {
            status: StatusCode::BAD_REQUEST,
            code: RpcCode::InvalidArgument,
            message,
        }
    }

    fn respond(self, encoding: Encoding) -> Response {
        let body = match encoding {
            Encoding::Protobuf => RpcStatus {
                code: self.code as i32,
                message: self.message,
            }
            .encode_to_vec(),
            Encoding::Json => serde_json::to_vec(&serde_json::json!({
                "code": self.code as i32,
                "message": self.message,
            }))
            .expect("a JSON value always serializes"),
        };
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, encoding.media_type())],
            body,
        )
            .into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE
            || self.status == StatusCode::TOO_MANY_REQUESTS
        {
            // Exporters retry 503s, after this long.
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        response
    }
}

/// The OTLP answer to each kind of engine failure. Exporters retry 429, 502, 503 and
/// 504 (after `Retry-After`) and drop data on any other status, so every retryable kind
/// is a 503 or a 429 here.
fn status_of(kind: ErrorKind) -> (StatusCode, RpcCode) {
    match kind {
        ErrorKind::Invalid | ErrorKind::DecryptionFailed => {
            (StatusCode::BAD_REQUEST, RpcCode::InvalidArgument)
        }
        ErrorKind::NotFound => (StatusCode::NOT_FOUND, RpcCode::NotFound),
        ErrorKind::Conflict | ErrorKind::ConditionFailed => {
            (StatusCode::CONFLICT, RpcCode::FailedPrecondition)
        }
        ErrorKind::RangeNotSatisfiable => (StatusCode::RANGE_NOT_SATISFIABLE, RpcCode::OutOfRange),
        ErrorKind::Unauthenticated => (StatusCode::UNAUTHORIZED, RpcCode::Unauthenticated),
        ErrorKind::PermissionDenied => (StatusCode::FORBIDDEN, RpcCode::PermissionDenied),
        ErrorKind::RateLimited => (StatusCode::TOO_MANY_REQUESTS, RpcCode::ResourceExhausted),
        ErrorKind::Unavailable | ErrorKind::StorageFailed => {
            (StatusCode::SERVICE_UNAVAILABLE, RpcCode::Unavailable)
        }
        ErrorKind::NotImplemented => (StatusCode::NOT_IMPLEMENTED, RpcCode::Unimplemented),
        ErrorKind::Internal => (StatusCode::INTERNAL_SERVER_ERROR, RpcCode::Internal),
    }
}

impl From<streamgate_core::Error> for Failure {
    fn from(err: streamgate_core::Error) -> Failure {
        let (status, code) = status_of(err.kind());
        if err.kind().is_retryable() {
            tracing::debug!(error = %err, "OTLP export turned away for now");
        }
        Failure {
            status,
            code,
            message: err.to_string(),
        }
    }
}

/// `Export*ServiceResponse`: field 1 is `partial_success`, whose field 1 is the
/// rejected count and field 2 the message, in all three signals.
#[derive(Clone, PartialEq, Message)]
struct ExportResponse {
    #[prost(message, optional, tag = "1")]
    partial_success: Option<PartialSuccess>,
}

#[derive(Clone, PartialEq, Message)]
struct PartialSuccess {
    #[prost(int64, tag = "1")]
    rejected: i64,
    #[prost(string, tag = "2")]
    error_message: String,
}

fn success(signal: Signal, encoding: Encoding, outcome: &Outcome) -> Response {
    let partial = (outcome.rejected_groups > 0).then(|| PartialSuccess {
        rejected: outcome.rejected_items as i64,
        error_message: outcome.messages.join("; "),
    });
    let body = match encoding {
        Encoding::Protobuf => ExportResponse {
            partial_success: partial,
        }
        .encode_to_vec(),
        Encoding::Json => {
            let mut response = serde_json::Map::new();
            if let Some(partial) = partial {
                // The OTLP JSON mapping writes 64-bit integers as strings.
                response.insert(
                    "partialSuccess".into(),
                    serde_json::json!({
                        signal.rejected_key(): partial.rejected.to_string(),
                        "errorMessage": partial.error_message,
                    }),
                );
            }
            serde_json::to_vec(&response).expect("a JSON value always serializes")
        }
    };
    ([(header::CONTENT_TYPE, encoding.media_type())], body).into_response()
}

/// The `google.rpc.Status` codes used here.
#[derive(Clone, Copy)]
enum RpcCode {
    InvalidArgument = 3,
    NotFound = 5,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

/// `google.rpc.Status`, the body of OTLP/HTTP failures.
#[derive(Clone, PartialEq, Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}
