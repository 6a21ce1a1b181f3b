//! Errors as the REST API reports them: a status and a JSON body, which is the standard
//! `{code, message}` except for the structured 412 and 416 bodies.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use streamgate_core::{Error, ErrorKind};

use super::failure_log;

#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    body: Value,
    /// Seconds for a `Retry-After` header.
    retry_after: Option<u64>,
}

impl ApiError {
    fn standard(status: StatusCode, code: &str, message: impl std::fmt::Display) -> Self {
        Self {
            status,
            body: json!({ "code": code, "message": message.to_string() }),
            retry_after: None,
        }
    }

    pub fn bad_header(message: impl std::fmt::Display) -> Self {
        Self::standard(StatusCode::BAD_REQUEST, "bad_header", message)
    }

    pub fn bad_path(message: impl std::fmt::Display) -> Self {
        Self::standard(StatusCode::BAD_REQUEST, "bad_path", message)
    }

    pub fn bad_query(message: impl std::fmt::Display) -> Self {
        Self::standard(StatusCode::BAD_REQUEST, "bad_query", message)
    }

    pub fn bad_json(message: impl std::fmt::Display) -> Self {
        Self::standard(StatusCode::BAD_REQUEST, "bad_json", message)
    }

    pub fn bad_proto(message: impl std::fmt::Display) -> Self {
        Self::standard(StatusCode::BAD_REQUEST, "bad_proto", message)
    }

    pub fn invalid(message: impl std::fmt::Display) -> Self {
        Self::standard(StatusCode::UNPROCESSABLE_ENTITY, "invalid", message)
    }

    pub fn bad_frame(message: impl std::fmt::Display) -> Self {
        Self::standard(StatusCode::BAD_REQUEST, "bad_frame", message)
    }

    pub fn internal(message: impl std::fmt::Display) -> Self {
        Self::standard(StatusCode::INTERNAL_SERVER_ERROR, "other", message)
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    pub fn body(&self) -> &Value {
        &self.body
    }

    pub fn not_implemented(what: &str) -> Self {
        Self::standard(
            StatusCode::NOT_IMPLEMENTED,
            "not_implemented",
            format!("{what} is not implemented by this streamgate version yet"),
        )
    }
}

/// The REST (and S2S terminal) answer to each kind of engine failure.
fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::Invalid => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorKind::DecryptionFailed => StatusCode::BAD_REQUEST,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Conflict => StatusCode::CONFLICT,
        ErrorKind::ConditionFailed => StatusCode::PRECONDITION_FAILED,
        ErrorKind::RangeNotSatisfiable => StatusCode::RANGE_NOT_SATISFIABLE,
        ErrorKind::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
        ErrorKind::RateLimited => StatusCode::TOO_MANY_REQUESTS,
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::StorageFailed | ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorKind::NotImplemented => StatusCode::NOT_IMPLEMENTED,
    }
}

impl From<Error> for ApiError {
    fn from(err: Error) -> Self {
        let status = status_of(err.kind());
        // The documented structured bodies; every other error is `{code, message}`.
        let structured = match &err {
            Error::SeqNumMismatch(next) => Some(json!({ "seq_num_mismatch": next })),
            Error::FencingTokenMismatch(token) => Some(json!({ "fencing_token_mismatch": token })),
            Error::RangeNotSatisfiable { tail } => {
                Some(json!({ "tail": { "seq_num": tail.seq_num, "timestamp": tail.timestamp } }))
            }
            _ => None,
        };
        if let Some(body) = structured {
            return Self {
                status,
                body,
                retry_after: None,
            };
        }
        if status.is_server_error() && !matches!(err, Error::ServerDraining) {
            failure_log::log_failure(err.code(), &err);
        }
        let retry_after = match &err {
            Error::RateLimited { retry_after, .. } => {
                Some(retry_after.as_secs_f64().ceil().max(1.0) as u64)
            }
            _ if status == StatusCode::SERVICE_UNAVAILABLE => Some(1),
            _ => None,
        };
        Self {
            retry_after,
            ..Self::standard(status, err.code(), &err)
        }
    }
}

impl From<streamgate_http::BodyError> for ApiError {
    fn from(err: streamgate_http::BodyError) -> Self {
        match err {
            streamgate_http::BodyError::TimedOut(_) => {
                Self::standard(StatusCode::REQUEST_TIMEOUT, "request_timeout", err)
            }
            _ => Self::bad_json(err),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body)).into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, seconds.into());
        }
        response
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
