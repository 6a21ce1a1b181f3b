//! The official Rust SDK's streaming APIs against the real binary: pipelined append
//! sessions, the producer, read sessions that follow the tail or stop at it, poisoning
//! on a failed condition, and a read session surviving a server restart.

use std::time::Duration;

use futures::StreamExt;
use s2_sdk::append_session::AppendSessionConfig;
use s2_sdk::producer::ProducerConfig;
use s2_sdk::types::*;
use s2_sdk::{S2Stream, S2};
use streamgate_compat::{sdk_client, Server};

async fn stream(s2: &S2, name: &str) -> S2Stream {
    let basin_name: BasinName = "sdk-sessions".parse().unwrap();
    let _ = s2
        .create_basin(CreateBasinInput::new(basin_name.clone()))
        .await;
    let basin = s2.basin(basin_name);
    basin
        .create_stream(CreateStreamInput::new(name.parse().unwrap()))
        .await
        .unwrap();
    basin.stream(name.parse().unwrap())
}

fn batch(bodies: impl IntoIterator<Item = String>) -> AppendInput {
    let records: Vec<AppendRecord> = bodies
        .into_iter()
        .map(|b| AppendRecord::new(b).unwrap())
        .collect();
    AppendInput::new(AppendRecordBatch::try_from_iter(records).unwrap())
}

async fn read_bodies(stream: &S2Stream, from: u64, count: usize) -> Vec<String> {
    let input = ReadInput::new()
        .with_start(ReadStart::new().with_from(ReadFrom::SeqNum(from)))
        .with_stop(ReadStop::new().with_limits(ReadLimits::new().with_count(count)));
    let mut session = stream
        .read_session(input, ReadSessionConfig::new())
        .await
        .unwrap();
    let mut bodies = Vec::new();
    while let Some(batch) = session.next().await {
        for record in batch.unwrap().records {
            bodies.push(String::from_utf8(record.body.to_vec()).unwrap());
        }
    }
    bodies
}

#[tokio::test]
async fn pipelined_append_session_acks_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let s2 = sdk_client(&server);
    let stream = stream(&s2, "pipelined").await;

    let session = stream.append_session(AppendSessionConfig::new());
    let mut tickets = Vec::new();
    for i in 0..200 {
        tickets.push(
            session
                .submit(batch((0..5).map(|j| format!("{i}-{j}"))))
                .await
                .unwrap(),
        );
    }
    let mut expected_start = 0;
    for ticket in tickets {
        let ack = ticket.await.unwrap();
        assert_eq!(ack.start.seq_num, expected_start);
        assert_eq!(ack.end.seq_num, expected_start + 5);
        assert!(ack.tail.seq_num >= ack.end.seq_num);
        expected_start += 5;
    }
    session.close().await.unwrap();
    assert_eq!(stream.check_tail().await.unwrap().seq_num, 1000);
    let bodies = read_bodies(&stream, 0, 1000).await;
    assert_eq!(
        bodies.len(),
        1000,
        "a bounded read session stops once its count is reached"
    );
    assert_eq!(bodies[0], "0-0");
    assert_eq!(bodies[999], "199-4");
}

#[tokio::test]
async fn producer_and_a_bounded_session_stopping_at_the_tail() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let s2 = sdk_client(&server);
    let stream = stream(&s2, "produced").await;

    let producer = stream.producer(ProducerConfig::new());
    let mut tickets = Vec::new();
    for i in 0..500 {
        tickets.push(
            producer
                .submit(AppendRecord::new(format!("record-{i}")).unwrap())
                .await
                .unwrap(),
        );
    }
    for (i, ticket) in tickets.into_iter().enumerate() {
        assert_eq!(ticket.await.unwrap().seq_num, i as u64);
    }
    producer.close().await.unwrap();

    // count is larger than what exists and no wait: the session ends at the tail.
    let bodies = tokio::time::timeout(Duration::from_secs(10), read_bodies(&stream, 100, 10_000))
        .await
        .expect("a bounded session without wait ends at the tail");
    assert_eq!(bodies.len(), 400);
    assert_eq!(bodies[0], "record-100");
}

async fn next_body(session: &mut s2_sdk::read_session::ReadSession) -> Vec<String> {
    let batch = tokio::time::timeout(Duration::from_secs(20), session.next())
        .await
        .expect("a batch arrives")
        .expect("the session is open")
        .expect("no session error");
    batch
        .records
        .iter()
        .map(|r| String::from_utf8(r.body.to_vec()).unwrap())
        .collect()
}

#[tokio::test]
async fn a_following_read_session_sees_new_records_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path());
    let s2 = sdk_client(&server);
    let stream = stream(&s2, "followed").await;
    stream.append(batch(["before".to_string()])).await.unwrap();

    let input = ReadInput::new().with_start(ReadStart::new().with_from(ReadFrom::SeqNum(0)));
    let mut session = stream
        .read_session(input, ReadSessionConfig::new())
        .await
        .unwrap();
    assert_eq!(next_body(&mut session).await, ["before"]);

    stream.append(batch(["live".to_string()])).await.unwrap();
    assert_eq!(next_body(&mut session).await, ["live"]);

    // The server dies and comes back on the same port; the session reconnects and resumes
    // after the last record it delivered.
    server.restart();
    let s2_after = sdk_client(&server);
    let stream_after = s2_after
        .basin("sdk-sessions".parse().unwrap())
        .stream("followed".parse().unwrap());
    stream_after
        .append(batch(["after-restart".to_string()]))
        .await
        .unwrap();
    assert_eq!(next_body(&mut session).await, ["after-restart"]);
}

#[tokio::test]
async fn a_failed_condition_poisons_the_append_session() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let s2 = sdk_client(&server);
    let stream = stream(&s2, "poisoned").await;

    let session = stream.append_session(AppendSessionConfig::new());
    let first = session
        .submit(batch(["a".to_string()]).with_match_seq_num(0))
        .await
        .unwrap();
    let wrong = session
        .submit(batch(["b".to_string()]).with_match_seq_num(5))
        .await
        .unwrap();
    let after = session.submit(batch(["c".to_string()])).await;
    assert_eq!(
        first.await.unwrap().end.seq_num,
        1,
        "inputs before the failure are acknowledged"
    );
    let err = wrong.await.unwrap_err();
    assert!(format!("{err:?}").contains("SeqNumMismatch"), "{err:?}");
    if let Ok(ticket) = after {
        assert!(
            ticket.await.is_err(),
            "nothing after the failed input is appended"
        );
    }
    assert_eq!(stream.check_tail().await.unwrap().seq_num, 1);
}
