//! `bench`: unary append and read performance of streamgate, measured against the disk's
//! own floor in the same run. Prints numbers; asserts nothing.
//!
//!   cargo run --release -p streamgate-compat --bin bench -- [--data-dir DIR] [--seconds N]
//!
//! Phases: the request round trip; single-client append latency against the fdatasync
//! floor, unary and through an append session; 16-client append throughput against the
//! durable bandwidth; reads of what was written; reads of history from segments after a
//! restart (cold through one read session, which the server reads ahead for; cold, then
//! cached, through unary reads); and the append latency again while another client reads
//! history (unary reads, then a read session).
//!
//! The server is the release binary, started on a fresh data directory on the filesystem
//! of `--data-dir`, and driven through the official Rust SDK (protobuf over HTTP/2).

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use s2_sdk::append_session::AppendSessionConfig;
use s2_sdk::types::*;
use s2_sdk::S2Stream;
use streamgate_compat::{cpu_secs, percentile, rss_kib, Server};

#[derive(Parser)]
struct Args {
    /// Where the server's data (and the disk-floor probe files) go.
    #[arg(long, default_value = "target/bench-data")]
    data_dir: PathBuf,
    /// Duration of each throughput phase.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Unary appends in the single-client latency phase.
    #[arg(long, default_value_t = 2000)]
    latency_appends: usize,
    /// The server's compaction interval: short enough that compaction runs during the
    /// append phases and the history phase reads segments.
    #[arg(long, default_value_t = 5000)]
    compaction_interval_ms: u64,
}

/// Reads a stream from `start` up to `end` in unary reads of up to 1 MiB; the bytes read
/// and each read's latency.
async fn read_range(stream: &S2Stream, start: u64, end: u64) -> (usize, Vec<Duration>) {
    let (mut seq, mut bytes, mut latencies) = (start, 0usize, Vec::new());
    while seq < end {
        let began = Instant::now();
        let batch = stream
            .read(ReadInput::new().with_start(ReadStart::new().with_from(ReadFrom::SeqNum(seq))))
            .await
            .unwrap();
        latencies.push(began.elapsed());
        seq = batch.records.last().unwrap().seq_num + 1;
        bytes += batch.records.iter().map(|r| r.body.len()).sum::<usize>();
    }
    (bytes, latencies)
}

/// Reads records 0..`end` through one read session (which the server reads ahead for);
/// the bytes read.
async fn session_read(stream: &S2Stream, end: u64) -> usize {
    let input = ReadInput::new()
        .with_start(ReadStart::new().with_from(ReadFrom::SeqNum(0)))
        .with_stop(ReadStop::new().with_limits(ReadLimits::new().with_count(end as usize)));
    let mut session = stream
        .read_session(input, ReadSessionConfig::new())
        .await
        .unwrap();
    let (mut seen, mut bytes) = (0u64, 0usize);
    while seen < end {
        let batch = session
            .next()
            .await
            .expect("the session ended before its count")
            .unwrap();
        seen += batch.records.len() as u64;
        bytes += batch.records.iter().map(|r| r.body.len()).sum::<usize>();
    }
    bytes
}

/// The latencies of `count` single-record 100 B appends while `scan` runs alongside.
async fn appends_while(
    stream: &S2Stream,
    count: usize,
    scan: impl std::future::Future<Output = ()> + Send + 'static,
) -> Vec<Duration> {
    let scan = tokio::spawn(scan);
    let mut latencies = Vec::new();
    for _ in 0..count {
        let start = Instant::now();
        stream.append(batch(1, 100)).await.unwrap();
        latencies.push(start.elapsed());
    }
    scan.abort();
    latencies
}

/// Reads records 0..`end` and prints the rate and the latency of each 1 MiB read.
async fn timed_read(stream: &S2Stream, end: u64, what: &str) {
    let started = Instant::now();
    let (bytes, latencies) = read_range(stream, 0, end).await;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{what}, 1 MiB batches: {:.0} records/s, {:.1} MiB/s; {}",
        end as f64 / secs,
        bytes as f64 / (1 << 20) as f64 / secs,
        summary(latencies)
    );
}

fn summary(mut latencies: Vec<Duration>) -> String {
    latencies.sort();
    format!(
        "p50 {:.2} ms, p99 {:.2} ms, p999 {:.2} ms",
        percentile(&latencies, 0.50).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3,
        percentile(&latencies, 0.999).as_secs_f64() * 1e3
    )
}

/// p50 of one small write + fdatasync: into a file it creates (`existing` false), or into
/// an empty file created and made durable beforehand, as a prepared WAL chunk is.
fn fdatasync_floor(dir: &Path, existing: bool) -> Duration {
    let paths: Vec<PathBuf> = (0..200)
        .map(|i| dir.join(format!("fsync-probe-{i}")))
        .collect();
    if existing {
        for path in &paths {
            std::fs::File::create(path).unwrap();
        }
        std::fs::File::open(dir).unwrap().sync_all().unwrap();
    }
    let mut samples = Vec::new();
    for path in &paths {
        let start = Instant::now();
        let mut file = OpenOptions::new()
            .write(true)
            .create(!existing)
            .truncate(!existing)
            .open(path)
            .unwrap();
        file.write_all(&[7u8; 1024]).unwrap();
        file.sync_data().unwrap();
        samples.push(start.elapsed());
        std::fs::remove_file(path).unwrap();
    }
    samples.sort();
    percentile(&samples, 0.5)
}

/// Durable sequential write bandwidth: 8 MiB writes, each followed by fdatasync.
fn durable_bandwidth(dir: &Path) -> f64 {
    let path = dir.join("bandwidth-probe");
    let chunk = vec![42u8; 8 << 20];
    let total = 512usize << 20;
    let mut file = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    let start = Instant::now();
    let mut written = 0;
    while written < total {
        file.write_all(&chunk).unwrap();
        file.sync_data().unwrap();
        written += chunk.len();
    }
    let secs = start.elapsed().as_secs_f64();
    std::fs::remove_file(path).unwrap();
    written as f64 / (1 << 20) as f64 / secs
}

fn rss_mib(pid: u32) -> f64 {
    rss_kib(pid) as f64 / 1024.0
}

fn batch(records: usize, size: usize) -> AppendInput {
    let body = bytes::Bytes::from(vec![b'x'; size]);
    let records: Vec<AppendRecord> = (0..records)
        .map(|_| AppendRecord::new(body.clone()).unwrap())
        .collect();
    AppendInput::new(AppendRecordBatch::try_from_iter(records).unwrap())
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let _ = std::fs::remove_dir_all(&args.data_dir);
    std::fs::create_dir_all(&args.data_dir).unwrap();
    let probe_dir = args.data_dir.join("probe");
    std::fs::create_dir_all(&probe_dir).unwrap();

    // The disk varies from moment to moment, so the floor is measured in rounds
    // interleaved with the latency phase below, and medians are compared.
    let mut bandwidths: Vec<f64> = (0..3).map(|_| durable_bandwidth(&probe_dir)).collect();
    bandwidths.sort_by(f64::total_cmp);
    let bandwidth = bandwidths[1];
    println!("disk floor: durable sequential write (8 MiB writes + fdatasync), median of 3: {bandwidth:.0} MiB/s");

    let interval = args.compaction_interval_ms.to_string();
    let mut server = Server::start_with(
        &args.data_dir.join("server"),
        &["--compaction-interval-ms", &interval],
    );
    let pid = server.pid().unwrap();
    let s2 = streamgate_compat::benchmark_sdk_client(&server);
    let basin_name: BasinName = "bench-basin".parse().unwrap();
    s2.create_basin(CreateBasinInput::new(basin_name.clone()))
        .await
        .unwrap();
    let basin = s2.basin(basin_name);
    for name in ["latency", "throughput"] {
        basin
            .create_stream(CreateStreamInput::new(name.parse().unwrap()))
            .await
            .unwrap();
    }

    // 0. The request round trip without storage: check-tail through the same client.
    let stream = basin.stream("latency".parse().unwrap());
    let mut latencies = Vec::new();
    for _ in 0..args.latency_appends {
        let start = Instant::now();
        stream.check_tail().await.unwrap();
        latencies.push(start.elapsed());
    }
    println!(
        "check-tail round trip (no storage), 1 client: {}",
        summary(latencies)
    );

    // 1. One client, one small record per append: the ack latency, in rounds with the
    //    fdatasync floors measured just before each.
    let rounds = 5;
    let mut new_file_floors = Vec::new();
    let mut existing_file_floors = Vec::new();
    let mut latencies = Vec::new();
    for _ in 0..rounds {
        new_file_floors.push(fdatasync_floor(&probe_dir, false));
        existing_file_floors.push(fdatasync_floor(&probe_dir, true));
        for _ in 0..args.latency_appends / rounds {
            let start = Instant::now();
            stream.append(batch(1, 100)).await.unwrap();
            latencies.push(start.elapsed());
        }
    }
    latencies.sort();
    let p50 = percentile(&latencies, 0.5);
    let mut ratios = Vec::new();
    for (kind, mut floors) in [
        ("a new file", new_file_floors),
        ("an existing empty file", existing_file_floors),
    ] {
        floors.sort();
        let floor = floors[rounds / 2];
        println!(
            "disk floor: small write + fdatasync into {kind}, median p50 of {rounds} rounds: {:.3} ms (rounds: {})",
            floor.as_secs_f64() * 1e3,
            floors.iter().map(|f| format!("{:.3}", f.as_secs_f64() * 1e3)).collect::<Vec<_>>().join(", ")
        );
        ratios.push(p50.as_secs_f64() / floor.as_secs_f64());
    }
    println!(
        "unary append, 1 client, 1 x 100 B record: {}  (p50 = {:.2}x the new-file floor, {:.2}x the existing-file floor)",
        summary(latencies),
        ratios[0],
        ratios[1]
    );

    // 1b. The same through an append session (as the `s2` CLI and the SDKs' producers
    //     append): one 100 B input at a time, each sent once the last is acknowledged.
    //     The server's CPU per append shows what the session's own bookkeeping costs.
    let session = stream.append_session(AppendSessionConfig::new());
    let mut latencies = Vec::with_capacity(args.latency_appends);
    let cpu_before = cpu_secs(pid);
    for _ in 0..args.latency_appends {
        let start = Instant::now();
        session.submit(batch(1, 100)).await.unwrap().await.unwrap();
        latencies.push(start.elapsed());
    }
    let cpu_per_append = (cpu_secs(pid) - cpu_before) / args.latency_appends as f64;
    session.close().await.unwrap();
    println!(
        "append session, 1 client, 1 x 100 B record, one input in flight: {}; server CPU {:.0} µs per append",
        summary(latencies),
        cpu_per_append * 1e6
    );

    // 2. 16 clients, protobuf batches of 64 x 8 KiB records: durable throughput. The
    //    body is encoded once, so the clients (on the same two cores) cost little.
    let clients = 16;
    let body = bytes::Bytes::from(streamgate_compat::wire::encode_append_input(
        &[&[b'x'; 8192][..]; 64],
    ));
    let http = streamgate_tests::client_builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let url = format!("{}/v1/streams/throughput/records", server.endpoint);
    let cpu_before = cpu_secs(pid);
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (http, url, body) = (http.clone(), url.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let start = Instant::now();
                let response = http
                    .post(&url)
                    .header("s2-basin", "bench-basin")
                    .header("content-type", "application/protobuf")
                    .header("accept", "application/protobuf")
                    .body(body.clone())
                    .send()
                    .await
                    .unwrap();
                assert!(
                    response.status().is_success(),
                    "append failed: {}",
                    response.status()
                );
                response.bytes().await.unwrap();
                latencies.push(start.elapsed());
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    let secs = started.elapsed().as_secs_f64();
    let records = all.len() * 64;
    let mib = records as f64 * 8192.0 / (1 << 20) as f64;
    println!(
        "unary append, {clients} clients, 64 x 8 KiB records: {:.0} records/s, {:.1} MiB/s ({:.0}% of durable bandwidth); {}",
        records as f64 / secs,
        mib / secs,
        100.0 * mib / secs / bandwidth,
        summary(all)
    );
    println!(
        "server RSS after appends: {:.0} MiB; server CPU during the phase: {:.0}% of one core",
        rss_mib(pid),
        100.0 * (cpu_secs(pid) - cpu_before) / secs
    );

    // 3. Unary reads of everything just written, 1 MiB batches.
    let stream = basin.stream("throughput".parse().unwrap());
    let tail = stream.check_tail().await.unwrap().seq_num;
    timed_read(&stream, tail, "unary read, 1 client").await;
    println!("server RSS: {:.0} MiB", rss_mib(pid));

    // 4. Reads of history from segments: once compaction has run, restart the server so
    //    no cache holds anything, read it all (cold: segments fetched from the store),
    //    then read the first 128 MiB twice more (the second time from the segment cache).
    tokio::time::sleep(Duration::from_millis(
        2 * args.compaction_interval_ms + 1000,
    ))
    .await;
    server.terminate();
    server.restart();
    let s2 = streamgate_compat::benchmark_sdk_client(&server);
    let basin = s2.basin("bench-basin".parse().unwrap());
    let stream = basin.stream("throughput".parse().unwrap());
    let started = Instant::now();
    let bytes = session_read(&stream, tail).await;
    println!(
        "history read from segments, cold (after a restart), one read session: {:.1} MiB/s",
        bytes as f64 / (1 << 20) as f64 / started.elapsed().as_secs_f64()
    );
    server.terminate();
    server.restart();
    let s2 = streamgate_compat::benchmark_sdk_client(&server);
    let basin = s2.basin("bench-basin".parse().unwrap());
    let stream = basin.stream("throughput".parse().unwrap());
    timed_read(
        &stream,
        tail,
        "history read from segments, cold (after a restart)",
    )
    .await;
    let cached_end = tail.min(128 * 128); // 128 records of 8 KiB per MiB
    read_range(&stream, 0, cached_end).await;
    timed_read(&stream, cached_end, "history read from segments, cached").await;

    // 5. Appends while a reader scans history: the single-client ack latency again, with
    //    the history read by unary reads, then by a read session (which reads ahead).
    let throughput = || basin.stream("throughput".parse().unwrap());
    let stream = basin.stream("latency".parse().unwrap());
    let count = args.latency_appends / 2;
    let unary_scan = throughput();
    let latencies = appends_while(&stream, count, async move {
        loop {
            read_range(&unary_scan, 0, tail).await;
        }
    })
    .await;
    println!(
        "unary append, 1 client, 1 x 100 B record, while another client reads history: {}",
        summary(latencies)
    );
    let session_scan = throughput();
    let latencies = appends_while(&stream, count, async move {
        loop {
            session_read(&session_scan, tail).await;
        }
    })
    .await;
    println!(
        "unary append, 1 client, 1 x 100 B record, while another client reads history \
         through a read session: {}",
        summary(latencies)
    );
    let pid = server.pid().unwrap();
    println!("server RSS at the end: {:.0} MiB", rss_mib(pid));
    drop(server);
    let _ = std::fs::remove_dir_all(&args.data_dir);
}
