//! Engine behaviour on the embedded default backends (SQLite + local directory),
//! including restarts: everything acknowledged must come back exactly as acknowledged.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use streamgate_core::config::{BasinConfig, StreamConfig};
use streamgate_core::names::{BasinName, StreamName};
use streamgate_core::read::{ReadLimits, ReadRequest, ReadStart};
use streamgate_core::record::{AppendInput, AppendRecord, Header};
use streamgate_core::storage::local_dir::LocalDirObjectStore;
use streamgate_core::storage::s3::{S3Location, S3ObjectStore};
use streamgate_core::storage::sql::SqlMetadataStore;
use streamgate_core::storage::ObjectStore;
use streamgate_core::{Caller, Engine, EngineSettings, Error, Resource};
use streamgate_tests::backends;

/// An engine, used with full access (the root principal): authorization has its own
/// tests. Derefs to the root `Caller`.
struct TestEngine {
    engine: Engine,
    root: Caller,
    objects: Arc<dyn ObjectStore>,
}

impl std::ops::Deref for TestEngine {
    type Target = Caller;
    fn deref(&self) -> &Caller {
        &self.root
    }
}

async fn open(dir: &Path) -> TestEngine {
    open_with(dir, EngineSettings::default()).await
}

/// The metadata store of a test's data directory: SQLite inside it, or PostgreSQL (see
/// `streamgate_tests::backends`; the same database each time the test reopens it).
async fn metadata_store(dir: &Path) -> SqlMetadataStore {
    match backends::postgres_url(dir) {
        Some(url) => SqlMetadataStore::connect_postgres(&url).await.unwrap(),
        None => SqlMetadataStore::open_sqlite(&dir.join("metadata.db"))
            .await
            .unwrap(),
    }
}

/// The object store of a test's data directory: a local directory inside it, or an S3
/// bucket of its own (see `streamgate_tests::backends`).
async fn object_store(dir: &Path) -> Arc<dyn ObjectStore> {
    match backends::s3_url(dir) {
        Some(url) => {
            let location = S3Location {
                endpoint: Some(backends::s3_endpoint()),
                ..S3Location::parse(&url).unwrap()
            };
            Arc::new(S3ObjectStore::connect(location).await.unwrap())
        }
        None => Arc::new(LocalDirObjectStore::open(dir.join("objects")).unwrap()),
    }
}

async fn open_with(dir: &Path, settings: EngineSettings) -> TestEngine {
    open_with_objects(dir, settings, |objects| objects).await
}

/// `open_with`, on the object store that `wrap` makes of the test's own.
async fn open_with_objects(
    dir: &Path,
    settings: EngineSettings,
    wrap: impl FnOnce(Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore>,
) -> TestEngine {
    let metadata = metadata_store(dir).await;
    let objects = wrap(object_store(dir).await);
    let settings = EngineSettings {
        reap_interval: Duration::from_millis(200),
        ..settings
    };
    let engine = Engine::open(Arc::new(metadata), objects.clone(), settings)
        .await
        .unwrap();
    TestEngine {
        root: Caller::root(&engine),
        engine,
        objects,
    }
}

fn basin() -> BasinName {
    BasinName::new("engine-test").unwrap()
}

fn stream(name: &str) -> StreamName {
    StreamName::new(name).unwrap()
}

fn records(bodies: &[&str]) -> AppendInput {
    AppendInput {
        records: bodies
            .iter()
            .map(|b| AppendRecord {
                timestamp: None,
                headers: vec![],
                body: Bytes::copy_from_slice(b.as_bytes()),
            })
            .collect(),
        ..Default::default()
    }
}

fn command(op: &str, body: &[u8]) -> AppendInput {
    AppendInput {
        records: vec![AppendRecord {
            timestamp: None,
            headers: vec![Header {
                name: Bytes::new(),
                value: Bytes::copy_from_slice(op.as_bytes()),
            }],
            body: Bytes::copy_from_slice(body),
        }],
        ..Default::default()
    }
}

fn from_seq(seq: u64) -> ReadRequest {
    ReadRequest {
        start: ReadStart::SeqNum(seq),
        ..Default::default()
    }
}

fn bodies(batch: &streamgate_core::read::ReadBatch) -> Vec<String> {
    batch
        .records
        .iter()
        .map(|r| String::from_utf8(r.body.to_vec()).unwrap())
        .collect()
}

async fn setup(engine: &Caller, name: &str) -> StreamName {
    match engine
        .create_basin(basin(), BasinConfig::default(), None)
        .await
    {
        Ok(_) | Err(Error::AlreadyExists(_)) => {}
        Err(err) => panic!("{err}"),
    }
    engine
        .create_stream(&basin(), stream(name), StreamConfig::default(), None)
        .await
        .unwrap();
    stream(name)
}

/// The test basin, creating streams on append.
async fn create_auto_creating_basin(engine: &Caller) {
    let config = BasinConfig {
        create_stream_on_append: true,
        ..Default::default()
    };
    engine.create_basin(basin(), config, None).await.unwrap();
}

#[tokio::test]
async fn acknowledged_records_fences_and_trims_survive_restart() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let s = setup(&engine, "orders").await;
    let ack = engine
        .append(&basin(), &s, records(&["a", "b"]), None)
        .await
        .unwrap();
    assert_eq!((ack.start.seq_num, ack.end.seq_num), (0, 2));
    let ack2 = engine
        .append(&basin(), &s, records(&["c"]), None)
        .await
        .unwrap();
    assert_eq!(ack2.start.seq_num, 2);
    assert!(ack2.start.timestamp >= ack.end.timestamp);
    engine
        .append(&basin(), &s, command("fence", b"writer-1"), None)
        .await
        .unwrap();
    engine
        .append(&basin(), &s, command("trim", &1u64.to_be_bytes()), None)
        .await
        .unwrap();
    let before = engine.read(&basin(), &s, from_seq(0), None).await.unwrap();
    engine.engine.shutdown().await;
    drop(engine);

    let engine = open(dir.path()).await;
    let tail = engine.check_tail(&basin(), &s, None).await.unwrap();
    assert_eq!(tail.seq_num, 5);
    let after = engine.read(&basin(), &s, from_seq(0), None).await.unwrap();
    assert_eq!(after, before, "reads after restart match reads before");
    assert_eq!(after.records[0].seq_num, 1, "the trim point (1) survived");
    assert_eq!(bodies(&after)[..2], ["b", "c"]);

    // The fencing token survived too.
    let mut fenced = records(&["d"]);
    fenced.fencing_token = Some("someone-else".into());
    match engine.append(&basin(), &s, fenced, None).await {
        Err(Error::FencingTokenMismatch(token)) => assert_eq!(token, "writer-1"),
        other => panic!("expected a fencing mismatch, got {other:?}"),
    }
    let mut fenced = records(&["d"]);
    fenced.fencing_token = Some("writer-1".into());
    let ack = engine.append(&basin(), &s, fenced, None).await.unwrap();
    assert_eq!(ack.start.seq_num, 5);
    assert!(
        ack.start.timestamp >= tail.timestamp,
        "timestamps stay monotonic across restarts"
    );
}

#[tokio::test]
async fn reads_follow_the_documented_416_table_and_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let s = setup(&engine, "reads").await;

    // Empty stream: any immediate read is 416 with the tail.
    for start in [
        ReadStart::SeqNum(0),
        ReadStart::TailOffset(0),
        ReadStart::Timestamp(0),
    ] {
        let req = ReadRequest {
            start,
            ..Default::default()
        };
        assert!(matches!(
            engine.read(&basin(), &s, req, None).await,
            Err(Error::RangeNotSatisfiable { tail }) if tail.seq_num == 0
        ));
    }
    for i in 0..5 {
        engine
            .append(&basin(), &s, records(&[&format!("r{i}")]), None)
            .await
            .unwrap();
    }
    let tail = engine.check_tail(&basin(), &s, None).await.unwrap();
    assert_eq!(tail.seq_num, 5);

    // Start at the tail with wait=0: 416; beyond the tail: 416 unless clamped.
    assert!(engine.read(&basin(), &s, from_seq(5), None).await.is_err());
    assert!(engine.read(&basin(), &s, from_seq(6), None).await.is_err());
    let clamped = ReadRequest {
        start: ReadStart::SeqNum(100),
        clamp: true,
        wait: Duration::from_millis(50),
        ..Default::default()
    };
    let batch = engine.read(&basin(), &s, clamped, None).await.unwrap();
    assert!(
        batch.records.is_empty(),
        "clamped to the tail and waited: empty batch"
    );
    let beyond_ts = ReadRequest {
        start: ReadStart::Timestamp(tail.timestamp + 1),
        ..Default::default()
    };
    assert!(matches!(
        engine.read(&basin(), &s, beyond_ts, None).await,
        Err(Error::RangeNotSatisfiable { .. })
    ));

    // tail_offset counts back from the tail; no selector means the tail.
    let last_two = ReadRequest {
        start: ReadStart::TailOffset(2),
        ..Default::default()
    };
    assert_eq!(
        bodies(&engine.read(&basin(), &s, last_two, None).await.unwrap()),
        ["r3", "r4"]
    );
    let saturated = ReadRequest {
        start: ReadStart::TailOffset(99),
        ..Default::default()
    };
    let all = engine.read(&basin(), &s, saturated, None).await.unwrap();
    assert_eq!(all.records.len(), 5);
    assert_eq!(
        all.tail,
        Some(tail),
        "a batch that reaches the tail carries it"
    );

    // Bounds: count, bytes (each record here is 8 + 2 = 10 metered bytes), until.
    let count = ReadRequest {
        start: ReadStart::SeqNum(1),
        limits: ReadLimits {
            count: Some(2),
            ..Default::default()
        },
        ..Default::default()
    };
    let batch = engine.read(&basin(), &s, count, None).await.unwrap();
    assert_eq!(bodies(&batch), ["r1", "r2"]);
    assert_eq!(batch.tail, None);
    let bytes = ReadRequest {
        start: ReadStart::SeqNum(0),
        limits: ReadLimits {
            bytes: Some(25),
            ..Default::default()
        },
        ..Default::default()
    };
    assert_eq!(
        engine
            .read(&basin(), &s, bytes, None)
            .await
            .unwrap()
            .records
            .len(),
        2
    );
    let zero = ReadRequest {
        start: ReadStart::SeqNum(0),
        limits: ReadLimits {
            count: Some(0),
            ..Default::default()
        },
        ..Default::default()
    };
    assert!(engine
        .read(&basin(), &s, zero, None)
        .await
        .unwrap()
        .records
        .is_empty());
    let first = engine.read(&basin(), &s, from_seq(0), None).await.unwrap();
    let until = ReadRequest {
        start: ReadStart::SeqNum(0),
        limits: ReadLimits {
            until: Some(first.records[0].timestamp),
            ..Default::default()
        },
        ..Default::default()
    };
    assert!(engine
        .read(&basin(), &s, until, None)
        .await
        .unwrap()
        .records
        .is_empty());

    // A timestamp start finds the first record at or after it.
    let by_ts = ReadRequest {
        start: ReadStart::Timestamp(first.records[3].timestamp),
        ..Default::default()
    };
    let batch = engine.read(&basin(), &s, by_ts, None).await.unwrap();
    assert!(batch.records[0].timestamp >= first.records[3].timestamp);
    assert!(batch.records[0].seq_num <= 3);
}

/// A 416 names the tail it was decided against. Readers keep reading at the tail while
/// appends land: a reader's position never passes the tail, so every 416 it gets must
/// name exactly its position. (The tail was once read twice, for the decision and for
/// the answer: an append published in between gave "416, tail 481" to a read at 454.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_416_names_the_tail_it_was_decided_against() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let s = setup(&engine, "racing-the-tail").await;
    const APPENDS_PER_WRITER: usize = 1500;
    let writers: Vec<_> = (0..6)
        .map(|w| {
            let (caller, s) = (engine.root.clone(), s.clone());
            tokio::spawn(async move {
                for i in 0..APPENDS_PER_WRITER {
                    let body = format!("w{w}-{i}");
                    caller
                        .append(&basin(), &s, records(&[&body]), None)
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (caller, s) = (engine.root.clone(), s.clone());
            tokio::spawn(async move {
                let (mut position, mut refusals) = (0u64, 0u64);
                while position < 6 * APPENDS_PER_WRITER as u64 {
                    match caller.read(&basin(), &s, from_seq(position), None).await {
                        Ok(batch) => {
                            let last = batch.records.last().expect("a read below the tail");
                            position = last.seq_num + 1;
                        }
                        Err(Error::RangeNotSatisfiable { tail }) => {
                            assert_eq!(
                                tail.seq_num, position,
                                "a read at {position} was refused naming tail {}",
                                tail.seq_num
                            );
                            refusals += 1;
                            // A read at the tail completes without waiting: let the
                            // writers' tasks run (a client's request would wait on its
                            // socket here).
                            tokio::task::yield_now().await;
                        }
                        Err(err) => panic!("{err}"),
                    }
                }
                refusals
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    let mut refusals = 0;
    for reader in readers {
        refusals += reader.await.unwrap();
    }
    // The readers did wait at the tail: the race was run.
    assert!(refusals > 1000, "only {refusals} reads found the tail");
}

/// A read that does not wait answers records or 416, never nothing: also when what it
/// was to return is trimmed away while it reads. A writer appends a record and then
/// trims everything (itself included), over and over, while readers read from 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_whose_records_are_trimmed_under_it_is_refused_at_the_tail() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let s = setup(&engine, "trimmed-under-reads").await;
    let writer = {
        let (caller, s) = (engine.root.clone(), s.clone());
        tokio::spawn(async move {
            for i in 0..2000 {
                let body = format!("r{i}");
                caller
                    .append(&basin(), &s, records(&[&body]), None)
                    .await
                    .unwrap();
                let everything = command("trim", &u64::MAX.to_be_bytes());
                caller.append(&basin(), &s, everything, None).await.unwrap();
            }
        })
    };
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (caller, s, writer) = (engine.root.clone(), s.clone(), writer.abort_handle());
            tokio::spawn(async move {
                let (mut read, mut refused) = (0u64, 0u64);
                while !writer.is_finished() {
                    match caller.read(&basin(), &s, from_seq(0), None).await {
                        Ok(batch) => {
                            assert!(!batch.records.is_empty(), "an empty answer: {batch:?}");
                            read += 1;
                        }
                        Err(Error::RangeNotSatisfiable { .. }) => refused += 1,
                        Err(err) => panic!("{err}"),
                    }
                    tokio::task::yield_now().await;
                }
                (read, refused)
            })
        })
        .collect();
    writer.await.unwrap();
    for reader in readers {
        let (read, refused) = reader.await.unwrap();
        assert!(read > 0 && refused > 0, "read {read}, refused {refused}");
    }
}

#[tokio::test]
async fn a_waiting_read_wakes_on_append() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let s = setup(&engine, "live").await;
    let reader = {
        let engine = engine.clone();
        let s = s.clone();
        tokio::spawn(async move {
            // A read that is not woken by the append below returns empty when its
            // wait ends, and fails the check.
            let req = ReadRequest {
                start: ReadStart::TailOffset(0),
                wait: Duration::from_secs(10),
                ..Default::default()
            };
            engine.read(&basin(), &s, req, None).await
        })
    };
    // Time for the read to reach its wait at the tail (had it not, it would find the
    // record without waiting, and the test would prove less but still pass).
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !reader.is_finished(),
        "the read waits at the tail of an empty stream"
    );
    engine
        .append(&basin(), &s, records(&["hello"]), None)
        .await
        .unwrap();
    // The bound only keeps a broken build from hanging; it is longer than the wait.
    let batch = tokio::time::timeout(Duration::from_secs(30), reader)
        .await
        .expect("the read ends")
        .unwrap()
        .unwrap();
    assert_eq!(
        bodies(&batch),
        ["hello"],
        "the read was woken by the append"
    );
}

#[tokio::test]
async fn conditions_fail_with_the_current_state_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let s = setup(&engine, "cas").await;
    engine
        .append(&basin(), &s, records(&["a"]), None)
        .await
        .unwrap();
    let mut stale = records(&["b"]);
    stale.match_seq_num = Some(0);
    assert!(matches!(
        engine.append(&basin(), &s, stale, None).await,
        Err(Error::SeqNumMismatch(1))
    ));
    let mut invalid = records(&["x"]);
    invalid.records[0].headers.push(Header {
        name: Bytes::new(),
        value: Bytes::from_static(b"boom"),
    });
    assert_eq!(
        engine
            .append(&basin(), &s, invalid, None)
            .await
            .unwrap_err()
            .code(),
        "invalid"
    );
    assert_eq!(
        engine.check_tail(&basin(), &s, None).await.unwrap().seq_num,
        1
    );
}

#[tokio::test]
async fn a_recreated_stream_never_sees_old_records_and_names_wait_for_deletion() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let s = setup(&engine, "phoenix").await;
    engine
        .append(&basin(), &s, records(&["old"]), None)
        .await
        .unwrap();
    engine.delete_stream(&basin(), &s).await.unwrap();
    assert!(matches!(
        engine.append(&basin(), &s, records(&["x"]), None).await,
        Err(Error::DeletionPending(Resource::Stream(_)))
    ));
    assert!(matches!(
        engine
            .create_stream(&basin(), s.clone(), StreamConfig::default(), None)
            .await,
        Err(Error::DeletionPending(Resource::Stream(_)))
    ));
    // The reaper finishes the deletion; then the name is free again.
    let mut recreated = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if engine
            .create_stream(&basin(), s.clone(), StreamConfig::default(), None)
            .await
            .is_ok()
        {
            recreated = true;
            break;
        }
    }
    assert!(recreated, "deletion completed and the name was reusable");
    assert_eq!(
        engine.check_tail(&basin(), &s, None).await.unwrap().seq_num,
        0
    );
    engine
        .append(&basin(), &s, records(&["new"]), None)
        .await
        .unwrap();
    engine.engine.shutdown().await;
    drop(engine);
    let engine = open(dir.path()).await;
    let batch = engine.read(&basin(), &s, from_seq(0), None).await.unwrap();
    assert_eq!(bodies(&batch), ["new"]);
}

/// Simulates a crash in which chunk 1 never became durable (missing, or torn by the
/// crash) while chunk 2 did: the writer never acknowledged chunk 2's batch, so recovery
/// must not resurrect it, and sequence numbers must continue densely.
async fn recovery_stops_at_chunk_1(damage: Damage) {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let s = setup(&engine, "gap").await;
    for body in ["a", "b", "c"] {
        engine
            .append(&basin(), &s, records(&[body]), None)
            .await
            .unwrap();
    }
    let epoch = engine.engine.epoch();
    engine.engine.shutdown().await;
    let chunk_1 = streamgate_core::wal::chunk_key(epoch, 1);
    match damage {
        Damage::Missing => engine.objects.delete(&chunk_1).await.unwrap(),
        Damage::Torn if engine.objects.describe().starts_with("S3") => {
            // An interrupted S3 PUT leaves no object at all.
            engine.objects.delete(&chunk_1).await.unwrap()
        }
        Damage::Torn => {
            // A local file cut short, as a crash mid-write leaves it.
            let file = dir.path().join("objects").join(&chunk_1);
            let bytes = std::fs::read(&file).unwrap();
            std::fs::write(&file, &bytes[..bytes.len() - 3]).unwrap();
        }
    }
    drop(engine);
    let engine = open(dir.path()).await;
    let batch = engine.read(&basin(), &s, from_seq(0), None).await.unwrap();
    assert_eq!(bodies(&batch), ["a"]);
    let ack = engine
        .append(&basin(), &s, records(&["d"]), None)
        .await
        .unwrap();
    assert_eq!(ack.start.seq_num, 1, "sequence numbers stay dense");
}

/// What happens to chunk 1 between the two runs.
enum Damage {
    Missing,
    /// Cut short: what a crash mid-write leaves where a store could tear an object.
    Torn,
}

#[tokio::test]
async fn chunks_after_a_missing_chunk_are_ignored_by_recovery() {
    recovery_stops_at_chunk_1(Damage::Missing).await;
}

#[tokio::test]
async fn a_torn_chunk_ends_its_epoch_in_recovery() {
    recovery_stops_at_chunk_1(Damage::Torn).await;
}

/// A crash loses only the chunks in flight, so a missing chunk with more than
/// `MAX_TORN_TAIL` complete chunks after it is damage: recovery refuses to start rather
/// than silently drop acknowledged records.
#[tokio::test]
async fn a_missing_chunk_followed_by_many_is_reported_as_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let s = setup(&engine, "damaged").await;
    for i in 0..streamgate_core::MAX_TORN_TAIL + 3 {
        engine
            .append(&basin(), &s, records(&[&format!("r{i}")]), None)
            .await
            .unwrap();
    }
    let epoch = engine.engine.epoch();
    engine.engine.shutdown().await;
    let chunks = engine.objects.list("wal/").await.unwrap();
    assert!(chunks.len() > streamgate_core::MAX_TORN_TAIL + 1);
    engine
        .objects
        .delete(&streamgate_core::wal::chunk_key(epoch, 1))
        .await
        .unwrap();
    drop(engine);
    let reopened = Engine::open(
        Arc::new(metadata_store(dir.path()).await),
        object_store(dir.path()).await,
        EngineSettings::default(),
    )
    .await;
    let error = reopened
        .err()
        .expect("recovery refuses a damaged log")
        .to_string();
    assert!(error.contains("the log is corrupt"), "{error}");
}

/// Many appends auto-creating the same new stream at once all land in it: the losers
/// of the creation race find the winner's stream even before it is registered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appends_auto_creating_one_stream_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    create_auto_creating_basin(&engine).await;
    for round in 0..50 {
        let name = stream(&format!("raced-{round}"));
        let appends: Vec<_> = (0..32)
            .map(|i| {
                let (root, name) = (engine.root.clone(), name.clone());
                tokio::spawn(async move {
                    root.append(&basin(), &name, records(&[&format!("r{i}")]), None)
                        .await
                })
            })
            .collect();
        for append in appends {
            append.await.unwrap().unwrap();
        }
        let tail = engine.check_tail(&basin(), &name, None).await.unwrap();
        assert_eq!(tail.seq_num, 32, "round {round}");
    }
}

#[tokio::test]
async fn auto_creation_follows_the_basin_config() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    create_auto_creating_basin(&engine).await;
    assert!(matches!(
        engine.check_tail(&basin(), &stream("nope"), None).await,
        Err(Error::NotFound(Resource::Stream(_)))
    ));
    let override_config: StreamConfig =
        serde_json::from_str(r#"{"retention_policy":{"age":3600}}"#).unwrap();
    engine
        .append(
            &basin(),
            &stream("auto"),
            records(&["x"]),
            Some(&override_config),
        )
        .await
        .unwrap();
    let config = engine
        .stream_config(&basin(), &stream("auto"))
        .await
        .unwrap();
    assert_eq!(config.retention_policy, override_config.retention_policy);
    assert!(matches!(
        engine
            .append(
                &BasinName::new("missing-basin").unwrap(),
                &stream("a"),
                records(&["x"]),
                None
            )
            .await,
        Err(Error::NotFound(Resource::Basin(_)))
    ));
}

/// An object store that holds every WAL chunk put until the test lets it through, so
/// the test decides when appends become durable; other objects pass. It also counts
/// the reads of segments.
struct HeldWal {
    inner: Arc<dyn ObjectStore>,
    /// Whether WAL puts may go on to the store.
    open: tokio::sync::watch::Sender<bool>,
    /// WAL puts waiting to be let through.
    waiting: tokio::sync::watch::Sender<usize>,
    /// WAL puts made so far (through `put`).
    puts: std::sync::atomic::AtomicUsize,
    /// WAL chunks the writer put on its own thread; whether such puts fail, and how
    /// many failed.
    blocking_puts: std::sync::atomic::AtomicUsize,
    fail_blocking_puts: std::sync::atomic::AtomicBool,
    failed_blocking_puts: std::sync::atomic::AtomicUsize,
    /// Puts the writer began on its own thread, and whether they are held there (the
    /// writer's thread blocked, as by a slow disk) until the test lets them go.
    blocking_put_attempts: std::sync::atomic::AtomicUsize,
    hold_blocking_puts: std::sync::atomic::AtomicBool,
    segment_gets: std::sync::atomic::AtomicUsize,
}

impl HeldWal {
    fn new(inner: Arc<dyn ObjectStore>) -> HeldWal {
        HeldWal {
            inner,
            open: tokio::sync::watch::Sender::new(true),
            waiting: tokio::sync::watch::Sender::new(0),
            puts: Default::default(),
            blocking_puts: Default::default(),
            fail_blocking_puts: Default::default(),
            failed_blocking_puts: Default::default(),
            blocking_put_attempts: Default::default(),
            hold_blocking_puts: Default::default(),
            segment_gets: Default::default(),
        }
    }

    /// An engine on `dir` whose WAL puts go through a `HeldWal`, and that `HeldWal`.
    async fn open(dir: &Path, settings: EngineSettings) -> (TestEngine, Arc<HeldWal>) {
        let mut held = None;
        let engine = open_with_objects(dir, settings, |objects| {
            let wal = Arc::new(HeldWal::new(objects));
            held = Some(wal.clone());
            wal
        })
        .await;
        (engine, held.expect("the engine's object store"))
    }

    /// WAL chunks written, either way.
    fn chunk_writes(&self) -> usize {
        use std::sync::atomic::Ordering::SeqCst;
        self.puts.load(SeqCst) + self.blocking_puts.load(SeqCst)
    }

    fn count_segment_read(&self, key: &str) {
        if key.starts_with("segments/") {
            self.segment_gets
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Waits until `count` WAL puts are held.
    async fn holding(&self, count: usize) {
        let mut waiting = self.waiting.subscribe();
        let held = tokio::time::timeout(Duration::from_secs(30), waiting.wait_for(|n| *n == count));
        assert!(
            held.await.is_ok_and(|held| held.is_ok()),
            "{count} WAL puts are held (the bound only keeps a broken build from hanging)"
        );
    }
}

#[async_trait::async_trait]
impl ObjectStore for HeldWal {
    async fn put(&self, key: &str, data: Bytes) -> streamgate_core::Result<()> {
        if key.starts_with("wal/") {
            self.puts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.waiting.send_modify(|n| *n += 1);
            let _ = self.open.subscribe().wait_for(|open| *open).await;
            self.waiting.send_modify(|n| *n -= 1);
        }
        self.inner.put(key, data).await
    }
    async fn get(&self, key: &str) -> streamgate_core::Result<Option<Bytes>> {
        self.count_segment_read(key);
        self.inner.get(key).await
    }
    async fn get_range(
        &self,
        key: &str,
        range: std::ops::Range<u64>,
    ) -> streamgate_core::Result<Bytes> {
        self.count_segment_read(key);
        self.inner.get_range(key, range).await
    }
    async fn list(&self, prefix: &str) -> streamgate_core::Result<Vec<String>> {
        self.inner.list(prefix).await
    }
    async fn delete(&self, key: &str) -> streamgate_core::Result<()> {
        self.inner.delete(key).await
    }
    async fn sync_deletes(&self, keys: &[String]) -> streamgate_core::Result<()> {
        self.inner.sync_deletes(keys).await
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    async fn prepare(&self, keys: &[String]) -> streamgate_core::Result<()> {
        self.inner.prepare(keys).await
    }
    fn put_prepared_blocking(&self, key: &str, data: &[u8]) -> Option<streamgate_core::Result<()>> {
        use std::sync::atomic::Ordering::SeqCst;
        // Held puts are held in `put`: while they are, none goes this way.
        if !*self.open.borrow() {
            return None;
        }
        self.blocking_put_attempts.fetch_add(1, SeqCst);
        while self.hold_blocking_puts.load(SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        if self.fail_blocking_puts.load(SeqCst) {
            self.failed_blocking_puts.fetch_add(1, SeqCst);
            return Some(Err(streamgate_core::Error::storage("a failing disk")));
        }
        let put = self.inner.put_prepared_blocking(key, data);
        if matches!(put, Some(Ok(()))) {
            self.blocking_puts.fetch_add(1, SeqCst);
        }
        put
    }
}

/// On a local disk, a small chunk written while no other is in flight is put on the WAL
/// writer's own thread (no hand-off to another thread and back), where the runtime has
/// more than one. Should that put fail, the chunk is written the usual way, retried
/// until durable, and its appends are acknowledged all the same, in order and once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_chunks_are_put_on_the_writers_thread_and_fall_back_when_that_fails() {
    use std::sync::atomic::Ordering::SeqCst;
    let dir = tempfile::tempdir().unwrap();
    let (engine, held) = HeldWal::open(dir.path(), EngineSettings::default()).await;
    let s = setup(&engine, "blocking").await;
    let local = backends::s3_url(dir.path()).is_none();
    let mut bodies = Vec::new();
    // The writer prepares its chunk files ahead on a thread of its own: the first
    // chunks may be written before any is prepared, the usual way.
    for n in 0..200 {
        let body = format!("r{n}");
        let ack = engine
            .append(&basin(), &s, records(&[body.as_str()]), None)
            .await
            .unwrap();
        assert_eq!(ack.start.seq_num, n);
        bodies.push(body);
        if held.blocking_puts.load(SeqCst) >= 3 {
            break;
        }
    }
    if local {
        assert!(
            held.blocking_puts.load(SeqCst) >= 3,
            "sequential small appends are put on the writer's thread"
        );
    } else {
        assert_eq!(held.blocking_puts.load(SeqCst), 0, "S3 has no blocking put");
    }

    held.fail_blocking_puts.store(true, SeqCst);
    let (blocking, usual) = (held.blocking_puts.load(SeqCst), held.puts.load(SeqCst));
    for body in ["after-1", "after-2"] {
        let ack = engine
            .append(&basin(), &s, records(&[body]), None)
            .await
            .unwrap();
        assert_eq!(ack.start.seq_num, bodies.len() as u64);
        bodies.push(body.to_owned());
    }
    assert_eq!(held.blocking_puts.load(SeqCst), blocking);
    assert_eq!(
        held.failed_blocking_puts.load(SeqCst),
        2,
        "each chunk was tried on the writer's thread first"
    );
    assert_eq!(
        held.puts.load(SeqCst) - usual,
        2,
        "each chunk whose blocking put failed was put the usual way"
    );
    assert_eq!(
        engine.engine.unready_reason(),
        None,
        "the log is healthy again"
    );

    drop(engine);
    let engine = open(dir.path()).await;
    let read: Vec<String> = read_all(&engine, &s, ReadStart::SeqNum(0))
        .await
        .into_iter()
        .map(|(_, _, body)| body)
        .collect();
    assert_eq!(
        read, bodies,
        "every acknowledged record, once, after a restart"
    );
}

/// On a local disk, small appends that arrive while a chunk is being written share the
/// next chunk (one flush between them) instead of each starting a chunk of its own.
#[tokio::test]
async fn small_appends_arriving_during_a_write_share_the_next_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, held) = HeldWal::open(dir.path(), EngineSettings::default()).await;
    let s = setup(&engine, "sharing").await;
    let before = held.chunk_writes();
    held.open.send_replace(false);
    let append = |body: &'static str| {
        let (caller, s) = (engine.root.clone(), s.clone());
        tokio::spawn(async move { caller.append(&basin(), &s, records(&[body]), None).await })
    };
    let first = append("first");
    held.holding(1).await;
    let others: Vec<_> = ["second", "third", "fourth"]
        .into_iter()
        .map(append)
        .collect();
    // Time for them to reach the writer; if they did not, they would go out one by one
    // and the count below would say so.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        *held.waiting.borrow(),
        1,
        "no second small chunk while one is written"
    );
    held.open.send_replace(true);
    assert_eq!(first.await.unwrap().unwrap().start.seq_num, 0);
    let mut starts = Vec::new();
    for other in others {
        starts.push(other.await.unwrap().unwrap().start.seq_num);
    }
    starts.sort();
    assert_eq!(starts, [1, 2, 3]);
    assert_eq!(
        held.chunk_writes() - before,
        2,
        "the first chunk, then one for the three that waited"
    );
}

/// Appends that queue while the writer's thread is busy putting a chunk go out together
/// in the next chunk while they are small; appends of at least `parallel_min_bytes`
/// (256 KiB by default) keep a chunk each, written alongside one another, rather than
/// being gathered into one large chunk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_queued_behind_a_blocking_put_share_a_chunk_only_while_small() {
    use std::sync::atomic::Ordering::SeqCst;
    let dir = tempfile::tempdir().unwrap();
    let (engine, held) = HeldWal::open(dir.path(), EngineSettings::default()).await;
    let s = setup(&engine, "gathering").await;
    let large = "x".repeat(300 * 1024);
    let mut tail = 0;
    for (round, bodies, chunks) in [
        ("small", vec!["s1", "s2", "s3"], 1),
        ("large", vec![large.as_str(), large.as_str()], 2),
    ] {
        let writes_before = held.chunk_writes();
        let attempts_before = held.blocking_put_attempts.load(SeqCst);
        held.hold_blocking_puts.store(true, SeqCst);
        let append = |body: &str| {
            let (caller, s, body) = (engine.root.clone(), s.clone(), body.to_owned());
            tokio::spawn(async move { caller.append(&basin(), &s, records(&[&body]), None).await })
        };
        // A small append alone: the writer puts its chunk on its own thread, held there.
        let first = append("first");
        let started = tokio::time::timeout(Duration::from_secs(30), async {
            while held.blocking_put_attempts.load(SeqCst) == attempts_before {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        assert!(
            started.await.is_ok(),
            "{round}: the lone small chunk is put on the writer's thread"
        );
        let queued: Vec<_> = bodies.iter().map(|body| append(body)).collect();
        // Time for them to reach the writer's queue while it is blocked.
        tokio::time::sleep(Duration::from_millis(300)).await;
        held.hold_blocking_puts.store(false, SeqCst);
        assert_eq!(first.await.unwrap().unwrap().start.seq_num, tail);
        let mut starts = Vec::new();
        for append in queued {
            starts.push(append.await.unwrap().unwrap().start.seq_num);
        }
        starts.sort();
        let expected: Vec<u64> = (tail + 1..=tail + bodies.len() as u64).collect();
        assert_eq!(
            starts, expected,
            "{round}: each acknowledged once, in sequence"
        );
        tail += 1 + bodies.len() as u64;
        assert_eq!(
            held.chunk_writes() - writes_before,
            1 + chunks,
            "{round}: the held chunk, then {chunks} chunk(s) for the {} queued appends",
            bodies.len()
        );
    }
}

/// With the in-flight budget spent by appends whose chunks the store has not taken yet,
/// a further append waits (the engine reports itself congested meanwhile) and is
/// appended once the store takes them; one that finds no room for 10 s is refused
/// retryably and never lands.
#[tokio::test]
async fn appends_beyond_the_in_flight_budget_wait_instead_of_failing() {
    let dir = tempfile::tempdir().unwrap();
    let settings = EngineSettings {
        max_inflight_bytes: 32 * 1024,
        // Every append a chunk of its own, written alongside the others.
        flush: streamgate_core::FlushSettings {
            parallel_min_bytes: 0,
            ..Default::default()
        },
        ..Default::default()
    };
    let (engine, held) = HeldWal::open(dir.path(), settings).await;
    let s = setup(&engine, "budget").await;
    // 8 KiB bodies: 9 KiB of budget each (8 bytes of metering overhead round up), so
    // three fit in 32 KiB and a fourth does not.
    let body = "x".repeat(8 * 1024);
    let metered = records(&[&body]).records[0].metered_size();
    let append = |engine: &TestEngine| {
        let (caller, s, body) = (engine.root.clone(), s.clone(), body.clone());
        tokio::spawn(async move { caller.append(&basin(), &s, records(&[&body]), None).await })
    };

    let mut tail = 0;
    for round in ["waits", "is refused"] {
        held.open.send_replace(false);
        // Each append takes budget and goes on to a chunk of its own (linger 0, four
        // chunks in flight), which the store holds.
        let mut holders = Vec::new();
        for n in 1..=3 {
            assert!(
                !engine.is_congested(metered),
                "{round}: room for append {n}"
            );
            holders.push(append(&engine));
            held.holding(n).await;
        }
        assert!(engine.is_congested(metered), "{round}: the budget is spent");
        let beyond = append(&engine);
        let outcome = if round == "waits" {
            held.open.send_replace(true);
            beyond.await.unwrap()
        } else {
            // Nothing frees budget: after 10 s of waiting the append is refused (the
            // bound only keeps a broken build, which would not refuse, from hanging).
            let refused = tokio::time::timeout(Duration::from_secs(60), beyond)
                .await
                .expect("an append waiting for budget is answered")
                .unwrap();
            held.open.send_replace(true);
            refused
        };
        for holder in holders {
            holder.await.unwrap().unwrap();
        }
        tail += 3;
        match (round, outcome) {
            ("waits", Ok(ack)) => {
                assert_eq!(
                    ack.start.seq_num, tail,
                    "appended after the ones it waited for"
                );
                tail += 1;
            }
            ("is refused", Err(err)) => {
                assert_eq!(err.kind(), streamgate_core::ErrorKind::Unavailable, "{err}");
                assert!(err.kind().is_retryable(), "{err}");
            }
            (round, outcome) => panic!("the append beyond the budget {round}: {outcome:?}"),
        }
        assert_eq!(
            engine.check_tail(&basin(), &s, None).await.unwrap().seq_num,
            tail,
            "{round}: the appends that were answered with success, and only those"
        );
        assert!(
            !engine.is_congested(metered),
            "{round}: the budget is free again"
        );
    }
}

/// Every record, read one batch at a time from `start`.
async fn read_all(engine: &Caller, s: &StreamName, start: ReadStart) -> Vec<(u64, u64, String)> {
    let mut out = Vec::new();
    let mut request = ReadRequest {
        start,
        clamp: true,
        ..Default::default()
    };
    loop {
        match engine.read(&basin(), s, request, None).await {
            Ok(batch) if batch.records.is_empty() => return out,
            Ok(batch) => {
                for r in &batch.records {
                    out.push((
                        r.seq_num,
                        r.timestamp,
                        String::from_utf8(r.body.to_vec()).unwrap(),
                    ));
                }
                request.start = ReadStart::SeqNum(batch.records.last().unwrap().seq_num + 1);
            }
            Err(Error::RangeNotSatisfiable { .. }) => return out,
            Err(err) => panic!("{err}"),
        }
    }
}

fn with_timestamps(bodies_and_timestamps: &[(&str, u64)]) -> AppendInput {
    AppendInput {
        records: bodies_and_timestamps
            .iter()
            .map(|(b, ts)| AppendRecord {
                timestamp: Some(*ts),
                headers: vec![],
                body: Bytes::copy_from_slice(b.as_bytes()),
            })
            .collect(),
        ..Default::default()
    }
}

#[tokio::test]
async fn compacted_records_read_the_same_from_segments_and_recover_from_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    // Compaction only when the test asks for it.
    let manual = EngineSettings {
        compaction_interval: Duration::from_secs(3600),
        ..Default::default()
    };
    let engine = open_with(dir.path(), manual.clone()).await;
    let s = setup(&engine, "history").await;
    let other = setup(&engine, "other").await;
    // 60 batches of 1-5 records with client timestamps 10, 20, ..., a fence and a trim.
    let mut ts = 0;
    for batch in 0..60 {
        let records: Vec<(String, u64)> = (0..(batch % 5 + 1))
            .map(|i| {
                ts += 10;
                (format!("r{batch}-{i}"), ts)
            })
            .collect();
        let refs: Vec<(&str, u64)> = records.iter().map(|(b, t)| (b.as_str(), *t)).collect();
        engine
            .append(&basin(), &s, with_timestamps(&refs), None)
            .await
            .unwrap();
        engine
            .append(&basin(), &other, records_of(batch), None)
            .await
            .unwrap();
    }
    engine
        .append(&basin(), &s, command("fence", b"w1"), None)
        .await
        .unwrap();
    engine
        .append(&basin(), &s, command("trim", &3u64.to_be_bytes()), None)
        .await
        .unwrap();
    let everything = read_all(&engine, &s, ReadStart::SeqNum(0)).await;
    assert_eq!(everything.len(), 182 - 3, "trimmed through seq 2");
    let from_timestamp = read_all(&engine, &s, ReadStart::Timestamp(455)).await;
    let from_tail_offset = read_all(&engine, &s, ReadStart::TailOffset(50)).await;

    let stats = engine.engine.compact().await.unwrap();
    assert!(stats.chunks >= 120, "every chunk compacted: {stats:?}");
    assert_eq!(stats.segments, 2, "one segment per stream: {stats:?}");
    let segments = engine.objects.list("segments/").await.unwrap();
    assert_eq!(segments.len(), 2, "{segments:?}");
    // Retention (7 days by default) ages records by arrival, not by their timestamps,
    // which here lie in 1970: nothing expires.
    engine.engine.run_lifecycle().await.unwrap();
    assert_eq!(engine.objects.list("segments/").await.unwrap().len(), 2);

    // Appends after compaction stay in the WAL: reads cross from segments to memory.
    let late = engine
        .append(&basin(), &s, with_timestamps(&[("late", ts + 10)]), None)
        .await
        .unwrap();
    let mut expected = everything.clone();
    expected.push((182, late.start.timestamp, "late".into()));
    assert_eq!(read_all(&engine, &s, ReadStart::SeqNum(0)).await, expected);
    let one_batch = engine.read(&basin(), &s, from_seq(0), None).await.unwrap();
    assert_eq!(
        one_batch.records.len(),
        180,
        "one read spans segment and memory"
    );
    assert_eq!(
        read_all(&engine, &s, ReadStart::Timestamp(455)).await,
        [
            from_timestamp.clone(),
            vec![expected[expected.len() - 1].clone()]
        ]
        .concat()
    );
    assert_eq!(from_timestamp[0].1, 460, "the first record at or after 455");
    assert_eq!(
        read_all(&engine, &s, ReadStart::TailOffset(51)).await,
        [
            from_tail_offset.clone(),
            vec![expected[expected.len() - 1].clone()]
        ]
        .concat()
    );
    for start in [0, 1, 3, 17, 100, 181] {
        let got = read_all(&engine, &s, ReadStart::SeqNum(start)).await;
        let want: Vec<_> = expected
            .iter()
            .filter(|r| r.0 >= start.max(3))
            .cloned()
            .collect();
        assert_eq!(got, want, "reading from {start}");
    }

    // A restart recovers from the checkpoints plus the WAL after them; compacted chunks
    // still present (their grace period has not passed) are not replayed again.
    engine.engine.shutdown().await;
    drop(engine);
    let engine = open_with(dir.path(), manual).await;
    assert_eq!(read_all(&engine, &s, ReadStart::SeqNum(0)).await, expected);
    assert_eq!(
        engine.check_tail(&basin(), &s, None).await.unwrap().seq_num,
        183
    );
    let mut fenced = records(&["x"]);
    fenced.fencing_token = Some("w2".into());
    assert!(matches!(
        engine.append(&basin(), &s, fenced, None).await,
        Err(Error::FencingTokenMismatch(t)) if t == "w1"
    ));
    let other_records = read_all(&engine, &other, ReadStart::SeqNum(0)).await;
    assert_eq!(other_records.len(), 60);
    assert_eq!(other_records[59].2, "o59");

    // The rest compacts after the restart too, continuing the same streams.
    let stats = engine.engine.compact().await.unwrap();
    assert!(stats.chunks >= 1 && stats.segments == 1, "{stats:?}");
    assert_eq!(read_all(&engine, &s, ReadStart::SeqNum(0)).await, expected);
}

/// A read session far behind the tail reads ahead of what it takes (nothing is cached
/// here, so every batch is fetched from storage, in ranges that also hold another
/// stream's batches): it gets every record once and in order while compaction moves
/// the records ahead of it from WAL chunks into segments, across segments and on into
/// records compacted just before it reaches them.
#[tokio::test]
async fn a_session_reading_ahead_gets_every_record_once_while_compaction_moves_them() {
    let dir = tempfile::tempdir().unwrap();
    let uncached = EngineSettings {
        compaction_interval: Duration::from_secs(3600),
        cache_bytes: 0,
        segment_cache_bytes: 0,
        ..Default::default()
    };
    let engine = open_with(dir.path(), uncached).await;
    let s = setup(&engine, "behind").await;
    let other = setup(&engine, "beside").await;
    let mut expected = Vec::new();
    let mut append_batches = |count: usize| {
        let first = expected.len();
        let batches: Vec<Vec<String>> = (0..count)
            .map(|b| (0..5).map(|i| format!("r{}", first + 5 * b + i)).collect())
            .collect();
        expected.extend(batches.iter().flatten().cloned());
        batches
    };
    let append = |batches: Vec<Vec<String>>| {
        let engine = &engine;
        let (s, other) = (&s, &other);
        async move {
            for batch in batches {
                let refs: Vec<&str> = batch.iter().map(String::as_str).collect();
                engine
                    .append(&basin(), s, records(&refs), None)
                    .await
                    .unwrap();
                engine
                    .append(&basin(), other, records(&["beside"]), None)
                    .await
                    .unwrap();
            }
        }
    };
    append(append_batches(100)).await;
    engine.engine.compact().await.unwrap();
    append(append_batches(100)).await;

    let mut reader = engine
        .open_reader(&basin(), &s, ReadStart::SeqNum(0), false, None)
        .await
        .unwrap();
    let limits = ReadLimits {
        count: Some(37),
        bytes: None,
        until: None,
    };
    let mut seen = Vec::new();
    let mut compacted = false;
    let mut appended_late = false;
    loop {
        let (batch, _) = engine.next_batch(&mut reader, limits).await.unwrap();
        if batch.records.is_empty() {
            if appended_late {
                break;
            }
            // Reached the tail: a few more, compacted before the reader gets to them.
            append(append_batches(3)).await;
            engine.engine.compact().await.unwrap();
            appended_late = true;
            continue;
        }
        for r in &batch.records {
            assert_eq!(r.seq_num, seen.len() as u64, "in order, none twice");
            seen.push(String::from_utf8(r.body.to_vec()).unwrap());
        }
        // Half way through the first segment: compaction moves the records ahead of
        // the reader (the second hundred batches) into segments.
        if !compacted && seen.len() > 250 {
            let stats = engine.engine.compact().await.unwrap();
            assert!(stats.chunks >= 200 && stats.segments == 2, "{stats:?}");
            compacted = true;
        }
    }
    assert!(compacted);
    assert_eq!(seen, expected);
}

fn records_of(batch: usize) -> AppendInput {
    records(&[&format!("o{batch}")])
}

/// Polls `check` every 50 ms for up to 30 s; panics with `what` if it never holds.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..600 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never happened: {what}");
}

async fn objects_under(engine: &TestEngine, prefix: &str) -> Vec<String> {
    engine.objects.list(prefix).await.unwrap()
}

#[tokio::test]
async fn trims_retention_delete_on_empty_and_deletion_remove_whole_objects() {
    use streamgate_core::config::{DeleteOnEmptyConfig, RetentionPolicy};
    let dir = tempfile::tempdir().unwrap();
    let settings = EngineSettings {
        compaction_interval: Duration::from_millis(100),
        // Each round's segment stays its own, so that trims can drop some of them.
        merge_segments: false,
        ..Default::default()
    };
    let engine = open_with(dir.path(), settings).await;
    setup(&engine, "unused").await;
    let create = |name: &str, config: StreamConfig| {
        let engine = engine.root.clone();
        let name = stream(name);
        async move {
            engine
                .create_stream(&basin(), name.clone(), config, None)
                .await
                .unwrap();
            name
        }
    };
    let trimmed = create("trimmed", StreamConfig::default()).await;
    let expiring = create(
        "expiring",
        StreamConfig {
            retention_policy: Some(RetentionPolicy::Age(1)),
            ..Default::default()
        },
    )
    .await;
    let emptied = create(
        "emptied",
        StreamConfig {
            delete_on_empty: Some(DeleteOnEmptyConfig { min_age_secs: 1 }),
            ..Default::default()
        },
    )
    .await;
    let deleted = create("deleted", StreamConfig::default()).await;
    let kept = create("kept", StreamConfig::default()).await;

    // Each stream gets records across several compaction rounds, so several segments.
    for round in 0..4 {
        for s in [&trimmed, &expiring, &emptied, &deleted, &kept] {
            let body = format!("{round}");
            engine
                .append(&basin(), s, records(&[&body, &body]), None)
                .await
                .unwrap();
        }
        engine.engine.compact().await.unwrap();
    }
    let id_of = |s: &StreamName| {
        let engine = engine.root.clone();
        let s = s.clone();
        async move {
            let range = streamgate_core::storage::metadata::ListRange {
                limit: 100,
                ..Default::default()
            };
            let page = engine.list_streams(&basin(), &range).await.unwrap();
            page.items.into_iter().find(|r| r.name == s).map(|r| r.id)
        }
    };
    let prefix_of = |id: u64| format!("segments/{id:020}/");
    let trimmed_id = id_of(&trimmed).await.unwrap();
    let expiring_id = id_of(&expiring).await.unwrap();
    let deleted_id = id_of(&deleted).await.unwrap();
    let kept_id = id_of(&kept).await.unwrap();
    assert_eq!(
        objects_under(&engine, &prefix_of(trimmed_id)).await.len(),
        4
    );

    // An explicit trim through seq 5: the two segments wholly below it go, and the
    // records below it are unreadable at once.
    engine
        .append(
            &basin(),
            &trimmed,
            command("trim", &5u64.to_be_bytes()),
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        read_all(&engine, &trimmed, ReadStart::SeqNum(0)).await[0].0,
        5
    );
    // Left: [4, 6), [6, 8) and the trim record's own [8, 9).
    eventually("segments below the trim point are deleted", || async {
        objects_under(&engine, &prefix_of(trimmed_id)).await.len() == 3
    })
    .await;
    let left: Vec<u64> = read_all(&engine, &trimmed, ReadStart::SeqNum(0))
        .await
        .iter()
        .map(|r| r.0)
        .collect();
    assert_eq!(left, [5, 6, 7, 8]);

    // Retention of 1 s: once compacted, the old records expire, segments and all.
    eventually(
        "expired records are unreadable and their segments deleted",
        || async {
            read_all(&engine, &expiring, ReadStart::SeqNum(0))
                .await
                .is_empty()
                && objects_under(&engine, &prefix_of(expiring_id))
                    .await
                    .is_empty()
        },
    )
    .await;
    assert_eq!(
        engine
            .check_tail(&basin(), &expiring, None)
            .await
            .unwrap()
            .seq_num,
        8,
        "expiry keeps the tail"
    );
    let reader = engine
        .open_reader(&basin(), &expiring, ReadStart::SeqNum(0), false, None)
        .await
        .unwrap();
    assert_eq!(
        reader.position(),
        8,
        "a reader starts at the first retained record"
    );

    // Delete-on-empty: trimmed empty, it is deleted a second later.
    engine
        .append(
            &basin(),
            &emptied,
            command("trim", &u64::MAX.to_be_bytes()),
            None,
        )
        .await
        .unwrap();
    eventually("the emptied stream is deleted", || async {
        id_of(&emptied).await.is_none()
    })
    .await;

    // Deleting a stream removes its segments, then its row.
    engine.delete_stream(&basin(), &deleted).await.unwrap();
    eventually("a deleted stream's segments are deleted", || async {
        objects_under(&engine, &prefix_of(deleted_id))
            .await
            .is_empty()
            && id_of(&deleted).await.is_none()
    })
    .await;

    // Compacted WAL chunks are deleted after their grace period; the rest is intact.
    eventually("compacted WAL chunks are deleted", || async {
        objects_under(&engine, "wal/").await.len() <= 2
    })
    .await;
    assert_eq!(objects_under(&engine, &prefix_of(kept_id)).await.len(), 4);
    let kept_records = read_all(&engine, &kept, ReadStart::SeqNum(0)).await;
    let bodies: Vec<&str> = kept_records.iter().map(|r| r.2.as_str()).collect();
    assert_eq!(bodies, ["0", "0", "1", "1", "2", "2", "3", "3"]);

    // All of it holds after a restart.
    engine.engine.shutdown().await;
    drop(engine);
    let engine = open(dir.path()).await;
    assert_eq!(
        read_all(&engine, &kept, ReadStart::SeqNum(0)).await,
        kept_records
    );
    assert_eq!(
        read_all(&engine, &trimmed, ReadStart::SeqNum(0))
            .await
            .len(),
        4
    );
    assert!(read_all(&engine, &expiring, ReadStart::SeqNum(0))
        .await
        .is_empty());
}

/// Consumer groups are state of their stream: each change is durable when answered, so
/// the groups come back exactly after a crash (no shutdown), from the log alone and then
/// from a compaction checkpoint plus the log; they are not records; they go with the
/// stream.
#[tokio::test]
async fn consumer_groups_survive_a_crash_from_the_log_and_from_checkpoints() {
    use streamgate_core::groups::{EntryId, GroupOp, Groups};

    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let s = setup(&engine, "jobs").await;
    let ack = engine
        .append(&basin(), &s, records(&["j0", "j1", "j2", "j3", "j4"]), None)
        .await
        .unwrap();
    let id = |seq: u64| EntryId::new(ack.start.timestamp, seq);
    let change = |ops: Vec<GroupOp>| {
        let engine = &engine;
        let s = &s;
        async move {
            let ((), durable) = engine
                .change_groups(&basin(), s, |_, _| Ok((ops, ())))
                .await
                .unwrap();
            durable.await.unwrap()
        }
    };
    change(vec![GroupOp::Create {
        group: "workers".into(),
        last_id: EntryId::MIN,
        entries_read: None,
    }])
    .await;
    change(vec![GroupOp::Deliver {
        group: "workers".into(),
        consumer: "alice".into(),
        now_ms: 1_000,
        ids: vec![id(0), id(1), id(2)],
        last_id: id(2),
        entries_read: Some(3),
        noack: false,
    }])
    .await;
    change(vec![GroupOp::Ack {
        group: "workers".into(),
        ids: vec![id(0)],
    }])
    .await;
    let snapshot = |engine: &TestEngine| {
        let s = s.clone();
        let engine = engine.root.clone();
        async move {
            let (groups, durable) = engine
                .read_groups(&basin(), &s, |groups: &Groups, _| groups.clone())
                .await
                .unwrap();
            durable.await.unwrap();
            groups
        }
    };
    let before = snapshot(&engine).await;
    let workers = before.get("workers").unwrap();
    assert_eq!(workers.last_id, id(2));
    assert_eq!(
        workers.pending.keys().copied().collect::<Vec<_>>(),
        [id(1), id(2)]
    );
    drop(engine); // no shutdown: what recovery finds is what the log holds

    let engine = open(dir.path()).await;
    assert_eq!(
        snapshot(&engine).await,
        before,
        "the groups came back from the log"
    );
    assert_eq!(
        engine.check_tail(&basin(), &s, None).await.unwrap().seq_num,
        5,
        "group ops take no position of the stream"
    );
    engine.engine.compact().await.unwrap();
    let ((), durable) = engine
        .change_groups(&basin(), &s, |_, _| {
            Ok((
                vec![GroupOp::Deliver {
                    group: "workers".into(),
                    consumer: "bob".into(),
                    now_ms: 2_000,
                    ids: vec![id(3)],
                    last_id: id(3),
                    entries_read: Some(4),
                    noack: false,
                }],
                (),
            ))
        })
        .await
        .unwrap();
    durable.await.unwrap();
    let later = snapshot(&engine).await;
    assert_eq!(
        later.get("workers").unwrap().consumers["bob"].pending.len(),
        1
    );
    drop(engine);

    let engine = open(dir.path()).await;
    assert_eq!(
        snapshot(&engine).await,
        later,
        "the groups came back from the checkpoint and the log after it"
    );
    // Records read as before: the group ops are no records.
    let read = engine.read(&basin(), &s, from_seq(0), None).await.unwrap();
    assert_eq!(bodies(&read), ["j0", "j1", "j2", "j3", "j4"]);

    // Deleting the stream deletes its groups: a new stream of that name has none.
    engine.delete_stream(&basin(), &s).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match engine
            .create_stream(&basin(), s.clone(), StreamConfig::default(), None)
            .await
        {
            Ok(_) => break,
            Err(Error::DeletionPending(_)) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(err) => panic!("recreating the stream: {err}"),
        }
    }
    assert!(snapshot(&engine).await.is_empty());
}

/// A stream appending a little at a time gets a small segment per compaction round; the
/// rounds merge them, so reading its history back costs a few object reads rather than
/// one per round, returns every record as appended, and keeps doing so across a restart
/// (which forgets what the merger remembered).
#[tokio::test]
async fn small_segments_merge_so_a_slow_streams_history_costs_few_reads() {
    let dir = tempfile::tempdir().unwrap();
    let manual = EngineSettings {
        compaction_interval: Duration::from_secs(3600),
        ..Default::default()
    };
    let (engine, _) = HeldWal::open(dir.path(), manual.clone()).await;
    let s = setup(&engine, "slow").await;
    let mut expected = Vec::new();
    let mut merges = 0;
    for round in 0..40 {
        merges += append_a_round_and_compact(&engine, &s, round, &mut expected).await;
    }
    assert!(merges >= 10, "{merges} merges in 40 rounds");

    // A restart forgets the merger's memory; the next rounds look the stream up and go on.
    engine.engine.shutdown().await;
    drop(engine);
    let (engine, _) = HeldWal::open(dir.path(), manual.clone()).await;
    let mut merges_after_restart = 0;
    for round in 40..64 {
        merges_after_restart += append_a_round_and_compact(&engine, &s, round, &mut expected).await;
    }
    assert!(
        merges_after_restart >= 5,
        "{merges_after_restart} merges after the restart"
    );
    engine.engine.shutdown().await;
    drop(engine);

    // Cold (after a restart): every record back in order, in a few segment reads.
    let (engine, store) = HeldWal::open(dir.path(), manual).await;
    let got: Vec<String> = read_all(&engine, &s, ReadStart::SeqNum(0))
        .await
        .into_iter()
        .map(|(_, _, body)| body)
        .collect();
    assert_eq!(got, expected);
    let reads = store.segment_gets.load(std::sync::atomic::Ordering::SeqCst);
    // 64 rounds of one entry: base-4 merging leaves at most 3 runs each of 16, 4 and 1
    // rounds after the first full 64 (at most one merge happens per round).
    assert!(
        (1..=10).contains(&reads),
        "{reads} segment reads for 64 rounds' segments"
    );
    // Reads from the middle land in the merged segments too.
    let from_middle = read_all(&engine, &s, ReadStart::SeqNum(100)).await;
    assert_eq!(from_middle.len(), expected.len() - 100);
    assert_eq!(from_middle[0].2, expected[100]);
}

/// Appends one batch of three records to `s` (noting their bodies in `expected`) and
/// compacts; how many merges the compaction made.
async fn append_a_round_and_compact(
    engine: &TestEngine,
    s: &StreamName,
    round: usize,
    expected: &mut Vec<String>,
) -> usize {
    let bodies: Vec<String> = (0..3).map(|i| format!("r{round}-{i}")).collect();
    let refs: Vec<&str> = bodies.iter().map(String::as_str).collect();
    engine
        .append(&basin(), s, records(&refs), None)
        .await
        .unwrap();
    expected.extend(bodies);
    let stats = engine.engine.compact().await.unwrap();
    assert_eq!(stats.segments, 1, "one new segment a round: {stats:?}");
    stats.merges
}
