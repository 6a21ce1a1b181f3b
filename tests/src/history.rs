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

pub fn verify(history: &History, streams: &[Vec<(u64, u64, String)>]) -> usize {
    let mut seen: HashMap<&str, (usize, u64)> = HashMap::new();
    for (stream, records) in streams.iter().enumerate() {
        let mut last_ts = 0;
        let mut i = 0;
        while i < records.len() {
            let (seq, ts, body) = &records[i];
            assert_eq!(*seq, i as u64, "sequence numbers are dense");
            assert!(*ts >= last_ts, "timestamps never go backwards");
            last_ts = *ts;
            let (batch, index) = body.split_once('/').expect("only test records exist");
            assert_eq!(index, "0", "batch {batch} starts at its first record");
            let size = *history
                .sent
                .get(batch)
                .unwrap_or_else(|| panic!("{batch} was never sent"));
            for k in 0..size {
                let (_, _, body) = records
                    .get(i + k)
                    .unwrap_or_else(|| panic!("batch {batch} is cut short"));
                assert_eq!(
                    *body,
                    format!("{batch}/{k}"),
                    "batch {batch} is whole and in order"
                );
            }
            assert!(
                seen.insert(batch, (stream, i as u64)).is_none(),
                "batch {batch} appears twice"
            );
            i += size;
        }
    }
    for (batch, (stream, start, _)) in &history.acked {
        assert_eq!(
            seen.get(batch.as_str()),
            Some(&(*stream, *start)),
            "acknowledged batch {batch} is present at its acknowledged position"
        );
    }
    for (batch, stream) in &history.acked_unplaced {
        assert_eq!(
            seen.get(batch.as_str()).map(|(s, _)| s),
            Some(stream),
            "acknowledged OTLP export {batch} is present in its stream"
        );
    }
    for batch in &history.refused {
        assert!(
            !seen.contains_key(batch.as_str()),
            "refused batch {batch} is absent"
        );
    }
    seen.len()
}
