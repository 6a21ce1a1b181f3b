//! Faults in the services streamgate depends on, met while clients append: PostgreSQL
//! connections cut again and again, and an S3 server that answers with 5xx, resets and
//! stalls. Afterwards the server is killed with `kill -9` and started again, so what is
//! read back comes from storage, not from the memory of the process that acknowledged
//! it: every acknowledged append must be there exactly once, at its position.
//! (Process crashes: `crash.rs`; long outages: `outages.rs`.)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use streamgate_tests::history::{read_all, verify, History};
use streamgate_tests::proxy::{
    server_with_metadata_behind_proxy, server_with_objects_behind_proxy, Mode,
};
use streamgate_tests::Server;
use tokio::sync::watch;

const BASIN: &str = "fault-basin";
/// How many times the PostgreSQL connections are cut.
const CUTS: usize = 4;
/// Appends acknowledged between two cuts (and after the last), so each cut comes while
/// appends are under way and appends are seen to go on after it.
const PROGRESS: usize = 20;
/// A liveness bound: how long the test waits for progress before it gives up.
const GIVE_UP: Duration = Duration::from_secs(60);

type SharedHistory = Arc<Mutex<History>>;

/// One-record unary appends (`{writer}-{n}/0`) to `s{stream}` until `stop`, each logged
/// in `history`. Every append must be acknowledged or refused retryably (`503
/// unavailable` with `Retry-After`, which a refused append never lands with); anything
/// else fails the test. Returns how many were refused.
async fn append_until(
    endpoint: String,
    stream: usize,
    writer: String,
    history: SharedHistory,
    stop: watch::Receiver<bool>,
) -> usize {
    let client = streamgate_tests::client();
    let mut refused = 0;
    for n in 0.. {
        if *stop.borrow() {
            break;
        }
        let batch = format!("{writer}-{n}");
        history.lock().unwrap().sent.insert(batch.clone(), 1);
        let response = client
            .post(format!("{endpoint}/v1/streams/s{stream}/records"))
            .header("s2-basin", BASIN)
            .json(&json!({"records": [{"body": format!("{batch}/0")}]}))
            .send()
            .await
            .expect("the server answers every append");
        let status = response.status();
        if status == 200 {
            let ack: Value = response.json().await.unwrap();
            let start = ack["start"]["seq_num"].as_u64().unwrap();
            history
                .lock()
                .unwrap()
                .acked
                .insert(batch, (stream, start, start + 1));
            continue;
        }
        let retry_after = response.headers().contains_key("retry-after");
        let error: Value = response.json().await.unwrap_or_default();
        assert!(
            status == 503 && error["code"] == "unavailable" && retry_after,
            "an append is acknowledged or refused retryably, not {status} {error}"
        );
        history.lock().unwrap().refused.push(batch);
        refused += 1;
        tokio::time::sleep(Duration::from_millis(50)).await; // as a client backs off
    }
    refused
}

/// One writer per entry of `streams`, appending to that stream until `stop`; each
/// returns how many of its appends were refused.
fn start_writers(
    endpoint: &str,
    streams: &[usize],
    history: &SharedHistory,
    stop: &watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<usize>> {
    streams
        .iter()
        .enumerate()
        .map(|(w, &s)| {
            tokio::spawn(append_until(
                endpoint.to_owned(),
                s,
                format!("w{w}"),
                history.clone(),
                stop.clone(),
            ))
        })
        .collect()
}

/// Waits until `done` holds (polling); `what` says what the test waited for if it
/// never does within the liveness bound.
async fn until(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + GIVE_UP;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until at least `count` appends are acknowledged in all; how many are.
async fn acked_at_least(history: &SharedHistory, count: usize) -> usize {
    let acked = || history.lock().unwrap().acked.len();
    until(&format!("{count} appends acknowledged"), || {
        acked() >= count
    })
    .await;
    acked()
}

/// Kills the server with `kill -9`, starts it again on the same storage and checks every
/// stream against the history; how many batches are present.
async fn verify_after_kill9(server: &mut Server, streams: usize, history: &SharedHistory) -> usize {
    server.restart();
    let mut records = Vec::new();
    for s in 0..streams {
        records.push(read_all(&server.endpoint, BASIN, s).await);
    }
    verify(&history.lock().unwrap(), &records)
}

/// Ends every connection of the server to `database` from the PostgreSQL side, as a
/// database restart or failover does; how many there were.
fn terminate_backends(postgres: &str, database: &str) -> usize {
    let killed = std::process::Command::new("psql")
        .arg(format!("{postgres}/postgres"))
        .args(["-qAtc", &format!(
            "select count(pg_terminate_backend(pid)) from pg_stat_activity where datname = '{database}'"
        )])
        .output()
        .expect("psql runs");
    String::from_utf8_lossy(&killed.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("psql: {}", String::from_utf8_lossy(&killed.stderr)))
}

/// Checks that the test basin lists every one of `streams`.
async fn assert_listed(endpoint: &str, streams: &[String]) {
    let listed = streamgate_tests::json_of(
        streamgate_tests::client()
            .get(format!("{endpoint}/v1/streams?limit=1000"))
            .header("s2-basin", BASIN),
    )
    .await;
    let names: Vec<&str> = listed["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    for stream in streams {
        assert!(
            names.contains(&stream.as_str()),
            "acknowledged stream {stream} is listed: {names:?}"
        );
    }
}

/// Control-plane calls that write metadata, one after another until `stop`: creates
/// streams `c{n}`, and adds to `created` those whose creation was acknowledged (201). A
/// call cut in the middle may fail, retryably (`503`, or `500 storage`: it may or may
/// not have happened), never otherwise.
async fn create_streams_until(
    endpoint: String,
    created: Arc<Mutex<Vec<String>>>,
    stop: watch::Receiver<bool>,
) {
    let client = streamgate_tests::client();
    for n in 0.. {
        if *stop.borrow() {
            break;
        }
        let name = format!("c{n}");
        let response = client
            .post(format!("{endpoint}/v1/streams"))
            .header("s2-basin", BASIN)
            .json(&json!({ "stream": name }))
            .send()
            .await
            .expect("the server answers every control-plane call");
        let status = response.status();
        let error: Value = response.json().await.unwrap_or_default();
        match status.as_u16() {
            201 => created.lock().unwrap().push(name),
            503 if error["code"] == "unavailable" => {}
            500 if error["code"] == "storage" => {}
            _ => panic!("creating {name}: {status} {error}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The connections to the metadata database are cut again and again while clients
/// append and a control-plane client creates streams: half the time from the PostgreSQL
/// side (as a database restart or failover does), half the time on the network (reset
/// by the proxy in between), so compaction commits, token checks and stream creations
/// are cut in flight. Appends never notice (metadata is not on the append path), every
/// kind of metadata work succeeds right after, and after `kill -9` every acknowledged
/// append and every acknowledged stream creation is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_connections_cut_under_load_are_reestablished_and_lose_nothing() {
    const STREAMS: usize = 2;
    let postgres = streamgate_tests::backends::postgres_server();
    let database = format!("streamgate_test_fault_{}", std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let (proxy, mut server) =
        server_with_metadata_behind_proxy(&postgres, dir.path(), &database).await;
    let endpoint = server.endpoint.clone();
    let client = streamgate_tests::client();
    streamgate_tests::create_streams(&endpoint, BASIN, &["s0", "s1"]).await;

    let history = SharedHistory::default();
    let (stop, stopped) = watch::channel(false);
    let writers = start_writers(&endpoint, &[0, 1], &history, &stopped);
    let created = Arc::new(Mutex::new(Vec::new()));
    let control = tokio::spawn(create_streams_until(
        endpoint.clone(),
        created.clone(),
        stopped.clone(),
    ));
    // Before each cut (and after the last), appends and stream creations made progress
    // since the one before: each cut comes with both under way, and neither stops.
    let mut progress = (0, 0);
    let mut await_progress = async || {
        let (acked, streams) = progress;
        let acked = acked_at_least(&history, acked + PROGRESS).await;
        let creations = || created.lock().unwrap().len();
        until("streams created", || creations() >= streams + 3).await;
        progress = (acked, creations());
    };
    for cut in 0..CUTS {
        await_progress().await;
        let (how, connections) = if cut % 2 == 0 {
            (
                "terminated by PostgreSQL",
                terminate_backends(&postgres, &database),
            )
        } else {
            ("reset on the network", proxy.cut().await)
        };
        eprintln!("cut {cut}: {connections} connections {how}");
        assert!(
            connections > 0,
            "cut {cut}: the server had connections to cut"
        );
    }
    await_progress().await;
    stop.send_replace(true);
    for writer in writers {
        assert_eq!(
            writer.await.unwrap(),
            0,
            "no append was refused because metadata connections were cut"
        );
    }
    control.await.unwrap();
    let created = created.lock().unwrap().clone();

    // Metadata writes and reads, and token lookups, all succeed at once.
    streamgate_tests::create_streams(&endpoint, BASIN, &["after"]).await;
    let mut expected = created.clone();
    expected.push("after".into());
    assert_listed(&endpoint, &expected).await;
    let issued = client
        .post(format!("{endpoint}/v1/access-tokens"))
        .json(&json!({"id": "after-fault", "scope": {"streams": {"prefix": ""}, "basins": {"prefix": ""}, "ops": ["append"]}}))
        .send()
        .await
        .unwrap();
    assert_eq!(issued.status(), 201);
    let token = issued.json::<Value>().await.unwrap()["access_token"]
        .as_str()
        .unwrap()
        .to_owned();
    let appended = reqwest::Client::new()
        .post(format!("{endpoint}/v1/streams/after/records"))
        .header("s2-basin", BASIN)
        .header("authorization", format!("Bearer {token}"))
        .json(&json!({"records": [{"body": "x"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(appended.status(), 200);

    let present = verify_after_kill9(&mut server, STREAMS, &history).await;
    assert_listed(&endpoint, &expected).await;
    eprintln!(
        "{present} appends present after kill -9; {} streams created during the cuts",
        created.len()
    );
}

/// Appends run while the object store answers with 5xx, resets and multi-second
/// stalls. Each append is acknowledged (once durable) or refused retryably; after the
/// faults appends go on without a restart; and after `kill -9` everything acknowledged
/// is there exactly once, in order, and nothing refused is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_store_faults_lose_no_acknowledged_append() {
    const WRITERS: usize = 4;
    let dir = tempfile::tempdir().unwrap();
    let bucket = format!("streamgate-test-fault-{}", std::process::id());
    let (proxy, mut server) = server_with_objects_behind_proxy(
        &streamgate_tests::backends::s3_endpoint(),
        dir.path(),
        &bucket,
    )
    .await;
    let endpoint = server.endpoint.clone();
    streamgate_tests::create_streams(&endpoint, BASIN, &["s0"]).await;

    let history = SharedHistory::default();
    let (stop, stopped) = watch::channel(false);
    // All writers append to one stream, so the check below sees them interleaved.
    let writers = start_writers(&endpoint, &[0; WRITERS], &history, &stopped);
    let before_faults = acked_at_least(&history, PROGRESS).await;
    proxy.set(Mode::Faulty);
    // The length of the faulty spell (what the test plays, not something it checks).
    tokio::time::sleep(Duration::from_secs(4)).await;
    proxy.set(Mode::Forward);
    // Each writer has at most one append in flight, so past this many acks, appends sent
    // after the store healed were acknowledged.
    let healed_at = history.lock().unwrap().acked.len();
    acked_at_least(&history, healed_at + WRITERS + PROGRESS).await;
    stop.send_replace(true);
    let mut refused = 0;
    for writer in writers {
        refused += writer.await.unwrap();
    }
    let injected = proxy.faulted_connections();
    eprintln!(
        "{} appends acknowledged ({before_faults} before the faults), {refused} refused; \
         {injected} connections met a fault",
        history.lock().unwrap().acked.len(),
    );
    // Faulty connections take the faults in turn (503, reset, stall): three in a row
    // meet each kind.
    assert!(
        injected >= 3,
        "the server's requests met every kind of fault ({injected} faulty connections)"
    );

    let present = verify_after_kill9(&mut server, 1, &history).await;
    eprintln!("after kill -9: {present} appends present");
}
