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
}

#[async_trait]
pub trait RemoteStreams: Send + Sync + 'static {
    /// Appends a batch at the owner; returns once it is durable there.
    async fn append(&self, at: &RemoteStream, input: AppendInput) -> Result<AppendAck>;
    /// One batch of a read at the owner (a start beyond the tail, without `clamp`, is
    /// `RangeNotSatisfiable` with the tail).
    async fn read(&self, at: &RemoteStream, request: ReadRequest) -> Result<ReadBatch>;
    async fn check_tail(&self, at: &RemoteStream) -> Result<StreamPosition>;
}
