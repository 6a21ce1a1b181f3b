//! `merge_bench`: what reading back a slow stream's history costs in object reads. One
//! client appends 100-byte records one at a time, 30 per compaction round, for 2,880
//! rounds: a day of a stream appending once a second, with the default 30 s rounds.
//! Then the server is restarted, so no cache holds anything, and the whole stream is
//! read back from the start. Prints the rounds, the segments compaction wrote, the object reads (GETs) the
//! read-back cost (from the server's own request counters) and the read's time.
//! Without merging every round's segment is its own object, one GET each; with it, a
//! few dozen. Asserts nothing; a failed request ends the run with a non-zero exit.
//!
//!   cargo run --release -p streamgate-compat --bin merge_bench -- [--rounds N] [--interval-ms MS]
//!
//! Rounds are compressed in time (`--interval-ms`, default 50 ms), so the hour within
//! which segments may merge never binds here; `STREAMGATE_BIN=<an older build>` measures
//! a build without merging the same way.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use s2_sdk::types::*;
use s2_sdk::S2Stream;
use streamgate_compat::Server;

#[derive(Parser)]
struct Args {
    /// Where the server's data goes.
    #[arg(long, default_value = "target/merge-bench-data")]
    data_dir: PathBuf,
    /// Compaction rounds.
    #[arg(long, default_value_t = 2880)]
    rounds: u64,
    /// Appends (of one record each) per round.
    #[arg(long, default_value_t = 30)]
    appends_per_round: u64,
    /// The server's compaction interval.
    #[arg(long, default_value_t = 50)]
    interval_ms: u64,
}

/// The server's counter of object-store requests of `operation` that succeeded.
async fn object_requests(server: &Server, operation: &str) -> u64 {
    let wanted = format!("operation=\"{operation}\"");
    server
        .scrape_metrics()
        .await
        .lines()
        .filter(|l| l.starts_with("streamgate_object_store_requests_total{"))
        .filter(|l| l.contains(&wanted) && l.contains("outcome=\"ok\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Reads the stream from the start to `end` in unary reads; the records read.
async fn read_everything(stream: &S2Stream, end: u64) -> u64 {
    let mut seq = 0;
    let mut records = 0;
    while seq < end {
        let batch = stream
            .read(ReadInput::new().with_start(ReadStart::new().with_from(ReadFrom::SeqNum(seq))))
            .await
            .expect("a read of history");
        let last = batch
            .records
            .last()
            .expect("records up to the tail")
            .seq_num;
        records += batch.records.len() as u64;
        seq = last + 1;
    }
    records
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let _ = std::fs::remove_dir_all(&args.data_dir);
    std::fs::create_dir_all(&args.data_dir).unwrap();
    let interval = args.interval_ms.to_string();
    let mut server = Server::start_with(
        &args.data_dir,
        &[
            "--compaction-interval-ms",
            &interval,
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    let s2 = streamgate_compat::benchmark_sdk_client(&server);
    let basin_name: BasinName = "merge-bench".parse().unwrap();
    s2.create_basin(CreateBasinInput::new(basin_name.clone()))
        .await
        .expect("creating the basin");
    let basin = s2.basin(basin_name.clone());
    basin
        .create_stream(CreateStreamInput::new("slow".parse().unwrap()))
        .await
        .expect("creating the stream");
    let stream = basin.stream("slow".parse().unwrap());

    let started = Instant::now();
    let puts_before = object_requests(&server, "put").await;
    // Spread over a little more than a round, so that each round finds some.
    let pause = Duration::from_millis(args.interval_ms * 6 / 5) / args.appends_per_round as u32;
    for round in 0..args.rounds {
        for _ in 0..args.appends_per_round {
            let record = AppendRecord::new(vec![b'x'; 100]).unwrap();
            let input = AppendInput::new(AppendRecordBatch::try_from_iter([record]).unwrap());
            stream.append(input).await.expect("an append");
            tokio::time::sleep(pause).await;
        }
        if round % 500 == 499 {
            eprintln!("{} rounds appended", round + 1);
        }
    }
    tokio::time::sleep(Duration::from_millis(3 * args.interval_ms + 500)).await;
    let puts = object_requests(&server, "put").await - puts_before;
    let append_secs = started.elapsed().as_secs_f64();
    let tail = stream.check_tail().await.expect("the tail").seq_num;

    server.terminate();
    server.restart();
    let s2 = streamgate_compat::benchmark_sdk_client(&server);
    let stream = s2.basin(basin_name).stream("slow".parse().unwrap());
    let gets_before = object_requests(&server, "get").await;
    let read_started = Instant::now();
    let records = read_everything(&stream, tail).await;
    let read_ms = read_started.elapsed().as_secs_f64() * 1e3;
    let gets = object_requests(&server, "get").await - gets_before;
    println!(
        "{} rounds of {} one-record appends of 100 bytes ({append_secs:.0} s, {puts} object writes: WAL chunks, segments and merges)",
        args.rounds, args.appends_per_round
    );
    println!(
        "read back {records} records from the start after a restart: {gets} object reads (GETs), {read_ms:.0} ms"
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&args.data_dir);
}
