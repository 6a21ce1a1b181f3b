//! The v1 JSON shapes of records, positions and resource infos. Record bytes (header
//! names and values, bodies) are text under `s2-format: raw` and base64 under `base64`.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use streamgate_core::read::ReadBatch;
use streamgate_core::record::{self, AppendAck, StreamPosition};
use streamgate_core::storage::{BasinRecord, StreamRecord};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::error::ApiError;

/// How record bytes are written in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Raw,
    Base64,
}

impl Format {
    pub fn from_headers(headers: &axum::http::HeaderMap) -> Result<Self, ApiError> {
        match headers.get("s2-format").map(|v| v.to_str().map(str::trim)) {
            None => Ok(Format::Raw),
            Some(Ok("raw" | "json")) => Ok(Format::Raw),
            Some(Ok("base64" | "json-binsafe")) => Ok(Format::Base64),
            Some(_) => Err(ApiError::bad_header(
                "`s2-format` must be `raw` or `base64`",
            )),
        }
    }

    fn decode(self, text: String) -> Result<Bytes, ApiError> {
        match self {
            Format::Raw => Ok(Bytes::from(text.into_bytes())),
            Format::Base64 => BASE64
                .decode(text.as_bytes())
                .map(Bytes::from)
                .map_err(|e| ApiError::invalid(format!("invalid base64 encoding: {e}"))),
        }
    }

    fn encode(self, bytes: &[u8]) -> String {
        match self {
            Format::Raw => String::from_utf8_lossy(bytes).into_owned(),
            Format::Base64 => BASE64.encode(bytes),
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct AppendInputJson {
    pub records: Vec<AppendRecordJson>,
    #[serde(default)]
    pub match_seq_num: Option<u64>,
    #[serde(default)]
    pub fencing_token: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct AppendRecordJson {
    #[serde(default)]
    pub timestamp: Option<u64>,
    #[serde(default)]
    pub headers: Vec<(String, String)>,
    #[serde(default)]
    pub body: String,
}

impl AppendInputJson {
    pub fn into_core(self, format: Format) -> Result<record::AppendInput, ApiError> {
        let mut records = Vec::with_capacity(self.records.len());
        for r in self.records {
            let mut headers = Vec::with_capacity(r.headers.len());
            for (name, value) in r.headers {
                headers.push(record::Header {
                    name: format.decode(name)?,
                    value: format.decode(value)?,
                });
            }
            records.push(record::AppendRecord {
                timestamp: r.timestamp,
                headers,
                body: format.decode(r.body)?,
            });
        }
        Ok(record::AppendInput {
            records,
            match_seq_num: self.match_seq_num,
            fencing_token: self.fencing_token,
        })
    }
}

pub fn position(p: StreamPosition) -> Value {
    json!({ "seq_num": p.seq_num, "timestamp": p.timestamp })
}

pub fn append_ack(ack: &AppendAck) -> Value {
    json!({ "start": position(ack.start), "end": position(ack.end), "tail": position(ack.tail) })
}

pub fn tail(tail: StreamPosition) -> Value {
    json!({ "tail": position(tail) })
}

pub fn read_batch(batch: &ReadBatch, format: Format) -> Value {
    let records: Vec<Value> = batch
        .records
        .iter()
        .map(|r| {
            let mut record = json!({ "seq_num": r.seq_num, "timestamp": r.timestamp });
            if !r.headers.is_empty() {
                let headers: Vec<[String; 2]> = r
                    .headers
                    .iter()
                    .map(|h| [format.encode(&h.name), format.encode(&h.value)])
                    .collect();
                record["headers"] = json!(headers);
            }
            if !r.body.is_empty() {
                record["body"] = json!(format.encode(&r.body));
            }
            record
        })
        .collect();
    let mut out = json!({ "records": records });
    if let Some(t) = batch.tail {
        out["tail"] = position(t);
    }
    out
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_default()
}

/// The values the v1 spec allows for a basin's `scope`: a location by another name is
/// reported only as `location`, so clients that know only these values still parse it.
const BASIN_SCOPES: [&str; 3] = ["aws:us-east-1", "aws:us-west-2", "aws:eu-north-1"];

#[derive(Serialize)]
pub struct BasinInfo {
    name: String,
    scope: Option<String>,
    location: String,
    created_at: String,
    deleted_at: Option<String>,
    state: &'static str,
}

impl From<&BasinRecord> for BasinInfo {
    fn from(b: &BasinRecord) -> Self {
        Self {
            name: b.name.to_string(),
            scope: BASIN_SCOPES
                .contains(&b.location.as_str())
                .then(|| b.location.clone()),
            location: b.location.clone(),
            created_at: rfc3339(b.created_at),
            deleted_at: b.deleted_at.map(rfc3339),
            state: if b.deleted_at.is_some() {
                "deleting"
            } else {
                "active"
            },
        }
    }
}

#[derive(Serialize)]
pub struct StreamInfo {
    name: String,
    created_at: String,
    deleted_at: Option<String>,
    cipher: Option<String>,
}

impl From<&StreamRecord> for StreamInfo {
    fn from(s: &StreamRecord) -> Self {
        Self {
            name: s.name.to_string(),
            created_at: rfc3339(s.created_at),
            deleted_at: s.deleted_at.map(rfc3339),
            cipher: s.cipher.map(|c| c.as_str().to_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_round_trip_record_bytes() {
        let input: AppendInputJson = serde_json::from_str(
            r#"{"records":[{"headers":[["","dHJpbQ=="]],"body":"AAAAAAAAAGQ="}]}"#,
        )
        .unwrap();
        let core = input.into_core(Format::Base64).unwrap();
        assert_eq!(
            core.records[0].headers[0].value,
            Bytes::from_static(b"trim")
        );
        assert_eq!(core.records[0].body.as_ref(), &100u64.to_be_bytes());

        let bad: AppendInputJson =
            serde_json::from_str(r#"{"records":[{"body":"not base64!"}]}"#).unwrap();
        assert!(bad.into_core(Format::Base64).is_err());

        let batch = ReadBatch {
            records: vec![record::SequencedRecord {
                seq_num: 4,
                timestamp: 9,
                headers: vec![],
                body: Bytes::from_static(b"\xffhi"),
            }],
            tail: None,
        };
        let raw = read_batch(&batch, Format::Raw);
        assert_eq!(raw["records"][0]["body"], "\u{fffd}hi");
        assert!(raw["records"][0].get("headers").is_none());
        assert!(raw.get("tail").is_none());
        let b64 = read_batch(&batch, Format::Base64);
        assert_eq!(b64["records"][0]["body"], "/2hp");
    }
}
