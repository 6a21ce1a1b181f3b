//! The cluster: three streamgate nodes on one PostgreSQL database and one S3 bucket (a
//! moto server), each with its own ports and data directory.
//! - Every operation works through every node: the control plane on one, appends on
//!   another, reads and check-tails on a third, unary and in sessions, Redis Streams
//!   (XADD, XRANGE, XREAD BLOCK) and OTLP exports that touch several streams, and what
//!   one node acknowledged the others read at once (requests are forwarded to a
//!   stream's owner).
//! - Writers spread over all nodes keep appending while nodes fail one after another:
//!   `kill -9`, `SIGSTOP` past the lease (a zombie that wakes up), PostgreSQL cut off
//!   past the lease, and a rolling restart with SIGTERM. Each time, every stream takes
//!   appends again through the others, and a zombie or cut-off node finds its streams
//!   taken when it comes back and stops. A node stopped with SIGTERM hands its streams
//!   over first: through the other nodes, not one append fails. Afterwards every stream, read from every node,
//!   holds every acknowledged batch exactly once at its acknowledged position, so no
//!   position was acknowledged twice.
//! - A node that joins takes an even share of the streams from the others, with no
//!   failed append, and loses nothing when it is killed afterwards.
//! - A node whose start-up takeover outlasts its lease still starts (it renews the
//!   lease meanwhile), and a takeover that fails part way is made again.
//! - Nodes serving HTTPS pass requests to each other over TLS, checking each other's
//!   certificate against `--peer-ca`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::{json, Value};
use streamgate_tests::cluster::Cluster;
use streamgate_tests::history::{read_all, send_rest_batch, verify, History, Sent};
use streamgate_tests::proxy::{Mode, Proxy};
use streamgate_tests::resp::{Connection, Reply};
use streamgate_tests::s2s::AppendSession;
use streamgate_tests::{backends, client, Server};

const BASIN: &str = "cluster-test";
const NODES: usize = 3;
/// Short, so failover is quick: a node silent this long loses its streams. Only the
/// tests that wait for a failover use it; the others keep the default (10 s), so that a
/// node held up for a second or two on a loaded machine is not fenced (and stops) in
/// the middle of a test about something else.
const LEASE_SECS: &str = "2";

/// Every bulk string in a reply, nested ones too.
fn bulk_strings(reply: &Reply) -> Vec<String> {
    match reply {
        Reply::Bulk(Some(bytes)) => vec![String::from_utf8_lossy(bytes).into_owned()],
        Reply::Array(Some(items)) => items.iter().flat_map(bulk_strings).collect(),
        _ => Vec::new(),
    }
}

/// Sends `blocking` (an XREAD or XREADGROUP with BLOCK) on `blocker`, then XADDs `body`
/// to `stream` through `adder`, and checks that the blocked read wakes up with it.
async fn woken_by_xadd(
    blocker: &mut Connection,
    blocking: &[&str],
    adder: &mut Connection,
    stream: &str,
    body: &str,
) {
    blocker.send(blocking).await.unwrap();
    // Time for the read to block before the entry comes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    adder.call(&["XADD", stream, "*", "b", body]).await.unwrap();
    let woken = tokio::time::timeout(Duration::from_secs(20), blocker.reply())
        .await
        .unwrap_or_else(|_| panic!("{} through another node wakes up", blocking[0]))
        .unwrap();
    assert!(
        bulk_strings(&woken).iter().any(|b| b == body),
        "{}: {woken:?}",
        blocking[0]
    );
}

fn stream_names(count: usize) -> Vec<String> {
    (0..count).map(|s| format!("s{s}")).collect()
}

async fn append(endpoint: &str, stream: &str, bodies: &[String]) -> reqwest::Response {
    let records: Vec<Value> = bodies.iter().map(|b| json!({ "body": b })).collect();
    client()
        .post(format!("{endpoint}/v1/streams/{stream}/records"))
        .header("s2-basin", BASIN)
        .json(&json!({ "records": records }))
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .unwrap()
}

async fn tail(endpoint: &str, stream: &str) -> u64 {
    let response = client()
        .get(format!("{endpoint}/v1/streams/{stream}/records/tail"))
        .header("s2-basin", BASIN)
        .send()
        .await
        .unwrap();
    assert!(
        response.status().is_success(),
        "check-tail: {}",
        response.status()
    );
    let tail: Value = response.json().await.unwrap();
    tail["tail"]["seq_num"].as_u64().unwrap()
}

/// The node that served a request, as its answer names it.
fn served_by(answer: &reqwest::Response) -> String {
    answer.headers()["streamgate-served-by"]
        .to_str()
        .unwrap()
        .to_owned()
}

async fn bodies_of(endpoint: &str, stream: &str) -> Vec<String> {
    streamgate_tests::read_stream(endpoint, BASIN, stream)
        .await
        .iter()
        // Redis entries keep their fields in headers and have no body.
        .map(|r| r["body"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_node_serves_every_operation_and_reads_its_peers_writes() {
    let cluster = Cluster::start(NODES, &["--metrics-listen", "127.0.0.1:0"]);
    for node in 0..NODES {
        cluster.wait_for_live_nodes(node, NODES).await;
    }
    let view = cluster.view(1).await;
    let urls: Vec<&str> = view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["advertise_url"].as_str().unwrap())
        .collect();
    for node in 0..NODES {
        assert!(
            urls.contains(&cluster.endpoint(node).as_str()),
            "{} advertises itself: {view}",
            cluster.endpoint(node)
        );
    }

    // The control plane on node 0.
    let names = stream_names(6);
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    streamgate_tests::create_streams(&cluster.endpoint(0), BASIN, &refs).await;

    // Appends on one node, check-tail and reads on the others, at once.
    for (s, stream) in names.iter().enumerate() {
        for writer in 0..NODES {
            let body = format!("{stream} from node {writer}");
            let response = append(
                &cluster.endpoint(writer + s),
                stream,
                std::slice::from_ref(&body),
            )
            .await;
            assert!(
                response.status().is_success(),
                "append: {}",
                response.status()
            );
            let ack: Value = response.json().await.unwrap();
            let end = ack["end"]["seq_num"].as_u64().unwrap();
            assert_eq!(tail(&cluster.endpoint(writer + s + 1), stream).await, end);
            let read = bodies_of(&cluster.endpoint(writer + s + 2), stream).await;
            assert_eq!(read.len() as u64, end, "a peer reads every record at once");
            assert_eq!(read.last(), Some(&body));
        }
    }

    // A request passed on by a node that went by an owner it remembered, or looked
    // before a hand-over: the node it reaches finds the stream held elsewhere and
    // passes it on once more (it used to refuse it).
    let stream = &names[1];
    let answer = append(&cluster.endpoint(0), stream, &["locate".into()]).await;
    let owner = served_by(&answer);
    let elsewhere = (0..NODES)
        .map(|n| cluster.endpoint(n))
        .find(|endpoint| *endpoint != owner)
        .unwrap();
    let answer = client()
        .post(format!("{elsewhere}/v1/streams/{stream}/records"))
        .header("s2-basin", BASIN)
        .header("streamgate-forwarded-by", "1")
        .json(&json!({ "records": [{ "body": "passed on" }] }))
        .send()
        .await
        .unwrap();
    assert!(answer.status().is_success(), "{}", answer.status());
    let passed_to = served_by(&answer);
    assert!(cluster.node_at(&passed_to).is_some(), "{passed_to}");

    // Requests for the stream that reach another node at once, once the owner it
    // remembers has aged out, share one lookup of the owner rather than each making
    // their own. Five rounds: with a lookup each, how many requests found none under
    // way depended on how quickly each was answered (1 to 200 per round here).
    let multiplexed = streamgate_tests::client_builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let check_tail = |endpoint: String| {
        multiplexed
            .get(format!("{endpoint}/v1/streams/{stream}/records/tail"))
            .header("s2-basin", BASIN)
            .send()
    };
    let answered_by = |answer: &reqwest::Response| {
        assert!(answer.status().is_success(), "{}", answer.status());
        served_by(answer)
    };
    let mut rounds = 0;
    for _ in 0..5 {
        let owner = answered_by(&check_tail(cluster.endpoint(0)).await.unwrap());
        let via = (0..NODES).find(|n| cluster.endpoint(*n) != owner).unwrap();
        // Opens the connection the requests then share.
        answered_by(&check_tail(cluster.endpoint(via)).await.unwrap());
        // Past the half second an owner is remembered for (`owner_cache` in the core).
        tokio::time::sleep(Duration::from_millis(700)).await;
        let before = cluster.owner_lookups(via).await;
        let began = Instant::now();
        let answers =
            futures::future::join_all((0..200).map(|_| check_tail(cluster.endpoint(via)))).await;
        // One lookup, and one more for each half second the round lasted (a slow
        // machine): the owner found is remembered that long.
        let allowed = 2 + (began.elapsed().as_millis() / 500) as u64;
        let moved = answers
            .into_iter()
            .any(|answer| answered_by(&answer.unwrap()) != owner);
        let lookups = cluster.owner_lookups(via).await - before;
        if moved {
            continue; // the nodes evened out their shares meanwhile: the round says nothing
        }
        rounds += 1;
        assert!(
            (1..=allowed).contains(&lookups),
            "200 requests at once looked the stream's owner up {lookups} times (at most {allowed})"
        );
    }
    assert!(
        rounds >= 4,
        "the stream moved in {} rounds of 5",
        5 - rounds
    );

    // An S2S append session through a node that does not sequence the stream.
    let session_stream = &names[0];
    let views: Vec<Value> = futures::future::join_all((0..NODES).map(|n| cluster.view(n))).await;
    let owner_of_s0 = views
        .iter()
        .position(|v| v["node"]["streams_served"].as_u64() > Some(0))
        .expect("some node serves streams");
    let mut session =
        AppendSession::open(&cluster.endpoint(owner_of_s0 + 1), BASIN, session_stream)
            .await
            .expect("a session through any node");
    for i in 0..20 {
        session
            .send(&[format!("session {i}").as_bytes()])
            .await
            .unwrap();
    }
    let mut last_end = 0;
    for _ in 0..20 {
        let (start, end) = session.ack().await.unwrap();
        assert!(start >= last_end);
        last_end = end;
    }
    drop(session);
    let read = bodies_of(&cluster.endpoint(owner_of_s0 + 2), session_stream).await;
    assert_eq!(read.len() as u64, last_end);
    assert_eq!(read.last().map(String::as_str), Some("session 19"));

    // Redis Streams through every node: XADD on one, XRANGE on the next, and an
    // XREAD BLOCK on a third that an XADD through the first wakes up.
    for (s, stream) in names.iter().enumerate() {
        let mut adder = Connection::open(cluster.nodes[s % NODES].resp_port, Some(BASIN))
            .await
            .unwrap();
        let id = adder
            .call(&["XADD", stream, "*", "b", &format!("xadd to {stream}")])
            .await
            .unwrap()
            .text();
        let mut ranger = Connection::open(cluster.nodes[(s + 1) % NODES].resp_port, Some(BASIN))
            .await
            .unwrap();
        let range = ranger.call(&["XRANGE", stream, &id, "+"]).await.unwrap();
        assert!(
            bulk_strings(&range).contains(&format!("xadd to {stream}")),
            "XRANGE through another node: {range:?}"
        );
        let mut blocker = Connection::open(cluster.nodes[(s + 2) % NODES].resp_port, Some(BASIN))
            .await
            .unwrap();
        woken_by_xadd(
            &mut blocker,
            &["XREAD", "BLOCK", "20000", "STREAMS", stream, "$"],
            &mut adder,
            stream,
            "wakes the reader",
        )
        .await;

        // Consumer groups through every node: a group lives with its stream, at the
        // node that sequences it, and group commands reaching another node run there.
        let created = adder
            .call(&["XGROUP", "CREATE", stream, "workers", &id])
            .await
            .unwrap();
        assert_eq!(created, Reply::Simple("OK".into()), "XGROUP CREATE");
        let taken = ranger
            .call(&[
                "XREADGROUP",
                "GROUP",
                "workers",
                "w1",
                "COUNT",
                "1",
                "STREAMS",
                stream,
                ">",
            ])
            .await
            .unwrap();
        assert!(
            bulk_strings(&taken).iter().any(|b| b == "wakes the reader"),
            "XREADGROUP through another node: {taken:?}"
        );
        let taken_id = bulk_strings(&taken)[1].clone();
        let pending = blocker
            .call(&["XPENDING", stream, "workers"])
            .await
            .unwrap();
        let Reply::Array(Some(summary)) = &pending else {
            panic!("XPENDING: {pending:?}")
        };
        assert_eq!(
            summary[0],
            Reply::Integer(1),
            "XPENDING through a third node"
        );
        let acked = blocker
            .call(&["XACK", stream, "workers", &taken_id])
            .await
            .unwrap();
        assert_eq!(acked, Reply::Integer(1), "XACK");
        let again = adder
            .call(&["XACK", stream, "workers", &taken_id])
            .await
            .unwrap();
        assert_eq!(
            again,
            Reply::Integer(0),
            "acknowledged once, whichever node is asked"
        );
        // A blocked XREADGROUP passed on to the owner wakes there.
        woken_by_xadd(
            &mut blocker,
            &[
                "XREADGROUP",
                "GROUP",
                "workers",
                "w2",
                "BLOCK",
                "20000",
                "STREAMS",
                stream,
                ">",
            ],
            &mut adder,
            stream,
            "for the group",
        )
        .await;
    }

    // One OTLP export through one node that touches every stream.
    let lines: Vec<(String, String)> = names
        .iter()
        .map(|stream| (stream.clone(), format!("otlp to {stream}")))
        .collect();
    let lines: Vec<(&str, &str)> = lines
        .iter()
        .map(|(s, l)| (s.as_str(), l.as_str()))
        .collect();
    let response = streamgate_tests::export_logs(&cluster.endpoint(1), BASIN, &lines).await;
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    for (s, stream) in names.iter().enumerate() {
        let read = bodies_of(&cluster.endpoint(s + 2), stream).await;
        let last: Value = serde_json::from_str(read.last().unwrap()).unwrap();
        assert_eq!(
            last["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]["body"]["stringValue"],
            format!("otlp to {stream}")
        );
    }

    // The streams are spread over the nodes: together they own all six, each some.
    let views: Vec<Value> = futures::future::join_all((0..NODES).map(|n| cluster.view(n))).await;
    let served: Vec<u64> = views
        .iter()
        .map(|v| v["node"]["streams_served"].as_u64().unwrap())
        .collect();
    assert_eq!(
        served.iter().sum::<u64>(),
        6,
        "each stream is served once: {served:?}"
    );
    assert!(
        served.iter().filter(|n| **n > 0).count() >= 2,
        "streams spread over the nodes: {served:?}"
    );
}

/// Encrypted streams and usage across nodes: appends with the key through one node,
/// reads through another (the key travels with the forwarded request), a wrong key
/// refused on a third; and the usage every node counts is the same whichever node the
/// metrics API is asked on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn encrypted_streams_and_usage_work_through_every_node() {
    const SECURE: &str = "cluster-secure";
    let cluster = Cluster::start(NODES, &[]);
    for node in 0..NODES {
        cluster.wait_for_live_nodes(node, NODES).await;
    }
    let http = client();
    let created = http
        .post(format!("{}/v1/basins", cluster.endpoint(0)))
        .json(&json!({"basin": SECURE, "config": {"stream_cipher": "aegis-256"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let names = stream_names(NODES);
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    streamgate_tests::create_streams(&cluster.endpoint(1), SECURE, &refs).await;
    let key = "QkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkI="; // 32 bytes of 'B'
    let wrong = "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE="; // 32 bytes of 'A'
    let records = |node: usize, stream: &str| {
        http.request(
            reqwest::Method::GET,
            format!(
                "{}/v1/streams/{stream}/records?seq_num=0",
                cluster.endpoint(node)
            ),
        )
        .header("s2-basin", SECURE)
        .header("s2-format", "raw")
    };
    let mut appended = 0u64;
    for (s, stream) in names.iter().enumerate() {
        let body = format!("sealed through node {s}");
        let response = http
            .post(format!(
                "{}/v1/streams/{stream}/records",
                cluster.endpoint(s)
            ))
            .header("s2-basin", SECURE)
            .header("s2-format", "raw")
            .header("s2-encryption-key", key)
            .json(&json!({"records": [{"body": body}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
        appended += 8 + body.len() as u64;
        let read: Value = records(s + 1, stream)
            .header("s2-encryption-key", key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            read["records"][0]["body"], body,
            "read through another node"
        );
        let refused = records(s + 2, stream)
            .header("s2-encryption-key", wrong)
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 400);
        let missing = records(s + 2, stream).send().await.unwrap();
        assert_eq!(missing.status(), 422);
    }

    // Every node counted its share; each answers with the sum.
    let start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 300;
    let appended_bytes = |node: usize| {
        let url = format!(
            "{}/v1/metrics/{SECURE}?set=append-throughput&start={start}&end={}",
            cluster.endpoint(node),
            start + 300
        );
        let http = http.clone();
        async move {
            let answer: Value = http.get(url).send().await.unwrap().json().await.unwrap();
            answer["values"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|m| {
                    m["accumulation"]["values"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                })
                .map(|p| p[1].as_f64().unwrap() as u64)
                .sum::<u64>()
        }
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while appended_bytes(0).await < appended {
        assert!(
            Instant::now() < deadline,
            "usage never reached {appended} bytes"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for node in 0..NODES {
        assert_eq!(appended_bytes(node).await, appended, "node {node}");
    }
}

/// Appends that were not acknowledged: through which node, when, and what came back.
type Failures = Arc<Mutex<Vec<(usize, Instant, String)>>>;

/// Appends from one writer through node `node`, retrying whenever that node is down:
/// answers that are not acknowledgements leave the batch's fate unknown, and are
/// recorded in `failures`.
async fn write_through(
    (endpoint, node): (String, usize),
    writer: usize,
    streams: usize,
    history: Arc<Mutex<History>>,
    (acks_by_stream, failures): (Arc<Mutex<HashMap<usize, Instant>>>, Failures),
    stop: Arc<AtomicBool>,
) {
    let http = client();
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        let (stream, size) = {
            let mut rng = rand::rng();
            (rng.random_range(0..streams), rng.random_range(1..=10))
        };
        let batch = format!("w{writer}b{n}");
        n += 1;
        let request = http
            .post(format!("{endpoint}/v1/streams/s{stream}/records"))
            .timeout(Duration::from_secs(20));
        match send_rest_batch(&history, request, BASIN, (stream, batch, size)).await {
            Sent::Acked { .. } => {
                acks_by_stream
                    .lock()
                    .unwrap()
                    .insert(stream, Instant::now());
            }
            Sent::Refused(r) => {
                // Only a retryable refusal is expected while a node is down.
                assert!(r.status() == 503, "unexpected answer {}", r.status());
                let body = r.text().await.unwrap_or_default();
                failures.lock().unwrap().push((node, Instant::now(), body));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Sent::NoAnswer => {
                let what = "no answer".to_owned();
                failures.lock().unwrap().push((node, Instant::now(), what));
                tokio::time::sleep(Duration::from_millis(100)).await
            }
        }
    }
}

/// How a node is taken out of the cluster for a while.
#[derive(Debug, Clone, Copy)]
enum Failure {
    /// `kill -9`, then started again.
    Kill,
    /// `SIGSTOP` past its lease, then `SIGCONT`: a zombie that wakes up to find its
    /// streams taken, must not acknowledge anything and stops (then started again).
    Pause,
    /// Its PostgreSQL connection black-holed past its lease, then healed: it cannot
    /// renew, stops acknowledging, finds its streams taken and stops.
    MetadataCut,
    /// SIGTERM (a rolling restart, one node at a time), then started again.
    Restart,
}

fn signal(server: &Server, signal: &str) {
    let pid = server.pid().expect("the node runs").to_string();
    let status = std::process::Command::new("kill")
        .args([signal, &pid])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Waits until every stream has taken an append acknowledged after `since`.
async fn every_stream_acknowledges_after(
    acks_by_stream: &Mutex<HashMap<usize, Instant>>,
    streams: usize,
    since: Instant,
    what: &str,
) {
    let deadline = since + Duration::from_secs(40);
    loop {
        let recovered = acks_by_stream
            .lock()
            .unwrap()
            .values()
            .filter(|at| **at > since)
            .count();
        if recovered == streams {
            eprintln!(
                "{what}: every stream took appends again after {:.1} s",
                since.elapsed().as_secs_f64()
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: only {recovered} of {streams} streams took appends again within 40 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn node_failures_of_every_kind_lose_no_acknowledged_record() {
    const STREAMS: usize = 6;
    const WRITERS: usize = 6;
    // Every node reaches PostgreSQL through a proxy of its own, to cut it off alone.
    let server = backends::postgres_server();
    let (credentials, address) = server
        .strip_prefix("postgres://")
        .and_then(|rest| rest.rsplit_once('@'))
        .expect("STREAMGATE_TEST_POSTGRES is postgres://USER[:PASSWORD]@HOST:PORT");
    let mut proxies = Vec::new();
    for _ in 0..NODES {
        proxies.push(Proxy::start(address).await);
    }
    let through: Vec<String> = proxies
        .iter()
        .map(|p| format!("postgres://{credentials}@127.0.0.1:{}", p.port))
        .collect();
    let mut cluster = Cluster::start_with_metadata_servers(&through, &["--lease-secs", LEASE_SECS]);
    for node in 0..NODES {
        cluster.wait_for_live_nodes(node, NODES).await;
    }
    let names = stream_names(STREAMS);
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    streamgate_tests::create_streams(&cluster.endpoint(0), BASIN, &refs).await;

    let history = Arc::new(Mutex::new(History::default()));
    let acks_by_stream = Arc::new(Mutex::new(HashMap::new()));
    let failures: Failures = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            tokio::spawn(write_through(
                (cluster.endpoint(w), w % NODES),
                w,
                STREAMS,
                history.clone(),
                (acks_by_stream.clone(), failures.clone()),
                stop.clone(),
            ))
        })
        .collect();
    every_stream_acknowledges_after(&acks_by_stream, STREAMS, Instant::now(), "start").await;

    let lease = Duration::from_secs(LEASE_SECS.parse().unwrap());
    let plan = [
        (0, Failure::Kill),
        (1, Failure::Kill),
        (2, Failure::Pause),
        (0, Failure::MetadataCut),
        (0, Failure::Restart),
        (1, Failure::Restart),
        (2, Failure::Restart),
    ];
    for (victim, failure) in plan {
        let what = format!("{failure:?} of node {victim}");
        let failed_at = Instant::now();
        match failure {
            Failure::Kill => cluster.nodes[victim].kill9(),
            Failure::Pause => signal(&cluster.nodes[victim], "-STOP"),
            Failure::MetadataCut => proxies[victim].set(Mode::BlackHole),
            Failure::Restart => {
                let code = cluster.nodes[victim].terminate();
                assert_eq!(code, Some(0), "{what}: a drained node exits cleanly");
            }
        }
        // From when the victim can no longer acknowledge (gone, or its lease lapsed),
        // every stream takes appends again: the others took the victim's streams over.
        let victim_silent_from = match failure {
            Failure::Kill | Failure::Restart => Instant::now(),
            Failure::Pause | Failure::MetadataCut => failed_at + lease,
        };
        tokio::time::sleep_until(victim_silent_from.into()).await;
        every_stream_acknowledges_after(&acks_by_stream, STREAMS, victim_silent_from, &what).await;
        match failure {
            Failure::Pause | Failure::MetadataCut => {
                match failure {
                    Failure::Pause => signal(&cluster.nodes[victim], "-CONT"),
                    _ => proxies[victim].set(Mode::Forward),
                }
                // Back, it finds its leases taken: it stops, and says why.
                let status = cluster.nodes[victim]
                    .wait_for_exit(Duration::from_secs(60))
                    .unwrap_or_else(|| panic!("{what}: the fenced node did not stop"));
                assert!(
                    !status.success(),
                    "{what}: a fenced node exits with an error"
                );
                cluster.nodes[victim].restart();
            }
            Failure::Kill | Failure::Restart => cluster.nodes[victim].restart(),
        }
        cluster.wait_for_live_nodes(victim, NODES).await;
        every_stream_acknowledges_after(&acks_by_stream, STREAMS, Instant::now(), &what).await;
        if let Failure::Restart = failure {
            // The node handed its streams over before it stopped: through the others,
            // not one append failed (through itself, only while it was down).
            let failed: Vec<_> = failures
                .lock()
                .unwrap()
                .iter()
                .filter(|(node, at, _)| *node != victim && *at >= failed_at)
                .map(|(node, _, what)| (*node, what.clone()))
                .collect();
            assert!(
                failed.is_empty(),
                "{what}: appends through the other nodes failed: {failed:?}"
            );
        }
    }
    stop.store(true, Ordering::SeqCst);
    for writer in writers {
        writer.await.unwrap();
    }

    let history = std::mem::take(&mut *history.lock().unwrap());
    assert!(
        history.acked.len() > 100,
        "only {} batches acknowledged",
        history.acked.len()
    );
    let mut first_view = None;
    for node in 0..NODES {
        let mut streams = Vec::new();
        for s in 0..STREAMS {
            streams.push(read_all(&cluster.endpoint(node), BASIN, s).await);
        }
        let records = verify(&history, &streams);
        eprintln!("node {node} reads {records} records, every acknowledged one exactly once");
        match &first_view {
            None => first_view = Some(streams),
            Some(first) => assert_eq!(first, &streams, "every node reads the same streams"),
        }
    }
}

/// XADDs through one node to `streams` in turn until `stop`: the values acknowledged
/// per stream, and every error reply or lost connection.
async fn xadd_through(
    port: u16,
    streams: Vec<String>,
    stop: Arc<AtomicBool>,
) -> (HashMap<String, Vec<u64>>, Vec<String>) {
    let mut connection = Connection::open(port, Some(BASIN)).await.unwrap();
    let mut acked: HashMap<String, Vec<u64>> = HashMap::new();
    let mut failed = Vec::new();
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let stream = &streams[n as usize % streams.len()];
        match connection
            .call(&["XADD", stream, "*", "n", &n.to_string()])
            .await
        {
            Ok(Reply::Bulk(Some(_))) => acked.entry(stream.clone()).or_default().push(n),
            Ok(other) => failed.push(format!("{other:?}")),
            Err(err) => {
                failed.push(err.to_string());
                return (acked, failed);
            }
        }
        n += 1;
    }
    (acked, failed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_stopped_with_sigterm_hands_its_streams_over_and_no_append_fails_nor_is_lost_after_a_kill(
) {
    let flags = [
        "--lease-secs",
        LEASE_SECS,
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    let mut cluster = Cluster::start(NODES, &flags);
    for node in 0..NODES {
        cluster.wait_for_live_nodes(node, NODES).await;
    }
    const STREAMS: usize = 6;
    let names = stream_names(STREAMS);
    let redis_streams: Vec<String> = (0..3).map(|r| format!("r{r}")).collect();
    let refs: Vec<&str> = names
        .iter()
        .chain(&redis_streams)
        .map(String::as_str)
        .collect();
    streamgate_tests::create_streams(&cluster.endpoint(0), BASIN, &refs).await;
    let history = Arc::new(Mutex::new(History::default()));
    // Appended to once, so that each has an owner.
    for s in 0..STREAMS {
        let request = client().post(format!("{}/v1/streams/s{s}/records", cluster.endpoint(0)));
        let first = send_rest_batch(&history, request, BASIN, (s, format!("first{s}"), 1)).await;
        assert!(matches!(first, Sent::Acked { .. }));
    }
    for stream in &redis_streams {
        let first = append(&cluster.endpoint(0), stream, &["first".into()]).await;
        assert!(first.status().is_success());
    }
    let leaving = NODES - 1;
    let held = cluster.view(leaving).await["node"]["streams_served"]
        .as_u64()
        .unwrap();
    assert!(held > 0, "the node to stop serves some streams");

    // REST writers through the two nodes that stay, and XADDs through one of them.
    let acks_by_stream = Arc::new(Mutex::new(HashMap::new()));
    let failures: Failures = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let stop_xadds = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            tokio::spawn(write_through(
                (cluster.endpoint(w % 2), w % 2),
                w,
                STREAMS,
                history.clone(),
                (acks_by_stream.clone(), failures.clone()),
                stop.clone(),
            ))
        })
        .collect();
    let redis = tokio::spawn(xadd_through(
        cluster.nodes[1].resp_port,
        redis_streams.clone(),
        stop_xadds.clone(),
    ));
    every_stream_acknowledges_after(&acks_by_stream, STREAMS, Instant::now(), "start").await;
    let served = |view: Value| view["node"]["streams_served"].as_u64().unwrap();
    let served_before = [served(cluster.view(0).await), served(cluster.view(1).await)];

    let handovers_before = counted(&cluster, &[0, 1], HANDOVERS).await;
    let takeovers_before = counted(&cluster, &[0, 1], TAKEOVERS).await;
    let stopping = Instant::now();
    let code = cluster.nodes[leaving].terminate();
    assert_eq!(
        code,
        Some(0),
        "a node that hands its streams over exits cleanly"
    );
    eprintln!(
        "node {leaving} handed {held} streams over and stopped in {:.1} s",
        stopping.elapsed().as_secs_f64()
    );
    every_stream_acknowledges_after(&acks_by_stream, STREAMS, Instant::now(), "after").await;
    stop_xadds.store(true, Ordering::SeqCst);
    let (xadded, xadd_failures) = redis.await.unwrap();
    assert!(
        xadd_failures.is_empty(),
        "XADDs that failed: {xadd_failures:?}"
    );
    // The stopped node gave each node that stays its group of streams, which that node
    // rebuilt in one replay (and any move between the two for an even share since, in
    // one more each).
    let takeovers = counted(&cluster, &[0, 1], TAKEOVERS).await - takeovers_before;
    let handovers = counted(&cluster, &[0, 1], HANDOVERS).await - handovers_before;
    assert!(
        takeovers <= 2 + handovers,
        "the nodes that stay took the stopped node's {held} streams in {takeovers} \
         takeovers, with {handovers} hand-overs between them"
    );

    // A node that took streams of the stopped one is killed: what it rebuilt from the
    // stopped node's log and acknowledged since is all found again by the last node.
    let served_after = [served(cluster.view(0).await), served(cluster.view(1).await)];
    let taker = (0..2)
        .find(|n| served_after[*n] > served_before[*n])
        .expect("a node that stays took streams of the stopped one");
    let survivor = 1 - taker;
    let killed_at = Instant::now();
    cluster.nodes[taker].kill9();
    let what = format!("kill -9 of node {taker}");
    every_stream_acknowledges_after(&acks_by_stream, STREAMS, killed_at, &what).await;
    stop.store(true, Ordering::SeqCst);
    for writer in writers {
        writer.await.unwrap();
    }

    let failed: Vec<_> = failures
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, at, _)| *at < killed_at)
        .cloned()
        .collect();
    assert!(
        failed.is_empty(),
        "appends that failed before the kill: {failed:?}"
    );
    let history = std::mem::take(&mut *history.lock().unwrap());
    let mut streams = Vec::new();
    for s in 0..STREAMS {
        streams.push(read_all(&cluster.endpoint(survivor), BASIN, s).await);
    }
    let records = verify(&history, &streams);
    eprintln!("{records} records, every acknowledged one exactly once");
    let mut reader = Connection::open(cluster.nodes[survivor].resp_port, Some(BASIN))
        .await
        .unwrap();
    for stream in &redis_streams {
        let range = reader.call(&["XRANGE", stream, "-", "+"]).await.unwrap();
        let values: Vec<u64> = bulk_strings(&range)
            .iter()
            .filter_map(|v| v.parse().ok())
            .collect();
        let expected = xadded.get(stream).cloned().unwrap_or_default();
        assert!(!expected.is_empty(), "XADDs to {stream} were acknowledged");
        assert_eq!(
            values, expected,
            "{stream} holds every acknowledged XADD once, in order"
        );
    }
}

/// What an SSE follower got: record bodies in order, and error events.
#[derive(Default)]
struct Followed {
    bodies: Vec<String>,
    errors: Vec<String>,
}

/// Follows `stream` through `endpoint` with an SSE read session from its first record
/// until aborted.
fn follow_sse(
    endpoint: String,
    stream: String,
) -> (Arc<Mutex<Followed>>, tokio::task::JoinHandle<()>) {
    let followed = Arc::new(Mutex::new(Followed::default()));
    let into = followed.clone();
    let task = tokio::spawn(async move {
        let mut response = client()
            .get(format!("{endpoint}/v1/streams/{stream}/records?seq_num=0"))
            .header("s2-basin", BASIN)
            .header("accept", "text/event-stream")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "SSE session on {stream}");
        let mut text = String::new();
        while let Ok(Some(chunk)) = response.chunk().await {
            text.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = text.find("\n\n") {
                let block: String = text.drain(..end + 2).collect();
                let Some((event, _, data)) = streamgate_tests::sse::events(&block).pop() else {
                    continue;
                };
                let mut followed = into.lock().unwrap();
                match event.as_str() {
                    "batch" => {
                        let batch: Value = serde_json::from_str(&data).unwrap();
                        for record in batch["records"].as_array().unwrap() {
                            let body = record["body"].as_str().unwrap_or_default();
                            followed.bodies.push(body.to_owned());
                        }
                    }
                    "error" => followed.errors.push(data),
                    _ => {}
                }
            }
        }
        into.lock().unwrap().errors.push("the session ended".into());
    });
    (followed, task)
}

/// XREAD BLOCK through one node on `streams` until `stop`, each time after the last
/// entry it got: the values it got per stream, or the first error.
async fn xread_through(
    port: u16,
    streams: Vec<String>,
    stop: Arc<AtomicBool>,
) -> Result<HashMap<String, Vec<u64>>, String> {
    let mut connection = Connection::open(port, Some(BASIN)).await.unwrap();
    let mut got: HashMap<String, Vec<u64>> = HashMap::new();
    let mut after: HashMap<String, String> =
        streams.iter().map(|s| (s.clone(), "0".into())).collect();
    while !stop.load(Ordering::SeqCst) {
        let mut args = vec!["XREAD", "BLOCK", "500", "STREAMS"];
        args.extend(streams.iter().map(String::as_str));
        let ids: Vec<String> = streams.iter().map(|s| after[s].clone()).collect();
        args.extend(ids.iter().map(String::as_str));
        let reply = connection.call(&args).await.map_err(|e| e.to_string())?;
        let Reply::Array(Some(per_stream)) = reply else {
            match reply {
                Reply::Array(None) => continue,
                other => return Err(format!("{other:?}")),
            }
        };
        for item in per_stream {
            let Reply::Array(Some(pair)) = item else {
                continue;
            };
            let [Reply::Bulk(Some(key)), Reply::Array(Some(entries))] = &pair[..] else {
                return Err(format!("unexpected XREAD reply {pair:?}"));
            };
            let key = String::from_utf8_lossy(key).into_owned();
            for entry in entries {
                let Reply::Array(Some(parts)) = entry else {
                    continue;
                };
                if let Some(Reply::Bulk(Some(id))) = parts.first() {
                    after.insert(key.clone(), String::from_utf8_lossy(id).into_owned());
                }
                let values = bulk_strings(entry);
                if let Some(v) = values.last().and_then(|v| v.parse().ok()) {
                    got.entry(key.clone()).or_default().push(v);
                }
            }
        }
    }
    Ok(got)
}

/// The streams each live node holds, by `GET /cluster` of `node`, in epoch order.
async fn shares(cluster: &Cluster, node: usize) -> Vec<u64> {
    cluster.view(node).await["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["live"] == true)
        .map(|n| n["streams_owned"].as_u64().unwrap())
        .collect()
}

/// A cluster of two (lease `LEASE_SECS`, and `flags`) whose node 0 holds streams `s0`…
/// each with one batch acknowledged through it, and whose node 1 is down (`kill -9`ed
/// before the streams were made), for a test to restart.
async fn node_0_holding_every_stream(
    streams: usize,
    flags: &[&str],
    history: &Mutex<History>,
) -> Cluster {
    let mut cluster = Cluster::start(2, &[&["--lease-secs", LEASE_SECS], flags].concat());
    cluster.nodes[1].kill9();
    cluster.wait_for_live_nodes(0, 1).await;
    let names = stream_names(streams);
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    streamgate_tests::create_streams(&cluster.endpoint(0), BASIN, &refs).await;
    // For a moment node 0 may still place a stream on the node it saw leave, and
    // refuse the append (retryably).
    let deadline = Instant::now() + Duration::from_secs(30);
    for s in 0..streams {
        let id = format!("first.s{s}");
        append_until_acked(history, &cluster.endpoint(0), (s, &id, 3), deadline).await;
    }
    let served = cluster.view(0).await["node"]["streams_served"].as_u64();
    assert_eq!(served, Some(streams as u64), "node 0 holds every stream");
    cluster
}

/// Appends a batch of `size` records to stream `s{s}` through `endpoint` until it is
/// acknowledged, by `deadline`. Each attempt is a batch of its own (`{id}.{attempt}`):
/// one that got no answer may be there. Only a retryable refusal (5xx) is retried.
async fn append_until_acked(
    history: &Mutex<History>,
    endpoint: &str,
    (s, id, size): (usize, &str, usize),
    deadline: Instant,
) {
    for attempt in 0.. {
        let request = client()
            .post(format!("{endpoint}/v1/streams/s{s}/records"))
            .timeout(Duration::from_secs(20));
        let batch = format!("{id}.{attempt}");
        match send_rest_batch(history, request, BASIN, (s, batch, size)).await {
            Sent::Acked { .. } => return,
            Sent::Refused(r) => assert!(
                r.status().is_server_error(),
                "only a retryable refusal of s{s} through {endpoint}: {}",
                r.status()
            ),
            Sent::NoAnswer => {}
        }
        assert!(
            Instant::now() < deadline,
            "{id}: s{s} took no append through {endpoint} in time"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Streams `s0`… read whole through `endpoint`, each once the cluster serves it again
/// (after a node died, another takes it over within a few leases).
async fn read_all_once_served(endpoint: &str, streams: usize) -> Vec<Vec<(u64, u64, String)>> {
    let mut read = Vec::new();
    for s in 0..streams {
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            let response = client()
                .get(format!("{endpoint}/v1/streams/s{s}/records?seq_num=0"))
                .header("s2-basin", BASIN)
                .send()
                .await
                .unwrap();
            if response.status().is_success() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{endpoint} never served s{s} again: {}",
                response.status()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        read.push(read_all(endpoint, BASIN, s).await);
    }
    read
}

/// The sum over `nodes` of a counter of theirs (0 where it was not counted yet).
async fn counted(cluster: &Cluster, nodes: &[usize], series: &str) -> u64 {
    let mut sum = 0;
    for node in nodes {
        let text = cluster.nodes[*node].scrape_metrics().await;
        sum += streamgate_tests::prometheus_sample(&text, series).unwrap_or(0.0) as u64;
    }
    sum
}

const TAKEOVERS: &str = "streamgate_takeovers_total";
const TAKEN_OVER_STREAMS: &str = "streamgate_taken_over_streams_total";
const HANDOVERS: &str = "streamgate_handovers_total";

/// A node that joins a running cluster takes an even share of the streams from the
/// others while REST writers and XADDs go on through every node: not one append fails,
/// and once the new node is killed with `kill -9`, every batch acknowledged through any
/// node (the ones it rebuilt from the others' logs too) is found exactly once. Streams
/// that change owner together (a hand-over, the killed node's) are rebuilt together, in
/// one replay of the log they were in, however many requests for them arrive at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_that_joins_takes_an_even_share_and_no_append_fails_nor_is_lost_after_a_kill() {
    const STREAMS: usize = 12;
    const REDIS_STREAMS: usize = 3;
    let flags = [
        "--lease-secs",
        LEASE_SECS,
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    let mut cluster = Cluster::start(2, &flags);
    for node in 0..2 {
        cluster.wait_for_live_nodes(node, 2).await;
    }
    let names = stream_names(STREAMS);
    let redis_streams: Vec<String> = (0..REDIS_STREAMS).map(|r| format!("r{r}")).collect();
    let refs: Vec<&str> = names
        .iter()
        .chain(&redis_streams)
        .map(String::as_str)
        .collect();
    streamgate_tests::create_streams(&cluster.endpoint(0), BASIN, &refs).await;
    let history = Arc::new(Mutex::new(History::default()));
    for s in 0..STREAMS {
        let request = client().post(format!("{}/v1/streams/s{s}/records", cluster.endpoint(0)));
        let first = send_rest_batch(&history, request, BASIN, (s, format!("first{s}"), 1)).await;
        assert!(matches!(first, Sent::Acked { .. }));
    }
    for stream in &redis_streams {
        let first = append(&cluster.endpoint(0), stream, &["first".into()]).await;
        assert!(first.status().is_success());
    }
    let total = (STREAMS + REDIS_STREAMS) as u64;
    let before = shares(&cluster, 0).await;
    assert_eq!(before.iter().sum::<u64>(), total, "{before:?}");

    let acks_by_stream = Arc::new(Mutex::new(HashMap::new()));
    let failures: Failures = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let spawn_writer = |node: usize, writer: usize, endpoint: String| {
        tokio::spawn(write_through(
            (endpoint, node),
            writer,
            STREAMS,
            history.clone(),
            (acks_by_stream.clone(), failures.clone()),
            stop.clone(),
        ))
    };
    let mut writers: Vec<_> = (0..4)
        .map(|w| spawn_writer(w % 2, w, cluster.endpoint(w % 2)))
        .collect();
    let stop_xadds = Arc::new(AtomicBool::new(false));
    // One connection per node, each to streams of its own (so each stream's order is
    // known): r0 and r1 through node 0, r2 through node 1.
    let redis: Vec<_> = [&redis_streams[..2], &redis_streams[2..]]
        .into_iter()
        .enumerate()
        .map(|(node, streams)| {
            tokio::spawn(xadd_through(
                cluster.nodes[node].resp_port,
                streams.to_vec(),
                stop_xadds.clone(),
            ))
        })
        .collect();
    every_stream_acknowledges_after(&acks_by_stream, STREAMS, Instant::now(), "start").await;
    // Readers that follow every stream through the first two nodes, across the moves:
    // an SSE session per REST stream, and an XREAD BLOCK loop per node.
    let followers: Vec<_> = (0..STREAMS)
        .map(|s| follow_sse(cluster.endpoint(s % 2), format!("s{s}")))
        .collect();
    let stop_xreads = Arc::new(AtomicBool::new(false));
    let xreads: Vec<_> = (0..2)
        .map(|node| {
            tokio::spawn(xread_through(
                cluster.nodes[node].resp_port,
                redis_streams.clone(),
                stop_xreads.clone(),
            ))
        })
        .collect();

    // The third node joins; writers go through it too once it is up.
    let joined_at = Instant::now();
    let joining = cluster.add_node(&flags);
    cluster.wait_for_live_nodes(0, 3).await;
    writers.push(spawn_writer(joining, 4, cluster.endpoint(joining)));
    let (floor, ceil) = (total / 3, total.div_ceil(3));
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let now = shares(&cluster, 0).await;
        let served = cluster.view(joining).await["node"]["streams_served"]
            .as_u64()
            .unwrap();
        let even = now.len() == 3 && now.iter().all(|s| (floor..=ceil).contains(s));
        if even && served == now[2] {
            eprintln!(
                "shares {before:?} became {now:?} {:.1} s after the third node started",
                joined_at.elapsed().as_secs_f64()
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no even share within 40 s: {now:?}, the new node serves {served}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Replays, not requests: one per hand-over at most (a replay per stream, each
    // behind the last and each longer, once kept appends waiting for 20 s).
    let handovers = counted(&cluster, &[0, 1], HANDOVERS).await;
    let takeovers = counted(&cluster, &[joining], TAKEOVERS).await;
    assert_eq!(
        counted(&cluster, &[joining], TAKEN_OVER_STREAMS).await,
        shares(&cluster, 0).await[2],
        "the new node rebuilt each stream it serves once"
    );
    assert!(
        (1..=handovers).contains(&takeovers),
        "the new node rebuilt its streams in {takeovers} takeovers from {handovers} hand-overs"
    );
    every_stream_acknowledges_after(&acks_by_stream, STREAMS, Instant::now(), "shared").await;
    stop_xadds.store(true, Ordering::SeqCst);
    let mut xadded: HashMap<String, Vec<u64>> = HashMap::new();
    for (node, xadds) in redis.into_iter().enumerate() {
        let (acked, xadd_failures) = xadds.await.unwrap();
        assert!(
            xadd_failures.is_empty(),
            "XADDs through node {node} that failed: {xadd_failures:?}"
        );
        for (stream, values) in acked {
            xadded.entry(stream).or_default().extend(values);
        }
    }
    let failed = failures.lock().unwrap().clone();
    assert!(failed.is_empty(), "appends that failed: {failed:?}");
    // Every follower catches up with what was acknowledged by now, with no error.
    let mut tails = Vec::new();
    for s in 0..STREAMS {
        tails.push(tail(&cluster.endpoint(0), &format!("s{s}")).await as usize);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    for (s, (followed, _)) in followers.iter().enumerate() {
        loop {
            let (got, errors) = {
                let followed = followed.lock().unwrap();
                (followed.bodies.len(), followed.errors.clone())
            };
            assert!(errors.is_empty(), "SSE follower of s{s}: {errors:?}");
            if got >= tails[s] {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the SSE follower of s{s} got {got} of {} records",
                tails[s]
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    for (_, task) in &followers {
        task.abort();
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop_xreads.store(true, Ordering::SeqCst);
    for (node, xread) in xreads.into_iter().enumerate() {
        let got = xread
            .await
            .unwrap()
            .unwrap_or_else(|err| panic!("XREAD BLOCK through node {node}: {err}"));
        for stream in &redis_streams {
            assert_eq!(
                got.get(stream),
                xadded.get(stream),
                "XREAD BLOCK through node {node} got every XADD to {stream} once, in order"
            );
        }
    }

    // The new node dies: what it rebuilt from the others' logs and acknowledged since
    // is all found again by the nodes that stay.
    let takeovers_before = counted(&cluster, &[0, 1], TAKEOVERS).await;
    let streams_before = counted(&cluster, &[0, 1], TAKEN_OVER_STREAMS).await;
    let killed_at = Instant::now();
    cluster.nodes[joining].kill9();
    every_stream_acknowledges_after(&acks_by_stream, STREAMS, killed_at, "kill -9").await;
    // Each node that stays takes its share of the dead node's streams together, in one
    // replay of its log, not one stream per replay as requests for them come in.
    let takeovers = counted(&cluster, &[0, 1], TAKEOVERS).await - takeovers_before;
    let streams_taken = counted(&cluster, &[0, 1], TAKEN_OVER_STREAMS).await - streams_before;
    assert!(
        takeovers < streams_taken,
        "the other nodes took {streams_taken} streams in {takeovers} takeovers"
    );
    stop.store(true, Ordering::SeqCst);
    for writer in writers {
        writer.await.unwrap();
    }
    let history = std::mem::take(&mut *history.lock().unwrap());
    let mut streams = Vec::new();
    for s in 0..STREAMS {
        streams.push(read_all(&cluster.endpoint(s % 2), BASIN, s).await);
    }
    let records = verify(&history, &streams);
    eprintln!("{records} records, every acknowledged one exactly once");
    for (s, (followed, _)) in followers.iter().enumerate() {
        let stored = bodies_of(&cluster.endpoint(s % 2), &format!("s{s}")).await;
        let followed = &followed.lock().unwrap().bodies;
        assert_eq!(
            followed[..],
            stored[..followed.len().min(stored.len())],
            "the SSE follower of s{s} got the stream's records in order, none twice"
        );
    }
    let mut reader = Connection::open(cluster.nodes[1].resp_port, Some(BASIN))
        .await
        .unwrap();
    for stream in &redis_streams {
        let range = reader.call(&["XRANGE", stream, "-", "+"]).await.unwrap();
        let values: Vec<u64> = bulk_strings(&range)
            .iter()
            .filter_map(|v| v.parse().ok())
            .collect();
        let expected = xadded.get(stream).cloned().unwrap_or_default();
        assert!(!expected.is_empty(), "XADDs to {stream} were acknowledged");
        assert_eq!(
            values, expected,
            "{stream} holds every acknowledged XADD once, in order"
        );
    }
}

/// A restarted node replays its log and takes its streams back before it serves. When
/// that takes longer than a lease (here a test hook pauses it for three leases), the
/// node keeps its lease renewed meanwhile, starts, and has lost no acknowledged record.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restart_whose_recovery_outlasts_the_lease_still_starts() {
    const LEASE: Duration = Duration::from_secs(1);
    let dir = tempfile::tempdir().unwrap();
    let tag = format!("{}{}", std::process::id(), rand::rng().random::<u32>());
    let metadata = format!(
        "{}/streamgate_test_slow_recovery_{tag}",
        backends::postgres_server()
    );
    let s3 = backends::s3_endpoint();
    let objects = format!("s3://streamgate-test-slow-recovery-{tag}/records");
    let lease_secs = LEASE.as_secs().to_string();
    let mut node = Server::start_with(
        dir.path(),
        &[
            "--metadata",
            &metadata,
            "--objects",
            &objects,
            "--s3-endpoint",
            &s3,
            "--lease-secs",
            &lease_secs,
            // Nothing is compacted, so the restart replays every batch from the log.
            "--compaction-interval-ms",
            "3600000",
        ],
    );
    streamgate_tests::create_streams(&node.endpoint, BASIN, &["s0"]).await;
    let history = Mutex::new(History::default());
    for batch in 0..20 {
        let request = client().post(format!("{}/v1/streams/s0/records", node.endpoint));
        let sent = send_rest_batch(&history, request, BASIN, (0, format!("b{batch}"), 5)).await;
        assert!(
            matches!(sent, Sent::Acked { .. }),
            "batch {batch} was acknowledged"
        );
    }
    node.kill9();

    // The restart's takeover pauses for three leases once it has read the log.
    node.set_env("STREAMGATE_PAUSE_AT", Some("takeover-replayed:3000"));
    let started = Instant::now();
    tokio::task::block_in_place(|| node.restart());
    eprintln!(
        "the node started {:.1} s after its restart began",
        started.elapsed().as_secs_f64()
    );
    let streams = vec![read_all(&node.endpoint, BASIN, 0).await];
    let verified = verify(&history.lock().unwrap(), &streams);
    assert_eq!(verified, 20, "every acknowledged batch is there once");
}

/// A takeover that fails part way (here after it relogged the streams' tails, by a test
/// hook) is made again on the next request: the stream does not stay unserved, the
/// copies the failed attempt left in the new owner's log are never read twice, and no
/// acknowledged record is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_takeover_that_fails_part_way_is_made_again() {
    const STREAMS: usize = 4;
    let history = Mutex::new(History::default());
    // Node 0 never compacts, so the takeover below has batches to relog.
    let mut cluster =
        node_0_holding_every_stream(STREAMS, &["--compaction-interval-ms", "3600000"], &history)
            .await;

    // Node 1 comes back with the hook, then node 0 dies: node 1's first takeover of
    // node 0's streams fails after relogging them.
    cluster.nodes[1].set_env("STREAMGATE_FAIL_AT", Some("takeover-relogged"));
    cluster.nodes[1].set_flag("--compaction-interval-ms", "200");
    cluster.nodes[1].set_flag("--metrics-listen", "127.0.0.1:0");
    tokio::task::block_in_place(|| cluster.nodes[1].restart());
    cluster.wait_for_live_nodes(1, 2).await;
    cluster.nodes[0].kill9();
    let deadline = Instant::now() + Duration::from_secs(40);
    for round in 0..3 {
        for s in 0..STREAMS {
            let id = format!("round{round}.s{s}");
            append_until_acked(&history, &cluster.endpoint(1), (s, &id, 3), deadline).await;
        }
    }

    // Node 1's log holds the failed attempt's copies and the real ones: its compaction
    // takes each batch once and goes on (rounds keep succeeding, none fails).
    let rounds = |text: &str, outcome: &str| {
        let series = format!("streamgate_compaction_rounds_total{{outcome=\"{outcome}\"}}");
        streamgate_tests::prometheus_sample(text, &series).unwrap_or(0.0)
    };
    let before = cluster.nodes[1].scrape_metrics().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = cluster.nodes[1].scrape_metrics().await;
    assert!(
        rounds(&after, "ok") > rounds(&before, "ok"),
        "node 1 compacts: {after}"
    );
    assert_eq!(
        rounds(&after, "error"),
        rounds(&before, "error"),
        "no compaction round of node 1 failed meanwhile: {after}"
    );
    // The hook did its part: a takeover of node 1's failed after relogging (and the
    // appends above went through, so it was made again).
    let failed_takeovers =
        streamgate_tests::prometheus_sample(&after, "streamgate_takeover_failures_total");
    assert!(
        failed_takeovers.unwrap_or(0.0) >= 1.0,
        "a takeover of node 1's failed part way, as STREAMGATE_FAIL_AT asked: {after}"
    );

    // Node 0, started again once node 1 is gone, rebuilds every stream from node 1's log.
    cluster.nodes[1].kill9();
    cluster.nodes[0].set_env("STREAMGATE_FAIL_AT", None);
    tokio::task::block_in_place(|| cluster.nodes[0].restart());
    let streams = read_all_once_served(&cluster.endpoint(0), STREAMS).await;
    let verified = verify(&history.lock().unwrap(), &streams);
    assert_eq!(
        verified,
        4 * STREAMS,
        "every acknowledged batch is there once"
    );
}

/// A node is neither handed nor placed a stream while it is still starting: a peer that
/// did would forward their appends to a node that does not answer yet, and they would
/// fail. Node 1 restarts and holds at the end of its start-up (`STREAMGATE_PAUSE_AT`)
/// for three leases while a writer appends to every stream through node 0, which holds
/// them all, and the first appends to four streams nobody holds are made through node 0:
/// not one append may fail. Once node 1 serves, it gets its share; then it is killed
/// with `kill -9`, and node 0 must read every acknowledged batch once, the ones node 1
/// was handed too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_still_starting_is_handed_no_stream() {
    const STREAMS: usize = 4;
    // Streams nobody holds until their first append, made while node 1 starts.
    const NEW_STREAMS: usize = 4;
    let history = Arc::new(Mutex::new(History::default()));
    // Node 0 holds every stream before node 1 is back.
    let mut cluster = node_0_holding_every_stream(STREAMS, &[], &history).await;
    let new_names: Vec<String> = (STREAMS..STREAMS + NEW_STREAMS)
        .map(|s| format!("s{s}"))
        .collect();
    let refs: Vec<&str> = new_names.iter().map(String::as_str).collect();
    streamgate_tests::create_streams(&cluster.endpoint(0), BASIN, &refs).await;
    let placed_while_starting = tokio::spawn(first_appends_while_a_node_starts(
        cluster.endpoint(0),
        STREAMS..STREAMS + NEW_STREAMS,
        history.clone(),
    ));

    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn({
        let (history, stop, endpoint) = (history.clone(), stop.clone(), cluster.endpoint(0));
        async move {
            let mut failures = Vec::new();
            let mut batch = 0;
            while !stop.load(Ordering::SeqCst) {
                for s in 0..STREAMS {
                    batch += 1;
                    let id = format!("b{batch}");
                    failures.extend(append_once(&history, &endpoint, s, id).await);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            failures
        }
    });

    // Three leases at the end of its start-up: long enough for node 0 to rebalance
    // several times, and for a request forwarded to a node that does not answer to
    // fail (the peers give up on a silent node after a lease).
    cluster.nodes[1].set_env("STREAMGATE_PAUSE_AT", Some("start-up-done:6000"));
    let acked_before = history.lock().unwrap().acked.len();
    tokio::task::block_in_place(|| cluster.nodes[1].restart());
    let acked_during = history.lock().unwrap().acked.len() - acked_before;
    assert!(
        acked_during >= STREAMS,
        "the writer appended to every stream while node 1 started: {acked_during} batches"
    );
    // The live nodes are node 0 and node 1's new run.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let shares = shares(&cluster, 0).await;
        if shares.len() == 2 && shares.iter().all(|&held| held >= 1) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node 1 got no share once it served: {shares:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::SeqCst);
    let failures = writer.await.unwrap();
    assert!(
        failures.is_empty(),
        "appends through node 0 failed while node 1 started: {failures:?}"
    );
    let failures = placed_while_starting.await.unwrap();
    assert!(
        failures.is_empty(),
        "first appends to streams nobody held failed while node 1 started: {failures:?}"
    );

    cluster.nodes[1].kill9();
    let streams = read_all_once_served(&cluster.endpoint(0), STREAMS + NEW_STREAMS).await;
    let history = history.lock().unwrap();
    let acked = history.acked.len();
    assert_eq!(
        verify(&history, &streams),
        acked,
        "every acknowledged batch is there once"
    );
}

/// One batch `id` of two records appended to `s{s}` through `endpoint`, and no retry:
/// why it failed, if it did.
async fn append_once(
    history: &Mutex<History>,
    endpoint: &str,
    s: usize,
    id: String,
) -> Option<String> {
    let request = client()
        .post(format!("{endpoint}/v1/streams/s{s}/records"))
        .timeout(Duration::from_secs(20));
    match send_rest_batch(history, request, BASIN, (s, id, 2)).await {
        Sent::Acked { .. } => None,
        Sent::Refused(r) => Some(format!("s{s}: {}", r.status())),
        Sent::NoAnswer => Some(format!("s{s}: no answer")),
    }
}

/// Once `endpoint`'s node, which holds every stream before `streams`, sees a node that
/// is live but still starting, the first append to each of `streams` (which nobody
/// holds) through it: none may be placed on the starting node, which would not answer
/// for it. The failures; it checks that the node was still starting after the last
/// append, and that `endpoint`'s node then served every stream, the new ones too.
async fn first_appends_while_a_node_starts(
    endpoint: String,
    streams: std::ops::Range<usize>,
    history: Arc<Mutex<History>>,
) -> Vec<String> {
    let starting = |view: &Value| {
        view["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["live"] == true && n["ready"] == false)
    };
    let view = || async {
        let answer = client()
            .get(format!("{endpoint}/cluster"))
            .send()
            .await
            .unwrap();
        answer.json::<Value>().await.unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !starting(&view().await) {
        assert!(Instant::now() < deadline, "no node was ever seen starting");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut failures = Vec::new();
    for s in streams.clone() {
        failures.extend(append_once(&history, &endpoint, s, format!("first.s{s}")).await);
    }
    let after = view().await;
    assert!(
        starting(&after),
        "the first appends ended while the node was still starting"
    );
    assert_eq!(
        after["node"]["streams_served"].as_u64(),
        Some(streams.end as u64),
        "the node the first appends went through serves every stream: {after}"
    );
    failures
}

/// A private CA and a certificate it issued for 127.0.0.1, written into `dir`:
/// (the CA's PEM, the nodes' certificate, its key).
fn certificates(dir: &std::path::Path) -> [String; 3] {
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "streamgate test CA");
    let ca = rcgen::CertifiedIssuer::self_signed(ca, rcgen::KeyPair::generate().unwrap()).unwrap();
    let node_key = rcgen::KeyPair::generate().unwrap();
    let node = rcgen::CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()])
        .unwrap()
        .signed_by(&node_key, &ca)
        .unwrap();
    let files = [
        ("ca.pem", ca.pem()),
        ("node.pem", node.pem()),
        ("node.key", node_key.serialize_pem()),
    ];
    files.map(|(name, pem)| {
        let path = dir.join(name);
        std::fs::write(&path, pem).unwrap();
        path.to_str().unwrap().to_owned()
    })
}

/// Nodes that serve HTTPS pass requests on to each other over TLS, trusting the CA
/// given with `--peer-ca`; a node without it refuses to talk to its peers (their
/// certificate is not trusted) and says why, rather than trusting any certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_serving_https_forward_to_each_other_and_check_each_others_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let [ca, cert, key] = certificates(dir.path());
    streamgate_tests::trust_certificate(&std::fs::read(&ca).unwrap());
    let tls = ["--tls-cert", &cert, "--tls-key", &key];
    let trusting: Vec<&str> = tls.iter().copied().chain(["--peer-ca", &ca]).collect();
    let mut cluster = Cluster::start(2, &trusting);
    let distrustful = cluster.add_node(&tls);
    for node in 0..3 {
        cluster.wait_for_live_nodes(node, 3).await;
        assert!(cluster.endpoint(node).starts_with("https://"));
    }
    let names = stream_names(9);
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    streamgate_tests::create_streams(&cluster.endpoint(0), BASIN, &refs).await;

    // Through the two nodes that trust the CA, every stream, wherever it is sequenced.
    let mut owners = HashMap::new();
    for (s, stream) in names.iter().enumerate() {
        for writer in 0..2 {
            let body = format!("{stream} over TLS from node {writer}");
            let answer = append(
                &cluster.endpoint(writer),
                stream,
                std::slice::from_ref(&body),
            )
            .await;
            assert!(answer.status().is_success(), "append: {}", answer.status());
            let owner = served_by(&answer);
            owners.insert(stream.clone(), cluster.node_at(&owner).unwrap());
            let end = answer.json::<Value>().await.unwrap()["end"]["seq_num"]
                .as_u64()
                .unwrap();
            assert_eq!(tail(&cluster.endpoint(1 - writer), stream).await, end);
            let reader = (s + writer) % 2;
            let read = bodies_of(&cluster.endpoint(reader), stream).await;
            assert_eq!(read.last(), Some(&body), "read through node {reader}");
        }
    }
    let passed_on: Vec<usize> = owners.values().copied().collect();
    assert!(
        passed_on.iter().any(|owner| *owner != 0) && passed_on.iter().any(|owner| *owner != 1),
        "each trusting node passed requests on to another: {owners:?}"
    );

    // The node without the CA cannot reach the others: its requests for the streams
    // they sequence are refused, retryably, naming the certificate.
    let mut refused = 0;
    for stream in &names {
        let answer = append(
            &cluster.endpoint(distrustful),
            stream,
            &["not trusted".into()],
        )
        .await;
        if answer.status().is_success() {
            assert_eq!(
                answer.headers()["streamgate-served-by"],
                cluster.endpoint(distrustful).as_str(),
                "only what it sequences itself"
            );
            continue;
        }
        assert_eq!(answer.status(), 503);
        let why = answer.text().await.unwrap();
        assert!(why.contains("certificate"), "{why}");
        refused += 1;
    }
    assert!(
        refused > 0,
        "some streams are sequenced by the others: {owners:?}"
    );
}
