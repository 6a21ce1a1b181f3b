//! `groups_bench`: consumer-group throughput over RESP, the work-queue loop: `XREADGROUP
//! ... COUNT 1 STREAMS key >` for an entry, then `XACK` of it. Against streamgate (each
//! reply once the group state it shows is durable), a Redis with `appendonly yes` and
//! `appendfsync always` (the durable peer), and a Redis without persistence, with 1, 8
//! and 50 connections, one command at a time and pipelined. Prints numbers; asserts
//! nothing.
//!
//!   cargo run --release -p streamgate-compat --bin groups_bench -- [--seconds 3] [--pipeline 16]
//!
//! Each target's stream is filled first; each run takes a fresh group over it from the
//! start, so every run reads the same entries. A run that empties the stream stops there
//! and its rate counts the time it ran. Needs `redis-server`; a target that cannot be
//! started or answers with an error ends the program with exit code 1.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use streamgate_compat::services::{redis_server, KillOnDrop};
use streamgate_compat::Server;
use streamgate_tests::resp::{Connection, Reply};

#[derive(Parser)]
struct Args {
    /// How long each run goes on.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Commands sent per write in the pipelined runs.
    #[arg(long, default_value_t = 16)]
    pipeline: usize,
    /// Connection counts, comma-separated.
    #[arg(long, default_value = "1,8,50", value_delimiter = ',')]
    connections: Vec<usize>,
    /// Entries put in each target's stream before the runs.
    #[arg(long, default_value_t = 300_000)]
    entries: usize,
    #[arg(long, default_value = "target/groups-bench-data")]
    data_dir: std::path::PathBuf,
}

/// A RESP server to measure: its port, and the basin to log in to (streamgate only).
struct Target {
    name: &'static str,
    port: u16,
    basin: Option<&'static str>,
}

const KEY: &str = "groups-bench";

#[tokio::main]
async fn main() {
    if let Err(err) = run(Args::parse()).await {
        eprintln!("groups_bench: {err:#}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Result<()> {
    let _ = std::fs::remove_dir_all(&args.data_dir);
    let (streamgate, _redis_always, _redis_memory, targets) = start_targets(&args).await?;
    println!(
        "XREADGROUP (COUNT 1) + XACK per entry, {} s per run, pipelined runs send {} commands per write",
        args.seconds, args.pipeline
    );
    for target in &targets {
        fill(target, args.entries).await?;
    }
    println!(
        "| connections | pipeline | {} |",
        targets
            .iter()
            .map(|t| t.name)
            .collect::<Vec<_>>()
            .join(" | ")
    );
    println!("|---|---|{}", "---|".repeat(targets.len()));
    let mut run_number = 0;
    for &connections in &args.connections {
        for pipeline in [1, args.pipeline] {
            run_number += 1;
            let mut cells = Vec::new();
            for target in &targets {
                let group = format!("run-{run_number}");
                let (entries, took) =
                    work(target, &group, connections, pipeline, args.seconds).await?;
                let rate = entries as f64 / took.as_secs_f64();
                let ran_out = if took.as_secs_f64() < args.seconds * 0.95 {
                    " (stream emptied)"
                } else {
                    ""
                };
                cells.push(format!("{rate:.0}/s{ran_out}"));
            }
            println!("| {connections} | {pipeline} | {} |", cells.join(" | "));
        }
    }
    drop(streamgate);
    Ok(())
}

async fn start_targets(args: &Args) -> Result<(Server, KillOnDrop, KillOnDrop, Vec<Target>)> {
    std::fs::create_dir_all(args.data_dir.join("redis-always"))?;
    std::fs::create_dir_all(args.data_dir.join("redis-memory"))?;
    let (always_port, always) = redis_server(
        &args.data_dir.join("redis-always"),
        &["--appendonly", "yes", "--appendfsync", "always"],
    )
    .map_err(|e| anyhow!(e))?;
    let (memory_port, memory) =
        redis_server(&args.data_dir.join("redis-memory"), &["--appendonly", "no"])
            .map_err(|e| anyhow!(e))?;
    let server = Server::start(&args.data_dir.join("streamgate"));
    let created = streamgate_tests::client()
        .post(format!("{}/v1/basins", server.endpoint))
        .json(&serde_json::json!({"basin": "groups-bench", "config": {"create_stream_on_append": true}}))
        .send()
        .await
        .context("creating the benchmark basin")?;
    if !created.status().is_success() {
        bail!(
            "streamgate refused the benchmark basin: {}",
            created.status()
        );
    }
    let targets = vec![
        Target {
            name: "streamgate (durable)",
            port: server.resp_port,
            basin: Some("groups-bench"),
        },
        Target {
            name: "Redis, appendfsync always",
            port: always_port,
            basin: None,
        },
        Target {
            name: "Redis, no persistence",
            port: memory_port,
            basin: None,
        },
    ];
    Ok((server, always, memory, targets))
}

async fn connect(target: &Target) -> Result<Connection> {
    Connection::open(target.port, target.basin)
        .await
        .with_context(|| format!("connecting to {}", target.name))
}

/// Puts `entries` entries in the target's stream, a thousand per write.
async fn fill(target: &Target, entries: usize) -> Result<()> {
    let mut connection = connect(target).await?;
    let started = Instant::now();
    let mut left = entries;
    while left > 0 {
        let batch = left.min(1000);
        let commands: Vec<Vec<String>> = (0..batch)
            .map(|_| {
                ["XADD", KEY, "*", "job", "payload-of-sixteen"]
                    .map(String::from)
                    .to_vec()
            })
            .collect();
        connection.send_pipelined(&commands).await?;
        for _ in 0..batch {
            expect_ok(target, connection.reply().await?)?;
        }
        left -= batch;
    }
    println!(
        "{}: {entries} entries put in {:.1} s",
        target.name,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn expect_ok(target: &Target, reply: Reply) -> Result<Reply> {
    match reply {
        Reply::Error(message) => bail!("{} answered with an error: {message}", target.name),
        reply => Ok(reply),
    }
}

/// `connections` consumers of a new group, each taking entries one by one and
/// acknowledging them, `pipeline` at a time, for `seconds`: entries acknowledged, and how
/// long the consumers ran.
async fn work(
    target: &Target,
    group: &str,
    connections: usize,
    pipeline: usize,
    seconds: f64,
) -> Result<(usize, Duration)> {
    let mut admin = connect(target).await?;
    expect_ok(
        target,
        admin.call(&["XGROUP", "CREATE", KEY, group, "0"]).await?,
    )?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let mut consumers = Vec::new();
    for n in 0..connections {
        let mut connection = connect(target).await?;
        let group = group.to_string();
        let target = Target {
            name: target.name,
            port: target.port,
            basin: target.basin,
        };
        consumers.push(tokio::spawn(async move {
            let consumer = format!("consumer-{n}");
            let read: Vec<String> = [
                "XREADGROUP",
                "GROUP",
                &group,
                &consumer,
                "COUNT",
                "1",
                "STREAMS",
                KEY,
                ">",
            ]
            .map(String::from)
            .to_vec();
            let mut acknowledged = 0;
            while Instant::now() < deadline {
                connection
                    .send_pipelined(&vec![read.clone(); pipeline])
                    .await?;
                let mut ids = Vec::with_capacity(pipeline);
                for _ in 0..pipeline {
                    if let Some(id) = entry_id(expect_ok(&target, connection.reply().await?)?)? {
                        ids.push(id);
                    }
                }
                if ids.is_empty() {
                    break;
                }
                let acks: Vec<Vec<String>> = ids
                    .iter()
                    .map(|id| vec!["XACK".into(), KEY.into(), group.clone(), id.clone()])
                    .collect();
                connection.send_pipelined(&acks).await?;
                for _ in &ids {
                    match expect_ok(&target, connection.reply().await?)? {
                        Reply::Integer(1) => acknowledged += 1,
                        other => bail!("{}: XACK answered {other:?}", target.name),
                    }
                }
            }
            Ok::<_, anyhow::Error>(acknowledged)
        }));
    }
    let mut total = 0;
    for consumer in consumers {
        total += consumer.await??;
    }
    Ok((total, started.elapsed()))
}

/// The ID of the one entry in an XREADGROUP reply, or none when there was nothing new.
fn entry_id(reply: Reply) -> Result<Option<String>> {
    let Reply::Array(Some(streams)) = reply else {
        return Ok(None);
    };
    let id = (|| {
        let Reply::Array(Some(stream)) = streams.first()? else {
            return None;
        };
        let Reply::Array(Some(entries)) = stream.get(1)? else {
            return None;
        };
        let Reply::Array(Some(entry)) = entries.first()? else {
            return None;
        };
        match entry.first()? {
            Reply::Bulk(Some(id)) => String::from_utf8(id.clone()).ok(),
            _ => None,
        }
    })();
    id.map(Some)
        .ok_or_else(|| anyhow!("not an XREADGROUP reply: {streams:?}"))
}
