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
use streamgate_core::{Caller, Engine, EngineSettings, Error};
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
    let metadata = metadata_store(dir).await;
    let objects = object_store(dir).await;
    let settings = EngineSettings {
        reap_interval: Duration::from_millis(200),
        ..settings
    };
    let engine = Engine::open(Arc::new(metadata), objects.clone(), settings)
        .await
        .unwrap();
    TestEngine {
        root: engine.as_root(),
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

#[tokio::test]
async fn a_waiting_read_wakes_on_append() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let s = setup(&engine, "live").await;
    let reader = {
        let engine = engine.clone();
        let s = s.clone();
        tokio::spawn(async move {
            let req = ReadRequest {
                start: ReadStart::TailOffset(0),
                wait: Duration::from_secs(10),
                ..Default::default()
            };
            engine.read(&basin(), &s, req, None).await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    engine
        .append(&basin(), &s, records(&["hello"]), None)
        .await
        .unwrap();
    let batch = tokio::time::timeout(Duration::from_secs(5), reader)
        .await
        .expect("the waiting read returned promptly")
        .unwrap()
        .unwrap();
    assert_eq!(bodies(&batch), ["hello"]);
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
        Err(Error::StreamDeletionPending(_))
    ));
    assert!(matches!(
        engine
            .create_stream(&basin(), s.clone(), StreamConfig::default(), None)
            .await,
        Err(Error::StreamDeletionPending(_))
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

/// Many appends auto-creating the same new stream at once all land in it: the losers
/// of the creation race find the winner's stream even before it is registered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appends_auto_creating_one_stream_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let config = BasinConfig {
        create_stream_on_append: true,
        ..Default::default()
    };
    engine.create_basin(basin(), config, None).await.unwrap();
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
    let config = BasinConfig {
        create_stream_on_append: true,
        ..Default::default()
    };
    engine.create_basin(basin(), config, None).await.unwrap();
    assert!(matches!(
        engine.check_tail(&basin(), &stream("nope"), None).await,
        Err(Error::StreamNotFound(_))
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
        Err(Error::BasinNotFound(_))
    ));
}

#[tokio::test]
async fn appends_beyond_the_in_flight_budget_wait_instead_of_failing() {
    let dir = tempfile::tempdir().unwrap();
    let settings = EngineSettings {
        max_inflight_bytes: 32 * 1024,
        ..Default::default()
    };
    let engine = open_with(dir.path(), settings).await;
    let s = setup(&engine, "budget").await;
    let body = "x".repeat(8 * 1024);
    let appends: Vec<_> = (0..40)
        .map(|_| {
            let (engine, s, body) = (engine.clone(), s.clone(), body.clone());
            tokio::spawn(async move { engine.append(&basin(), &s, records(&[&body]), None).await })
        })
        .collect();
    for append in appends {
        append.await.unwrap().unwrap();
    }
    assert_eq!(
        engine.check_tail(&basin(), &s, None).await.unwrap().seq_num,
        40
    );
}
