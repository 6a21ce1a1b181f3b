//! The official Rust SDK (crate `s2-sdk`) against the real binary: basin and stream
//! lifecycle, pagination, unary append / read / check-tail with every start selector and
//! bound, conditions, fence, trim, auto-creation and errors.

use s2_sdk::error::{AppendConditionFailed, AppendError, ReadError};
use s2_sdk::types::*;
use s2_sdk::{S2Basin, S2Stream, S2};
use streamgate_compat::{sdk_client, Server};

fn records(bodies: &[&str]) -> AppendInput {
    let records: Vec<AppendRecord> = bodies
        .iter()
        .map(|b| AppendRecord::new(b.to_string()).unwrap())
        .collect();
    AppendInput::new(AppendRecordBatch::try_from_iter(records).unwrap())
}

fn read_from(from: ReadFrom) -> ReadInput {
    ReadInput::new().with_start(ReadStart::new().with_from(from))
}

fn bodies(batch: &ReadBatch) -> Vec<String> {
    batch
        .records
        .iter()
        .map(|r| String::from_utf8(r.body.to_vec()).unwrap())
        .collect()
}

fn server_code<E: std::fmt::Debug>(err: &E) -> String {
    // The SDK's error types carry the server's code; their Debug output names it.
    format!("{err:?}")
}

async fn new_stream(s2: &S2, basin: &str, stream: &str) -> (S2Basin, S2Stream) {
    let basin_name: BasinName = basin.parse().unwrap();
    let _ = s2
        .create_basin(CreateBasinInput::new(basin_name.clone()))
        .await;
    let basin = s2.basin(basin_name);
    basin
        .create_stream(CreateStreamInput::new(stream.parse().unwrap()))
        .await
        .unwrap();
    let stream = basin.stream(stream.parse().unwrap());
    (basin, stream)
}

#[tokio::test]
async fn basin_and_stream_lifecycle_with_pagination() {
    let dir = tempfile::tempdir().unwrap();
    // Deletions stay pending for the whole test, so listing them is deterministic.
    let server = Server::start_with(dir.path(), &["--reap-interval-secs", "600"]);
    let s2 = sdk_client(&server);

    for name in ["sdk-basin-a", "sdk-basin-b", "sdk-basin-c"] {
        let info = s2
            .create_basin(CreateBasinInput::new(name.parse().unwrap()))
            .await
            .unwrap();
        assert_eq!(info.name.to_string(), name);
        assert!(info.deleted_at.is_none());
    }
    let err = s2
        .create_basin(CreateBasinInput::new("sdk-basin-a".parse().unwrap()))
        .await
        .unwrap_err();
    assert!(
        server_code(&err).contains("resource_already_exists"),
        "{err:?}"
    );

    let page = s2
        .list_basins(
            ListBasinsInput::new()
                .with_prefix("sdk-basin".parse().unwrap())
                .with_limit(2),
        )
        .await
        .unwrap();
    let names: Vec<String> = page.values.iter().map(|b| b.name.to_string()).collect();
    assert_eq!(names, ["sdk-basin-a", "sdk-basin-b"]);
    assert!(page.has_more);
    let page = s2
        .list_basins(
            ListBasinsInput::new()
                .with_prefix("sdk-basin".parse().unwrap())
                .with_start_after("sdk-basin-b".parse().unwrap())
                .with_limit(2),
        )
        .await
        .unwrap();
    assert_eq!(page.values.len(), 1);
    assert!(!page.has_more);

    let basin_name: BasinName = "sdk-basin-a".parse().unwrap();
    let config = s2
        .reconfigure_basin(ReconfigureBasinInput::new(
            basin_name.clone(),
            BasinReconfiguration::new().with_create_stream_on_append(true),
        ))
        .await
        .unwrap();
    assert!(config.create_stream_on_append);
    assert!(
        s2.get_basin_config(basin_name.clone())
            .await
            .unwrap()
            .create_stream_on_append
    );

    let basin = s2.basin(basin_name.clone());
    for name in ["jobs/1", "jobs/2", "jobs/3", "other"] {
        basin
            .create_stream(CreateStreamInput::new(name.parse().unwrap()))
            .await
            .unwrap();
    }
    let page = basin
        .list_streams(
            ListStreamsInput::new()
                .with_prefix("jobs/".parse().unwrap())
                .with_limit(2),
        )
        .await
        .unwrap();
    let names: Vec<String> = page.values.iter().map(|s| s.name.to_string()).collect();
    assert_eq!(names, ["jobs/1", "jobs/2"]);
    assert!(page.has_more);

    let config = basin
        .reconfigure_stream(ReconfigureStreamInput::new(
            "jobs/1".parse().unwrap(),
            StreamReconfiguration::new().with_retention_policy(RetentionPolicy::Age(3600)),
        ))
        .await
        .unwrap();
    assert!(matches!(
        config.retention_policy,
        Some(RetentionPolicy::Age(3600))
    ));
    let fetched = basin
        .get_stream_config("jobs/1".parse().unwrap())
        .await
        .unwrap();
    assert!(matches!(
        fetched.retention_policy,
        Some(RetentionPolicy::Age(3600))
    ));

    basin
        .delete_stream(DeleteStreamInput::new("jobs/3".parse().unwrap()))
        .await
        .unwrap();
    let page = basin
        .list_streams(ListStreamsInput::new().with_prefix("jobs/3".parse().unwrap()))
        .await
        .unwrap();
    assert_eq!(
        page.values.len(),
        1,
        "a stream being deleted is still listed"
    );
    assert!(
        page.values[0].deleted_at.is_some(),
        "with its deletion time"
    );
    let err = basin
        .get_stream_config("never".parse().unwrap())
        .await
        .unwrap_err();
    assert!(server_code(&err).contains("stream_not_found"), "{err:?}");

    s2.delete_basin(DeleteBasinInput::new("sdk-basin-c".parse().unwrap()))
        .await
        .unwrap();
    s2.delete_basin(
        DeleteBasinInput::new("sdk-basin-zz".parse().unwrap()).with_ignore_not_found(true),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn append_read_and_check_tail_with_every_selector_and_bound() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let s2 = sdk_client(&server);
    let (_, stream) = new_stream(&s2, "sdk-records", "events").await;

    assert_eq!(stream.check_tail().await.unwrap().seq_num, 0);
    let first = AppendInput::new(
        AppendRecordBatch::try_from_iter([
            AppendRecord::new("hello")
                .unwrap()
                .with_headers([Header::new("k", "v")])
                .unwrap(),
            AppendRecord::new(vec![0u8, 255, 1]).unwrap(),
        ])
        .unwrap(),
    );
    let ack = stream.append(first).await.unwrap();
    assert_eq!(
        (ack.start.seq_num, ack.end.seq_num, ack.tail.seq_num),
        (0, 2, 2)
    );
    for i in 2..10 {
        stream.append(records(&[&format!("r{i}")])).await.unwrap();
    }
    let tail = stream.check_tail().await.unwrap();
    assert_eq!(tail.seq_num, 10);

    let batch = stream.read(read_from(ReadFrom::SeqNum(0))).await.unwrap();
    assert_eq!(batch.records.len(), 10);
    assert_eq!(batch.records[0].body.as_ref(), b"hello");
    assert_eq!(batch.records[0].headers, vec![Header::new("k", "v")]);
    assert_eq!(batch.records[1].body.as_ref(), &[0u8, 255, 1]);
    assert_eq!(batch.tail.map(|t| t.seq_num), Some(10));

    let batch = stream
        .read(read_from(ReadFrom::TailOffset(3)))
        .await
        .unwrap();
    assert_eq!(bodies(&batch), ["r7", "r8", "r9"]);
    let ts = batch.records[0].timestamp;
    let batch = stream
        .read(read_from(ReadFrom::Timestamp(ts)))
        .await
        .unwrap();
    assert!(batch.records[0].timestamp >= ts && batch.records[0].seq_num <= 7);

    let limited = read_from(ReadFrom::SeqNum(2))
        .with_stop(ReadStop::new().with_limits(ReadLimits::new().with_count(3)));
    assert_eq!(
        bodies(&stream.read(limited).await.unwrap()),
        ["r2", "r3", "r4"]
    );
    let by_bytes = read_from(ReadFrom::SeqNum(2))
        .with_stop(ReadStop::new().with_limits(ReadLimits::new().with_bytes(21)));
    assert_eq!(
        stream.read(by_bytes).await.unwrap().records.len(),
        2,
        "each record meters 10 bytes"
    );
    // `until` and timestamp starts with explicit, distinct client timestamps (in the
    // past, so not capped).
    let timed: Vec<AppendRecord> = (0..4u64)
        .map(|i| {
            AppendRecord::new(format!("t{i}"))
                .unwrap()
                .with_timestamp(1_000 + i)
        })
        .collect();
    let (_, timed_stream) = new_stream(&s2, "sdk-records", "timed").await;
    timed_stream
        .append(AppendInput::new(
            AppendRecordBatch::try_from_iter(timed).unwrap(),
        ))
        .await
        .unwrap();
    let until = read_from(ReadFrom::SeqNum(0)).with_stop(ReadStop::new().with_until(..1_002));
    assert_eq!(
        bodies(&timed_stream.read(until).await.unwrap()),
        ["t0", "t1"]
    );
    let by_ts = read_from(ReadFrom::Timestamp(1_001));
    assert_eq!(
        bodies(&timed_stream.read(by_ts).await.unwrap()),
        ["t1", "t2", "t3"]
    );

    // Beyond the tail: ReadUnwritten with the tail, unless clamped (and then it waits).
    let err = stream
        .read(read_from(ReadFrom::SeqNum(10)))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ReadError::ReadUnwritten(t) if t.seq_num == 10),
        "{err:?}"
    );
    let err = stream
        .read(read_from(ReadFrom::SeqNum(50)))
        .await
        .unwrap_err();
    assert!(matches!(err, ReadError::ReadUnwritten(_)), "{err:?}");
    let clamped = ReadInput::new()
        .with_start(
            ReadStart::new()
                .with_from(ReadFrom::SeqNum(50))
                .with_clamp_to_tail(true),
        )
        .with_stop(ReadStop::new().with_wait(1));
    assert!(stream.read(clamped).await.unwrap().records.is_empty());
}

#[tokio::test]
async fn conditions_fencing_and_trimming() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let s2 = sdk_client(&server);
    let (_, stream) = new_stream(&s2, "sdk-conditions", "cas").await;

    stream.append(records(&["a", "b"])).await.unwrap();
    let err = stream
        .append(records(&["c"]).with_match_seq_num(0))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            AppendError::ConditionFailed(AppendConditionFailed::SeqNumMismatch(2))
        ),
        "{err:?}"
    );
    stream
        .append(records(&["c"]).with_match_seq_num(2))
        .await
        .unwrap();

    let token: FencingToken = "writer-1".parse().unwrap();
    let fence =
        AppendRecordBatch::try_from_iter([AppendRecord::from(CommandRecord::fence(token.clone()))])
            .unwrap();
    stream.append(AppendInput::new(fence)).await.unwrap();
    let err = stream
        .append(records(&["d"]).with_fencing_token("writer-2".parse().unwrap()))
        .await
        .unwrap_err();
    match err {
        AppendError::ConditionFailed(AppendConditionFailed::FencingTokenMismatch(current)) => {
            assert_eq!(current.to_string(), "writer-1")
        }
        other => panic!("expected a fencing mismatch, got {other:?}"),
    }
    let ack = stream
        .append(records(&["d"]).with_fencing_token(token))
        .await
        .unwrap();
    assert_eq!(ack.start.seq_num, 4);

    let trim =
        AppendRecordBatch::try_from_iter([AppendRecord::from(CommandRecord::trim(2))]).unwrap();
    stream.append(AppendInput::new(trim)).await.unwrap();
    let batch = stream.read(read_from(ReadFrom::SeqNum(0))).await.unwrap();
    assert_eq!(
        batch.records[0].seq_num, 2,
        "records before the trim point are gone"
    );
    let commands = batch
        .records
        .iter()
        .filter(|r| r.headers.len() == 1 && r.headers[0].name.is_empty())
        .count();
    assert_eq!(
        commands, 2,
        "the fence and trim command records are read back"
    );
}

#[tokio::test]
async fn auto_creation_on_append_and_read() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let s2 = sdk_client(&server);
    let basin_name: BasinName = "sdk-auto-create".parse().unwrap();
    s2.create_basin(
        CreateBasinInput::new(basin_name.clone()).with_config(
            BasinConfig::new()
                .with_create_stream_on_append(true)
                .with_default_stream_config(
                    StreamConfig::new().with_retention_policy(RetentionPolicy::Infinite),
                ),
        ),
    )
    .await
    .unwrap();
    let basin = s2.basin(basin_name);
    let stream = basin.stream("created/by-append".parse().unwrap());
    let ack = stream.append(records(&["first"])).await.unwrap();
    assert_eq!(ack.start.seq_num, 0);
    let config = basin
        .get_stream_config("created/by-append".parse().unwrap())
        .await
        .unwrap();
    assert!(matches!(
        config.retention_policy,
        Some(RetentionPolicy::Infinite)
    ));

    // Reads do not create streams in this basin.
    let err = basin
        .stream("not/created".parse().unwrap())
        .check_tail()
        .await
        .unwrap_err();
    assert!(server_code(&err).contains("stream_not_found"), "{err:?}");
}

#[tokio::test]
async fn access_tokens_issue_list_revoke_and_scope_the_sdk() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let root = sdk_client(&server);
    let (_, _) = new_stream(&root, "rust-tokens", "scoped/a").await;
    let (_, _) = new_stream(&root, "rust-tokens", "outside").await;

    let scope = AccessTokenScopeInput::from_op_group_perms(
        OperationGroupPermissions::new().with_stream(ReadWritePermissions::read_write()),
    )
    .with_basins(BasinMatcher::Exact("rust-tokens".parse().unwrap()))
    .with_streams(StreamMatcher::Prefix("scoped/".parse().unwrap()));
    let secret = root
        .issue_access_token(IssueAccessTokenInput::new(
            "rust/scoped".parse().unwrap(),
            scope,
        ))
        .await
        .unwrap();

    let page = root
        .list_access_tokens(ListAccessTokensInput::new().with_prefix("rust/".parse().unwrap()))
        .await
        .unwrap();
    assert_eq!(page.values.len(), 1);
    let info = &page.values[0];
    assert_eq!(info.id.to_string(), "rust/scoped");
    assert!(info.expires_at.is_none());
    assert!(!info.auto_prefix_streams);

    let scoped = streamgate_compat::sdk_client_with_token(&server, &secret);
    let basin = scoped.basin("rust-tokens".parse().unwrap());
    let ack = basin
        .stream("scoped/a".parse().unwrap())
        .append(records(&["in scope"]))
        .await
        .unwrap();
    assert_eq!(ack.end.seq_num, 1);
    let denied = basin
        .stream("outside".parse().unwrap())
        .append(records(&["no"]))
        .await
        .unwrap_err();
    assert!(
        server_code(&denied).contains("permission_denied"),
        "{denied:?}"
    );

    root.revoke_access_token("rust/scoped".parse().unwrap())
        .await
        .unwrap();
    let revoked = basin
        .stream("scoped/a".parse().unwrap())
        .check_tail()
        .await
        .unwrap_err();
    assert!(server_code(&revoked).contains("authn"), "{revoked:?}");
}
