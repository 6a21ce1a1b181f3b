//! The engine's typed errors. Front ends map each variant onto their protocol; the
//! `code()` strings are the documented S2 error codes, shared by every front end.

use crate::record::StreamPosition;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// A request that breaks a documented rule (name, limit, config value, ...).
    #[error("{0}")]
    Invalid(String),
    #[error("basin `{0}` does not exist")]
    BasinNotFound(String),
    #[error("stream `{0}` does not exist")]
    StreamNotFound(String),
    #[error("{0} already exists")]
    AlreadyExists(String),
    #[error("basin `{0}` is being deleted; its name can be reused once deletion completes")]
    BasinDeletionPending(String),
    #[error("stream `{0}` is being deleted; its name can be reused once deletion completes")]
    StreamDeletionPending(String),
    /// `match_seq_num` did not match: carries the sequence number the next record would get.
    #[error("append condition failed: the next sequence number is {0}")]
    SeqNumMismatch(u64),
    /// `fencing_token` did not match: carries the stream's current token.
    #[error("append condition failed: the current fencing token is `{0}`")]
    FencingTokenMismatch(String),
    /// A read whose start lies beyond the tail (see the docs' 416 table).
    #[error("the read start is beyond the tail of the stream")]
    RangeNotSatisfiable { tail: StreamPosition },
    /// The durable store failed; the request may or may not have taken effect.
    #[error("storage failure: {0}")]
    Storage(String),
    /// The server cannot take the request right now (draining, storage poisoned, ...).
    #[error("{0}")]
    Unavailable(String),
    #[error("the server is shutting down; retry against a running server")]
    ServerDraining,
    #[error("{0} is not implemented by this server yet")]
    NotImplemented(String),
    /// No access token, an unknown or revoked one, or an expired one.
    #[error("{0}")]
    Unauthenticated(String),
    /// A valid token whose scope does not cover the operation.
    #[error("{0}")]
    PermissionDenied(String),
    #[error("access token `{0}` does not exist")]
    AccessTokenNotFound(String),
    /// The client sent too much too fast (failed authentications): it may retry after
    /// `retry_after`.
    #[error("{message}")]
    RateLimited {
        message: String,
        retry_after: std::time::Duration,
    },
}

impl Error {
    /// The documented error code for this error.
    pub fn code(&self) -> &'static str {
        match self {
            Error::Invalid(_) => "invalid",
            Error::BasinNotFound(_) => "basin_not_found",
            Error::StreamNotFound(_) => "stream_not_found",
            Error::AlreadyExists(_) => "resource_already_exists",
            Error::BasinDeletionPending(_) => "basin_deletion_pending",
            Error::StreamDeletionPending(_) => "stream_deletion_pending",
            Error::SeqNumMismatch(_) | Error::FencingTokenMismatch(_) => "append_condition_failed",
            Error::RangeNotSatisfiable { .. } => "range_not_satisfiable",
            Error::Storage(_) => "storage",
            Error::Unavailable(_) => "unavailable",
            Error::ServerDraining => "server_draining",
            Error::NotImplemented(_) => "not_implemented",
            Error::Unauthenticated(_) => "authn",
            Error::PermissionDenied(_) => "permission_denied",
            Error::AccessTokenNotFound(_) => "access_token_not_found",
            Error::RateLimited { .. } => "rate_limited",
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Error::Invalid(message.into())
    }

    pub fn storage(err: impl std::fmt::Display) -> Self {
        Error::Storage(err.to_string())
    }
}
