//! Calls on streams another node sequences, for front ends that cannot pass a request on
//! whole the way HTTP does (RESP commands, OTLP exports that touch several streams): the
//! engine makes the call at the stream's owner with the caller's own credential, so the
//! owner checks it exactly as if the client had come to it. The gateway provides the
//! transport (the owner's S2 REST API).

use async_trait::async_trait;

use crate::error::Result;
use crate::names::{BasinName, StreamName};
use crate::read::{ReadBatch, ReadRequest};
use crate::record::{AppendAck, AppendInput, StreamPosition};

/// Who makes a call and where: the owner's advertised URL, the caller's bearer token,
/// and the stream as the caller names it.
#[derive(Debug, Clone)]
pub struct RemoteStream {
    pub node_url: String,
    pub bearer: String,
    pub basin: BasinName,
    pub stream: StreamName,
    /// The caller's key for an encrypted stream, sent along as `s2-encryption-key`.
    pub encryption_key: Option<crate::encryption::EncryptionKey>,
    /// The caller's client connection, so the owner counts usage by it.
    pub connection: Option<crate::usage::ConnectionId>,
}

#[async_trait]
pub trait RemoteStreams: Send + Sync + 'static {
    /// Appends a batch at the owner; returns once it is durable there.
    async fn append(&self, at: &RemoteStream, input: AppendInput) -> Result<AppendAck>;
    /// One batch of a read at the owner (a start beyond the tail, without `clamp`, is
    /// `RangeNotSatisfiable` with the tail).
    async fn read(&self, at: &RemoteStream, request: ReadRequest) -> Result<ReadBatch>;
    async fn check_tail(&self, at: &RemoteStream) -> Result<StreamPosition>;
    /// Runs a RESP command whole at the owner, because it works on state the owner keeps
    /// with the stream (consumer groups): `command` as the client sent it, the reply
    /// encoded as the client's protocol (`resp3`) wants it. `timeout` covers a blocking
    /// read's wait.
    async fn resp_command(
        &self,
        at: &RemoteStream,
        command: bytes::Bytes,
        resp3: bool,
        timeout: std::time::Duration,
    ) -> Result<bytes::Bytes>;
}
