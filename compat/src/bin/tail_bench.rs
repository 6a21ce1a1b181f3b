//! `tail_bench`: append-to-delivery latency for live readers, and the server's memory
//! per idle tailing reader. Prints numbers; asserts nothing.
//!
//!   cargo run --release -p streamgate-compat --bin tail_bench -- --readers 1,100,10000
//!
//! For each reader count, that many S2S read sessions (official Rust SDK) follow one
//! stream; a writer appends one record every 10 ms carrying its send time, and every
//! reader records how long each record took to reach it. Server memory is measured
//! before and after the sessions open, while they are idle.
//!
//! By default the writer sends its next record 10 ms after the previous one's
//! acknowledgement, so a server that acknowledges faster is offered more records. With
//! `--rate N` it sends N records a second on a clock, whatever the acknowledgements do,
//! so that builds are compared at the same offered load.
//!
//! The readers share the machine with the server, so what they cost shows in its
//! latencies. The writer's thread runs at a real-time priority where the system allows
//! (`--writer-priority`): otherwise the readers' threads, busy with a record's
//! deliveries, keep it from reading its acknowledgement for milliseconds, a delay a
//! writer on a machine of its own would not see. `--readers-client lean` opens the same S2S read sessions with a plain
//! HTTP/2 client (hyper, through reqwest) that only splits the frames and takes each
//! record's body out of its `ReadBatch`, with as many sessions per connection as the
//! SDK puts on one; the official SDK's sessions (the default) do much more per record.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Parser, ValueEnum};
use futures::{Stream, StreamExt};
use s2_sdk::types::*;
use streamgate_compat::{client_builder, cpu_secs, rss_kib, sdk_client, wire, Server};
use tokio::sync::Mutex;

#[derive(Parser)]
struct Args {
    /// Reader counts to measure, comma-separated.
    #[arg(long, default_value = "1,100,10000", value_delimiter = ',')]
    readers: Vec<usize>,
    /// Records appended per reader count.
    #[arg(long, default_value_t = 300)]
    records: usize,
    /// Records sent per second on a clock (each append without waiting for the one
    /// before); without it, each record is sent 10 ms after the previous one's ack.
    #[arg(long, value_parser = parse_rate)]
    rate: Option<f64>,
    /// Which client the readers are: the official SDK's read sessions, or lean ones
    /// over plain HTTP/2 that only split the frames and read the records' bodies, so
    /// the load generator takes less of the machine.
    #[arg(long, value_enum, default_value_t = ReadersClient::Sdk)]
    readers_client: ReadersClient,
    /// The writer thread's scheduling: real-time (SCHED_FIFO) where permitted, or the
    /// same as every other thread.
    #[arg(long, value_enum, default_value_t = WriterPriority::Realtime)]
    writer_priority: WriterPriority,
    /// Where the server under test keeps its data (emptied before and after).
    #[arg(long, default_value = "target/tail-bench-data")]
    data_dir: std::path::PathBuf,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum WriterPriority {
    Realtime,
    Normal,
}

/// Puts the calling thread under SCHED_FIFO; whether the system allowed it.
fn run_in_realtime() -> bool {
    let param = libc::sched_param { sched_priority: 10 };
    // SAFETY: `param` is a valid `sched_param`; pid 0 is the calling thread.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) == 0 }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ReadersClient {
    Sdk,
    Lean,
}

/// Read sessions per HTTP/2 connection for the lean readers: as many as the SDK puts on
/// one (10,000 sessions arrive over 112 connections), so that the server's side of the
/// comparison is the same.
const LEAN_SESSIONS_PER_CONNECTION: usize = 90;

/// What a reader hands on for each batch it receives: the send times its records carry.
type Follower = Pin<Box<dyn Stream<Item = Vec<u64>> + Send>>;

/// Send time carried by the first 8 bytes of a record's body.
fn send_time(body: &[u8]) -> u64 {
    u64::from_be_bytes(
        body[..8]
            .try_into()
            .expect("a record carries its send time"),
    )
}

/// A read session of the official SDK, from the stream's first record.
async fn sdk_follower(stream: &s2_sdk::S2Stream) -> Follower {
    let input = ReadInput::new().with_start(ReadStart::new().with_from(ReadFrom::SeqNum(0)));
    let session = stream
        .read_session(input, ReadSessionConfig::new())
        .await
        .unwrap();
    Box::pin(futures::stream::unfold(session, |mut session| async move {
        let batch = session.next().await?.ok()?;
        let sent = batch.records.iter().map(|r| send_time(&r.body)).collect();
        Some((sent, session))
    }))
}

/// A lean read session (see above) on `client`'s connection, from the first record.
async fn lean_follower(
    client: &reqwest::Client,
    endpoint: &str,
    basin: &str,
    stream: &str,
) -> Follower {
    let response = client
        .get(format!("{endpoint}/v1/streams/{stream}/records?seq_num=0"))
        .header("s2-basin", basin)
        .header("accept", "s2s/proto")
        .send()
        .await
        .unwrap();
    assert!(
        response.status().is_success(),
        "a read session was refused: {}",
        response.status()
    );
    let frames = response.bytes_stream();
    Box::pin(futures::stream::unfold(
        (frames, Vec::new()),
        |(mut frames, mut buffer)| async move {
            loop {
                if let Some((flags, message)) = wire::take_s2s_frame(&mut buffer) {
                    assert_eq!(
                        flags,
                        0,
                        "a frame that ends the session, or is compressed: {}",
                        String::from_utf8_lossy(&message)
                    );
                    let sent = wire::read_batch_bodies(&message)
                        .into_iter()
                        .map(send_time)
                        .collect();
                    return Some((sent, (frames, buffer)));
                }
                buffer.extend_from_slice(&frames.next().await?.ok()?);
            }
        },
    ))
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

fn parse_rate(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(rate) if rate > 0.0 && rate <= 100_000.0 => Ok(rate),
        _ => Err("a rate is records per second, above 0 and at most 100000".into()),
    }
}

/// Appends `records` records, each carrying its send time: 10 ms after the previous
/// one's acknowledgement, or `rate` a second on a clock. Returns each append's
/// acknowledgement latency (µs).
async fn append_timestamps(
    stream: s2_sdk::S2Stream,
    records: usize,
    rate: Option<f64>,
) -> Vec<u64> {
    let Some(rate) = rate else {
        let mut ack_latencies = Vec::with_capacity(records);
        for _ in 0..records {
            ack_latencies.push(append_timestamp(&stream).await);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        return ack_latencies;
    };
    let start = tokio::time::Instant::now();
    let mut appends = Vec::with_capacity(records);
    for i in 0..records {
        tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
        let stream = stream.clone();
        appends.push(tokio::spawn(async move { append_timestamp(&stream).await }));
    }
    let mut ack_latencies = Vec::with_capacity(records);
    for append in appends {
        ack_latencies.push(append.await.unwrap());
    }
    ack_latencies
}

/// Appends one record carrying its send time; returns the acknowledgement latency (µs).
async fn append_timestamp(stream: &s2_sdk::S2Stream) -> u64 {
    let body = now_micros().to_be_bytes().to_vec();
    let input = AppendInput::new(
        AppendRecordBatch::try_from_iter([AppendRecord::new(body).unwrap()]).unwrap(),
    );
    let sent = Instant::now();
    stream.append(input).await.unwrap();
    sent.elapsed().as_micros() as u64
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize] as f64 / 1000.0
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let _ = std::fs::remove_dir_all(&args.data_dir);
    let server = Server::start(&args.data_dir);
    let pid = server.pid().unwrap();
    let s2 = sdk_client(&server);
    let basin_name: BasinName = "tail-bench".parse().unwrap();
    s2.create_basin(CreateBasinInput::new(basin_name.clone()))
        .await
        .unwrap();
    let basin = s2.basin(basin_name.clone());

    let mut failed_rounds = 0;
    for (round, &readers) in args.readers.iter().enumerate() {
        let name: StreamName = format!("followed-{round}").parse().unwrap();
        basin
            .create_stream(CreateStreamInput::new(name.clone()))
            .await
            .unwrap();
        let stream = basin.stream(name.clone());
        let rss_before = rss_kib(pid);
        let latencies = Arc::new(Mutex::new(Vec::with_capacity(readers * args.records)));
        let mut sessions = Vec::new();
        let mut lean_client = None;
        for i in 0..readers {
            sessions.push(match args.readers_client {
                ReadersClient::Sdk => sdk_follower(&stream).await,
                ReadersClient::Lean => {
                    // reqwest keeps one HTTP/2 connection per client and puts every
                    // request on it: a client for each connection's share.
                    if i % LEAN_SESSIONS_PER_CONNECTION == 0 {
                        lean_client = Some(
                            client_builder()
                                .http2_prior_knowledge()
                                .build()
                                .expect("an HTTP/2 client"),
                        );
                    }
                    let client = lean_client.as_ref().unwrap();
                    lean_follower(client, &server.endpoint, basin_name.as_ref(), name.as_ref())
                        .await
                }
            });
        }
        // Let every session reach the tail and go idle, then weigh the server.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let rss_idle = rss_kib(pid);
        let expected = args.records;
        let mut tasks = Vec::new();
        for mut session in sessions {
            let latencies = latencies.clone();
            tasks.push(tokio::spawn(async move {
                let mut seen = 0;
                let mut mine = Vec::with_capacity(expected);
                while seen < expected {
                    let Some(sent) = session.next().await else {
                        break;
                    };
                    let arrived = now_micros();
                    seen += sent.len();
                    mine.extend(sent.into_iter().map(|sent| arrived.saturating_sub(sent)));
                }
                latencies.lock().await.extend(mine);
                seen >= expected
            }));
        }
        let started = Instant::now();
        let cpu_before = (cpu_secs(pid), cpu_secs(std::process::id()));
        // The writer is another client, as it would be: its own connection (not queued
        // behind the readers' deliveries on theirs) and its own thread (not behind their
        // tasks in this process's runtime).
        let writer = {
            let stream = sdk_client(&server)
                .basin(basin_name.clone())
                .stream(name.clone());
            let (records, rate, priority) = (args.records, args.rate, args.writer_priority);
            std::thread::spawn(move || {
                let realtime = priority == WriterPriority::Realtime && run_in_realtime();
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                (
                    runtime.block_on(append_timestamps(stream, records, rate)),
                    realtime,
                )
            })
        };
        let (mut ack_latencies, writer_realtime) =
            tokio::task::spawn_blocking(move || writer.join().unwrap())
                .await
                .unwrap();
        let mut ended_early = 0;
        for task in tasks {
            let followed = tokio::time::timeout(Duration::from_secs(60), task).await;
            if !matches!(followed, Ok(Ok(true))) {
                ended_early += 1;
            }
        }
        // Each process's CPU while the records were delivered, as a share of one core:
        // the load generator's shows whether it, not the server, set the pace.
        let secs = started.elapsed().as_secs_f64();
        let server_cpu = 100.0 * (cpu_secs(pid) - cpu_before.0) / secs;
        let generator_cpu = 100.0 * (cpu_secs(std::process::id()) - cpu_before.1) / secs;
        let mut delivered = latencies.lock().await.clone();
        delivered.sort_unstable();
        ack_latencies.sort_unstable();
        println!(
            "{readers} tailing readers{}{}: append ack p50 {:.2} ms; delivery after append p50 {:.2} ms, p99 {:.2} ms, p999 {:.2} ms ({} deliveries in {:.1} s); server RSS {} MiB -> {} MiB idle = {:.1} KiB per idle reader; CPU while delivering: server {:.0}%, load generator {:.0}% of one core ({} cores); writer at {} priority",
            if args.readers_client == ReadersClient::Lean { " (lean clients)" } else { "" },
            args.rate.map_or(String::new(), |rate| format!(", {rate} records/s on a clock")),
            percentile(&ack_latencies, 0.5),
            percentile(&delivered, 0.5),
            percentile(&delivered, 0.99),
            percentile(&delivered, 0.999),
            delivered.len(),
            started.elapsed().as_secs_f64(),
            rss_before / 1024,
            rss_idle / 1024,
            (rss_idle.saturating_sub(rss_before)) as f64 / readers as f64,
            server_cpu,
            generator_cpu,
            std::thread::available_parallelism().map_or(1, |n| n.get()),
            match (writer_realtime, args.writer_priority) {
                (true, _) => "real-time",
                (false, WriterPriority::Normal) => "normal",
                (false, WriterPriority::Realtime) => "normal (real-time was refused)",
            },
        );
        if ended_early > 0 {
            println!(
                "  {ended_early} of the {readers} readers ended or stalled before the last record"
            );
            failed_rounds += 1;
        }
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&args.data_dir);
    if failed_rounds > 0 {
        eprintln!("tail_bench: in {failed_rounds} of the rounds above, readers ended (or stalled) before every record reached them; their figures leave those readers out");
        std::process::exit(1);
    }
}
