//! The engine's typed errors. Each error has a [`ErrorKind`], which is all a front end
//! needs to choose its protocol's answer (one table per protocol maps kinds to an HTTP
//! status, a RESP error prefix, an OTLP status), and a `code()`, the documented S2 error
//! code shared by every front end. Failures of the stores keep their cause.

use std::fmt;
use std::sync::Arc;

use crate::names::StreamName;
use crate::record::StreamPosition;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a failure means for the client, whatever the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request breaks a documented rule; sent again unchanged it fails again.
    Invalid,
    /// A basin, stream or access token that does not exist.
    NotFound,
    /// The request clashes with the current state (the name is taken, or being deleted).
    Conflict,
    /// An append condition (`match_seq_num`, `fencing_token`) did not hold.
    ConditionFailed,
    /// A read start beyond the tail.
    RangeNotSatisfiable,
    /// The encryption key given does not open the stream's records (a wrong key).
    DecryptionFailed,
    /// No valid credential.
    Unauthenticated,
    /// A valid credential whose scope does not cover the operation.
    PermissionDenied,
    /// Too many requests; retry after a pause.
    RateLimited,
    /// The server cannot serve the request now (draining, overloaded, the store is away);
    /// nothing was done, and a retry later should succeed.
    Unavailable,
    /// The durable store failed; the request may or may not have taken effect, and may be
    /// retried.
    StorageFailed,
    NotImplemented,
    /// A bug or an unexpected state in the server.
    Internal,
}

impl ErrorKind {
    /// Whether a client may retry the same request and expect it to succeed.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorKind::RateLimited | ErrorKind::Unavailable | ErrorKind::StorageFailed
        )
    }
}

/// What an error is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resource {
    Basin(String),
    Stream(StreamName),
    AccessToken(String),
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Resource::Basin(name) => write!(f, "basin `{name}`"),
            Resource::Stream(name) => write!(f, "stream `{name}`"),
            Resource::AccessToken(id) => write!(f, "access token `{id}`"),
        }
    }
}

/// A failure with what was being done and, where there is one, its cause (its
/// `source()`, so the chain of causes stays inspectable, not only their text).
#[derive(Debug, Clone)]
pub struct Failure {
    what: String,
    cause: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl std::error::Error for Failure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause
            .as_deref()
            .map(|cause| cause as &(dyn std::error::Error + 'static))
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.cause {
            Some(cause) => write!(f, "{}: {cause}", self.what),
            None => f.write_str(&self.what),
        }
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// A request that breaks a documented rule (name, limit, config value, ...).
    #[error("{0}")]
    Invalid(String),
    #[error("{0} does not exist")]
    NotFound(Resource),
    #[error("{0} already exists")]
    AlreadyExists(Resource),
    #[error("{0} is being deleted; its name can be reused once deletion completes")]
    DeletionPending(Resource),
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
    Storage(#[source] Failure),
    /// The server cannot take the request right now (storage away, budget full, ...).
    #[error("{0}")]
    Unavailable(String),
    #[error("the server is shutting down; retry against a running server")]
    ServerDraining,
    /// Another node took streams of this one while it could not renew its lease: this
    /// node must stop serving them (it stops altogether).
    #[error("this node's stream leases were taken over by other nodes after it failed to renew them in time; it stops serving and must be restarted")]
    LeaseLost,
    /// The stream is sequenced by another node, which serves it (a front end that can,
    /// forwards the request there).
    #[error(
        "the stream is served by the node at {advertise_url}; send the request there, or retry"
    )]
    OwnedElsewhere { advertise_url: String },
    /// This node handed the stream to another one (shutting down, or evening out the
    /// shares of the nodes) while the request was under way here; nothing of the
    /// request was done. Readers follow the stream instead of failing with it.
    #[error("this node handed the stream to another node; retry, and the retry reaches the node that serves it now")]
    StreamMoved,
    #[error("{0} is not implemented by this server yet")]
    NotImplemented(String),
    /// A record of an encrypted stream could not be opened with the key the request
    /// gave: a wrong key (or records written with another one).
    #[error("record decryption failed: the `s2-encryption-key` given is not the key these records were written with")]
    DecryptionFailed,
    /// No access token, an unknown or revoked one, or an expired one.
    #[error("{0}")]
    Unauthenticated(String),
    /// A valid token whose scope does not cover the operation.
    #[error("{0}")]
    PermissionDenied(String),
    /// The client sent too much too fast (failed authentications): it may retry after
    /// `retry_after`.
    #[error("{message}")]
    RateLimited {
        message: String,
        retry_after: std::time::Duration,
    },
    /// Something in the server itself went wrong (a task that died, ...).
    #[error("internal error: {0}")]
    Internal(#[source] Failure),
}

impl Error {
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Invalid(_) => ErrorKind::Invalid,
            Error::NotFound(_) => ErrorKind::NotFound,
            Error::AlreadyExists(_) | Error::DeletionPending(_) => ErrorKind::Conflict,
            Error::SeqNumMismatch(_) | Error::FencingTokenMismatch(_) => ErrorKind::ConditionFailed,
            Error::RangeNotSatisfiable { .. } => ErrorKind::RangeNotSatisfiable,
            Error::Storage(_) => ErrorKind::StorageFailed,
            Error::Unavailable(_)
            | Error::ServerDraining
            | Error::LeaseLost
            | Error::OwnedElsewhere { .. }
            | Error::StreamMoved => ErrorKind::Unavailable,
            Error::NotImplemented(_) => ErrorKind::NotImplemented,
            Error::DecryptionFailed => ErrorKind::DecryptionFailed,
            Error::Unauthenticated(_) => ErrorKind::Unauthenticated,
            Error::PermissionDenied(_) => ErrorKind::PermissionDenied,
            Error::RateLimited { .. } => ErrorKind::RateLimited,
            Error::Internal(_) => ErrorKind::Internal,
        }
    }

    /// The documented error code for this error.
    pub fn code(&self) -> &'static str {
        match self {
            Error::Invalid(_) => "invalid",
            Error::NotFound(Resource::Basin(_)) => "basin_not_found",
            Error::NotFound(Resource::Stream(_)) => "stream_not_found",
            Error::NotFound(Resource::AccessToken(_)) => "access_token_not_found",
            Error::AlreadyExists(_) => "resource_already_exists",
            Error::DeletionPending(Resource::Basin(_)) => "basin_deletion_pending",
            Error::DeletionPending(_) => "stream_deletion_pending",
            Error::SeqNumMismatch(_) | Error::FencingTokenMismatch(_) => "append_condition_failed",
            Error::RangeNotSatisfiable { .. } => "range_not_satisfiable",
            Error::Storage(_) => "storage",
            Error::Unavailable(_)
            | Error::LeaseLost
            | Error::OwnedElsewhere { .. }
            | Error::StreamMoved => "unavailable",
            Error::ServerDraining => "server_draining",
            Error::NotImplemented(_) => "not_implemented",
            Error::DecryptionFailed => "decryption_failed",
            Error::Unauthenticated(_) => "authn",
            Error::PermissionDenied(_) => "permission_denied",
            Error::RateLimited { .. } => "rate_limited",
            Error::Internal(_) => "other",
        }
    }

    /// The same error about another resource (a stream named as the caller names it).
    pub(crate) fn map_resource(self, rename: impl FnOnce(Resource) -> Resource) -> Error {
        match self {
            Error::NotFound(r) => Error::NotFound(rename(r)),
            Error::AlreadyExists(r) => Error::AlreadyExists(rename(r)),
            Error::DeletionPending(r) => Error::DeletionPending(rename(r)),
            other => other,
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Error::Invalid(message.into())
    }

    /// A store failure found by the server itself (corrupt or inconsistent data).
    pub fn storage(what: impl Into<String>) -> Self {
        Error::Storage(Failure {
            what: what.into(),
            cause: None,
        })
    }

    /// A store failure while doing `what`, caused by `cause`.
    pub fn storage_caused(
        what: impl Into<String>,
        cause: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Storage(Failure {
            what: what.into(),
            cause: Some(Arc::new(cause)),
        })
    }

    /// An internal failure while doing `what`, caused by `cause`.
    pub fn internal(
        what: impl Into<String>,
        cause: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Internal(Failure {
            what: what.into(),
            cause: Some(Arc::new(cause)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn a_store_failure_keeps_its_cause_and_is_retryable() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "disk says no");
        let err = Error::storage_caused("writing `wal/1`", io);
        assert_eq!(err.kind(), ErrorKind::StorageFailed);
        assert!(err.kind().is_retryable());
        assert_eq!(err.code(), "storage");
        assert_eq!(
            err.to_string(),
            "storage failure: writing `wal/1`: disk says no"
        );
        let cause = err.source().and_then(|failure| failure.source());
        let io = cause.and_then(|c| c.downcast_ref::<std::io::Error>());
        assert_eq!(
            io.map(std::io::Error::kind),
            Some(std::io::ErrorKind::PermissionDenied)
        );
    }

    #[test]
    fn resources_name_the_documented_codes() {
        let stream = || Resource::Stream(StreamName::new("s").unwrap());
        assert_eq!(Error::NotFound(stream()).code(), "stream_not_found");
        assert_eq!(
            Error::DeletionPending(Resource::Basin("b".into())).code(),
            "basin_deletion_pending"
        );
        assert_eq!(
            Error::AlreadyExists(stream()).to_string(),
            "stream `s` already exists"
        );
        assert!(!Error::NotFound(stream()).kind().is_retryable());
    }
}
