//! A linearizability check of one stream: several clients append, read and check the
//! tail concurrently while every operation's real-time interval is recorded; the history
//! is then checked against the model of a single append-only log. Each operation must
//! take effect at one instant inside its interval, so:
//! - a tail or a read reflects every append acknowledged before it began, and nothing
//!   that was never appended (no tail beyond the appends begun before it ended);
//! - a read returns exactly the records at their acknowledged positions;
//! - operations that do not overlap are ordered: a later tail never goes backwards.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use streamgate_tests::Server;

const BASIN: &str = "linearizable";

#[derive(Debug, Clone)]
enum Op {
    /// An append of `body`; `seq` is its acknowledged position (`None`: no answer).
    Append { body: String, seq: Option<u64> },
    /// A check-tail and the tail it returned.
    Tail { tail: u64 },
    /// A read from 0 and the bodies it returned, in order.
    Read { bodies: Vec<String> },
}

#[derive(Debug, Clone)]
struct Event {
    start: Instant,
    end: Instant,
    op: Op,
}

async fn append(client: &reqwest::Client, endpoint: &str, body: &str) -> Option<u64> {
    let response = client
        .post(format!("{endpoint}/v1/streams/log/records"))
        .header("s2-basin", BASIN)
        .json(&json!({"records": [{"body": body}]}))
        .send()
        .await
        .ok()?;
    if !response.status().is_success() {
        return None;
    }
    let ack: Value = response.json().await.ok()?;
    ack["start"]["seq_num"].as_u64()
}

async fn tail(client: &reqwest::Client, endpoint: &str) -> u64 {
    let tail: Value = streamgate_tests::json_of(
        client
            .get(format!("{endpoint}/v1/streams/log/records/tail"))
            .header("s2-basin", BASIN),
    )
    .await;
    tail["tail"]["seq_num"].as_u64().unwrap()
}

async fn read_all(client: &reqwest::Client, endpoint: &str) -> Vec<String> {
    let response = client
        .get(format!(
            "{endpoint}/v1/streams/log/records?seq_num=0&count=1000"
        ))
        .header("s2-basin", BASIN)
        .send()
        .await
        .unwrap();
    if response.status() == 416 {
        return Vec::new();
    }
    let batch: Value = response.json().await.unwrap();
    batch["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["body"].as_str().unwrap().to_owned())
        .collect()
}

fn check(history: &[Event]) {
    let appends: Vec<(&Event, &str, Option<u64>)> = history
        .iter()
        .filter_map(|e| match &e.op {
            Op::Append { body, seq } => Some((e, body.as_str(), *seq)),
            _ => None,
        })
        .collect();
    // Acknowledged positions are distinct.
    let mut positions: Vec<u64> = appends.iter().filter_map(|(_, _, s)| *s).collect();
    positions.sort();
    positions.dedup();
    assert_eq!(
        positions.len(),
        appends.iter().filter(|(_, _, s)| s.is_some()).count()
    );

    for event in history {
        // Appends acknowledged before this operation began must be visible to it;
        // appends begun only after it ended cannot be.
        let must_see = appends
            .iter()
            .filter(|(a, _, seq)| seq.is_some() && a.end < event.start)
            .map(|(_, _, seq)| seq.unwrap() + 1)
            .max()
            .unwrap_or(0);
        let could_see = appends
            .iter()
            .filter(|(a, _, _)| a.start < event.end)
            .count() as u64;
        match &event.op {
            Op::Tail { tail } => {
                assert!(
                    *tail >= must_see,
                    "tail {tail} misses an acknowledged append (needs {must_see})"
                );
                assert!(
                    *tail <= could_see,
                    "tail {tail} counts appends not yet begun ({could_see} begun)"
                );
            }
            Op::Read { bodies } => {
                let len = bodies.len() as u64;
                assert!(
                    len >= must_see,
                    "read of {len} misses an acknowledged append (needs {must_see})"
                );
                assert!(
                    len <= could_see,
                    "read of {len} holds appends not yet begun"
                );
                for (position, body) in bodies.iter().enumerate() {
                    let (append, _, seq) = appends
                        .iter()
                        .find(|(_, b, _)| *b == body)
                        .unwrap_or_else(|| panic!("{body} was never appended"));
                    assert!(
                        append.start < event.end,
                        "{body} read before its append began"
                    );
                    if let Some(seq) = seq {
                        assert_eq!(
                            *seq, position as u64,
                            "{body} read away from its acknowledged position"
                        );
                    }
                }
            }
            Op::Append { .. } => {}
        }
    }
    // Non-overlapping tails are ordered in real time.
    let tails: Vec<(&Event, u64)> = history
        .iter()
        .filter_map(|e| match e.op {
            Op::Tail { tail } => Some((e, tail)),
            _ => None,
        })
        .collect();
    for (a, ta) in &tails {
        for (b, tb) in &tails {
            if a.end < b.start {
                assert!(
                    tb >= ta,
                    "a later tail ({tb}) went back from an earlier one ({ta})"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn appends_reads_and_tails_of_one_stream_are_linearizable() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let endpoint = server.endpoint.clone();
    streamgate_tests::create_streams(&endpoint, BASIN, &["log"]).await;
    let history = Arc::new(Mutex::new(Vec::<Event>::new()));
    let deadline = Instant::now() + Duration::from_secs(4);
    let mut clients = Vec::new();
    for id in 0..6 {
        let (endpoint, history) = (endpoint.clone(), history.clone());
        clients.push(tokio::spawn(async move {
            let client = streamgate_tests::client();
            let mut n = 0;
            // Two appenders, two tailers, two readers; bounded so a read fits one batch.
            while Instant::now() < deadline && n < 300 {
                let start = Instant::now();
                let op = match id % 3 {
                    0 => {
                        let body = format!("c{id}-{n}");
                        let seq = append(&client, &endpoint, &body).await;
                        Op::Append { body, seq }
                    }
                    1 => Op::Tail {
                        tail: tail(&client, &endpoint).await,
                    },
                    _ => Op::Read {
                        bodies: read_all(&client, &endpoint).await,
                    },
                };
                history.lock().unwrap().push(Event {
                    start,
                    end: Instant::now(),
                    op,
                });
                n += 1;
            }
        }));
    }
    for client in clients {
        client.await.unwrap();
    }
    let history = history.lock().unwrap().clone();
    let count = |f: fn(&Op) -> bool| history.iter().filter(|e| f(&e.op)).count();
    let (appends, tails, reads) = (
        count(|op| matches!(op, Op::Append { .. })),
        count(|op| matches!(op, Op::Tail { .. })),
        count(|op| matches!(op, Op::Read { .. })),
    );
    eprintln!("history: {appends} appends, {tails} tails, {reads} reads");
    assert!(
        appends > 20 && tails > 20 && reads > 20,
        "the clients overlapped enough to test"
    );
    check(&history);
}

/// The checker itself: histories that break the model are caught.
fn at(ms: u64, until: u64, op: Op) -> Event {
    let base = *BASE;
    Event {
        start: base + Duration::from_millis(ms),
        end: base + Duration::from_millis(until),
        op,
    }
}

static BASE: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);

fn acked(body: &str, seq: u64, ms: u64, until: u64) -> Event {
    at(
        ms,
        until,
        Op::Append {
            body: body.into(),
            seq: Some(seq),
        },
    )
}

#[test]
#[should_panic(expected = "misses an acknowledged append")]
fn the_checker_catches_a_stale_tail() {
    check(&[acked("a", 0, 0, 1), at(2, 3, Op::Tail { tail: 0 })]);
}

#[test]
#[should_panic(expected = "was never appended")]
fn the_checker_catches_a_phantom_record() {
    check(&[
        acked("a", 0, 0, 1),
        at(
            2,
            3,
            Op::Read {
                bodies: vec!["b".into()],
            },
        ),
    ]);
}

#[test]
#[should_panic(expected = "went back")]
fn the_checker_catches_a_tail_going_back() {
    check(&[
        acked("a", 0, 0, 10),
        acked("b", 1, 0, 10),
        at(1, 2, Op::Tail { tail: 2 }),
        at(3, 4, Op::Tail { tail: 1 }),
    ]);
}

#[test]
fn the_checker_accepts_a_concurrent_but_consistent_history() {
    check(&[
        acked("a", 0, 0, 5),
        at(1, 2, Op::Tail { tail: 0 }), // overlaps the append: either answer is fine
        at(
            3,
            6,
            Op::Read {
                bodies: vec!["a".into()],
            },
        ),
        at(7, 8, Op::Tail { tail: 1 }),
    ]);
}
