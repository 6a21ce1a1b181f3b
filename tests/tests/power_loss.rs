//! Power loss: streamgate runs on the power-loss file system (`power_loss_fs`), which
//! keeps every write not yet fsync'd or fdatasync'd, and every directory change whose
//! directory was not yet synced, in a volatile layer. Writers append (unary REST, and S2S
//! append sessions with many inputs in flight) and record every ack; at a random moment
//! while appends are in flight the power is cut: the server is `kill -9`ed, the volatile
//! layer is thrown away, and the server restarts on what a disk would really hold. Every
//! acknowledged batch must then be present exactly once at its acknowledged position
//! (`history::check`). Several cycles run on the same data, so recovery itself (WAL
//! replay, compaction into segments, deleted chunks that an unsynced unlink brings back)
//! is cut into as well.
//!
//! Storage: the data directory is a subdirectory of the mount that streamgate creates
//! itself, and the records always go to the local object directory on the mount
//! (`--objects` is given, so `STREAMGATE_TEST_OBJECTS=s3` does not move them: this test
//! is about the local write path). The metadata follows the environment: by default it is
//! SQLite in the data directory, on the mount, so SQLite's own syncs are put to the test
//! too; with `STREAMGATE_TEST_METADATA=postgres` it is PostgreSQL, which a cut of this
//! disk leaves alone, as when the database runs on another machine.
//!
//! The test's power is shown by mutations of the file system (test setup, not product
//! code): inside the WAL directory, fdatasync of the chunk files made into a no-op, or
//! the directory syncs that make new chunk files' names durable made into no-ops. Either
//! is exactly a sync removed from the write path, and the same procedure must then find
//! acknowledged records missing.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use serde_json::{json, Value};
use streamgate_tests::history::{check, read_all, History, Violation};
use streamgate_tests::power_loss_fs::{Mutation, PowerLossFs};
use streamgate_tests::s2s::{AppendSession, SessionEnd};
use streamgate_tests::Server;

const BASIN: &str = "power-loss";
const STREAMS: usize = 3;
/// Power cuts on the real write path.
const CYCLES: usize = 8;
/// Power cuts a mutated file system gets to be caught in (the first one should do).
const MUTATION_CYCLES: usize = 3;
/// Acks every cycle sees before its cut, so that no cycle passes by appending nothing.
const MIN_ACKS_PER_CYCLE: usize = 100;
/// How long a cycle may take to see them before the test gives up (a liveness bound).
const ACK_LIMIT: Duration = Duration::from_secs(60);
/// Unary REST writers, and S2S append sessions, per cycle.
const REST_WRITERS: usize = 4;
const SESSIONS: usize = 2;
/// Inputs each session keeps in flight.
const SESSION_IN_FLIGHT: usize = 16;
/// The data directory and the WAL directory (where mutations apply), from the mount.
const DATA_DIR: &str = "data";
const WAL_DIR: &str = "data/objects/wal";

/// What the writers saw: the history, and the acks of the current cycle, unary and
/// through sessions.
#[derive(Default)]
struct Log {
    history: Mutex<History>,
    unary_acks_this_cycle: AtomicUsize,
    session_acks_this_cycle: AtomicUsize,
}

impl Log {
    fn sent(&self, batch: &str, size: usize) {
        self.history
            .lock()
            .unwrap()
            .sent
            .insert(batch.to_owned(), size);
    }

    fn acked(&self, batch: String, stream: usize, start: u64, end: u64, size: usize) {
        assert_eq!(end - start, size as u64, "the ack covers the whole batch");
        let counter = if batch.starts_with('s') {
            &self.session_acks_this_cycle
        } else {
            &self.unary_acks_this_cycle
        };
        self.history
            .lock()
            .unwrap()
            .acked
            .insert(batch, (stream, start, end));
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn acks_this_cycle(&self) -> usize {
        self.unary_acks_this_cycle.load(Ordering::Relaxed)
            + self.session_acks_this_cycle.load(Ordering::Relaxed)
    }
}

/// Bodies `<batch>/<index>` for a batch of `size` records.
fn bodies(batch: &str, size: usize) -> Vec<String> {
    (0..size).map(|i| format!("{batch}/{i}")).collect()
}

/// Unary REST appends of 1..=10 records to random streams, one after another, until the
/// server dies.
async fn rest_writer(endpoint: String, id: usize, cycle: usize, log: Arc<Log>) {
    let client = streamgate_tests::client();
    for n in 0.. {
        let (stream, size) = {
            let mut rng = rand::rng();
            (rng.random_range(0..STREAMS), rng.random_range(1..=10))
        };
        let batch = format!("w{id}c{cycle}n{n}");
        let records: Vec<Value> = bodies(&batch, size)
            .into_iter()
            .map(|body| json!({ "body": body }))
            .collect();
        log.sent(&batch, size);
        let response = client
            .post(format!("{endpoint}/v1/streams/s{stream}/records"))
            .header("s2-basin", BASIN)
            .json(&json!({ "records": records }))
            .send()
            .await;
        let ack: Value = match response {
            Ok(r) if r.status().is_success() => match r.json().await {
                Ok(ack) => ack,
                Err(_) => return, // the server died while answering: fate unknown
            },
            Ok(r) => panic!("append failed while the server was up: {}", r.status()),
            Err(_) => return, // the server died: this batch's fate is unknown
        };
        let position = |at: &str| ack[at]["seq_num"].as_u64().expect("an ack position");
        log.acked(batch, stream, position("start"), position("end"), size);
    }
}

/// One S2S append session on `stream` over HTTP/2, keeping `SESSION_IN_FLIGHT` inputs of
/// 1..=10 records in flight, until the server dies.
async fn session_writer(endpoint: String, id: usize, stream: usize, cycle: usize, log: Arc<Log>) {
    let mut session = match AppendSession::open(&endpoint, BASIN, &format!("s{stream}")).await {
        Ok(session) => session,
        Err(SessionEnd::Refused(status, body)) => {
            panic!("an append session opens: {status} {body}")
        }
        Err(_) => return, // the server died before the session started
    };
    let mut in_flight = std::collections::VecDeque::new();
    let mut next = 0;
    loop {
        while in_flight.len() < SESSION_IN_FLIGHT {
            let size = rand::rng().random_range(1..=10);
            let batch = format!("s{id}c{cycle}n{next}");
            next += 1;
            let bodies = bodies(&batch, size);
            let refs: Vec<&[u8]> = bodies.iter().map(|b| b.as_bytes()).collect();
            log.sent(&batch, size);
            if session.send(&refs).await.is_err() {
                return;
            }
            in_flight.push_back((batch, size));
        }
        let (start, end) = match tokio::time::timeout(Duration::from_secs(10), session.ack()).await
        {
            Ok(Ok(range)) => range,
            Ok(Err(SessionEnd::Terminal(error))) => {
                panic!("no terminal frame while the server is up: {error}")
            }
            _ => return, // the server died: the unacknowledged inputs' fate is unknown
        };
        let (batch, size) = in_flight
            .pop_front()
            .expect("an ack for an input in flight");
        log.acked(batch, stream, start, end, size);
    }
}

/// What one cycle did.
#[derive(Debug)]
struct CycleReport {
    /// Batches acknowledged in this cycle before the cut, unary and through sessions.
    unary_acks: usize,
    session_acks: usize,
    /// Batches sent in this cycle whose ack never came (in flight at the cut).
    unacknowledged: usize,
    /// Batches present after the restart, over all cycles.
    present: usize,
    /// WAL chunks in the chunk log (preallocated log files) just before the cut.
    log_chunks: f64,
}

/// The server on the mount, and the mount; the server is dropped (killed) first.
struct Rig {
    server: Server,
    fs: PowerLossFs,
    _mountpoint: tempfile::TempDir,
}

impl Rig {
    fn start(mutation: Option<Mutation>) -> Rig {
        let mountpoint = tempfile::tempdir().unwrap();
        let fs = match mutation {
            None => PowerLossFs::mount(mountpoint.path()),
            Some(mutation) => {
                PowerLossFs::mount_mutated(mountpoint.path(), mutation, Path::new(WAL_DIR))
            }
        }
        .unwrap_or_else(|e| panic!("the power-loss test needs its FUSE file system: {e}"));
        let data_dir = fs.path().join(DATA_DIR);
        let objects = data_dir.join("objects");
        let server = Server::start_with(
            &data_dir,
            &[
                "--objects",
                objects.to_str().unwrap(),
                "--metrics-listen",
                "127.0.0.1:0",
            ],
        );
        Rig {
            server,
            fs,
            _mountpoint: mountpoint,
        }
    }

    /// `kill -9`, and the volatile layer thrown away.
    fn cut_power(&mut self) {
        self.server.kill9();
        self.fs
            .cut_power()
            .unwrap_or_else(|e| panic!("cutting the power: {e}"));
    }
}

/// Runs `cycles` power cuts under appends on a file system with `mutation` (if any),
/// checking after each restart that every acknowledged batch is in place; the first
/// violation found, or what each cycle did.
async fn power_cycles(
    mutation: Option<Mutation>,
    cycles: usize,
) -> Result<Vec<CycleReport>, Violation> {
    let mut rig = Rig::start(mutation);
    let endpoint = rig.server.endpoint.clone();
    let names: Vec<String> = (0..STREAMS).map(|s| format!("s{s}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    streamgate_tests::create_streams(&endpoint, BASIN, &names).await;

    let log = Arc::new(Log::default());
    let mut reports = Vec::new();
    for cycle in 0..cycles {
        log.unary_acks_this_cycle.store(0, Ordering::Relaxed);
        log.session_acks_this_cycle.store(0, Ordering::Relaxed);
        let sent_before = log.history.lock().unwrap().sent.len();
        let mut writers: Vec<_> = (0..REST_WRITERS)
            .map(|id| tokio::spawn(rest_writer(endpoint.clone(), id, cycle, log.clone())))
            .collect();
        writers.extend((0..SESSIONS).map(|id| {
            tokio::spawn(session_writer(
                endpoint.clone(),
                id,
                id % STREAMS,
                cycle,
                log.clone(),
            ))
        }));
        wait_for_acks(&log, MIN_ACKS_PER_CYCLE).await;
        // A random moment, with appends in flight all along. Every few cycles the server
        // runs long enough for compacted WAL chunks to be deleted (their grace is 5 s),
        // so that cuts also undo unlinks that no directory sync made durable.
        let delay = if cycle % 4 == 3 {
            rand::rng().random_range(5_500..7_000)
        } else {
            rand::rng().random_range(0..250)
        };
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let log_chunks = rig.server.metric("streamgate_wal_log_chunks").await;
        tokio::task::block_in_place(|| rig.cut_power());
        // Writers that have not noticed yet end now, before the restart, so none goes on
        // appending to the new server; acks that arrived until then were sent before the
        // cut, and count.
        for writer in writers {
            writer.abort();
            if let Err(e) = writer.await {
                if e.is_panic() {
                    std::panic::resume_unwind(e.into_panic());
                }
            }
        }
        tokio::task::block_in_place(|| rig.server.restart());
        let mut streams = Vec::new();
        for s in 0..STREAMS {
            streams.push(read_all(&rig.server.endpoint, BASIN, s).await);
        }
        let history = log.history.lock().unwrap();
        let present = check(&history, &streams)?;
        let report = CycleReport {
            unary_acks: log.unary_acks_this_cycle.load(Ordering::Relaxed),
            session_acks: log.session_acks_this_cycle.load(Ordering::Relaxed),
            unacknowledged: history.sent.len() - sent_before - log.acks_this_cycle(),
            present,
            log_chunks,
        };
        eprintln!(
            "cycle {cycle}: cut {delay} ms after the first {MIN_ACKS_PER_CYCLE} acks: {report:?}"
        );
        reports.push(report);
    }
    Ok(reports)
}

/// Waits until `count` batches of this cycle are acknowledged.
async fn wait_for_acks(log: &Log, count: usize) {
    let deadline = tokio::time::Instant::now() + ACK_LIMIT;
    while log.acks_this_cycle() < count {
        assert!(
            tokio::time::Instant::now() < deadline,
            "appends were not acknowledged: {} of {count} within {ACK_LIMIT:?}",
            log.acks_this_cycle()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_cut_loses_no_acknowledged_record() {
    let reports = power_cycles(None, CYCLES)
        .await
        .unwrap_or_else(|violation| panic!("after a power cut: {violation}"));
    assert_eq!(reports.len(), CYCLES);
    let mut present_before = 0;
    for (cycle, report) in reports.iter().enumerate() {
        // What a restart served was durable, so a later cut cannot take it away.
        assert!(
            report.present >= present_before,
            "cycle {cycle} lost batches that an earlier restart served: {report:?}"
        );
        present_before = report.present;
        // A fresh server's first chunks go to files of their own, until its log files
        // are made; what follows goes to the chunk log. The long cycles (see
        // `power_cycles`) surely cut into both.
        assert!(
            cycle % 4 != 3 || report.log_chunks > 0.0,
            "cycle {cycle} wrote WAL chunks into the chunk log: {report:?}"
        );
        assert!(
            report.unary_acks + report.session_acks >= MIN_ACKS_PER_CYCLE
                && report.unary_acks > 0
                && report.session_acks > 0,
            "cycle {cycle} appended under load, unary and through sessions: {report:?}"
        );
        assert!(
            report.unacknowledged > 0,
            "cycle {cycle} cut the power with appends in flight: {report:?}"
        );
    }
}

/// Asserts that the power-loss procedure, on a file system with `mutation` inside the
/// WAL directory, finds an acknowledged batch missing.
async fn assert_caught(mutation: Mutation) {
    match power_cycles(Some(mutation), MUTATION_CYCLES).await {
        Err(violation @ Violation::AcknowledgedBatchMissing { .. }) => {
            eprintln!("{mutation:?} caught: {violation}");
        }
        Err(other) => panic!("{mutation:?} broke the streams in an unexpected way: {other}"),
        Ok(reports) => {
            panic!("{mutation:?} went unnoticed through {MUTATION_CYCLES} power cuts: {reports:?}")
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_fdatasync_of_wal_chunks_acknowledged_records_are_lost() {
    assert_caught(Mutation::IgnoreFileSyncs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_directory_sync_of_new_wal_chunks_acknowledged_records_are_lost() {
    assert_caught(Mutation::IgnoreDirSyncs).await;
}
