//! `encryption_bench`: what stream encryption costs, measured side by side in one run on
//! one server: a plaintext stream, an AEGIS-256 stream and an AES-256-GCM stream, each
//! with single-client unary append latency (1 KiB records), append-session throughput
//! (8 KiB records, pipelined) and read-session throughput of what was written. Prints
//! numbers and each cipher's ratio to plaintext; asserts nothing. A failed request ends
//! the run with a non-zero exit.
//!
//!   cargo run --release -p streamgate-compat --bin encryption_bench -- [--seconds N]
//!
//! `--plaintext-only` measures the plaintext stream alone, so a build without
//! encryption (or without usage metering) can be measured the same way for comparison
//! (`STREAMGATE_BIN=<its binary>`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use s2_sdk::append_session::AppendSessionConfig;
use s2_sdk::types::*;
use s2_sdk::S2Stream;
use streamgate_compat::{percentile, Server};

#[derive(Parser)]
struct Args {
    /// Where the server's data goes.
    #[arg(long, default_value = "target/encryption-bench-data")]
    data_dir: PathBuf,
    /// Duration of each throughput phase.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Unary appends in each latency phase.
    #[arg(long, default_value_t = 2000)]
    latency_appends: usize,
    /// Measure only the plaintext stream.
    #[arg(long)]
    plaintext_only: bool,
}

struct Measured {
    p50_ms: f64,
    p99_ms: f64,
    write_mibps: f64,
    read_mibps: f64,
}

fn batch_of(records: usize, size: usize) -> AppendInput {
    let records: Vec<AppendRecord> = (0..records)
        .map(|_| AppendRecord::new(vec![b'x'; size]).unwrap())
        .collect();
    AppendInput::new(AppendRecordBatch::try_from_iter(records).unwrap())
}

async fn measure(stream: &S2Stream, args: &Args) -> Measured {
    // Latency: one client, one 1 KiB record per append, one at a time.
    let mut latencies = Vec::with_capacity(args.latency_appends);
    for _ in 0..args.latency_appends {
        let started = Instant::now();
        stream.append(batch_of(1, 1024)).await.unwrap();
        latencies.push(started.elapsed());
    }
    latencies.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;

    // Throughput: 64 records of 8 KiB per input, up to 16 inputs in flight.
    let session = stream.append_session(AppendSessionConfig::new());
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let started = Instant::now();
    let mut tickets = std::collections::VecDeque::new();
    let mut written = 0usize;
    while Instant::now() < deadline {
        if tickets.len() >= 16 {
            let ticket: s2_sdk::append_session::BatchSubmitTicket = tickets.pop_front().unwrap();
            ticket.await.unwrap();
        }
        tickets.push_back(session.submit(batch_of(64, 8192)).await.unwrap());
        written += 64 * 8192;
    }
    for ticket in tickets {
        ticket.await.unwrap();
    }
    session.close().await.unwrap();
    let write_mibps = written as f64 / (1 << 20) as f64 / started.elapsed().as_secs_f64();

    // Reading it all back in a read session.
    let tail = stream.check_tail().await.unwrap().seq_num;
    let input = ReadInput::new()
        .with_start(ReadStart::new().with_from(ReadFrom::SeqNum(0)))
        .with_stop(ReadStop::new().with_limits(ReadLimits::new().with_count(tail as usize)));
    let started = Instant::now();
    let mut session = stream
        .read_session(input, ReadSessionConfig::new())
        .await
        .unwrap();
    let mut read = 0usize;
    while let Some(batch) = session.next().await {
        read += batch
            .unwrap()
            .records
            .iter()
            .map(|r| r.body.len())
            .sum::<usize>();
    }
    let read_mibps = read as f64 / (1 << 20) as f64 / started.elapsed().as_secs_f64();
    Measured {
        p50_ms: ms(percentile(&latencies, 0.5)),
        p99_ms: ms(percentile(&latencies, 0.99)),
        write_mibps,
        read_mibps,
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let _ = std::fs::remove_dir_all(&args.data_dir);
    std::fs::create_dir_all(&args.data_dir).unwrap();
    // The embedded default (SQLite, local directory) whatever the environment says.
    let metadata = args.data_dir.join("metadata.db");
    let objects = args.data_dir.join("objects");
    let server = Server::start_with(
        &args.data_dir,
        &[
            "--metadata",
            metadata.to_str().unwrap(),
            "--objects",
            objects.to_str().unwrap(),
        ],
    );
    let s2 = streamgate_compat::benchmark_sdk_client(&server);
    let kinds: &[(&str, Option<EncryptionAlgorithm>)] = if args.plaintext_only {
        &[("plaintext", None)]
    } else {
        &[
            ("plaintext", None),
            ("aegis-256", Some(EncryptionAlgorithm::Aegis256)),
            ("aes-256-gcm", Some(EncryptionAlgorithm::Aes256Gcm)),
        ]
    };
    println!(
        "encryption_bench: {} s per throughput phase, {} unary appends per latency phase, local directory",
        args.seconds, args.latency_appends
    );
    let mut results = Vec::new();
    for (i, (name, cipher)) in kinds.iter().enumerate() {
        let basin: BasinName = format!("encryption-bench-{i}").parse().unwrap();
        let mut config = BasinConfig::new();
        if let Some(cipher) = cipher {
            config = config.with_stream_cipher(*cipher);
        }
        s2.create_basin(CreateBasinInput::new(basin.clone()).with_config(config))
            .await
            .unwrap();
        let basin = s2.basin(basin);
        basin
            .create_stream(CreateStreamInput::new("bench".parse().unwrap()))
            .await
            .unwrap();
        let stream = basin
            .stream("bench".parse().unwrap())
            .with_encryption_key(EncryptionKey::new([0x42u8; 32]));
        let measured = measure(&stream, &args).await;
        println!(
            "{name:>12}: unary append p50 {:.2} ms, p99 {:.2} ms; append session {:.1} MiB/s; read session {:.1} MiB/s",
            measured.p50_ms, measured.p99_ms, measured.write_mibps, measured.read_mibps
        );
        results.push((name, measured));
    }
    if let Some((_, plain)) = results.first() {
        for (name, m) in results.iter().skip(1) {
            println!(
                "{name:>12} vs plaintext: p50 {:.2}x, append throughput {:.2}x, read throughput {:.2}x",
                m.p50_ms / plain.p50_ms,
                m.write_mibps / plain.write_mibps,
                m.read_mibps / plain.read_mibps
            );
        }
    }
}
