//! `cluster_bench`: what a cluster of streamgate nodes gives and costs, on one
//! PostgreSQL database and one S3 bucket (moto). Prints numbers; asserts nothing.
//!
//!   cargo run --release -p streamgate-compat --bin cluster_bench -- [--lease-secs N]
//!       [--only failover,hand-off,forwarding,metadata-load,throughput]
//!
//! 1. Failover: three nodes at the lease time given (default: streamgate's default, 10
//!    s); one client per stream appends through a node other than the victim; the
//!    victim is `kill -9`ed. For each stream the victim sequenced: the time from the
//!    kill to its first acknowledged append.
//!    Then the same with `SIGTERM`: the victim hands its streams over before it stops,
//!    and the appends that were not acknowledged are counted too.
//! 2. Forwarding overhead: one client makes check-tails (no storage: the hop alone),
//!    then 1-record appends, one at a time on one stream, through the node that
//!    sequences it and through another node by turns. Then 2,000 check-tails at once
//!    through the other node, once its remembered owner has aged out: the owner
//!    lookups they cost, and the time until all are answered.
//! 3. Metadata load: PostgreSQL transactions per second per node while the cluster is
//!    idle, with 10, 1,000 and 10,000 streams held across the nodes (every statement
//!    outside a transaction is one). Then a fourth node joins: the time until the four
//!    hold even shares and the new one serves its own.
//! 4. Throughput: 16 clients appending 64 KiB batches to 16 streams for `--seconds`,
//!    through one node of a cluster of one and spread over the nodes of a cluster of
//!    three.
//!
//! S3: `STREAMGATE_TEST_S3_ENDPOINT`, or a moto server this program starts from
//! `.venv-compat`. PostgreSQL: `STREAMGATE_TEST_POSTGRES` (default the local server). A
//! missing service is reported and the program exits 1.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::{json, Value};
use streamgate_compat::percentile;
use streamgate_compat::services::{postgres_answers, s3_endpoint};
use streamgate_tests::cluster::Cluster;
use streamgate_tests::{backends, client};

#[derive(Parser)]
struct Args {
    /// Lease time of the nodes in the failover measurement.
    #[arg(long, default_value_t = 10)]
    lease_secs: u64,
    /// Calls per path (check-tails, then appends) in the forwarding measurement.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
    calls: u64,
    /// Run only these measurements (all of them by default).
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Phase>,
    /// Length of each throughput phase.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
}

/// The measurements, in the order they run.
#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
enum Phase {
    Failover,
    HandOff,
    Forwarding,
    MetadataLoad,
    Throughput,
}

const BASIN: &str = "bench-cluster";

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let _moto = match s3_endpoint() {
        Ok((_, moto)) => moto,
        Err(why) => {
            eprintln!("cluster_bench: {why}");
            std::process::exit(1);
        }
    };
    let postgres = backends::postgres_server();
    if !postgres_answers(&postgres) {
        eprintln!(
            "cluster_bench: PostgreSQL does not answer at {postgres}; set STREAMGATE_TEST_POSTGRES"
        );
        std::process::exit(1);
    }
    let lease = args.lease_secs.to_string();
    let runs = |phase: Phase| args.only.is_empty() || args.only.contains(&phase);

    if runs(Phase::Failover) {
        println!(
            "== failover: kill -9 of one of three nodes, lease {} s",
            args.lease_secs
        );
        node_loss(&lease, Loss::Kill).await;
    }
    if runs(Phase::HandOff) {
        println!(
            "== hand-off: SIGTERM of one of three nodes, lease {} s",
            args.lease_secs
        );
        node_loss(&lease, Loss::Terminate).await;
    }
    if runs(Phase::Forwarding) {
        println!("== forwarding: one client, one call at a time, through the owner and another node by turns");
        forwarding(args.calls as usize).await;
    }
    if runs(Phase::MetadataLoad) {
        println!("== metadata load of an idle cluster of three nodes");
        metadata_load().await;
    }
    if runs(Phase::Throughput) {
        println!(
            "== throughput: 16 clients, 64 KiB batches, {} s, records on S3 (moto)",
            args.seconds
        );
        for nodes in [1, 3] {
            let cluster = Cluster::start(nodes, &[]);
            setup_basin(&cluster).await;
            let (mib_s, appends) = throughput(&cluster, args.seconds).await;
            println!("{nodes} node(s): {mib_s:.1} MiB/s acknowledged ({appends} appends)");
        }
    }
}

/// A basin that creates streams on first append.
async fn setup_basin(cluster: &Cluster) {
    let response = client()
        .post(format!("{}/v1/basins", cluster.endpoint(0)))
        .json(&json!({"basin": BASIN, "config": {"create_stream_on_append": true}}))
        .send()
        .await
        .expect("creating the basin");
    assert!(
        response.status().is_success(),
        "creating the basin: {}",
        response.status()
    );
}

/// Appends one batch of `bodies` through `endpoint`; the node that served it, when
/// acknowledged.
async fn append(
    http: &reqwest::Client,
    endpoint: &str,
    stream: &str,
    bodies: &[String],
) -> Option<String> {
    let records: Vec<Value> = bodies.iter().map(|b| json!({ "body": b })).collect();
    let response = http
        .post(format!("{endpoint}/v1/streams/{stream}/records"))
        .header("s2-basin", BASIN)
        .json(&json!({ "records": records }))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .ok()?;
    if !response.status().is_success() {
        return None;
    }
    let served_by = response
        .headers()
        .get("streamgate-served-by")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    response.bytes().await.ok()?;
    Some(served_by)
}

/// How the victim of `node_loss` leaves.
#[derive(Clone, Copy, PartialEq)]
enum Loss {
    /// `kill -9`: its streams wait for its lease to run out.
    Kill,
    /// `SIGTERM`: it hands its streams over before it stops.
    Terminate,
}

/// One client per stream appends through a node that stays while node 0 leaves (as
/// `loss` says); for each stream node 0 sequenced: the time from the loss to the first
/// acknowledged append sent after it, the longest an append took from then on, and how
/// many were not acknowledged.
async fn node_loss(lease: &str, loss: Loss) {
    let mut cluster = Cluster::start(3, &["--lease-secs", lease]);
    for node in 0..3 {
        cluster.wait_for_live_nodes(node, 3).await;
    }
    setup_basin(&cluster).await;
    let streams = 12;
    let http = client();
    // Where each stream is sequenced.
    let mut owner = HashMap::new();
    for s in 0..streams {
        let served_by = append(&http, &cluster.endpoint(0), &format!("f{s}"), &["x".into()])
            .await
            .expect("an append");
        owner.insert(
            s,
            cluster.node_at(&served_by).expect("a node of the cluster"),
        );
    }
    let victim = 0;
    let stop = Arc::new(AtomicBool::new(false));
    let per_stream =
        || -> Arc<Vec<AtomicU64>> { Arc::new((0..streams).map(|_| AtomicU64::new(0)).collect()) };
    let (first_ack_after, longest_after, failed_after) = (per_stream(), per_stream(), per_stream());
    let lost_at = Arc::new(std::sync::OnceLock::<Instant>::new());
    let mut clients = Vec::new();
    for s in 0..streams {
        let endpoint = cluster.endpoint(1 + s % 2);
        let (http, stop, lost_at) = (http.clone(), stop.clone(), lost_at.clone());
        let (first, longest, failed) = (
            first_ack_after.clone(),
            longest_after.clone(),
            failed_after.clone(),
        );
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let sent = Instant::now();
                let acked = append(&http, &endpoint, &format!("f{s}"), &["y".into()])
                    .await
                    .is_some();
                if let Some(lost) = lost_at.get().filter(|lost| sent > **lost) {
                    let took = sent.elapsed().as_millis() as u64;
                    longest[s].fetch_max(took, Ordering::SeqCst);
                    if !acked {
                        failed[s].fetch_add(1, Ordering::SeqCst);
                    } else if first[s].load(Ordering::SeqCst) == 0 {
                        let after = lost.elapsed().as_millis() as u64;
                        first[s].store(after.max(1), Ordering::SeqCst);
                    }
                }
                if !acked {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let exited_after = match loss {
        Loss::Kill => {
            cluster.nodes[victim].kill9();
            lost_at.set(Instant::now()).unwrap();
            None
        }
        Loss::Terminate => {
            let signalled = Instant::now();
            lost_at.set(signalled).unwrap();
            let code = tokio::task::block_in_place(|| cluster.nodes[victim].terminate());
            if code != Some(0) {
                println!("the node stopped with SIGTERM exited with {code:?}");
                std::process::exit(1);
            }
            Some(signalled.elapsed())
        }
    };
    let affected: Vec<usize> = (0..streams).filter(|s| owner[s] == victim).collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    while affected
        .iter()
        .any(|s| first_ack_after[*s].load(Ordering::SeqCst) == 0)
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A little longer, so appends after the first one count too.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        let _ = c.await;
    }
    let millis = |values: &Arc<Vec<AtomicU64>>| -> Vec<Duration> {
        let mut times: Vec<Duration> = affected
            .iter()
            .map(|s| Duration::from_millis(values[*s].load(Ordering::SeqCst)))
            .collect();
        times.sort();
        times
    };
    let times = millis(&first_ack_after);
    if times.is_empty() || times.contains(&Duration::ZERO) {
        println!("the lost node's streams did not all take appends again within 120 s");
        std::process::exit(1);
    }
    let longest = millis(&longest_after);
    let failed: u64 = affected
        .iter()
        .map(|s| failed_after[*s].load(Ordering::SeqCst))
        .sum();
    let what = match loss {
        Loss::Kill => "kill -9",
        Loss::Terminate => "SIGTERM",
    };
    if let Some(exited) = exited_after {
        println!(
            "the node exited {:.2} s after SIGTERM",
            exited.as_secs_f64()
        );
    }
    println!(
        "{} of {streams} streams were on the lost node; {what} to first acknowledged append: min {:.2} s, median {:.2} s, max {:.2} s; longest append from then: max {:.2} s; appends not acknowledged: {failed}",
        times.len(),
        times[0].as_secs_f64(),
        percentile(&times, 0.5).as_secs_f64(),
        times[times.len() - 1].as_secs_f64(),
        longest[longest.len() - 1].as_secs_f64(),
    );
}

async fn forwarding(calls: usize) {
    let cluster = Cluster::start(3, &["--metrics-listen", "127.0.0.1:0"]);
    for node in 0..3 {
        cluster.wait_for_live_nodes(node, 3).await;
    }
    setup_basin(&cluster).await;
    let http = client();
    let served_by = append(&http, &cluster.endpoint(0), "fw", &["x".into()])
        .await
        .expect("an append");
    let owner = cluster.node_at(&served_by).expect("a node of the cluster");
    let paths = [cluster.endpoint(owner), cluster.endpoint((owner + 1) % 3)];
    for (what, call) in [("check-tail", Call::CheckTail), ("append", Call::Append)] {
        // Warm the connections up first.
        for _ in 0..100 {
            for endpoint in &paths {
                call.make(&http, endpoint).await;
            }
        }
        // The two paths take turns, each going first every other time, so a change in
        // the disk's or moto's speed during the run weighs on both alike.
        let mut latencies = [Vec::with_capacity(calls), Vec::with_capacity(calls)];
        let mut extra = Vec::with_capacity(calls);
        for i in 0..calls {
            let mut took = [Duration::ZERO; 2];
            for path in [i % 2, 1 - i % 2] {
                let started = Instant::now();
                assert!(
                    call.make(&http, &paths[path]).await,
                    "a {what} through {} failed",
                    paths[path]
                );
                took[path] = started.elapsed();
            }
            extra.push((took[1].as_secs_f64() - took[0].as_secs_f64()) * 1e3);
            for path in 0..2 {
                latencies[path].push(took[path]);
            }
        }
        for path in &mut latencies {
            path.sort();
        }
        extra.sort_by(f64::total_cmp);
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "{what}: through its owner p50 {:.2} ms, p99 {:.2} ms; through another node p50 \
             {:.2} ms, p99 {:.2} ms; the extra hop, median of {calls} pairs: {:.2} ms",
            ms(percentile(&latencies[0], 0.5)),
            ms(percentile(&latencies[0], 0.99)),
            ms(percentile(&latencies[1], 0.5)),
            ms(percentile(&latencies[1], 0.99)),
            extra[calls / 2],
        );
    }
    requests_at_once(&cluster, (owner + 1) % 3).await;
}

/// Requests that reach a node all at once for a stream another node sequences, just
/// after the owner the node remembered has aged out (sessions opening together, say):
/// how many lookups of the owner they cost, and how long until all were answered.
async fn requests_at_once(cluster: &Cluster, via: usize) {
    const AT_ONCE: usize = 2000;
    const ROUNDS: usize = 5;
    // One HTTP/2 connection, so that the requests arrive together.
    let http = streamgate_tests::client_builder()
        .http2_prior_knowledge()
        .build()
        .expect("an HTTP client");
    let endpoint = cluster.endpoint(via);
    assert!(Call::CheckTail.make(&http, &endpoint).await);
    let (mut made, mut took) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        // Past the half second a node remembers an owner for.
        tokio::time::sleep(Duration::from_millis(700)).await;
        let before = cluster.owner_lookups(via).await;
        let started = Instant::now();
        let answered =
            futures::future::join_all((0..AT_ONCE).map(|_| Call::CheckTail.make(&http, &endpoint)))
                .await;
        took.push(started.elapsed());
        let failed = answered.iter().filter(|ok| !**ok).count();
        assert_eq!(
            failed, 0,
            "{failed} of {AT_ONCE} check-tails at once failed"
        );
        made.push(cluster.owner_lookups(via).await - before);
    }
    took.sort();
    println!(
        "{AT_ONCE} check-tails at once through another node, {ROUNDS} rounds: owner lookups \
         {made:?}; all answered in {:.1} ms (median round), {:.1} ms (slowest)",
        took[ROUNDS / 2].as_secs_f64() * 1e3,
        took[ROUNDS - 1].as_secs_f64() * 1e3,
    );
}

/// A call of the forwarding measurement.
#[derive(Clone, Copy)]
enum Call {
    /// No storage: the hop alone.
    CheckTail,
    /// One 1-record batch, durable before it is acknowledged.
    Append,
}

impl Call {
    /// Makes the call through `endpoint`; whether it succeeded.
    async fn make(self, http: &reqwest::Client, endpoint: &str) -> bool {
        match self {
            Call::Append => append(http, endpoint, "fw", &["z".into()]).await.is_some(),
            Call::CheckTail => {
                let answer = http
                    .get(format!("{endpoint}/v1/streams/fw/records/tail"))
                    .header("s2-basin", BASIN)
                    .timeout(Duration::from_secs(30))
                    .send()
                    .await;
                match answer {
                    Ok(answer) if answer.status().is_success() => answer.bytes().await.is_ok(),
                    _ => false,
                }
            }
        }
    }
}

/// Transactions committed in `database` so far, by PostgreSQL's statistics.
fn commits(database: &str) -> u64 {
    let output = std::process::Command::new("psql")
        .arg(format!("{}/postgres", backends::postgres_server()))
        .args([
            "-qAtc",
            &format!(
                "SELECT pg_stat_clear_snapshot(); SELECT xact_commit FROM pg_stat_database WHERE datname = '{database}'"
            ),
        ])
        .output()
        .expect("running psql");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .next_back()
        .unwrap_or(0)
}

async fn metadata_load() {
    let mut cluster = Cluster::start(3, &[]);
    for node in 0..3 {
        cluster.wait_for_live_nodes(node, 3).await;
    }
    setup_basin(&cluster).await;
    let database = database_of(&cluster).await;
    let http = client();
    let mut created = 0;
    for target in [10usize, 1_000, 10_000] {
        // Streams are taken by the node the placement rule gives, on first append.
        let next: Vec<usize> = (created..target).collect();
        futures::future::join_all(next.chunks(next.len().div_ceil(32).max(1)).map(|chunk| {
            let (http, endpoint) = (http.clone(), cluster.endpoint(chunk[0]));
            let chunk = chunk.to_vec();
            async move {
                for s in chunk {
                    append(&http, &endpoint, &format!("m{s}"), &["x".into()]).await;
                }
            }
        }))
        .await;
        created = target;
        // Let the takeovers settle, then count over 20 s.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let window = Duration::from_secs(20);
        let before = commits(&database);
        tokio::time::sleep(window).await;
        let after = commits(&database);
        let views = futures::future::join_all((0..3).map(|n| cluster.view(n))).await;
        let owned: Vec<u64> = views
            .iter()
            .map(|v| v["node"]["streams_served"].as_u64().unwrap_or(0))
            .collect();
        println!(
            "{target} streams (held per node: {owned:?}): {:.1} transactions/s per node",
            (after - before) as f64 / window.as_secs_f64() / 3.0
        );
    }
    join_of_a_fourth_node(&mut cluster, created as u64).await;
}

/// A fourth node joins the cluster holding `streams`: how long until every node holds
/// an even share (by `GET /cluster`), and until the new node serves all of its share.
async fn join_of_a_fourth_node(cluster: &mut Cluster, streams: u64) {
    let started = Instant::now();
    let joined = cluster.add_node(&[]);
    let (floor, ceil) = (streams / 4, streams.div_ceil(4));
    let deadline = started + Duration::from_secs(300);
    loop {
        let view = cluster.view(0).await;
        let shares: Vec<u64> = view["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| n["live"] == true)
            .map(|n| n["streams_owned"].as_u64().unwrap_or(0))
            .collect();
        let served = cluster.view(joined).await["node"]["streams_served"]
            .as_u64()
            .unwrap_or(0);
        let even = shares.len() == 4 && shares.iter().all(|s| (floor..=ceil).contains(s));
        if even && Some(&served) == shares.last() {
            println!(
                "a fourth node joined the {streams} streams: even shares {shares:?}, all served, \
                 {:.1} s after it was started",
                started.elapsed().as_secs_f64()
            );
            return;
        }
        if Instant::now() > deadline {
            println!("a fourth node did not get an even share within 300 s: {shares:?}, serving {served}");
            std::process::exit(1);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The database name the cluster's nodes share.
async fn database_of(cluster: &Cluster) -> String {
    let banner = &cluster.nodes[0].banner;
    banner
        .lines()
        .find_map(|l| l.trim().strip_prefix("metadata:"))
        .and_then(|l| l.trim().rsplit('/').next())
        .expect("the banner names the metadata database")
        .to_owned()
}

async fn throughput(cluster: &Cluster, seconds: u64) -> (f64, u64) {
    for node in 0..cluster.nodes.len() {
        cluster.wait_for_live_nodes(node, cluster.nodes.len()).await;
    }
    let http = client();
    let body = "x".repeat(64 * 1024);
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for c in 0..16 {
        let endpoint = cluster.endpoint(c);
        let (http, stop, acked, body) = (http.clone(), stop.clone(), acked.clone(), body.clone());
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                if append(
                    &http,
                    &endpoint,
                    &format!("t{c}"),
                    std::slice::from_ref(&body),
                )
                .await
                .is_some()
                {
                    acked.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    // The first appends take the streams; count from when that is done.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let start = (Instant::now(), acked.load(Ordering::SeqCst));
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let appends = acked.load(Ordering::SeqCst) - start.1;
    let secs = start.0.elapsed().as_secs_f64();
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        let _ = c.await;
    }
    (appends as f64 * 64.0 / 1024.0 / secs, appends)
}
