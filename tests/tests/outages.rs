//! Outages of the services streamgate depends on, played by a TCP proxy between them:
//! first connections refused for 20 s (the service is down), then a black hole for 20 s
//! (connections accepted, nothing answered: a network partition), then healthy again.
//! Writers append throughout. streamgate must ride it out without a restart:
//!
//! - object store (S3) away: appends are refused retryably (`503 unavailable`, RESP
//!   `TRYAGAIN`) or wait; nothing sent during the outage is acknowledged before the store
//!   is back; readiness says why; appends resume by themselves afterwards;
//! - metadata store (PostgreSQL) away for less than the node's lease: appends to
//!   existing streams go on (metadata is not on the append path, and tokens verified
//!   earlier stay honoured); control-plane calls fail retryably within a bounded time
//!   instead of hanging; everything resumes after.
//!
//! Afterwards the server is killed with `kill -9` and restarted, and every acknowledged
//! record must be present exactly once at its position, and every refused one absent.
//!
//! A store that goes away while a restarted server takes its streams back is waited
//! for: the server starts once the store is back, with every acknowledged record.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use streamgate_tests::history::{read_all, verify, History};
use streamgate_tests::proxy::{
    server_with_metadata_behind_proxy_and_flags, server_with_objects_behind_proxy, Mode, Proxy,
};
use streamgate_tests::resp::{Connection, Reply};
use streamgate_tests::Server;
use tokio::sync::watch;

const BASIN: &str = "outage-test";
const STREAMS: usize = 3;
const OUTAGE_PHASE: Duration = Duration::from_secs(20);
/// The store's health between the spells of an outage.
const HEALED: Duration = Duration::from_secs(5);
/// When, into a spell, front ends are probed: after the server can have noticed it (an
/// S3 request into a black hole is abandoned after 5 s).
const PROBE_AFTER: Duration = Duration::from_secs(8);
/// How long, at most, the server may take to serve again after the store is back before
/// the test gives up (a liveness bound; the time itself is measured by `outage_bench`).
const RECOVERY_LIMIT: Duration = Duration::from_secs(60);

/// One append attempt as a writer saw it.
#[derive(Debug, Clone)]
struct Attempt {
    sent_at: Instant,
    answered_at: Instant,
    outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Acked,
    /// Refused with a retryable error: `503 unavailable`, or RESP `TRYAGAIN`.
    Refused,
    /// No answer (the client gave up): the append's fate is unknown.
    Unknown,
}

#[derive(Default)]
struct Log {
    history: History,
    attempts: Vec<Attempt>,
}

type SharedLog = Arc<Mutex<Log>>;

impl Log {
    fn record(
        &mut self,
        batch: String,
        stream: usize,
        sent_at: Instant,
        result: Outcome,
        seq: Option<u64>,
    ) {
        match result {
            Outcome::Acked => {
                let seq = seq.expect("an ack has a position");
                self.history.acked.insert(batch, (stream, seq, seq + 1));
            }
            Outcome::Refused => self.history.refused.push(batch),
            Outcome::Unknown => {}
        }
        self.attempts.push(Attempt {
            sent_at,
            answered_at: Instant::now(),
            outcome: result,
        });
    }
}

/// One unary REST append of one record (`{batch}/0`) to stream `s{stream}`, logged.
async fn rest_append(
    client: &reqwest::Client,
    endpoint: &str,
    stream: usize,
    batch: String,
    log: &SharedLog,
) -> Outcome {
    log.lock().unwrap().history.sent.insert(batch.clone(), 1);
    let sent_at = Instant::now();
    let response = client
        .post(format!("{endpoint}/v1/streams/s{stream}/records"))
        .header("s2-basin", BASIN)
        .json(&json!({ "records": [{ "body": format!("{batch}/0") }] }))
        .send()
        .await;
    let (outcome, seq) = match response {
        Ok(r) if r.status() == 200 => {
            let ack: Value = r.json().await.unwrap();
            (Outcome::Acked, ack["start"]["seq_num"].as_u64())
        }
        Ok(r) if r.status() == 503 => {
            assert!(
                r.headers().contains_key("retry-after"),
                "a 503 says when to retry"
            );
            let error: Value = r.json().await.unwrap();
            assert_eq!(error["code"], "unavailable", "{error}");
            (Outcome::Refused, None)
        }
        Ok(r) => panic!(
            "append answered {}: {}",
            r.status(),
            r.text().await.unwrap_or_default()
        ),
        Err(_) => (Outcome::Unknown, None),
    };
    log.lock()
        .unwrap()
        .record(batch, stream, sent_at, outcome.clone(), seq);
    outcome
}

/// Unary REST appends to stream `s{stream}`, one after another, until `stop`.
async fn rest_writer(
    endpoint: String,
    stream: usize,
    id: usize,
    log: SharedLog,
    stop: watch::Receiver<bool>,
) {
    // Longer than the whole outage: an append accepted before the store went away is
    // answered once it is durable.
    let client = streamgate_tests::client_builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let mut n = 0;
    while !*stop.borrow() {
        n += 1;
        if rest_append(&client, &endpoint, stream, format!("w{id}n{n}"), &log).await
            == Outcome::Refused
        {
            tokio::time::sleep(Duration::from_millis(100)).await; // as a client backs off
        }
    }
}

/// An authenticated RESP connection (the root token, the test basin).
async fn resp_connect(port: u16) -> Connection {
    Connection::open(port, Some(BASIN))
        .await
        .expect("AUTH succeeds on a RESP connection")
}

/// One unpipelined `XADD s{stream} * b {batch}/0` on `connection`, logged.
async fn resp_xadd(
    connection: &mut Connection,
    stream: usize,
    batch: String,
    log: &SharedLog,
) -> Outcome {
    log.lock().unwrap().history.sent.insert(batch.clone(), 1);
    let sent_at = Instant::now();
    let reply = connection
        .call(&[
            "XADD",
            &format!("s{stream}"),
            "*",
            "b",
            &format!("{batch}/0"),
        ])
        .await
        .unwrap();
    let (outcome, seq) = match reply {
        Reply::Bulk(Some(id)) => {
            let id = String::from_utf8(id).unwrap();
            let seq = id.rsplit('-').next().unwrap().parse().unwrap();
            (Outcome::Acked, Some(seq))
        }
        Reply::Error(error) if error.starts_with("TRYAGAIN") => (Outcome::Refused, None),
        other => panic!("XADD answered {other:?}"),
    };
    log.lock()
        .unwrap()
        .record(batch, stream, sent_at, outcome.clone(), seq);
    outcome
}

/// Unpipelined `XADD`s to stream `s{stream}` over one RESP connection until `stop`.
async fn resp_writer(
    port: u16,
    stream: usize,
    id: usize,
    log: SharedLog,
    stop: watch::Receiver<bool>,
) {
    let mut connection = resp_connect(port).await;
    let mut n = 0;
    while !*stop.borrow() {
        n += 1;
        if resp_xadd(&mut connection, stream, format!("r{id}n{n}"), &log).await == Outcome::Refused
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Writers on every stream: REST on each, and RESP on the last.
fn start_writers(
    server: &Server,
    log: &SharedLog,
    stop: &watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut writers: Vec<_> = (0..STREAMS)
        .map(|s| {
            tokio::spawn(rest_writer(
                server.endpoint.clone(),
                s,
                s,
                log.clone(),
                stop.clone(),
            ))
        })
        .collect();
    writers.push(tokio::spawn(resp_writer(
        server.resp_port,
        STREAMS - 1,
        0,
        log.clone(),
        stop.clone(),
    )));
    writers
}

/// Streams `s0`.. `s{STREAMS-1}` in the test basin.
async fn create_test_streams(server: &Server) {
    let names: Vec<String> = (0..STREAMS).map(|s| format!("s{s}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    streamgate_tests::create_streams(&server.endpoint, BASIN, &names).await;
}

/// What `/ready` answered over a period: (ready, reason).
fn watch_readiness(
    endpoint: String,
    stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Vec<(Instant, bool, String)>> {
    tokio::spawn(async move {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let mut seen = Vec::new();
        while !*stop.borrow() {
            if let Ok(response) = client.get(format!("{endpoint}/ready")).send().await {
                let ready = response.status() == 200;
                let body: Value = response.json().await.unwrap_or_default();
                seen.push((
                    Instant::now(),
                    ready,
                    body["reason"].as_str().unwrap_or("").to_owned(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        seen
    })
}

/// One spell of an outage: its kind, and when it began and ended.
#[derive(Debug, Clone, Copy)]
struct Spell {
    mode: Mode,
    began: Instant,
    ended: Instant,
}

/// Plays the outage on `proxy`: 20 s refused, then (after `HEALED` of health, so each
/// spell starts from a working store and must be noticed afresh) 20 s of black hole,
/// running `before_cut` just before each spell begins and `during` `PROBE_AFTER` into it.
async fn play_outage(
    proxy: &Proxy,
    mut before_cut: impl AsyncFnMut(),
    mut during: impl AsyncFnMut(Mode),
) -> Vec<Spell> {
    let mut spells = Vec::new();
    for (n, mode) in [Mode::Refuse, Mode::BlackHole].into_iter().enumerate() {
        if n > 0 {
            tokio::time::sleep(HEALED).await;
        }
        before_cut().await;
        let began = Instant::now();
        proxy.set(mode);
        tokio::time::sleep(PROBE_AFTER).await;
        during(mode).await;
        tokio::time::sleep_until((began + OUTAGE_PHASE).into()).await;
        let ended = Instant::now();
        proxy.set(Mode::Forward);
        spells.push(Spell { mode, began, ended });
    }
    spells
}

/// Waits until an append sent after `back` is acknowledged; how long after `back` its
/// ack came.
async fn first_ack_after(log: &SharedLog, back: Instant) -> Duration {
    let deadline = back + RECOVERY_LIMIT;
    loop {
        let first = log
            .lock()
            .unwrap()
            .attempts
            .iter()
            .filter(|a| a.sent_at >= back && a.outcome == Outcome::Acked)
            .map(|a| a.answered_at)
            .min();
        if let Some(at) = first {
            return at - back;
        }
        assert!(
            Instant::now() < deadline,
            "appends did not resume within {RECOVERY_LIMIT:?} of the store's return"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// After `kill -9` and a restart, every acknowledged record is present once at its
/// position, every refused one is absent; returns how many are present.
async fn verify_after_kill9(server: &mut Server, log: &SharedLog) -> usize {
    server.restart();
    let mut streams = Vec::new();
    for s in 0..STREAMS {
        streams.push(read_all(&server.endpoint, BASIN, s).await);
    }
    verify(&log.lock().unwrap().history, &streams)
}

fn count(log: &SharedLog, what: impl Fn(&Attempt) -> bool) -> usize {
    log.lock()
        .unwrap()
        .attempts
        .iter()
        .filter(|a| what(a))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_object_store_outage_is_weathered_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = format!("streamgate-test-outage-{}", std::process::id());
    let (proxy, mut server) = server_with_objects_behind_proxy(
        &streamgate_tests::backends::s3_endpoint(),
        dir.path(),
        &bucket,
    )
    .await;
    create_test_streams(&server).await;

    let log = SharedLog::default();
    let (stop, stopped) = watch::channel(false);
    let writers = start_writers(&server, &log, &stopped);
    let readiness = watch_readiness(server.endpoint.clone(), stopped.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Each writer has its one append waiting for the store; appends sent meanwhile are
    // refused at once, retryably, on every front end.
    let probe = streamgate_tests::client_builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut probe_outcomes = Vec::new();
    // An append sent just before each cut is on its way to the store when it goes away.
    // (The writers alone may all sit between a group commit's acks and their next
    // appends at that instant, with nothing in flight to wait.)
    let mut straddlers = Vec::new();
    let patient = streamgate_tests::client_builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let straddle = async || {
        let batch = format!("straddle-{}", straddlers.len());
        let (client, endpoint, shared) = (patient.clone(), server.endpoint.clone(), log.clone());
        let sent = batch.clone();
        straddlers.push(tokio::spawn(async move {
            rest_append(&client, &endpoint, 0, sent, &shared).await
        }));
        // It is logged as sent just before it goes out.
        while !log.lock().unwrap().history.sent.contains_key(&batch) {
            tokio::task::yield_now().await;
        }
    };
    let spells = play_outage(&proxy, straddle, async |phase| {
        let rest = rest_append(
            &probe,
            &server.endpoint,
            0,
            format!("probe-{phase:?}"),
            &log,
        )
        .await;
        let mut resp = resp_connect(server.resp_port).await;
        let xadd = resp_xadd(&mut resp, 1, format!("probe-resp-{phase:?}"), &log).await;
        probe_outcomes.push((phase, rest, xadd));
    })
    .await;
    let last_spell = *spells.last().unwrap();
    let recovery = first_ack_after(&log, last_spell.ended).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.send_replace(true);
    for writer in writers {
        writer.await.unwrap();
    }
    for straddler in straddlers {
        straddler.await.unwrap();
    }
    let readiness = readiness.await.unwrap();

    eprintln!(
        "S3 outage: {} acked, {} refused; first ack {recovery:?} after the store came back; \
         {} connections met the outage",
        count(&log, |a| a.outcome == Outcome::Acked),
        count(&log, |a| a.outcome == Outcome::Refused),
        proxy.faulted_connections()
    );
    assert!(
        count(&log, |a| a.outcome == Outcome::Acked
            && a.answered_at < spells[0].began)
            > 0,
        "appends were acknowledged before the outage"
    );
    for spell in &spells {
        let Spell { mode, began, ended } = *spell;
        let early = count(&log, |a| {
            a.outcome == Outcome::Acked && a.sent_at > began && a.answered_at < ended
        });
        assert_eq!(
            early, 0,
            "{mode:?}: nothing sent while the store was away was acknowledged before it came back"
        );
        let waited = count(&log, |a| {
            a.outcome == Outcome::Acked && a.sent_at < began && a.answered_at > ended
        });
        assert!(
            waited > 0,
            "{mode:?}: appends accepted before the store went away were acknowledged once it was back"
        );
        assert!(
            count(&log, |a| a.outcome == Outcome::Acked && a.sent_at >= ended) > 0,
            "{mode:?}: appends go on afterwards without a restart"
        );
        assert!(
            readiness
                .iter()
                .any(|(at, ready, reason)| *at > began + PROBE_AFTER
                    && *at < ended
                    && !ready
                    && reason.contains("record store")),
            "{mode:?}: readiness said why while the store was away: {readiness:?}"
        );
    }
    for (phase, rest, xadd) in &probe_outcomes {
        assert_eq!(
            *rest,
            Outcome::Refused,
            "{phase:?}: a REST append is refused retryably"
        );
        assert_eq!(
            *xadd,
            Outcome::Refused,
            "{phase:?}: an XADD is refused retryably"
        );
    }
    let last = readiness.last().expect("readiness was sampled");
    assert!(last.1, "ready again after the outage: {last:?}");

    let present = verify_after_kill9(&mut server, &log).await;
    eprintln!("after kill -9: {present} batches present");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_metadata_store_outage_within_the_lease_leaves_appends_running() {
    let database = format!("streamgate_test_outage_{}", std::process::id());
    let dir = tempfile::tempdir().unwrap();
    // A lease longer than both outages together: appends must go on throughout.
    // (What happens past the lease is `cluster.rs`'s metadata cut.)
    let (proxy, mut server) = server_with_metadata_behind_proxy_and_flags(
        &streamgate_tests::backends::postgres_server(),
        dir.path(),
        &database,
        &["--lease-secs", "120", "--metrics-listen", "127.0.0.1:0"],
    )
    .await;
    create_test_streams(&server).await;

    let log = SharedLog::default();
    let (stop, stopped) = watch::channel(false);
    let writers = start_writers(&server, &log, &stopped);
    tokio::time::sleep(Duration::from_secs(2)).await;

    // In each phase of the outage, a control-plane call is answered (refused
    // retryably) rather than left hanging.
    let control = streamgate_tests::client_builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let create = |name: String| {
        control
            .post(format!("{}/v1/streams", server.endpoint))
            .header("s2-basin", BASIN)
            .json(&json!({ "stream": name }))
            .send()
    };
    let mut control_answers = Vec::new();
    let spells = play_outage(
        &proxy,
        async || {},
        async |phase| {
            let response = create(format!("during-{phase:?}").to_lowercase())
                .await
                .expect("a control-plane call is answered during the outage");
            let status = response.status();
            let body: Value = response.json().await.unwrap();
            control_answers.push((phase, status, body));
        },
    )
    .await;

    // The control plane comes back by itself.
    let back = spells.last().unwrap().ended;
    let deadline = back + RECOVERY_LIMIT;
    let control_recovery = loop {
        let response = create("after".into()).await;
        if response.is_ok_and(|r| r.status() == 201 || r.status() == 409) {
            break back.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "the control plane did not come back within {RECOVERY_LIMIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.send_replace(true);
    for writer in writers {
        writer.await.unwrap();
    }

    let during = |a: &Attempt| {
        spells
            .iter()
            .any(|s| a.sent_at > s.began && a.sent_at < s.ended)
    };
    let acked_during = count(&log, |a| during(a) && a.outcome == Outcome::Acked);
    let failed = count(&log, |a| a.outcome != Outcome::Acked);
    eprintln!(
        "PostgreSQL outage: {acked_during} appends acked during it, {failed} not; control plane back \
         {control_recovery:?} after; answers during it: {control_answers:?}"
    );
    for (phase, status, body) in &control_answers {
        assert_eq!(*status, 503, "{phase:?}: {body}");
        assert_eq!(body["code"], "unavailable", "{phase:?}: {body}");
    }
    assert!(acked_during > 0, "appends went on during the outage");
    assert_eq!(
        failed, 0,
        "no append failed because the metadata store was away (within the lease)"
    );

    // Compaction caught up once the store was back: the WAL empties into segments.
    let objects = dir.path().join("objects");
    let deadline = Instant::now() + RECOVERY_LIMIT;
    while server.local_wal_chunks(&objects).await > 0 {
        assert!(
            Instant::now() < deadline,
            "compaction resumed after the outage"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let present = verify_after_kill9(&mut server, &log).await;
    eprintln!("after kill -9: {present} batches present");
}

/// The object store goes away while a node restarted after `kill -9` takes its streams
/// back (a test hook holds the takeover for 6 s after the store was first reached): the
/// node waits for the store, retrying, instead of exiting, and once the store is back
/// it starts with every acknowledged record.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_away_during_start_up_is_waited_for() {
    // When the store goes away after the restart (the node reached it at start long
    // before), and for how long.
    const AWAY_FROM: Duration = Duration::from_secs(3);
    const AWAY_FOR: Duration = Duration::from_secs(8);
    let dir = tempfile::tempdir().unwrap();
    let bucket = format!("streamgate-test-start-outage-{}", std::process::id());
    let (proxy, mut server) = server_with_objects_behind_proxy(
        &streamgate_tests::backends::s3_endpoint(),
        dir.path(),
        &bucket,
    )
    .await;
    create_test_streams(&server).await;
    let log = SharedLog::default();
    let client = streamgate_tests::client();
    for n in 0..30 {
        let batch = format!("b{n}");
        let outcome = rest_append(&client, &server.endpoint, n % STREAMS, batch, &log).await;
        assert!(matches!(outcome, Outcome::Acked), "append {n}");
    }
    server.kill9();
    server.set_env("STREAMGATE_PAUSE_AT", Some("takeover-claimed:6000"));
    let proxy = Arc::new(proxy);
    let store = proxy.clone();
    let outage = tokio::spawn(async move {
        tokio::time::sleep(AWAY_FROM).await;
        store.set(Mode::Refuse);
        tokio::time::sleep(AWAY_FOR).await;
        store.set(Mode::Forward);
    });
    let restarting = Instant::now();
    tokio::task::block_in_place(|| server.restart());
    let waited = restarting.elapsed();
    outage.await.unwrap();
    assert!(
        waited >= AWAY_FROM + AWAY_FOR,
        "the node started {waited:?} after the restart, before the store was back"
    );
    eprintln!(
        "started {:.1} s after the restart, the store away from {AWAY_FROM:?} for {AWAY_FOR:?}",
        waited.as_secs_f64()
    );
    let mut streams = Vec::new();
    for s in 0..STREAMS {
        streams.push(read_all(&server.endpoint, BASIN, s).await);
    }
    let records = verify(&log.lock().unwrap().history, &streams);
    assert_eq!(records, 30);
}
