//! Errors as the REST API reports them: a status and a JSON body, which is the standard
//! `{code, message}` except for the structured 412 and 416 bodies.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use streamgate_core::Error;

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

impl From<Error> for ApiError {
    fn from(err: Error) -> Self {
        let status = match &err {
            Error::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Error::BasinNotFound(_) | Error::StreamNotFound(_) | Error::AccessTokenNotFound(_) => {
                StatusCode::NOT_FOUND
            }
            Error::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Error::PermissionDenied(_) => StatusCode::FORBIDDEN,
            Error::AlreadyExists(_)
            | Error::BasinDeletionPending(_)
            | Error::StreamDeletionPending(_) => StatusCode::CONFLICT,
            Error::SeqNumMismatch(next) => {
                return Self {
                    status: StatusCode::PRECONDITION_FAILED,
                    body: json!({ "seq_num_mismatch": next }),
                    retry_after: None,
                }
            }
            Error::FencingTokenMismatch(token) => {
                return Self {
                    status: StatusCode::PRECONDITION_FAILED,
                    body: json!({ "fencing_token_mismatch": token }),
                    retry_after: None,
                }
            }
            Error::RangeNotSatisfiable { tail } => {
                return Self {
                    status: StatusCode::RANGE_NOT_SATISFIABLE,
                    body: json!({ "tail": { "seq_num": tail.seq_num, "timestamp": tail.timestamp } }),
                    retry_after: None,
                }
            }
            Error::Storage(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Error::Unavailable(_) | Error::ServerDraining => StatusCode::SERVICE_UNAVAILABLE,
            Error::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
            Error::RateLimited { retry_after, .. } => {
                return Self {
                    retry_after: Some(retry_after.as_secs_f64().ceil().max(1.0) as u64),
                    ..Self::standard(StatusCode::TOO_MANY_REQUESTS, err.code(), &err)
                }
            }
        };
        if status.is_server_error() && !matches!(err, Error::ServerDraining) {
            tracing::warn!(code = err.code(), error = %err, "request failed");
        }
        let retry_after = (status == StatusCode::SERVICE_UNAVAILABLE).then_some(1);
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
