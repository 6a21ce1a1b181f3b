//! Streaming sessions of the real binary, driven at the wire level: SSE reads with
//! `Last-Event-ID` resumption, S2S and SSE sessions drained by SIGTERM, and pipelined
//! RESP `XADD`s.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use reqwest::Client;
use serde_json::{json, Value};
use streamgate_tests::resp::{self, Reply};
use streamgate_tests::sse::{self, SseSession};
use streamgate_tests::{wire, Server};

const BASIN: &str = "session-test";

async fn setup(endpoint: &str, stream: &str) -> Client {
    streamgate_tests::create_streams(endpoint, BASIN, &[stream]).await;
    streamgate_tests::client()
}

async fn append(client: &Client, endpoint: &str, stream: &str, bodies: &[&str]) {
    let records: Vec<Value> = bodies.iter().map(|b| json!({"body": b})).collect();
    let status = client
        .post(format!("{endpoint}/v1/streams/{stream}/records"))
        .header("s2-basin", BASIN)
        .json(&json!({"records": records}))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 200);
}

#[tokio::test]
async fn sse_reads_batches_ends_with_done_and_resumes_after_last_event_id() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let endpoint = server.endpoint.clone();
    let client = setup(&endpoint, "sse").await;
    append(&client, &endpoint, "sse", &["one", "two", "three"]).await;
    append(&client, &endpoint, "sse", &["four"]).await;

    // A bounded session: all four records, then `[DONE]`.
    let response = sse_get(&client, &endpoint, "sse/records?seq_num=0&count=4")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let text = response.text().await.unwrap();
    let events = sse::events(&text);
    let batches: Vec<_> = events.iter().filter(|(e, _, _)| e == "batch").collect();
    let bodies: Vec<String> = batches
        .iter()
        .flat_map(|(_, _, data)| {
            let batch: Value = serde_json::from_str(data).unwrap();
            batch["records"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["body"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(bodies, ["one", "two", "three", "four"]);
    let (_, last_id, _) = batches.last().unwrap();
    // 4 records of 8 + body bytes: 11 + 11 + 13 + 12 metered bytes.
    assert_eq!(last_id, "3,4,47");
    assert_eq!(events.last().unwrap().2, "[DONE]");

    // Resume after the second record with `count=3`: one record is left to deliver.
    let response = sse_get(&client, &endpoint, "sse/records?seq_num=0&count=3")
        .header("last-event-id", "1:2:22")
        .send()
        .await
        .unwrap();
    let events = sse::events(&response.text().await.unwrap());
    let batch: Value = serde_json::from_str(&events[0].2).unwrap();
    assert_eq!(batch["records"][0]["body"], "three");
    assert_eq!(batch["records"].as_array().unwrap().len(), 1);
    assert_eq!(events[0].1, "2,3,35");
    assert_eq!(events.last().unwrap().2, "[DONE]");

    // A bad Last-Event-ID is a plain 400 before the stream starts.
    let response = sse_get(&client, &endpoint, "sse/records?seq_num=0")
        .header("last-event-id", "nonsense")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
}

#[tokio::test]
async fn a_following_sse_session_pings_when_it_catches_up_and_delivers_live_records() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let endpoint = server.endpoint.clone();
    let client = setup(&endpoint, "live").await;
    let mut events_in = sse_session(&client, &endpoint, "live/records?seq_num=0").await;
    let (event, _, data) = events_in.next_event().await;
    assert_eq!(
        event, "ping",
        "an empty stream: the session starts following at once"
    );
    let ping: Value = serde_json::from_str(&data).unwrap();
    assert!(ping["timestamp"].as_u64().unwrap() > 0);
    assert_eq!(ping["tail"]["seq_num"], 0);
    append(&client, &endpoint, "live", &["fresh"]).await;
    let (event, id, data) = events_in.next_event().await;
    assert_eq!(event, "batch");
    assert_eq!(id, "0,1,13");
    let batch: Value = serde_json::from_str(&data).unwrap();
    assert_eq!(batch["records"][0]["body"], "fresh");
    assert_eq!(batch["tail"]["seq_num"], 1, "live batches carry the tail");
}

/// A GET of `query` under `/v1/streams/` in the test basin, asking for SSE.
fn sse_get(client: &Client, endpoint: &str, query: &str) -> reqwest::RequestBuilder {
    client
        .get(format!("{endpoint}/v1/streams/{query}"))
        .header("s2-basin", BASIN)
        .header("accept", "text/event-stream")
}

/// Opens an SSE session on `query` and returns its events as they come.
async fn sse_session(client: &Client, endpoint: &str, query: &str) -> SseSession {
    SseSession::open(sse_get(client, endpoint, query)).await
}

/// A following session that goes quiet sends a heartbeat 5-15 s after its last event,
/// and again after each heartbeat; one with `wait` ends once idle that long, heartbeat
/// or not.
#[tokio::test]
async fn quiet_sessions_send_heartbeats_and_end_after_their_wait() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let endpoint = server.endpoint.clone();
    let client = setup(&endpoint, "quiet").await;
    append(&client, &endpoint, "quiet", &["first"]).await;

    let mut following = sse_session(&client, &endpoint, "quiet/records?seq_num=0").await;
    let mut bounded = sse_session(&client, &endpoint, "quiet/records?seq_num=0&wait=2").await;
    for (name, session) in [("following", &mut following), ("bounded", &mut bounded)] {
        let (event, id, _) = session.next_event().await;
        assert_eq!((event.as_str(), id.as_str()), ("batch", "0,1,13"), "{name}");
    }

    // The session with `wait=2` announces the tail, then ends 2 s after its last
    // record: before any heartbeat is due.
    let caught_up = std::time::Instant::now();
    let (event, _, _) = bounded.next_event().await;
    assert_eq!(event, "ping", "the bounded session announces the tail");
    let (event, _, data) = bounded.next_event().await;
    assert_eq!((event.as_str(), data.as_str()), ("", "[DONE]"));
    let idle = caught_up.elapsed();
    assert!(idle >= Duration::from_millis(1900), "ended after {idle:?}");

    // The following session's heartbeats: the announcement at once, then one every
    // 5-15 s while nothing is appended. The announcement came while the bounded
    // session was read, so the gap is timed from the first heartbeat to the second,
    // both read as they come (with half a second's slack for how late each was read).
    let (event, _, _) = following.next_event().await;
    assert_eq!(event, "ping", "the following session announces the tail");
    let mut quiet = None;
    for _ in 0..2 {
        let (event, _, data) = following.next_event().await;
        assert_eq!(event, "ping", "a heartbeat");
        let ping: Value = serde_json::from_str(&data).unwrap();
        assert_eq!(ping["tail"]["seq_num"], 1);
        if let Some(quiet) = quiet.replace(std::time::Instant::now()) {
            let gap = quiet.elapsed();
            assert!(
                gap >= Duration::from_millis(4500),
                "a heartbeat after {gap:?} of quiet"
            );
        }
    }

    // A record delivered, then quiet again: the next heartbeat counts from it.
    append(&client, &endpoint, "quiet", &["second"]).await;
    let (event, _, _) = following.next_event().await;
    assert_eq!(event, "batch");
    let delivered = std::time::Instant::now();
    let (event, _, _) = following.next_event().await;
    assert_eq!(event, "ping");
    let gap = delivered.elapsed();
    assert!(
        gap >= Duration::from_millis(4500),
        "a heartbeat after {gap:?}"
    );
}

/// The reconnect-advised flag of S2S frames.
const RECONNECT_ADVISED: u8 = 0x10;

/// Everything a streaming response sends until it ends (or its connection does).
async fn read_to_end(response: reqwest::Response) -> Vec<u8> {
    let mut body = response.bytes_stream();
    let mut all = Vec::new();
    // The bound only keeps a broken build from hanging.
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(30), body.next())
        .await
        .expect("the session ends")
    {
        match chunk {
            Ok(chunk) => all.extend_from_slice(&chunk),
            Err(_) => break, // the process exited; what arrived is checked
        }
    }
    all
}

#[tokio::test]
async fn sigterm_acknowledges_accepted_inputs_then_ends_append_sessions_with_server_draining() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path());
    let endpoint = server.endpoint.clone();
    setup(&endpoint, "drained").await;
    let h2 = streamgate_tests::client_builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();

    // Read sessions following the stream, over S2S and SSE: a drain ends them.
    let read_session = |accept: &'static str| {
        h2.get(format!("{endpoint}/v1/streams/drained/records?seq_num=0"))
            .header("s2-basin", BASIN)
            .header("accept", accept)
            .send()
    };
    let s2s_read = read_session("s2s/proto").await.unwrap();
    let sse_read = read_session("text/event-stream").await.unwrap();
    assert_eq!(s2s_read.status(), 200);
    assert_eq!(sse_read.status(), 200);
    let s2s_read = tokio::spawn(read_to_end(s2s_read));
    let sse_read = tokio::spawn(read_to_end(sse_read));

    // An S2S append session over HTTP/2 that keeps sending one-record inputs.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(16);
    let sent = Arc::new(Mutex::new(0u64));
    let sender = {
        let sent = sent.clone();
        tokio::spawn(async move {
            for i in 0u64.. {
                let body = format!("input-{i}");
                let frame = wire::s2s_frame(&wire::encode_append_input(&[body.as_bytes()]));
                if tx.send(Ok(frame)).await.is_err() {
                    return;
                }
                *sent.lock().unwrap() = i + 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let response = h2
        .post(format!("{endpoint}/v1/streams/drained/records"))
        .header("s2-basin", BASIN)
        .header("content-type", "s2s/proto")
        .body(reqwest::Body::wrap_stream(tokio_stream(rx)))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut frames = response.bytes_stream();
    let mut buffer = Vec::new();
    let mut acked_end = 0u64;
    let mut terminal = None;
    let mut terminated = false;
    // The flags of each ack, and whether it was read before SIGTERM was sent.
    let mut ack_flags: Vec<(bool, u8)> = Vec::new();
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(30), frames.next())
        .await
        .unwrap()
    {
        buffer.extend_from_slice(&chunk.unwrap());
        while let Some((flags, body)) = wire::take_s2s_frame(&mut buffer) {
            if flags & 0x80 != 0 {
                terminal = Some((
                    flags,
                    u16::from_be_bytes([body[0], body[1]]),
                    body[2..].to_vec(),
                ));
                continue;
            }
            assert!(terminal.is_none(), "nothing follows the terminal frame");
            let (start, end) = wire::decode_ack_range(&body);
            assert_eq!(start, acked_end, "acks are in order and dense");
            acked_end = end;
            ack_flags.push((!terminated, flags));
        }
        if acked_end >= 50 && !terminated {
            terminated = true;
            let pid = server.pid().unwrap();
            std::process::Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status()
                .unwrap();
        }
    }
    sender.abort();
    let (flags, status, body) = terminal.expect("the session ended with a terminal frame");
    assert_eq!(status, 503);
    let error: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(error["code"], "server_draining");
    assert!(*sent.lock().unwrap() >= acked_end);
    // The reconnect-advised flag: never before the drain, on everything from the first
    // message sent while draining on, and on the terminal frame.
    let advised = |flags: u8| flags & RECONNECT_ADVISED != 0;
    assert!(
        ack_flags
            .iter()
            .all(|&(before, flags)| !before || !advised(flags)),
        "no ack before SIGTERM advises reconnecting: {ack_flags:?}"
    );
    let first_advised = ack_flags
        .iter()
        .position(|&(_, flags)| advised(flags))
        .unwrap_or(ack_flags.len());
    assert!(
        ack_flags[first_advised..]
            .iter()
            .all(|&(_, flags)| advised(flags)),
        "once draining, every ack advises reconnecting: {ack_flags:?}"
    );
    assert!(advised(flags), "the terminal frame advises reconnecting");
    eprintln!(
        "{} acks advised reconnecting, of {} after SIGTERM",
        ack_flags.len() - first_advised,
        ack_flags.iter().filter(|(before, _)| !before).count()
    );

    // Both read sessions were ended by the drain with `server_draining`.
    // Before that, it delivered acknowledged inputs in order, from the first.
    let mut s2s_frames = s2s_read.await.unwrap();
    let mut last = None;
    let mut delivered: Vec<String> = Vec::new();
    while let Some(frame) = wire::take_s2s_frame(&mut s2s_frames) {
        if frame.0 == 0 {
            delivered.extend(
                wire::read_batch_bodies(&frame.1)
                    .into_iter()
                    .map(|body| String::from_utf8_lossy(body).into_owned()),
            );
        }
        last = Some(frame);
    }
    assert!(
        !delivered.is_empty(),
        "the S2S read session followed the appends"
    );
    assert!(delivered.len() as u64 <= acked_end);
    for (i, body) in delivered.iter().enumerate() {
        assert_eq!(body, &format!("input-{i}"), "delivered in order");
    }
    let (flags, body) = last.expect("the S2S read session sent frames");
    assert_ne!(
        flags & 0x80,
        0,
        "the S2S read session ends with a terminal frame"
    );
    assert_eq!(u16::from_be_bytes([body[0], body[1]]), 503);
    let error: Value = serde_json::from_slice(&body[2..]).unwrap();
    assert_eq!(error["code"], "server_draining", "{error}");
    let sse = String::from_utf8(sse_read.await.unwrap()).unwrap();
    let (event, _, data) = sse::events(&sse)
        .pop()
        .expect("the SSE session sent events");
    assert_eq!(
        event, "error",
        "the SSE session ends with an error event: {sse}"
    );
    let error: Value = serde_json::from_str(&data).unwrap();
    assert_eq!(error["code"], "server_draining", "{error}");

    // After a restart the stream holds exactly the acknowledged inputs, in order.
    server.restart();
    let bodies: Vec<String> = streamgate_tests::read_stream(&endpoint, BASIN, "drained")
        .await
        .iter()
        .map(|r| r["body"].as_str().unwrap().to_owned())
        .collect();
    let expected: Vec<String> = (0..acked_end).map(|i| format!("input-{i}")).collect();
    assert_eq!(
        bodies, expected,
        "every acknowledged input, in order, and nothing else"
    );
}

#[tokio::test]
async fn an_s2s_append_session_works_over_http1_with_one_batch_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let endpoint = server.endpoint.clone();
    setup(&endpoint, "h1").await;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
    let h1 = streamgate_tests::client_builder()
        .http1_only()
        .build()
        .unwrap();
    let request = h1
        .post(format!("{endpoint}/v1/streams/h1/records"))
        .header("s2-basin", BASIN)
        .header("content-type", "s2s/proto")
        .body(reqwest::Body::wrap_stream(tokio_stream(rx)));
    // The first input goes out with the request, as a browser's would.
    let first = wire::s2s_frame(&wire::encode_append_input(&[b"h1-0"]));
    tx.send(Ok(first)).await.unwrap();
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.version(), reqwest::Version::HTTP_11);
    let mut frames = response.bytes_stream();
    let mut buffer = Vec::new();
    for i in 0..5u64 {
        // Wait for the ack of input i before sending input i + 1.
        let (flags, ack) = loop {
            if let Some(frame) = wire::take_s2s_frame(&mut buffer) {
                break frame;
            }
            let chunk = tokio::time::timeout(Duration::from_secs(10), frames.next())
                .await
                .unwrap()
                .unwrap();
            buffer.extend_from_slice(&chunk.unwrap());
        };
        assert_eq!(flags & 0x80, 0, "an ack, not a terminal frame");
        assert_eq!(wire::decode_ack_range(&ack), (i, i + 1));
        if i < 4 {
            let body = format!("h1-{}", i + 1);
            tx.send(Ok(wire::s2s_frame(&wire::encode_append_input(&[
                body.as_bytes()
            ]))))
            .await
            .unwrap();
        }
    }
    drop(tx);
    // The client ended its side: the server ends the response without a terminal frame.
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(10), frames.next())
        .await
        .unwrap()
    {
        buffer.extend_from_slice(&chunk.unwrap());
    }
    assert!(buffer.is_empty(), "nothing after the last ack");
}

fn tokio_stream<T: Send + 'static>(
    rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
}

#[tokio::test]
async fn sessions_on_a_missing_stream_fail_before_they_start() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let endpoint = server.endpoint.clone();
    setup(&endpoint, "exists").await;
    let h2 = streamgate_tests::client_builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    for (method, accept) in [
        (reqwest::Method::POST, None),
        (reqwest::Method::GET, None),
        (reqwest::Method::GET, Some("text/event-stream")),
    ] {
        let mut request = h2
            .request(
                method.clone(),
                format!("{endpoint}/v1/streams/missing/records"),
            )
            .header("s2-basin", BASIN);
        request = match accept {
            Some(accept) => request.header("accept", accept),
            None => request.header("content-type", "S2S/Proto"),
        };
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 404, "{method} {accept:?}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["code"], "stream_not_found");
    }
}

/// Sends one `XADD key * field <body>` per body in one write (a few KiB, which the
/// server reads at once), and returns the IDs of the replies as (milliseconds, sequence).
async fn xadd_pipelined(
    connection: &mut resp::Connection,
    key: &str,
    bodies: Vec<String>,
) -> Vec<(u64, u64)> {
    let pipeline: Vec<Vec<String>> = bodies
        .iter()
        .map(|body| ["XADD", key, "*", "field", body].map(String::from).to_vec())
        .collect();
    connection.send_pipelined(&pipeline).await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..pipeline.len() {
        let id = match connection.reply().await.unwrap() {
            Reply::Bulk(Some(id)) => String::from_utf8(id).unwrap(),
            other => panic!("XADD answered {other:?}"),
        };
        let (timestamp, seq) = id.split_once('-').unwrap();
        ids.push((timestamp.parse().unwrap(), seq.parse().unwrap()));
    }
    ids
}

/// The log's chunk writes so far (`streamgate_wal_flushes_total`; shown from the first).
async fn wal_writes(server: &Server) -> u64 {
    let metrics = server.scrape_metrics().await;
    metrics
        .lines()
        .find_map(|line| line.strip_prefix("streamgate_wal_flushes_total "))
        .map_or(0, |value| value.trim().parse::<f64>().unwrap() as u64)
}

/// Each pipeline a long-lived connection sends in one write is one append. Parsed
/// commands keep the front of the connection's input buffer alive; a read that got only
/// the room left behind them split a pipeline into two appends.
#[tokio::test]
async fn every_pipeline_of_a_long_lived_connection_is_one_append() {
    const ROUNDS: usize = 40;
    const PIPELINE: usize = 100;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(dir.path(), &["--metrics-listen", "127.0.0.1:0"]);
    setup(&server.endpoint, "long-lived").await;
    let mut connection = resp::Connection::open(server.resp_port, Some(BASIN))
        .await
        .expect("AUTH succeeds");
    let before = wal_writes(&server).await;
    for round in 0..ROUNDS {
        // About 7 KiB, sent in one write once the previous pipeline is answered (so
        // durable): the log is idle when it comes, and one append is one chunk.
        let bodies = (0..PIPELINE).map(|i| format!("round-{round}-entry-{i}"));
        xadd_pipelined(&mut connection, "long-lived", bodies.collect()).await;
    }
    let writes = wal_writes(&server).await - before;
    assert_eq!(
        writes, ROUNDS as u64,
        "{ROUNDS} pipelines, each answered before the next was sent, took {writes} chunk writes"
    );
}

/// Pipelined `XADD`s to one stream that arrive together are gathered into one append:
/// their IDs are consecutive and share one timestamp, while another connection
/// pipelines to the same stream at the same moment. (As separate appends, the two
/// pipelines' entries would interleave, and cross millisecond boundaries.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_xadds_that_arrive_together_are_one_append() {
    const PIPELINE: usize = 100;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    setup(&server.endpoint, "piped").await;
    for round in 0..10 {
        let together = Arc::new(tokio::sync::Barrier::new(2));
        let pipelines: Vec<_> = (0..2)
            .map(|connection| {
                let (together, port) = (together.clone(), server.resp_port);
                let bodies = (0..PIPELINE).map(|i| format!("{round}-{connection}-{i}"));
                let bodies: Vec<String> = bodies.collect();
                tokio::spawn(async move {
                    let mut connection = resp::Connection::open(port, Some(BASIN))
                        .await
                        .expect("AUTH succeeds");
                    together.wait().await;
                    xadd_pipelined(&mut connection, "piped", bodies).await
                })
            })
            .collect();
        for pipeline in pipelines {
            let ids = pipeline.await.unwrap();
            let (timestamp, first) = ids[0];
            let expected: Vec<(u64, u64)> = (first..first + PIPELINE as u64)
                .map(|seq| (timestamp, seq))
                .collect();
            assert_eq!(
                ids, expected,
                "round {round}: one append's consecutive IDs, one timestamp"
            );
        }
    }
}

/// Sessions following one stream over one HTTP/2 connection wait at its tail together
/// (woken connection by connection): each gets every record, and each ends with an
/// error once the stream is deleted, at once (not at its next heartbeat, 5 s or more
/// after its last record, when a session not woken would look again).
#[tokio::test]
async fn followers_sharing_a_connection_each_get_every_record_and_end_with_their_stream() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let endpoint = server.endpoint.clone();
    let client = setup(&endpoint, "shared").await;
    let one_connection = streamgate_tests::client_builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let mut followers = Vec::new();
    for _ in 0..3 {
        let mut session = sse_session(&one_connection, &endpoint, "shared/records?seq_num=0").await;
        let (event, _, _) = session.next_event().await;
        assert_eq!(event, "ping", "following from the start");
        followers.push(session);
    }
    for (seq_num, body) in ["one", "two"].into_iter().enumerate() {
        append(&client, &endpoint, "shared", &[body]).await;
        for session in &mut followers {
            let (event, id, data) = promptly(session.next_event()).await;
            assert_eq!(event, "batch");
            assert!(id.starts_with(&format!("{seq_num},")), "{id}");
            let batch: Value = serde_json::from_str(&data).unwrap();
            assert_eq!(batch["records"][0]["body"], body);
        }
    }
    let deleted = client
        .delete(format!("{endpoint}/v1/streams/shared"))
        .header("s2-basin", BASIN)
        .send()
        .await
        .unwrap();
    assert!(deleted.status().is_success(), "{}", deleted.status());
    for session in &mut followers {
        let (event, _, data) = promptly(session.next_event()).await;
        assert_eq!(event, "error", "{data}");
        let error: Value = serde_json::from_str(&data).unwrap();
        assert_eq!(error["code"], "stream_deletion_pending", "{error}");
    }
}

/// What `event` gives, which must come within 3 s.
async fn promptly<T>(event: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(3), event)
        .await
        .expect("within 3 s")
}
