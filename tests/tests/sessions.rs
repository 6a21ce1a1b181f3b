//! Streaming sessions of the real binary, driven at the wire level: SSE reads with
//! `Last-Event-ID` resumption, and an S2S append session drained by SIGTERM.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use reqwest::Client;
use serde_json::{json, Value};
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

/// Parses SSE text into (event, id, data) triples.
fn events(text: &str) -> Vec<(String, String, String)> {
    text.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let field = |name: &str| {
                block
                    .lines()
                    .find_map(|l| l.strip_prefix(&format!("{name}: ")))
                    .unwrap_or("")
                    .to_owned()
            };
            (field("event"), field("id"), field("data"))
        })
        .collect()
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
    let response = client
        .get(format!(
            "{endpoint}/v1/streams/sse/records?seq_num=0&count=4"
        ))
        .header("s2-basin", BASIN)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let text = response.text().await.unwrap();
    let events = events(&text);
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
    let response = client
        .get(format!(
            "{endpoint}/v1/streams/sse/records?seq_num=0&count=3"
        ))
        .header("s2-basin", BASIN)
        .header("accept", "text/event-stream")
        .header("last-event-id", "1:2:22")
        .send()
        .await
        .unwrap();
    let events = crate::events(&response.text().await.unwrap());
    let batch: Value = serde_json::from_str(&events[0].2).unwrap();
    assert_eq!(batch["records"][0]["body"], "three");
    assert_eq!(batch["records"].as_array().unwrap().len(), 1);
    assert_eq!(events[0].1, "2,3,35");
    assert_eq!(events.last().unwrap().2, "[DONE]");

    // A bad Last-Event-ID is a plain 400 before the stream starts.
    let response = client
        .get(format!("{endpoint}/v1/streams/sse/records?seq_num=0"))
        .header("s2-basin", BASIN)
        .header("accept", "text/event-stream")
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
    let response = client
        .get(format!("{endpoint}/v1/streams/live/records?seq_num=0"))
        .header("s2-basin", BASIN)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut events_in = SseReader {
        body: Box::pin(response.bytes_stream()),
        text: String::new(),
    };
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

#[tokio::test]
async fn sigterm_acknowledges_accepted_inputs_then_ends_append_sessions_with_server_draining() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path());
    let endpoint = server.endpoint.clone();
    setup(&endpoint, "drained").await;

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
    let h2 = streamgate_tests::client_builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
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
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(30), frames.next())
        .await
        .unwrap()
    {
        buffer.extend_from_slice(&chunk.unwrap());
        while let Some((flags, body)) = wire::take_s2s_frame(&mut buffer) {
            if flags & 0x80 != 0 {
                terminal = Some((u16::from_be_bytes([body[0], body[1]]), body[2..].to_vec()));
                continue;
            }
            assert!(terminal.is_none(), "nothing follows the terminal frame");
            let (start, end) = wire::decode_ack_range(&body);
            assert_eq!(start, acked_end, "acks are in order and dense");
            acked_end = end;
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
    let (status, body) = terminal.expect("the session ended with a terminal frame");
    assert_eq!(status, 503);
    let error: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(error["code"], "server_draining");
    assert!(*sent.lock().unwrap() >= acked_end);

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

/// Reads SSE events one at a time from a streaming response.
struct SseReader {
    body: std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    text: String,
}

impl SseReader {
    async fn next_event(&mut self) -> (String, String, String) {
        loop {
            if let Some(end) = self.text.find("\n\n") {
                let event: String = self.text.drain(..end + 2).collect();
                return events(&event).remove(0);
            }
            let chunk = tokio::time::timeout(Duration::from_secs(20), self.body.next())
                .await
                .expect("an event within 20 s")
                .unwrap()
                .unwrap();
            self.text.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }
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
