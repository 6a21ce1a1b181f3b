//! Linearizability of one stream. Clients over REST (plain appends, appends conditional on
//! a sequence number or a fencing token, fences, trims, reads from anywhere, check-tails),
//! an S2S append session and pipelined RESP `XADD`s work on one stream at once while the
//! server is killed with SIGKILL and restarted under them; every operation is recorded
//! with its real-time interval and outcome, and the checker in
//! `streamgate_tests::linearizability` must find an order of all of them that the model
//! of a single stream explains. The first half of this file shows the checker refuses
//! histories that break the model.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use rand::Rng;
use serde_json::{json, Value};
use streamgate_tests::cluster::Cluster;
use streamgate_tests::linearizability::{
    append, check, records_from, Call, CheckError, HandHistory, Operation, Outcome, Record,
};
use streamgate_tests::resp::{self, Reply};
use streamgate_tests::s2s::AppendSession;
use streamgate_tests::Server;

// ---- the checker on histories written by hand ----

fn tail() -> Call {
    Call::CheckTail
}

fn read(from: u64, limit: usize) -> Call {
    Call::Read { from, limit }
}

fn at(start: u64) -> Outcome {
    Outcome::Appended { start }
}

fn violation(history: &HandHistory) -> String {
    match history.check() {
        Err(CheckError::NotLinearizable(v)) => v.to_string(),
        other => panic!("the checker accepted a history that breaks the model: {other:?}"),
    }
}

#[test]
fn a_sequential_history_is_linearizable() {
    let mut h = HandHistory::default();
    h.op(0, 1, append(&["a", "b"]), at(0))
        .op(2, 3, append(&["c"]), at(2))
        .op(4, 5, tail(), Outcome::Tail(3))
        .op(6, 7, read(1, 10), records_from(1, &["b", "c"]))
        .op(8, 9, read(0, 1), records_from(0, &["a"]))
        .op(10, 11, read(3, 10), Outcome::PastTail { tail: 3 });
    let checked = h.check().unwrap();
    assert_eq!(checked.known, 6);
}

#[test]
fn concurrent_operations_may_take_effect_in_either_order() {
    // Two overlapping appends acknowledged in the opposite order to their calls, and a
    // read overlapping both that saw only the second: only "b, read, a" explains it.
    let mut h = HandHistory::default();
    h.op(0, 10, append(&["a"]), at(1))
        .op(1, 9, append(&["b"]), at(0))
        .op(2, 8, read(0, 10), records_from(0, &["b"]))
        .op(11, 12, read(0, 10), records_from(0, &["b", "a"]));
    h.check().unwrap();
}

#[test]
fn a_tail_that_misses_an_acknowledged_append_is_refused() {
    let mut h = HandHistory::default();
    h.op(0, 1, append(&["a"]), at(0))
        .op(2, 3, tail(), Outcome::Tail(0));
    assert!(violation(&h).contains("CheckTail"));
}

#[test]
fn an_acknowledged_append_that_disappears_is_refused() {
    let mut h = HandHistory::default();
    h.op(0, 1, append(&["a"]), at(0))
        .op(2, 3, append(&["b"]), at(1))
        .op(4, 5, read(0, 10), records_from(0, &["b"]));
    violation(&h);
}

#[test]
fn one_position_acknowledged_twice_is_refused() {
    let mut h = HandHistory::default();
    h.op(0, 5, append(&["a"]), at(0))
        .op(0, 5, append(&["b"]), at(0));
    violation(&h);
}

#[test]
fn a_record_read_before_its_append_was_called_is_refused() {
    let mut h = HandHistory::default();
    h.op(0, 1, read(0, 10), records_from(0, &["a"]))
        .op(2, 3, append(&["a"]), at(0));
    violation(&h);
}

#[test]
fn a_read_shorter_than_what_was_acknowledged_is_refused() {
    // Reads return everything up to their limit: two acknowledged records, one read.
    let mut h = HandHistory::default();
    h.op(0, 1, append(&["a", "b"]), at(0))
        .op(2, 3, read(0, 10), records_from(0, &["a"]));
    violation(&h);
}

#[test]
fn a_tail_that_goes_back_is_refused() {
    let mut h = HandHistory::default();
    h.op(0, 10, append(&["a"]), at(0))
        .op(0, 10, append(&["b"]), at(1))
        .op(1, 2, tail(), Outcome::Tail(2))
        .op(3, 4, tail(), Outcome::Tail(1));
    violation(&h);
}

#[test]
fn unknown_outcomes_may_have_taken_effect_or_not() {
    let mut h = HandHistory::default();
    // One unknown append shows up later; another never does.
    h.op(0, 0, append(&["lost"]), Outcome::Unknown)
        .op(1, 1, append(&["maybe"]), Outcome::Unknown)
        .op(5, 6, append(&["c"]), at(1))
        .op(7, 8, read(0, 10), records_from(0, &["maybe", "c"]));
    let checked = h.check().unwrap();
    assert_eq!((checked.unknown_appends, checked.unknown_applied), (2, 1));
}

#[test]
fn an_unknown_append_seen_then_unseen_is_refused() {
    let mut h = HandHistory::default();
    h.op(0, 0, append(&["x"]), Outcome::Unknown)
        .op(1, 2, read(0, 10), records_from(0, &["x"]))
        .op(3, 4, read(0, 10), Outcome::PastTail { tail: 0 });
    violation(&h);
}

#[test]
fn an_unknown_append_cannot_take_effect_before_it_was_called() {
    let mut h = HandHistory::default();
    h.op(0, 1, read(0, 10), records_from(0, &["x"]))
        .op(2, 2, append(&["x"]), Outcome::Unknown);
    violation(&h);
}

#[test]
fn conditional_appends_follow_the_tail() {
    let conditional = |seq: u64, body: &str| Call::Append {
        records: vec![Record::Data(body.into())],
        match_seq_num: Some(seq),
        fencing_token: None,
    };
    let mut good = HandHistory::default();
    good.op(0, 1, append(&["a"]), at(0))
        .op(2, 3, conditional(1, "b"), at(1))
        .op(
            4,
            5,
            conditional(1, "c"),
            Outcome::SeqNumMismatch { tail: 2 },
        );
    good.check().unwrap();

    let mut wrong_tail = HandHistory::default();
    wrong_tail.op(0, 1, append(&["a"]), at(0)).op(
        2,
        3,
        conditional(5, "b"),
        Outcome::SeqNumMismatch { tail: 0 },
    );
    violation(&wrong_tail);

    let mut accepted_anyway = HandHistory::default();
    accepted_anyway
        .op(0, 1, append(&["a"]), at(0))
        .op(2, 3, conditional(0, "b"), at(1));
    violation(&accepted_anyway);
}

#[test]
fn fencing_tokens_are_honoured() {
    let fence = |token: &str, holding: Option<&str>| Call::Append {
        records: vec![Record::Fence(token.into())],
        match_seq_num: None,
        fencing_token: holding.map(str::to_owned),
    };
    let fenced = |body: &str, token: &str| Call::Append {
        records: vec![Record::Data(body.into())],
        match_seq_num: None,
        fencing_token: Some(token.into()),
    };
    let mut good = HandHistory::default();
    good.op(0, 1, fence("t1", None), at(0))
        .op(2, 3, fenced("a", "t1"), at(1))
        .op(
            4,
            5,
            fenced("b", "t0"),
            Outcome::FencingTokenMismatch { token: "t1".into() },
        )
        .op(6, 7, append(&["c"]), at(2));
    good.check().unwrap();

    let mut stale_writer_wins = HandHistory::default();
    stale_writer_wins
        .op(0, 1, fence("t1", None), at(0))
        .op(2, 3, fence("t2", Some("t1")), at(1))
        .op(4, 5, fenced("a", "t1"), at(2));
    violation(&stale_writer_wins);
}

#[test]
fn reads_skip_what_a_trim_removed() {
    let trim = |to: u64| Call::Append {
        records: vec![Record::Trim(to)],
        match_seq_num: None,
        fencing_token: None,
    };
    let mut good = HandHistory::default();
    good.op(0, 1, append(&["a", "b", "c"]), at(0))
        .op(2, 3, trim(2), at(3))
        .op(
            4,
            5,
            read(0, 10),
            Outcome::Records(vec![(2, Record::Data("c".into())), (3, Record::Trim(2))]),
        )
        // A trim never goes past itself: asking for 100 at position 5 trims to 5.
        .op(6, 7, append(&["d"]), at(4))
        .op(8, 9, trim(100), at(5))
        .op(10, 11, read(0, 10), Outcome::PastTail { tail: 6 });
    good.check().unwrap();

    let mut trimmed_but_seen = HandHistory::default();
    trimmed_but_seen
        .op(0, 1, append(&["a", "b"]), at(0))
        .op(2, 3, trim(1), at(2))
        .op(4, 5, read(0, 1), records_from(0, &["a"]));
    violation(&trimmed_but_seen);
}

#[test]
fn a_pipeline_takes_effect_in_the_order_it_was_sent() {
    // Two overlapping appends; on one pipeline, only the order they were sent in holds.
    let mut apart = HandHistory::default();
    apart
        .op(0, 10, append(&["a"]), at(1))
        .op(1, 9, append(&["b"]), at(0));
    apart.check().unwrap();
    let mut pipelined = HandHistory::default();
    pipelined
        .op(0, 10, append(&["a"]), at(1))
        .on_pipeline("p")
        .op(1, 9, append(&["b"]), at(0))
        .on_pipeline("p");
    violation(&pipelined);
    // An unknown append cannot take effect after a later one on its pipeline.
    let mut late = HandHistory::default();
    late.op(0, 0, append(&["a"]), Outcome::Unknown)
        .on_pipeline("p")
        .op(1, 2, append(&["b"]), at(0))
        .on_pipeline("p")
        .op(3, 4, read(0, 10), records_from(0, &["b", "a"]));
    violation(&late);
}

#[test]
fn a_gap_no_read_saw_is_filled_without_trying_every_order() {
    // Sixteen unknown appends, eight of which filled the eight positions no one read
    // before a known append. They are alike (one record each, no condition, no
    // pipeline), so which eight does not matter either: the search tries the first eight
    // called, in that order, rather than 12,870 sets of eight.
    let mut h = HandHistory::default();
    for i in 0..16 {
        h.op(i, i, append(&[&format!("u{i}")]), Outcome::Unknown);
    }
    h.op(20, 100, append(&["k"]), at(8))
        .op(101, 102, tail(), Outcome::Tail(9));
    let checked = h.check().unwrap();
    assert_eq!(checked.unknown_applied, 8);
    // And with a read that no filling explains, it says so after a few hundred steps.
    h.op(103, 104, read(0, 1), records_from(0, &["never-written"]));
    let Err(CheckError::NotLinearizable(_)) = h.check_with_budget(1_000) else {
        panic!("a history no filling explains was not refused within 1,000 steps");
    };
}

#[test]
fn reads_of_a_state_are_placed_before_the_appends_that_end_it() {
    // Fifty check-tails each saw the stream just before an append they overlap, and
    // returned only at the very end; a thousand appends follow one another. Tried in
    // the order of their calls, each append would go first, and each check-tail would be
    // found out of place only at its return, after placing everything after it: fifty
    // walks back through a thousand appends. A check-tail that fits is placed first.
    let mut h = HandHistory::default();
    for i in 0..1000 {
        h.op(10 * i, 10 * i + 2, append(&[&format!("a{i}")]), at(i));
        if i < 50 {
            h.op(10 * i + 1, 100_000, tail(), Outcome::Tail(i));
        }
    }
    let checked = h.check().unwrap();
    assert_eq!(checked.known, 1050);
    assert!(
        checked.steps < 20_000,
        "{} steps for 1,050 operations",
        checked.steps
    );
}

#[test]
fn the_search_budget_is_honoured() {
    // Twenty-four unknown appends, each on a pipeline of its own (so not interchangeable:
    // a pipeline orders what is sent on it), any twelve of which may fill the twelve
    // positions before a known one, then a read that no filling explains: the search
    // must try every set of twelve (2.7 million), far beyond a small budget, and says it
    // gave up rather than decide.
    let mut h = HandHistory::default();
    for i in 0..24 {
        h.op(0, 0, append(&[&format!("u{i}")]), Outcome::Unknown)
            .on_pipeline(&format!("p{i}"));
    }
    h.op(1, 100, append(&["k"]), at(12));
    h.check().unwrap();
    h.op(101, 102, read(0, 1), records_from(0, &["never-written"]));
    assert!(matches!(
        h.check_with_budget(100_000),
        Err(CheckError::GaveUp { steps: 100_001 })
    ));
}

#[test]
fn unknown_appends_past_their_chance_are_not_revisited() {
    // Two hundred unknown appends that could only have filled position 0, which a known
    // append took, then a thousand check-tails one after another: each restart of the
    // search would step over all two hundred (200,000 steps) were they not set aside
    // once the tail passed them.
    let mut h = HandHistory::default();
    for i in 0..200 {
        h.op(0, 0, append(&[&format!("u{i}")]), Outcome::Unknown);
    }
    h.op(1, 2, append(&["k"]), at(0));
    for i in 0..1000 {
        h.op(3 + 2 * i, 4 + 2 * i, tail(), Outcome::Tail(1));
    }
    let checked = h.check().unwrap();
    assert_eq!((checked.known, checked.unknown_applied), (1001, 0));
    assert!(
        checked.steps < 5_000,
        "{} steps for 1,001 operations in sequence",
        checked.steps
    );
}

// ---- real histories ----

const BASIN: &str = "linearizable";
const STREAM: &str = "log";
/// How long clients run between two kills, and how many kills.
const ROUND: Duration = Duration::from_secs(3);
/// The longest a round may take for every kind of client to be answered.
const MAX_ROUND: Duration = Duration::from_secs(20);
const KILLS: usize = 3;
/// Too small a history proves little: the clients go on after the last round until at
/// least this many operations were answered (a slow machine answers fewer per round),
/// for up to `MAX_ROUND` more.
const MIN_ANSWERED: usize = 3000;

/// The kinds of client whose operations share a connection or session, where the
/// server applies them in the order they were sent.
const PIPELINED: [&str; 2] = ["session append", "resp xadd"];

/// What the clients did, shared by all of them.
#[derive(Default)]
struct Recorder {
    ops: Mutex<Vec<Operation>>,
    stop: AtomicBool,
    /// The highest tail any client has seen: where readers and trims aim.
    tail_hint: AtomicU64,
    /// Acknowledged operations per client kind, to check every kind keeps working.
    acked: Mutex<HashMap<&'static str, usize>>,
}

impl Recorder {
    fn record(
        &self,
        client: &str,
        kind: &'static str,
        call: Call,
        called: Instant,
        outcome: Outcome,
    ) {
        let seen_tail = match (&call, &outcome) {
            (Call::Append { records, .. }, Outcome::Appended { start }) => {
                Some(start + records.len() as u64)
            }
            (
                _,
                Outcome::Tail(tail) | Outcome::PastTail { tail } | Outcome::SeqNumMismatch { tail },
            ) => Some(*tail),
            _ => None,
        };
        if let Some(tail) = seen_tail {
            self.tail_hint.fetch_max(tail, Ordering::Relaxed);
        }
        if !matches!(outcome, Outcome::Unknown) {
            *self.acked.lock().unwrap().entry(kind).or_default() += 1;
        }
        self.ops.lock().unwrap().push(Operation {
            client: client.to_owned(),
            pipeline: PIPELINED.contains(&kind).then(|| client.to_owned()),
            call,
            outcome,
            called,
            returned: Instant::now(),
        });
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn acked(&self) -> HashMap<&'static str, usize> {
        self.acked.lock().unwrap().clone()
    }
}

fn b64(bytes: &[u8]) -> String {
    BASE64.encode(bytes)
}

fn record_json(record: &Record) -> Value {
    match record {
        Record::Data(body) => json!({ "body": b64(body.as_bytes()) }),
        Record::Fence(token) => {
            json!({ "headers": [["", b64(b"fence")]], "body": b64(token.as_bytes()) })
        }
        Record::Trim(to) => {
            json!({ "headers": [["", b64(b"trim")]], "body": b64(&to.to_be_bytes()) })
        }
    }
}

/// A record as a base64-format read returns it; RESP entries carry their body in field `b`.
fn record_of(json: &Value) -> (u64, Record) {
    let text = |v: &Value| BASE64.decode(v.as_str().unwrap()).unwrap();
    let headers: Vec<(Vec<u8>, Vec<u8>)> = json["headers"]
        .as_array()
        .map(|hs| hs.iter().map(|h| (text(&h[0]), text(&h[1]))).collect())
        .unwrap_or_default();
    let body = json.get("body").map(text).unwrap_or_default();
    let record = match headers.as_slice() {
        [] => Record::Data(String::from_utf8(body).unwrap()),
        [(name, kind)] if name.is_empty() && kind == b"fence" => {
            Record::Fence(String::from_utf8(body).unwrap())
        }
        [(name, kind)] if name.is_empty() && kind == b"trim" => {
            Record::Trim(u64::from_be_bytes(body.try_into().unwrap()))
        }
        [(marker, _), (field, value)] if marker == b"s2-resp.v" && field == b"b" => {
            Record::Data(String::from_utf8(value.clone()).unwrap())
        }
        other => panic!("a record no client wrote: {other:?}"),
    };
    (json["seq_num"].as_u64().unwrap(), record)
}

/// What a REST call returned, as the model sees it; `None` when no connection could be
/// made (the request never reached a server, so it did nothing).
/// `appended` is the number of records when the call is an append: its ack must cover
/// exactly them.
async fn over_rest(request: reqwest::RequestBuilder, appended: Option<u64>) -> Option<Outcome> {
    let response = match request.send().await {
        Ok(response) => response,
        Err(e) if e.is_connect() => return None,
        Err(_) => return Some(Outcome::Unknown),
    };
    let status = response.status().as_u16();
    let Ok(body) = response.json::<Value>().await else {
        return Some(Outcome::Unknown);
    };
    Some(match status {
        200 if body.get("start").is_some() => {
            let position = |at: &str| body[at]["seq_num"].as_u64().unwrap();
            assert_eq!(
                Some(position("end") - position("start")),
                appended,
                "an ack covers its whole batch: {body}"
            );
            Outcome::Appended {
                start: position("start"),
            }
        }
        200 if body.get("records").is_some() => Outcome::Records(
            body["records"]
                .as_array()
                .unwrap()
                .iter()
                .map(record_of)
                .collect(),
        ),
        200 => Outcome::Tail(body["tail"]["seq_num"].as_u64().unwrap()),
        412 if body.get("seq_num_mismatch").is_some() => Outcome::SeqNumMismatch {
            tail: body["seq_num_mismatch"].as_u64().unwrap(),
        },
        412 => Outcome::FencingTokenMismatch {
            token: body["fencing_token_mismatch"].as_str().unwrap().to_owned(),
        },
        416 => Outcome::PastTail {
            tail: body["tail"]["seq_num"].as_u64().unwrap(),
        },
        // Storage trouble or a server going away: the outcome is not known.
        500.. => Outcome::Unknown,
        _ => panic!("an unexpected answer {status}: {body}"),
    })
}

/// Sends `call` over REST and records it (unless it never reached a server).
async fn rest(
    http: &reqwest::Client,
    endpoint: &str,
    recorder: &Recorder,
    client: &str,
    kind: &'static str,
    call: Call,
) -> Option<Outcome> {
    let url = format!("{endpoint}/v1/streams/{STREAM}/records");
    let request = match &call {
        Call::Append {
            records,
            match_seq_num,
            fencing_token,
        } => {
            let mut input =
                json!({ "records": records.iter().map(record_json).collect::<Vec<_>>() });
            if let Some(seq) = match_seq_num {
                input["match_seq_num"] = json!(seq);
            }
            if let Some(token) = fencing_token {
                input["fencing_token"] = json!(token);
            }
            http.post(url).json(&input)
        }
        Call::Read { from, limit } => http.get(format!("{url}?seq_num={from}&count={limit}")),
        Call::CheckTail => http.get(format!("{url}/tail")),
    };
    let called = Instant::now();
    let appended = match &call {
        Call::Append { records, .. } => Some(records.len() as u64),
        _ => None,
    };
    let outcome = over_rest(
        request
            .header("s2-basin", BASIN)
            .header("s2-format", "base64"),
        appended,
    )
    .await?;
    recorder.record(client, kind, call, called, outcome.clone());
    Some(outcome)
}

fn data(body: String) -> Record {
    Record::Data(body)
}

/// Plain appends of 1–3 records, every third one conditional on the tail it last saw.
async fn rest_appender(endpoint: String, id: usize, recorder: Arc<Recorder>) {
    let http = streamgate_tests::client();
    let name = format!("rest{id}");
    let mut expected_tail = None;
    for n in 0.. {
        if recorder.stopped() {
            break;
        }
        let size = rand::rng().random_range(1..=3);
        let call = Call::Append {
            records: (0..size).map(|i| data(format!("{name}-{n}/{i}"))).collect(),
            match_seq_num: expected_tail.filter(|_| n % 3 == 0),
            fencing_token: None,
        };
        match rest(&http, &endpoint, &recorder, &name, "rest append", call).await {
            Some(Outcome::Appended { start }) => expected_tail = Some(start + size),
            Some(Outcome::SeqNumMismatch { tail }) => expected_tail = Some(tail),
            Some(_) => {}
            None => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// One writer that holds the fence: it sets new fencing tokens, appends with its token
/// (and now and then with a wrong one, which must be refused), and trims the stream.
async fn fencer(endpoint: String, recorder: Arc<Recorder>) {
    let http = streamgate_tests::client();
    let name = "fencer";
    let mut token = String::new();
    for n in 0u64.. {
        if recorder.stopped() {
            break;
        }
        let holding = (!token.is_empty()).then(|| token.clone());
        let (call, kind) = match n % 10 {
            0 => (
                Call::Append {
                    records: vec![Record::Fence(format!("token-{n}"))],
                    match_seq_num: None,
                    fencing_token: holding,
                },
                "fence",
            ),
            5 => (
                Call::Append {
                    records: vec![Record::Trim(
                        recorder
                            .tail_hint
                            .load(Ordering::Relaxed)
                            .saturating_sub(TRIM_LAG),
                    )],
                    match_seq_num: None,
                    fencing_token: None,
                },
                "trim",
            ),
            7 => (
                Call::Append {
                    records: vec![data(format!("{name}-{n}/0"))],
                    match_seq_num: None,
                    fencing_token: Some("not-the-token".into()),
                },
                "refused fenced append",
            ),
            _ => (
                Call::Append {
                    records: vec![data(format!("{name}-{n}/0"))],
                    match_seq_num: None,
                    fencing_token: holding,
                },
                "fenced append",
            ),
        };
        let fence = match &call {
            Call::Append { records, .. } => match &records[0] {
                Record::Fence(new) => Some(new.clone()),
                _ => None,
            },
            _ => None,
        };
        match rest(&http, &endpoint, &recorder, name, kind, call).await {
            Some(Outcome::Appended { .. }) => token = fence.unwrap_or(token),
            Some(Outcome::FencingTokenMismatch { token: current }) => token = current,
            Some(_) => {}
            None => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// How far behind the highest tail seen the fencer trims: far enough that the scanning
/// reader has read what it trims (positions no one read leave the checker more to try).
const TRIM_LAG: u64 = 300;

/// Reads and check-tails: one reader reads up to 20 records from anywhere between below
/// the trim point and just past the tail; the other scans the stream in order, 100
/// records at a time, so that nearly every position is read by someone.
async fn reader(endpoint: String, id: usize, recorder: Arc<Recorder>) {
    let http = streamgate_tests::client();
    let name = format!("reader{id}");
    let scanning = id == 1;
    let mut cursor = 0;
    while !recorder.stopped() {
        let hint = recorder.tail_hint.load(Ordering::Relaxed);
        let (call, kind) = if rand::rng().random_bool(0.2) {
            (Call::CheckTail, "check-tail")
        } else if scanning {
            (
                Call::Read {
                    from: cursor,
                    limit: 100,
                },
                "read",
            )
        } else {
            let from = rand::rng().random_range(hint.saturating_sub(TRIM_LAG + 100)..=hint + 2);
            let limit = rand::rng().random_range(1..=20);
            (Call::Read { from, limit }, "read")
        };
        match rest(&http, &endpoint, &recorder, &name, kind, call).await {
            Some(Outcome::Records(records)) if scanning => {
                cursor = records.last().map_or(cursor, |(seq, _)| seq + 1);
            }
            Some(_) => {}
            None => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Calls in flight on a pipelined connection, oldest first.
type InFlight = std::collections::VecDeque<(Call, Instant)>;

/// Whatever is still in flight when a connection breaks has an unknown outcome.
fn abandon(recorder: &Recorder, client: &str, kind: &'static str, in_flight: &mut InFlight) {
    for (call, called) in in_flight.drain(..) {
        recorder.record(client, kind, call, called, Outcome::Unknown);
    }
}

/// An S2S append session with up to 8 inputs in flight, reopened whenever it breaks.
async fn session_appender(endpoint: String, recorder: Arc<Recorder>) {
    let mut n = 0;
    for incarnation in 0.. {
        if recorder.stopped() {
            break;
        }
        let Ok(mut session) = AppendSession::open(&endpoint, BASIN, STREAM).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        // Each session is a pipeline of its own (see `Operation::pipeline`).
        let name = &format!("session#{incarnation}");
        let mut in_flight = InFlight::new();
        loop {
            while in_flight.len() < 8 && !recorder.stopped() {
                let size = rand::rng().random_range(1..=4);
                let bodies: Vec<String> = (0..size).map(|i| format!("session-{n}/{i}")).collect();
                n += 1;
                let refs: Vec<&[u8]> = bodies.iter().map(|b| b.as_bytes()).collect();
                let called = Instant::now();
                let sent = session.send(&refs).await;
                in_flight.push_back((
                    append(&bodies.iter().map(String::as_str).collect::<Vec<_>>()),
                    called,
                ));
                if sent.is_err() {
                    break;
                }
            }
            if in_flight.is_empty() {
                return;
            }
            match tokio::time::timeout(Duration::from_secs(10), session.ack()).await {
                Ok(Ok((start, end))) => {
                    let (call, called) = in_flight.pop_front().unwrap();
                    let Call::Append { records, .. } = &call else {
                        unreachable!()
                    };
                    assert_eq!(
                        end - start,
                        records.len() as u64,
                        "an ack covers its whole input"
                    );
                    recorder.record(
                        name,
                        "session append",
                        call,
                        called,
                        Outcome::Appended { start },
                    );
                }
                _ => {
                    abandon(&recorder, name, "session append", &mut in_flight);
                    break;
                }
            }
        }
    }
}

/// Pipelined `XADD`s (up to 8 in flight) on the RESP port, reconnecting when cut off.
async fn resp_appender(port: u16, recorder: Arc<Recorder>) {
    let mut n = 0;
    for incarnation in 0.. {
        if recorder.stopped() {
            break;
        }
        let Ok(mut connection) = resp::Connection::open(port, Some(BASIN)).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        // Each connection is a pipeline of its own (see `Operation::pipeline`).
        let name = &format!("resp#{incarnation}");
        let mut in_flight = InFlight::new();
        loop {
            let mut pipeline = Vec::new();
            while in_flight.len() < 8 && !recorder.stopped() {
                let body = format!("resp-{n}/0");
                n += 1;
                pipeline.push(vec![
                    "XADD".into(),
                    STREAM.into(),
                    "*".into(),
                    "b".into(),
                    body.clone(),
                ]);
                in_flight.push_back((append(&[&body]), Instant::now()));
            }
            let sent = connection.send_pipelined(&pipeline).await;
            if in_flight.is_empty() {
                return;
            }
            let reply = match sent {
                Ok(()) => tokio::time::timeout(Duration::from_secs(10), connection.reply()).await,
                Err(e) => Ok(Err(e)),
            };
            match reply {
                Ok(Ok(Reply::Bulk(Some(id)))) => {
                    let id = String::from_utf8(id).unwrap();
                    let seq = id.rsplit('-').next().unwrap().parse().unwrap();
                    let (call, called) = in_flight.pop_front().unwrap();
                    recorder.record(
                        name,
                        "resp xadd",
                        call,
                        called,
                        Outcome::Appended { start: seq },
                    );
                }
                // A refusal such as TRYAGAIN: the append did not happen as far as the
                // client knows; its outcome is unknown to the model.
                Ok(Ok(Reply::Error(_))) => {
                    let (call, called) = in_flight.pop_front().unwrap();
                    recorder.record(name, "resp xadd", call, called, Outcome::Unknown);
                }
                Ok(Ok(other)) => panic!("XADD answered {other:?}"),
                _ => {
                    abandon(&recorder, name, "resp xadd", &mut in_flight);
                    break;
                }
            }
        }
    }
}

/// Every record of the stream, read in pages after all clients stopped, as operations
/// of the history (they pin down what every earlier operation left behind).
async fn read_everything(endpoint: &str, recorder: &Recorder) {
    let http = streamgate_tests::client();
    let mut from = 0;
    loop {
        let outcome = rest(
            &http,
            endpoint,
            recorder,
            "final",
            "final read",
            Call::Read { from, limit: 1000 },
        )
        .await
        .expect("the server is up");
        match outcome {
            Outcome::Records(records) => from = records.last().unwrap().0 + 1,
            Outcome::PastTail { .. } => return,
            other => panic!("the final read answered {other:?}"),
        }
    }
}

/// Where each client sends its requests: the HTTP endpoints and the RESP port of the
/// nodes it talks to.
struct Targets {
    appenders: [String; 2],
    readers: [String; 2],
    fencer: String,
    session: String,
    resp_port: u16,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rest_session_and_resp_clients_see_one_linearizable_stream_across_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path());
    let endpoint = server.endpoint.clone();
    let targets = Targets {
        appenders: [endpoint.clone(), endpoint.clone()],
        readers: [endpoint.clone(), endpoint.clone()],
        fencer: endpoint.clone(),
        session: endpoint.clone(),
        resp_port: server.resp_port,
    };
    record_and_check(targets, |_| server.restart()).await;
}

/// The same clients spread over the three nodes of a cluster, so that most requests
/// are forwarded to the node that sequences the stream, while one node after another is
/// `kill -9`ed and started again: one linearizable stream still.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clients_spread_over_three_nodes_see_one_linearizable_stream_across_kill_9() {
    let mut cluster = Cluster::start(3, &["--lease-secs", "2"]);
    for node in 0..3 {
        cluster.wait_for_live_nodes(node, 3).await;
    }
    let targets = Targets {
        appenders: [cluster.endpoint(0), cluster.endpoint(1)],
        readers: [cluster.endpoint(1), cluster.endpoint(2)],
        fencer: cluster.endpoint(2),
        session: cluster.endpoint(1),
        resp_port: cluster.nodes[2].resp_port,
    };
    record_and_check(targets, |round| cluster.nodes[round % 3].restart()).await;
}

/// Runs every kind of client on one stream through `targets`, calling `restart` after
/// each round but the last, then checks the whole history is linearizable.
async fn record_and_check(targets: Targets, mut restart: impl FnMut(usize)) {
    let endpoint = targets.fencer.clone();
    streamgate_tests::create_streams(&endpoint, BASIN, &[STREAM]).await;
    let recorder = Arc::new(Recorder::default());
    let mut clients = Vec::new();
    for id in 0..2 {
        clients.push(tokio::spawn(rest_appender(
            targets.appenders[id].clone(),
            id,
            recorder.clone(),
        )));
        clients.push(tokio::spawn(reader(
            targets.readers[id].clone(),
            id,
            recorder.clone(),
        )));
    }
    clients.push(tokio::spawn(fencer(endpoint.clone(), recorder.clone())));
    clients.push(tokio::spawn(session_appender(
        targets.session.clone(),
        recorder.clone(),
    )));
    clients.push(tokio::spawn(resp_appender(
        targets.resp_port,
        recorder.clone(),
    )));

    // Every kind of client must keep getting answers in every round, after every
    // restart: a front end that stopped working would otherwise go unnoticed.
    let kinds = [
        "rest append",
        "fence",
        "fenced append",
        "refused fenced append",
        "trim",
        "session append",
        "resp xadd",
        "read",
        "check-tail",
    ];
    let mut before = recorder.acked();
    for round in 0..=KILLS {
        tokio::time::sleep(ROUND).await;
        // The rarer kinds (one fencer call in ten is a refused fenced append) may need
        // longer after a restart, when a stream waits for its takeover: a round lasts
        // until every kind was answered, up to `MAX_ROUND`.
        let round_ends = Instant::now() + MAX_ROUND - ROUND;
        let unanswered = |now: &HashMap<&'static str, usize>| -> Vec<&str> {
            kinds
                .into_iter()
                .filter(|kind| {
                    now.get(kind).copied().unwrap_or(0) <= before.get(kind).copied().unwrap_or(0)
                })
                .collect()
        };
        let mut now = recorder.acked();
        while !unanswered(&now).is_empty() && Instant::now() < round_ends {
            tokio::time::sleep(Duration::from_millis(100)).await;
            now = recorder.acked();
        }
        let missing = unanswered(&now);
        assert!(
            missing.is_empty(),
            "round {round}: no {missing:?} was answered within {MAX_ROUND:?} ({now:?})"
        );
        before = now;
        if round < KILLS {
            tokio::task::block_in_place(|| restart(round));
        }
    }
    let last_round_ends = Instant::now() + MAX_ROUND;
    while recorder.acked().values().sum::<usize>() < MIN_ANSWERED
        && Instant::now() < last_round_ends
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    recorder.stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    read_everything(&endpoint, &recorder).await;

    let history = recorder.ops.lock().unwrap().clone();
    let checked = check(&history).unwrap_or_else(|e| {
        // The whole history, for reading what went wrong.
        let path =
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("linearizability-history.txt");
        let origin = history.iter().map(|op| op.called).min().unwrap();
        let mut sorted = history.clone();
        sorted.sort_by_key(|op| op.called);
        let text: String = sorted
            .iter()
            .map(|op| {
                let ms = |t: Instant| t.saturating_duration_since(origin).as_secs_f64() * 1000.0;
                format!(
                    "{} [{:.3} .. {:.3}] {:?} -> {:?}\n",
                    op.client,
                    ms(op.called),
                    ms(op.returned),
                    op.call,
                    op.outcome
                )
            })
            .collect();
        std::fs::write(&path, text).unwrap();
        panic!("{e}the history is in {}", path.display())
    });
    let count = |f: &dyn Fn(&Operation) -> bool| history.iter().filter(|op| f(op)).count();
    let acked_appends = count(&|op| matches!(op.outcome, Outcome::Appended { .. }));
    let reads = count(&|op| matches!(op.outcome, Outcome::Records(_)));
    let refusals = count(&|op| {
        matches!(
            op.outcome,
            Outcome::SeqNumMismatch { .. } | Outcome::FencingTokenMismatch { .. }
        )
    });
    eprintln!(
        "linearizable: {} operations with known outcomes ({acked_appends} acknowledged appends, \
         {reads} reads, {refusals} refused conditions), {} unknown appends of which {} took \
         effect; {} search steps; acknowledged by kind: {:?}",
        checked.known,
        checked.unknown_appends,
        checked.unknown_applied,
        checked.steps,
        recorder.acked()
    );
    assert!(
        checked.known >= MIN_ANSWERED,
        "only {} operations were answered",
        checked.known
    );
    assert!(
        acked_appends >= 1000,
        "only {acked_appends} appends were acknowledged"
    );
    assert!(
        reads >= 300 && refusals >= 20,
        "too few reads ({reads}) or refusals ({refusals})"
    );
}
