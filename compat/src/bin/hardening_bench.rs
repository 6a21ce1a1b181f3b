//! `hardening_bench`: how streamgate behaves when things go wrong. Prints numbers;
//! asserts nothing.
//!
//!   cargo run --release -p streamgate-compat --bin hardening_bench -- [--rounds N]
//!
//! 1. Recovery from store outages: records on S3 (moto, through a TCP proxy), then the
//!    proxy refuses connections (or black-holes them) for `--outage-secs`; a client keeps
//!    sending appends. Reported: the time from the store's return to the first
//!    acknowledged append sent after it, and to the acknowledgement of the appends that
//!    were waiting for the store. The same for the metadata store (PostgreSQL through a
//!    proxy): the time from its return to the first successful control-plane call.
//! 2. Append latency while another address floods the server with bad tokens at
//!    `--flood-rate` requests per second, next to the latency without the flood.
//!
//! S3: `STREAMGATE_TEST_S3_ENDPOINT`, or a moto server this program starts from
//! `.venv-compat` (scripts/test.sh creates it). PostgreSQL: `STREAMGATE_TEST_POSTGRES`
//! (default the local server). A missing service is reported and the program exits 1.

use std::process::Command;
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::json;
use streamgate_compat::services::{postgres_answers, s3_endpoint};
use streamgate_tests::proxy::{
    server_with_metadata_behind_proxy, server_with_objects_behind_proxy, Mode,
};
use streamgate_tests::Server;

#[derive(Parser)]
struct Args {
    /// Outages played per kind.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// How long each outage lasts.
    #[arg(long, default_value_t = 5)]
    outage_secs: u64,
    /// Failed-authentication requests per second in the flood phase.
    #[arg(long, default_value_t = 1000)]
    flood_rate: u64,
    /// Length of each latency phase.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
}

const BASIN: &str = "bench-hardening";

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let (s3, _moto) = match s3_endpoint() {
        Ok(found) => found,
        Err(why) => {
            eprintln!("hardening_bench: {why}");
            std::process::exit(1);
        }
    };
    let postgres = streamgate_tests::backends::postgres_server();
    if !postgres_answers(&postgres) {
        eprintln!("hardening_bench: PostgreSQL does not answer at {postgres}; set STREAMGATE_TEST_POSTGRES");
        std::process::exit(1);
    }

    println!(
        "== recovery from object store (S3) outages, {} s each",
        args.outage_secs
    );
    for mode in [Mode::Refuse, Mode::BlackHole] {
        let (first, waiting) = s3_recovery(&s3, mode, &args).await;
        println!(
            "{mode:?}: first ack of an append sent after the store's return {}; appends waiting through the outage acked {}",
            spread(&first),
            spread(&waiting)
        );
    }
    println!(
        "== recovery from metadata store (PostgreSQL) outages, {} s each",
        args.outage_secs
    );
    for mode in [Mode::Refuse, Mode::BlackHole] {
        let (control, appends_failed) = postgres_recovery(&postgres, mode, &args).await;
        println!(
            "{mode:?}: first successful control-plane call after the store's return {}; appends that failed during the outages: {appends_failed}",
            spread(&control)
        );
    }
    println!("== append latency (one client, 1 record per append) under a flood of bad tokens");
    auth_flood(&args).await;
}

fn append_request(client: &reqwest::Client, endpoint: &str, body: &str) -> reqwest::RequestBuilder {
    client
        .post(format!("{endpoint}/v1/streams/s/records"))
        .header("s2-basin", BASIN)
        .json(&json!({"records": [{"body": body}]}))
}

/// Per round: (time from the store's return to the first ack of an append sent after
/// it, time until the last append accepted before the outage was acked).
async fn s3_recovery(s3: &str, mode: Mode, args: &Args) -> (Vec<Duration>, Vec<Duration>) {
    let dir = tempfile::tempdir().unwrap();
    let bucket = format!("streamgate-bench-{}-{mode:?}", std::process::id()).to_lowercase();
    let (proxy, server) = server_with_objects_behind_proxy(s3, dir.path(), &bucket).await;
    streamgate_tests::create_streams(&server.endpoint, BASIN, &["s"]).await;
    let client = streamgate_tests::client_builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let (mut first, mut waiting) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        // A patient append started just before the outage waits through it.
        proxy.set(mode);
        let pending = tokio::spawn(
            append_request(&client, &server.endpoint, &format!("waiting-{round}")).send(),
        );
        tokio::time::sleep(Duration::from_secs(args.outage_secs)).await;
        let back = Instant::now();
        proxy.set(Mode::Forward);
        let recovered = loop {
            let response = append_request(&client, &server.endpoint, &format!("probe-{round}"))
                .send()
                .await;
            if response.is_ok_and(|r| r.status() == 200) {
                break back.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        first.push(recovered);
        // (Refused, rather than accepted, if it arrived after the writer saw the outage.)
        if pending.await.unwrap().is_ok_and(|r| r.status() == 200) {
            waiting.push(back.elapsed());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    (first, waiting)
}

/// Per round, the time from the metadata store's return to the first successful
/// control-plane call; and how many appends failed while it was away.
async fn postgres_recovery(postgres: &str, mode: Mode, args: &Args) -> (Vec<Duration>, usize) {
    let dir = tempfile::tempdir().unwrap();
    let database = format!("streamgate_bench_{}_{mode:?}", std::process::id()).to_lowercase();
    let (proxy, server) = server_with_metadata_behind_proxy(postgres, dir.path(), &database).await;
    streamgate_tests::create_streams(&server.endpoint, BASIN, &["s"]).await;
    let client = streamgate_tests::client_builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let (mut control, mut failed) = (Vec::new(), 0);
    for round in 0..args.rounds {
        proxy.set(mode);
        let outage_ends = Instant::now() + Duration::from_secs(args.outage_secs);
        while Instant::now() < outage_ends {
            let response = append_request(&client, &server.endpoint, "during")
                .send()
                .await;
            failed += usize::from(!response.is_ok_and(|r| r.status() == 200));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let back = Instant::now();
        proxy.set(Mode::Forward);
        loop {
            let response = client
                .post(format!("{}/v1/streams", server.endpoint))
                .header("s2-basin", BASIN)
                .json(&json!({"stream": format!("after-{round}")}))
                .send()
                .await;
            if response.is_ok_and(|r| r.status() == 201) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        control.push(back.elapsed());
    }
    let _ = Command::new("psql")
        .arg(format!("{postgres}/postgres"))
        .args([
            "-qc",
            &format!("drop database if exists {database} with (force)"),
        ])
        .output();
    (control, failed)
}

async fn auth_flood(args: &Args) {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    streamgate_tests::create_streams(&server.endpoint, BASIN, &["s"]).await;
    let client = streamgate_tests::client();
    let endpoint = server.endpoint.clone();
    let measure = |label: &'static str| {
        let (client, endpoint) = (client.clone(), endpoint.clone());
        async move {
            let ends = Instant::now() + Duration::from_secs(args.seconds);
            let mut latencies = Vec::new();
            while Instant::now() < ends {
                let started = Instant::now();
                let response = append_request(&client, &endpoint, label)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), 200);
                latencies.push(started.elapsed());
            }
            latencies
        }
    };
    let quiet = measure("quiet").await;
    // The flood comes from another address than the measured client.
    let attacker = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .build()
        .unwrap();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let flood = tokio::spawn({
        let (endpoint, rate) = (endpoint.clone(), args.flood_rate);
        async move {
            let mut interval = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut sent = Vec::new();
            let mut n = 0u64;
            while !*stopped.borrow() {
                interval.tick().await;
                n += 1;
                let request = attacker
                    .get(format!("{endpoint}/v1/basins"))
                    .bearer_auth(format!("a-bad-token-{n}"))
                    .send();
                sent.push(tokio::spawn(async move {
                    request.await.map(|r| r.status().as_u16()).unwrap_or(0)
                }));
            }
            let mut statuses = std::collections::BTreeMap::new();
            for answer in sent {
                *statuses.entry(answer.await.unwrap()).or_insert(0u64) += 1;
            }
            statuses
        }
    });
    let started = Instant::now();
    let flooded = measure("flooded").await;
    let elapsed = started.elapsed();
    stop.send_replace(true);
    let statuses = flood.await.unwrap();
    let total: u64 = statuses.values().sum();
    println!("without the flood: {}", summary(quiet));
    println!(
        "with {:.0} bad-token requests/s from another address ({statuses:?} by status): {}",
        total as f64 / elapsed.as_secs_f64(),
        summary(flooded)
    );
}

fn summary(mut latencies: Vec<Duration>) -> String {
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e3;
    format!(
        "{} appends, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        latencies.len(),
        at(0.5),
        at(0.99),
        at(1.0)
    )
}

fn spread(times: &[Duration]) -> String {
    if times.is_empty() {
        return "none measured".into();
    }
    let mut sorted: Vec<f64> = times.iter().map(|t| t.as_secs_f64()).collect();
    sorted.sort_by(f64::total_cmp);
    format!(
        "min {:.2} s, median {:.2} s, max {:.2} s over {} outages",
        sorted[0],
        sorted[sorted.len() / 2],
        sorted[sorted.len() - 1],
        sorted.len()
    )
}
