//! The v1 protobuf messages (package `s2.v1`), written from the public spec's field
//! numbers, and their conversions to and from the engine's types.

use bytes::Bytes;
use prost::Message;
use streamgate_core::read::ReadBatch as CoreReadBatch;
use streamgate_core::record::{self, AppendAck as CoreAppendAck};
use streamgate_http::protobuf;

use super::error::ApiError;

#[derive(Clone, PartialEq, prost::Message)]
pub struct StreamPosition {
    #[prost(uint64, tag = "1")]
    pub seq_num: u64,
    #[prost(uint64, tag = "2")]
    pub timestamp: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Header {
    #[prost(bytes = "bytes", tag = "1")]
    pub name: Bytes,
    #[prost(bytes = "bytes", tag = "2")]
    pub value: Bytes,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AppendRecord {
    #[prost(uint64, optional, tag = "1")]
    pub timestamp: Option<u64>,
    #[prost(message, repeated, tag = "2")]
    pub headers: Vec<Header>,
    #[prost(bytes = "bytes", tag = "3")]
    pub body: Bytes,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AppendInput {
    #[prost(message, repeated, tag = "1")]
    pub records: Vec<AppendRecord>,
    #[prost(uint64, optional, tag = "2")]
    pub match_seq_num: Option<u64>,
    #[prost(string, optional, tag = "3")]
    pub fencing_token: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AppendAck {
    #[prost(message, optional, tag = "1")]
    pub start: Option<StreamPosition>,
    #[prost(message, optional, tag = "2")]
    pub end: Option<StreamPosition>,
    #[prost(message, optional, tag = "3")]
    pub tail: Option<StreamPosition>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SequencedRecord {
    #[prost(uint64, tag = "1")]
    pub seq_num: u64,
    #[prost(uint64, tag = "2")]
    pub timestamp: u64,
    #[prost(message, repeated, tag = "3")]
    pub headers: Vec<Header>,
    #[prost(bytes = "bytes", tag = "4")]
    pub body: Bytes,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ReadBatch {
    #[prost(message, repeated, tag = "1")]
    pub records: Vec<SequencedRecord>,
    #[prost(message, optional, tag = "2")]
    pub tail: Option<StreamPosition>,
}

impl From<record::StreamPosition> for StreamPosition {
    fn from(p: record::StreamPosition) -> Self {
        Self {
            seq_num: p.seq_num,
            timestamp: p.timestamp,
        }
    }
}

fn core_headers(headers: Vec<Header>) -> Vec<record::Header> {
    headers
        .into_iter()
        .map(|h| record::Header {
            name: h.name,
            value: h.value,
        })
        .collect()
}

fn wire_headers(headers: Vec<record::Header>) -> Vec<Header> {
    headers
        .into_iter()
        .map(|h| Header {
            name: h.name,
            value: h.value,
        })
        .collect()
}

/// Decodes an `AppendInput` (a unary body or a session's message). What it holds is
/// counted on the wire first: a decoded record or header takes tens of times the bytes
/// of an empty one's encoding, so the counts are bounded before the decoder allocates.
pub fn decode_append_input(message: Bytes) -> Result<record::AppendInput, ApiError> {
    let malformed = |e: String| ApiError::bad_proto(format!("invalid AppendInput: {e}"));
    let (mut records, mut headers) = (0usize, 0usize);
    for field in protobuf::fields(&message) {
        let field = field.map_err(malformed)?;
        if field.number != 1 || !field.is_len {
            continue;
        }
        records += 1;
        if records > record::MAX_BATCH_RECORDS {
            break;
        }
        for field in protobuf::fields(&field.payload) {
            headers += usize::from(field.map_err(malformed)?.number == 2);
        }
        record::check_header_count(headers)?;
    }
    record::check_record_count(records)?;
    let input = AppendInput::decode(message).map_err(|e| malformed(e.to_string()))?;
    Ok(input.into())
}

impl From<AppendInput> for record::AppendInput {
    fn from(input: AppendInput) -> Self {
        Self {
            records: input
                .records
                .into_iter()
                .map(|r| record::AppendRecord {
                    timestamp: r.timestamp,
                    headers: core_headers(r.headers),
                    body: r.body,
                })
                .collect(),
            match_seq_num: input.match_seq_num,
            fencing_token: input.fencing_token,
        }
    }
}

impl From<CoreAppendAck> for AppendAck {
    fn from(ack: CoreAppendAck) -> Self {
        Self {
            start: Some(ack.start.into()),
            end: Some(ack.end.into()),
            tail: Some(ack.tail.into()),
        }
    }
}

impl From<CoreReadBatch> for ReadBatch {
    fn from(batch: CoreReadBatch) -> Self {
        Self {
            records: batch
                .records
                .into_iter()
                .map(|r| SequencedRecord {
                    seq_num: r.seq_num,
                    timestamp: r.timestamp,
                    headers: wire_headers(r.headers),
                    body: r.body,
                })
                .collect(),
            tail: batch.tail.map(Into::into),
        }
    }
}

// The other direction, for calls this node makes at the node that sequences a stream.

impl From<record::AppendInput> for AppendInput {
    fn from(input: record::AppendInput) -> Self {
        Self {
            records: input
                .records
                .into_iter()
                .map(|r| AppendRecord {
                    timestamp: r.timestamp,
                    headers: wire_headers(r.headers),
                    body: r.body,
                })
                .collect(),
            match_seq_num: input.match_seq_num,
            fencing_token: input.fencing_token,
        }
    }
}

impl From<StreamPosition> for record::StreamPosition {
    fn from(p: StreamPosition) -> Self {
        Self {
            seq_num: p.seq_num,
            timestamp: p.timestamp,
        }
    }
}

impl From<AppendAck> for CoreAppendAck {
    fn from(ack: AppendAck) -> Self {
        Self {
            start: ack.start.unwrap_or_default().into(),
            end: ack.end.unwrap_or_default().into(),
            tail: ack.tail.unwrap_or_default().into(),
        }
    }
}

impl From<ReadBatch> for CoreReadBatch {
    fn from(batch: ReadBatch) -> Self {
        Self {
            records: batch
                .records
                .into_iter()
                .map(|r| record::SequencedRecord {
                    seq_num: r.seq_num,
                    timestamp: r.timestamp,
                    headers: core_headers(r.headers),
                    body: r.body,
                })
                .collect(),
            tail: batch.tail.map(Into::into),
        }
    }
}
