//! What clients sent and were acknowledged, and the check of a stream's records against
//! it after a crash or an outage: every acknowledged batch exactly once at its acknowledged
//! position, batches whole and in order, dense sequence numbers, timestamps that never go
//! back, refused batches absent, and nothing that no client sent. Record bodies are
//! `<batch id>/<index in batch>`.

use std::collections::HashMap;

use serde_json::{json, Value};

#[derive(Default)]
pub struct History {
    /// Batch id → number of records sent.
    pub sent: HashMap<String, usize>,
    /// Batch id → (stream, first seq_num, end seq_num).
    pub acked: HashMap<String, (usize, u64, u64)>,
    /// Batches acknowledged without a position (OTLP answers success only) → stream.
    pub acked_unplaced: HashMap<String, usize>,
    /// Batches the server refused (e.g. `server_draining`): they must be absent.
    pub refused: Vec<String>,
}

/// What became of a batch sent with [`send_rest_batch`].
pub enum Sent {
    /// Acknowledged at these positions (recorded in the history).
    Acked { start: u64, end: u64 },
    /// Answered with something else.
    Refused(reqwest::Response),
    /// No answer (or no readable one): its fate is unknown.
    NoAnswer,
}

/// Sends batch `batch` of `size` records (`<batch>/<i>`) to stream `s{stream}` of
/// `basin` over REST, recording it as sent first and, when acknowledged, the positions
/// its ack gave (which must cover the whole batch).
pub async fn send_rest_batch(
    history: &std::sync::Mutex<History>,
    request: reqwest::RequestBuilder,
    basin: &str,
    (stream, batch, size): (usize, String, usize),
) -> Sent {
    let records: Vec<Value> = (0..size)
        .map(|i| json!({ "body": format!("{batch}/{i}") }))
        .collect();
    history.lock().unwrap().sent.insert(batch.clone(), size);
    let response = request
        .header("s2-basin", basin)
        .json(&json!({ "records": records }))
        .send()
        .await;
    let ack: Value = match response {
        Ok(r) if r.status().is_success() => match r.json().await {
            Ok(ack) => ack,
            Err(_) => return Sent::NoAnswer,
        },
        Ok(r) => return Sent::Refused(r),
        Err(_) => return Sent::NoAnswer,
    };
    let start = ack["start"]["seq_num"].as_u64().unwrap();
    let end = ack["end"]["seq_num"].as_u64().unwrap();
    assert_eq!(end - start, size as u64, "the ack covers the whole batch");
    history
        .lock()
        .unwrap()
        .acked
        .insert(batch, (stream, start, end));
    Sent::Acked { start, end }
}

/// A stream's records as (seq_num, timestamp, body); a Redis entry's body is its
/// field `b`, an OTLP record's the body of its one log record.
pub async fn read_all(endpoint: &str, basin: &str, stream: usize) -> Vec<(u64, u64, String)> {
    crate::read_stream(endpoint, basin, &format!("s{stream}"))
        .await
        .iter()
        .map(|r| {
            (
                r["seq_num"].as_u64().unwrap(),
                r["timestamp"].as_u64().unwrap(),
                match r.get("body") {
                    Some(body) if r["headers"][0][0] == "s2-otlp.signal" => {
                        let export: Value = serde_json::from_str(body.as_str().unwrap()).unwrap();
                        let log = &export["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0];
                        log["body"]["stringValue"].as_str().unwrap().to_owned()
                    }
                    Some(body) => body.as_str().unwrap().to_owned(),
                    None => {
                        let headers = r["headers"].as_array().unwrap();
                        assert_eq!(headers[0], json!(["s2-resp.v", "1"]));
                        assert_eq!(headers[1][0], "b");
                        headers[1][1].as_str().unwrap().to_owned()
                    }
                },
            )
        })
        .collect()
}

/// The first thing [`check`] found wrong with the streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// A stream is malformed: a gap in its sequence numbers, a timestamp going back, a
    /// batch torn, out of order or present twice, or a record no client sent.
    Malformed(String),
    /// An acknowledged batch is not at the position its ack gave: absent, or `found`
    /// somewhere else (stream, first seq_num).
    AcknowledgedBatchMissing {
        batch: String,
        stream: usize,
        start: u64,
        found: Option<(usize, u64)>,
    },
    /// An acknowledged OTLP export is not in its stream.
    AcknowledgedExportMissing { batch: String, stream: usize },
    /// A batch the server refused is present.
    RefusedBatchPresent { batch: String },
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Violation::Malformed(what) => f.write_str(what),
            Violation::AcknowledgedBatchMissing {
                batch,
                stream,
                start,
                found,
            } => write!(
                f,
                "acknowledged batch {batch} is not present at its acknowledged position \
                 (stream s{stream}, seq_num {start}); found at: {found:?}"
            ),
            Violation::AcknowledgedExportMissing { batch, stream } => write!(
                f,
                "acknowledged OTLP export {batch} is not present in its stream s{stream}"
            ),
            Violation::RefusedBatchPresent { batch } => {
                write!(f, "refused batch {batch} is present")
            }
        }
    }
}

/// Checks the streams' records against the history (see the module comment); panics at
/// the first violation. Returns how many batches are present.
pub fn verify(history: &History, streams: &[Vec<(u64, u64, String)>]) -> usize {
    check(history, streams).unwrap_or_else(|violation| panic!("{violation}"))
}

/// Like [`verify`], returning the first violation instead of panicking: for tests that
/// expect one (a deliberately broken setup must be caught).
pub fn check(history: &History, streams: &[Vec<(u64, u64, String)>]) -> Result<usize, Violation> {
    let malformed = |what: String| Err(Violation::Malformed(what));
    let mut seen: HashMap<&str, (usize, u64)> = HashMap::new();
    for (stream, records) in streams.iter().enumerate() {
        let mut last_ts = 0;
        let mut i = 0;
        while i < records.len() {
            let (seq, ts, body) = &records[i];
            if *seq != i as u64 {
                return malformed(format!(
                    "sequence numbers are dense: s{stream} has seq_num {seq} at index {i}"
                ));
            }
            if *ts < last_ts {
                return malformed(format!(
                    "timestamps never go backwards: s{stream} goes from {last_ts} to {ts} at \
                     seq_num {seq}"
                ));
            }
            last_ts = *ts;
            let Some((batch, index)) = body.split_once('/') else {
                return malformed(format!("only test records exist: s{stream} has {body:?}"));
            };
            if index != "0" {
                return malformed(format!(
                    "batch {batch} starts at its first record: s{stream} seq_num {seq} is \
                     record {index}"
                ));
            }
            let Some(&size) = history.sent.get(batch) else {
                return malformed(format!("{batch} was never sent"));
            };
            for k in 0..size {
                let Some((_, _, body)) = records.get(i + k) else {
                    return malformed(format!("batch {batch} is cut short"));
                };
                if *body != format!("{batch}/{k}") {
                    return malformed(format!(
                        "batch {batch} is whole and in order: record {k} is {body:?}"
                    ));
                }
            }
            if seen.insert(batch, (stream, i as u64)).is_some() {
                return malformed(format!("batch {batch} appears twice"));
            }
            i += size;
        }
    }
    for (batch, (stream, start, _)) in &history.acked {
        let found = seen.get(batch.as_str()).copied();
        if found != Some((*stream, *start)) {
            return Err(Violation::AcknowledgedBatchMissing {
                batch: batch.clone(),
                stream: *stream,
                start: *start,
                found,
            });
        }
    }
    for (batch, stream) in &history.acked_unplaced {
        if seen.get(batch.as_str()).map(|(s, _)| s) != Some(stream) {
            return Err(Violation::AcknowledgedExportMissing {
                batch: batch.clone(),
                stream: *stream,
            });
        }
    }
    for batch in &history.refused {
        if seen.contains_key(batch.as_str()) {
            return Err(Violation::RefusedBatchPresent {
                batch: batch.clone(),
            });
        }
    }
    Ok(seen.len())
}
