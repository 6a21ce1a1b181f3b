//! Hostile and broken clients against the real binary: inputs built to exhaust the stack
//! or memory, slow and silent connections, connection floods, floods of bad tokens, and
//! a request that makes the server panic. Each gets a clear error (or is cut off), and
//! the server goes on serving everyone else: every test ends by checking that normal
//! requests on every front end still work.

use std::io::Write;
use std::time::Duration;

use serde_json::{json, Value};
use streamgate_tests::resp::command;
use streamgate_tests::{wire, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BASIN: &str = "hostile-clients";

/// How long a test waits for the server to act on a slow client before failing (a
/// liveness bound, far above the server's own timeouts).
const LIVENESS: Duration = Duration::from_secs(90);

async fn start(extra: &[&str]) -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(dir.path(), extra);
    streamgate_tests::create_streams(&server.endpoint, BASIN, &["s"]).await;
    (dir, server)
}

fn address(endpoint: &str) -> String {
    endpoint.trim_start_matches("http://").to_owned()
}

/// Normal work on every front end: a REST append and read, an authenticated RESP
/// `XADD`, and an OTLP export.
async fn still_serving(server: &Server) {
    let client = streamgate_tests::client();
    let endpoint = &server.endpoint;
    let appended = client
        .post(format!("{endpoint}/v1/streams/s/records"))
        .header("s2-basin", BASIN)
        .json(&json!({"records": [{"body": "still-here"}]}))
        .send()
        .await
        .expect("the HTTP front end answers");
    assert_eq!(appended.status(), 200, "{}", appended.text().await.unwrap());
    let records = streamgate_tests::read_stream(endpoint, BASIN, "s").await;
    assert!(records.iter().any(|r| r["body"] == "still-here"));

    let mut resp = resp_authenticating(server).await;
    resp.write_all(&command(&["XADD", "s", "*", "f", "v"]))
        .await
        .unwrap();
    let reply = read_until(&mut resp, |text| text.matches("\r\n").count() >= 3).await;
    assert!(
        reply.starts_with("+OK\r\n$"),
        "AUTH and XADD succeed: {reply:?}"
    );

    let export = json!({"resourceLogs": [{
        "resource": {"attributes": [{"key": "s2.stream", "value": {"stringValue": "s"}}]},
        "scopeLogs": [{"logRecords": [{"body": {"stringValue": "otlp-still-here"}}]}]
    }]});
    let exported = client
        .post(format!("{endpoint}/otlp/v1/logs"))
        .header("s2-basin", BASIN)
        .json(&export)
        .send()
        .await
        .unwrap();
    assert_eq!(exported.status(), 200, "{}", exported.text().await.unwrap());
}

/// A RESP connection that has sent `AUTH` with the root token (its `+OK` unread).
async fn resp_authenticating(server: &Server) -> TcpStream {
    let mut resp = TcpStream::connect(("127.0.0.1", server.resp_port))
        .await
        .expect("the RESP front end accepts connections");
    let auth = command(&["AUTH", BASIN, streamgate_tests::ROOT_TOKEN]);
    resp.write_all(&auth).await.unwrap();
    resp
}

/// Reads from `socket` until `done` holds for what arrived or the peer closes; what
/// arrived.
async fn read_until(socket: &mut TcpStream, done: impl Fn(&str) -> bool) -> String {
    let mut text = Vec::new();
    let mut chunk = [0u8; 8192];
    let read = async {
        loop {
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => text.extend_from_slice(&chunk[..n]),
            }
            if done(&String::from_utf8_lossy(&text)) {
                return;
            }
        }
    };
    tokio::time::timeout(LIVENESS, read)
        .await
        .expect("the server answered or closed the connection");
    String::from_utf8_lossy(&text).into_owned()
}

/// Sends `request` on a fresh connection and returns everything the server sent until
/// it closed the connection.
async fn exchange(address: &str, request: &[u8]) -> String {
    let mut socket = TcpStream::connect(address).await.unwrap();
    // The server may close while a large request is still being sent.
    let _ = socket.write_all(request).await;
    read_until(&mut socket, |_| false).await
}

#[tokio::test]
async fn resp_requests_that_nest_overflow_or_ramble_are_refused_before_authentication() {
    let (_dir, server) = start(&[]).await;
    let resp = format!("127.0.0.1:{}", server.resp_port);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        // The request that used to overflow a worker thread's stack.
        (
            b"*1\r\n".repeat(10_000),
            "-ERR Protocol error: expected '$', got '*'\r\n",
        ),
        (
            b"*1\r\n:5\r\n".to_vec(),
            "-ERR Protocol error: expected '$', got ':'\r\n",
        ),
        (
            b"*99999999999\r\n".to_vec(),
            "-ERR Protocol error: invalid multibulk length\r\n",
        ),
        (
            b"*1\r\n$999999999999\r\n".to_vec(),
            "-ERR Protocol error: invalid bulk length\r\n",
        ),
        (
            b"*1\r\n$-5\r\n".to_vec(),
            "-ERR Protocol error: invalid bulk length\r\n",
        ),
        (
            vec![b'x'; 100 * 1024],
            "-ERR Protocol error: too big inline request\r\n",
        ),
    ];
    for (request, expected) in &cases {
        let answer = exchange(&resp, request).await;
        assert_eq!(
            answer,
            *expected,
            "for a request starting {:?}",
            String::from_utf8_lossy(&request[..12])
        );
    }
    // A million blank lines, then a command: handled without recursion.
    let mut blank = vec![b'\n'; 1_000_000];
    blank.extend_from_slice(b"QUIT\r\n");
    assert_eq!(exchange(&resp, &blank).await, "+OK\r\n");
    // A request larger than the limit, sent whole.
    let mut whole = b"*3\r\n$4\r\nECHO\r\n$1900000\r\n".to_vec();
    for _ in 0..2 {
        whole.extend(std::iter::repeat_n(b'a', 1_900_000));
        whole.extend_from_slice(b"\r\n$1900000\r\n");
    }
    assert!(
        exchange(&resp, &whole)
            .await
            .starts_with("-ERR Protocol error: a request may be at most"),
        "a request over 2 MiB is refused"
    );
    // A single argument larger than the limit is refused at its length.
    let mut huge = b"*2\r\n$4\r\nECHO\r\n$3000000\r\n".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 3_000_000));
    assert_eq!(
        exchange(&resp, &huge).await,
        "-ERR Protocol error: invalid bulk length\r\n"
    );
    still_serving(&server).await;
}

/// A JSON document nested `depth` levels deep.
fn nested_json(depth: usize) -> String {
    format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
}

/// Protobuf bytes of `depth` nested start-group markers (field 15), each of which a
/// decoder that skips unknown fields must descend into.
fn nested_protobuf_groups(depth: usize) -> Vec<u8> {
    std::iter::repeat_n((15u8 << 3) | 3, depth).collect()
}

/// A length-delimited protobuf field `number` wrapping `payload`.
fn protobuf_field(number: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![(number << 3) | 2];
    let mut len = payload.len();
    while len >= 0x80 {
        out.push((len as u8) | 0x80);
        len >>= 7;
    }
    out.push(len as u8);
    out.extend_from_slice(payload);
    out
}

#[tokio::test]
async fn deep_nesting_and_oversized_values_in_http_requests_get_clear_errors() {
    let (_dir, server) = start(&[]).await;
    let endpoint = &server.endpoint;
    let client = streamgate_tests::client();
    let error_of = |response: reqwest::Response| async move {
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or_default();
        (status, body["code"].as_str().unwrap_or("").to_owned(), body)
    };

    // JSON nested far deeper than any real request, in an append and a control-plane call.
    let deep = nested_json(100_000);
    for url in [
        format!("{endpoint}/v1/streams/s/records"),
        format!("{endpoint}/v1/streams"),
    ] {
        let response = client
            .post(&url)
            .header("s2-basin", BASIN)
            .header("content-type", "application/json")
            .body(format!(
                r#"{{"records": [{{"body": {deep}}}], "stream": {deep}}}"#
            ))
            .send()
            .await
            .unwrap();
        let (status, code, body) = error_of(response).await;
        assert_eq!((status, code.as_str()), (400, "bad_json"), "{url}: {body}");
    }

    // More records, or headers, than a batch can hold: counted before they are decoded.
    let many_records = format!(r#"{{"records":[{}]}}"#, vec!["{}"; 1001].join(","));
    let many_headers = format!(
        r#"{{"records":[{{"headers":[{}]}}]}}"#,
        vec![r#"["",""]"#; 600_000].join(",")
    );
    for body in [many_records, many_headers] {
        let response = client
            .post(format!("{endpoint}/v1/streams/s/records"))
            .header("s2-basin", BASIN)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let (status, code, body) = error_of(response).await;
        assert_eq!((status, code.as_str()), (422, "invalid"), "{body}");
    }

    // Protobuf: nested groups in an append, and a deep OTLP AnyValue (kvlist in kvlist).
    let response = client
        .post(format!("{endpoint}/v1/streams/s/records"))
        .header("s2-basin", BASIN)
        .header("content-type", "application/protobuf")
        // Inside a header, where the wire pre-scan does not look: the decoder's own
        // depth limit refuses it.
        .body(protobuf_field(
            1,
            &protobuf_field(2, &nested_protobuf_groups(100_000)),
        ))
        .send()
        .await
        .unwrap();
    let (status, code, body) = error_of(response).await;
    assert_eq!((status, code.as_str()), (400, "bad_proto"), "{body}");
    let mut value = protobuf_field(1, b"leaf"); // AnyValue { string_value }
    for _ in 0..2_000 {
        // AnyValue { kvlist_value (6): KeyValueList { values (1): KeyValue { key (1), value (2) } } }
        let key_value = [protobuf_field(1, b"k"), protobuf_field(2, &value)].concat();
        value = protobuf_field(6, &protobuf_field(1, &key_value));
    }
    let attribute = [protobuf_field(1, b"deep"), protobuf_field(2, &value)].concat();
    let resource = protobuf_field(1, &protobuf_field(1, &attribute)); // ResourceLogs.resource.attributes
    let export = protobuf_field(1, &resource); // ExportLogsServiceRequest.resource_logs
    let response = client
        .post(format!("{endpoint}/otlp/v1/logs"))
        .header("s2-basin", BASIN)
        .header("content-type", "application/x-protobuf")
        .body(export)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400, "{}", response.text().await.unwrap());
    // The same in OTLP/JSON, written as text (a `Value` this deep would overflow this
    // test's own stack when serialized).
    let depth = 2_000;
    let json_value = format!(
        "{}{{\"stringValue\":\"leaf\"}}{}",
        r#"{"kvlistValue":{"values":[{"key":"k","value":"#.repeat(depth),
        "}]}}".repeat(depth)
    );
    let export = format!(
        r#"{{"resourceLogs":[{{"resource":{{"attributes":[{{"key":"deep","value":{json_value}}}]}}}}]}}"#
    );
    let response = client
        .post(format!("{endpoint}/otlp/v1/logs"))
        .header("s2-basin", BASIN)
        .header("content-type", "application/json")
        .body(export)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400, "{}", response.text().await.unwrap());

    // Query values out of range, and an SSE resume point that is no id this server sent.
    for query in [
        "seq_num=99999999999999999999999",
        "count=-1",
        "wait=99999999999",
    ] {
        let response = client
            .get(format!("{endpoint}/v1/streams/s/records?{query}"))
            .header("s2-basin", BASIN)
            .send()
            .await
            .unwrap();
        let (status, code, body) = error_of(response).await;
        assert_eq!(
            (status, code.as_str()),
            (400, "bad_query"),
            "{query}: {body}"
        );
    }
    for last_event_id in ["1,2".to_owned(), "9".repeat(40_000), "1,".repeat(10_000)] {
        let response = client
            .get(format!("{endpoint}/v1/streams/s/records?seq_num=0"))
            .header("s2-basin", BASIN)
            .header("accept", "text/event-stream")
            .header("last-event-id", last_event_id)
            .send()
            .await
            .unwrap();
        let (status, code, body) = error_of(response).await;
        assert_eq!((status, code.as_str()), (400, "bad_header"), "{body}");
    }

    // Too many header fields, or too many header bytes: refused by the HTTP layer.
    let address = address(endpoint);
    let many: String = (0..500).map(|i| format!("x-h{i}: v\r\n")).collect();
    let answer = exchange(
        &address,
        format!("GET /health HTTP/1.1\r\nhost: x\r\n{many}\r\n").as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:?}");
    let long = "v".repeat(200 * 1024);
    let answer = exchange(
        &address,
        format!("GET /health HTTP/1.1\r\nhost: x\r\nx-long: {long}\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:?}");
    still_serving(&server).await;
}

#[tokio::test]
async fn s2s_frames_that_are_too_large_or_decompress_too_far_end_the_session_with_bad_frame() {
    let (_dir, server) = start(&[]).await;
    let h2 = streamgate_tests::client_builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    // A frame announcing 16 MiB, and a zstd frame that would decompress to 64 MiB.
    let oversized = vec![0xff, 0xff, 0xff, 0x00];
    let bomb = zstd::bulk::compress(&vec![0u8; 64 * 1024 * 1024], 19).unwrap();
    let mut compressed = ((bomb.len() + 1) as u32).to_be_bytes()[1..].to_vec();
    compressed.push(1 << 5); // zstd
    compressed.extend_from_slice(&bomb);
    for (what, frames) in [
        ("an oversized frame", oversized),
        ("a decompression bomb", compressed),
    ] {
        let response = h2
            .post(format!("{}/v1/streams/s/records", server.endpoint))
            .header("s2-basin", BASIN)
            .header("content-type", "s2s/proto")
            .body(frames)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{what}: the session starts");
        let mut received = response.bytes().await.unwrap().to_vec();
        let (flags, body) = wire::take_s2s_frame(&mut received).expect("a terminal frame");
        assert_ne!(
            flags & 0x80,
            0,
            "{what}: the session ends with a terminal frame"
        );
        let error: Value = serde_json::from_slice(&body[2..]).unwrap();
        assert_eq!(error["code"], "bad_frame", "{what}: {error}");
    }
    still_serving(&server).await;
}

/// Peak resident memory of a process (VmHWM), in bytes.
fn peak_memory(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

/// `size` zero bytes compressed with `encoding`.
fn bomb(encoding: &str, size: usize) -> Vec<u8> {
    fn inflating_to<W: Write>(mut encoder: W, size: usize) -> W {
        let zeros = vec![0u8; 1024 * 1024];
        for _ in 0..size / zeros.len() {
            encoder.write_all(&zeros).unwrap();
        }
        encoder
    }
    let level = flate2::Compression::best();
    match encoding {
        "zstd" => inflating_to(zstd::stream::Encoder::new(Vec::new(), 3).unwrap(), size)
            .finish()
            .unwrap(),
        "gzip" => inflating_to(flate2::write::GzEncoder::new(Vec::new(), level), size)
            .finish()
            .unwrap(),
        "deflate" => inflating_to(flate2::write::ZlibEncoder::new(Vec::new(), level), size)
            .finish()
            .unwrap(),
        other => panic!("no encoding {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decompression_bombs_on_every_body_route_leave_memory_bounded() {
    let (_dir, server) = start(&[]).await;
    let pid = server.pid().unwrap();
    let endpoint = &server.endpoint;
    let h2 = streamgate_tests::client_builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    still_serving(&server).await;
    let before = peak_memory(pid);
    // Each bomb inflates to 512 MiB; the server reads at most its body limit (16 MiB at
    // most) of it.
    const INFLATED: usize = 512 * 1024 * 1024;
    for encoding in ["gzip", "deflate", "zstd"] {
        let bomb = bomb(encoding, INFLATED);
        for (route, content_type) in [
            ("/v1/streams/s/records", "application/json"),
            ("/v1/streams", "application/json"),
            ("/otlp/v1/logs", "application/x-protobuf"),
            ("/v1/streams/s/records", "s2s/proto"),
        ] {
            let response = h2
                .post(format!("{endpoint}{route}"))
                .header("s2-basin", BASIN)
                .header("content-type", content_type)
                .header("content-encoding", encoding)
                .body(bomb.clone())
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let body = response.bytes().await.unwrap_or_default();
            let refused = match content_type {
                // A session answers 200, then ends with a terminal bad_frame.
                "s2s/proto" => status == 200 && body.windows(9).any(|w| w == b"bad_frame"),
                _ => status == 400 || status == 413,
            };
            assert!(
                refused,
                "{encoding} bomb on {route} ({content_type}): {status} {:?}",
                String::from_utf8_lossy(&body[..body.len().min(300)])
            );
        }
    }
    let grown = peak_memory(pid).saturating_sub(before);
    eprintln!(
        "peak memory grew by {} MiB under 12 bombs of 512 MiB each",
        grown / (1024 * 1024)
    );
    assert!(
        grown < 128 * 1024 * 1024,
        "memory stayed bounded: grew {grown} bytes"
    );
    still_serving(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_slow_clients_are_cut_off_while_others_are_served() {
    let (_dir, server) = start(&[]).await;
    let address = address(&server.endpoint);
    // Fifty connections that never say anything, one that stops in the middle of its
    // headers, one that stops in the middle of its body, one that stops in the middle of
    // the HTTP/2 preface, and a RESP one that never finishes its command.
    let mut silent = Vec::new();
    for _ in 0..50 {
        silent.push(TcpStream::connect(&address).await.unwrap());
    }
    let mut headers = TcpStream::connect(&address).await.unwrap();
    headers
        .write_all(b"POST /v1/streams HTTP/1.1\r\nhost: x\r\ncontent-type: appl")
        .await
        .unwrap();
    let mut body = TcpStream::connect(&address).await.unwrap();
    body.write_all(
        format!(
            "POST /v1/streams HTTP/1.1\r\nhost: x\r\ns2-basin: {BASIN}\r\nauthorization: Bearer {}\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"stream\":",
            streamgate_tests::ROOT_TOKEN
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut preface = TcpStream::connect(&address).await.unwrap();
    preface.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    let mut resp = resp_authenticating(&server).await;
    resp.write_all(b"*2\r\n$4\r\nECHO\r\n$10\r\nabc")
        .await
        .unwrap();

    // Meanwhile everyone else is served.
    still_serving(&server).await;

    for (what, socket) in silent
        .iter_mut()
        .map(|s| ("a silent connection", s))
        .chain([
            ("unfinished headers", &mut headers),
            ("an unfinished HTTP/2 preface", &mut preface),
        ])
    {
        let answer = read_until(socket, |_| false).await;
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
            "{what}: {answer:?}"
        );
    }
    let answer = read_until(&mut body, |_| false).await;
    assert!(
        answer.starts_with("HTTP/1.1 408"),
        "an unfinished body: {answer:?}"
    );
    assert!(answer.contains("request_timeout"), "{answer:?}");
    let answer = read_until(&mut resp, |_| false).await;
    assert!(
        answer.starts_with("+OK\r\n-ERR") && answer.contains("did not arrive in full"),
        "an unfinished RESP command: {answer:?}"
    );
    still_serving(&server).await;
}

/// Connections that have not yet shown which HTTP they speak (silent ones, half a
/// preface) hold no request, so a drain closes them at once rather than waiting out
/// their handshake time (10 s). A cluster node's SIGTERM waited for exactly that when a
/// peer or client had opened a connection ahead of use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_does_not_wait_for_connections_that_sent_nothing() {
    let (_dir, mut server) = start(&[]).await;
    let address = address(&server.endpoint);
    let mut silent = TcpStream::connect(&address).await.unwrap();
    let mut preface = TcpStream::connect(&address).await.unwrap();
    preface.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    // Both are past accept and in their handshake once a request after them is served.
    still_serving(&server).await;
    let signalled = std::time::Instant::now();
    let (server, code) = tokio::task::spawn_blocking(move || {
        let code = server.terminate();
        (server, code)
    })
    .await
    .unwrap();
    let took = signalled.elapsed();
    assert_eq!(code, Some(0), "a drained server exits cleanly");
    // The handshake time is 10 s; a drain that waited for it takes at least that long.
    assert!(
        took < Duration::from_secs(8),
        "the drain waited {took:?} for connections that sent nothing"
    );
    for (what, socket) in [("silent", &mut silent), ("half a preface", &mut preface)] {
        let answer = read_until(socket, |_| false).await;
        assert!(answer.is_empty(), "{what}: {answer:?}");
    }
    drop(server);
}

#[tokio::test]
async fn connections_past_the_limit_are_refused_until_others_close() {
    let (_dir, server) = start(&["--max-connections", "6"]).await;
    let address = address(&server.endpoint);
    // Six connections in use (each has sent a request and keeps its connection). Slots
    // of the set-up's connections are freed once the server sees them close.
    let mut open = Vec::new();
    while open.len() < 6 {
        let mut socket = TcpStream::connect(&address).await.unwrap();
        socket
            .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let answer = read_until(&mut socket, |text| {
            text.ends_with("ok") || text.ends_with('}')
        })
        .await;
        if answer.starts_with("HTTP/1.1 200") {
            open.push(socket);
        } else {
            assert!(answer.starts_with("HTTP/1.1 503"), "{answer:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let refused = exchange(&address, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused:?}");
    assert!(refused.contains("--max-connections"), "{refused:?}");
    let refused = exchange(&format!("127.0.0.1:{}", server.resp_port), b"PING\r\n").await;
    assert_eq!(
        refused,
        "-ERR max number of clients reached (--max-connections)\r\n"
    );
    open.truncate(2);
    // Closed connections free their slots (the server notices the close first).
    let mut answer = String::new();
    for _ in 0..100 {
        answer = exchange(
            &address,
            b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await;
        if answer.starts_with("HTTP/1.1 200") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
}

/// Bad attempts after the flood within which one must be throttled: each takes a few
/// milliseconds, the allowance refills one attempt per 200 ms.
const ATTEMPTS_AFTER_FLOOD: usize = 5;

#[tokio::test]
async fn a_flood_of_bad_tokens_is_throttled_and_good_tokens_still_work() {
    let (_dir, server) = start(&[]).await;
    let endpoint = &server.endpoint;
    let anonymous = reqwest::Client::new();
    // The same bad token again and again costs one lookup per few seconds, and does not
    // count against the client: plain 401s.
    for _ in 0..100 {
        let repeated = anonymous
            .get(format!("{endpoint}/v1/basins"))
            .bearer_auth("the-same-bad-token")
            .send()
            .await
            .unwrap();
        assert_eq!(repeated.status(), 401);
    }
    let mut statuses = Vec::new();
    for n in 0..200 {
        let response = anonymous
            .get(format!("{endpoint}/v1/basins"))
            .bearer_auth(format!("not-a-token-{n}"))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        if status == 429 {
            assert!(response.headers().contains_key("retry-after"));
            let body: Value = response.json().await.unwrap();
            assert_eq!(body["code"], "rate_limited", "{body}");
        }
        statuses.push(status);
        if n % 20 == 0 {
            // A client with a valid token, from the same address, is not slowed.
            let ok = streamgate_tests::client()
                .get(format!("{endpoint}/v1/basins"))
                .send()
                .await
                .unwrap();
            assert_eq!(ok.status(), 200);
        }
    }
    let unauthenticated = statuses.iter().filter(|s| **s == 401).count();
    let throttled = statuses.iter().filter(|s| **s == 429).count();
    eprintln!("{unauthenticated} answered 401, {throttled} throttled with 429");
    // The repeats above took one lookup of the allowance of 20: the first 19 distinct
    // bad tokens were looked up (401), the flood after them throttled.
    assert!(statuses[..19].iter().all(|s| *s == 401), "{statuses:?}");
    assert!(throttled > 100, "{statuses:?}");
    // The other front ends throttle the same address too. The allowance refills at a few
    // attempts per second, so a slow machine may get one more lookup between the flood and
    // these checks; a short burst must still be throttled before it runs out.
    let mut otlp_statuses = Vec::new();
    for n in 0..ATTEMPTS_AFTER_FLOOD {
        let otlp = anonymous
            .post(format!("{endpoint}/otlp/v1/logs"))
            .header("s2-basin", BASIN)
            .bearer_auth(format!("yet-another-bad-token-{n}"))
            .json(&json!({"resourceLogs": []}))
            .send()
            .await
            .unwrap();
        otlp_statuses.push(otlp.status().as_u16());
        if otlp.status() == 429 {
            break;
        }
        assert_eq!(otlp.status(), 401, "{otlp_statuses:?}");
    }
    assert_eq!(otlp_statuses.last(), Some(&429), "{otlp_statuses:?}");
    let mut resp = TcpStream::connect(("127.0.0.1", server.resp_port))
        .await
        .unwrap();
    let mut resp_replies = Vec::new();
    for n in 0..ATTEMPTS_AFTER_FLOOD {
        resp.write_all(&command(&["AUTH", BASIN, &format!("also-a-bad-token-{n}")]))
            .await
            .unwrap();
        let reply = read_until(&mut resp, |text| text.ends_with("\r\n")).await;
        let throttled = reply.starts_with("-TRYAGAIN");
        assert!(throttled || reply.starts_with("-WRONGPASS"), "{reply:?}");
        resp_replies.push(reply);
        if throttled {
            break;
        }
    }
    assert!(
        resp_replies
            .last()
            .is_some_and(|r| r.starts_with("-TRYAGAIN")),
        "{resp_replies:?}"
    );
    still_serving(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_ends_only_the_request_or_connection_it_happened_in() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start_with(dir.path(), &[]);
    server.set_env("STREAMGATE_PANIC_ON", Some("boom"));
    server.restart();
    streamgate_tests::create_streams(&server.endpoint, BASIN, &["s"]).await;
    let endpoint = &server.endpoint;

    // Unary REST: a 500 for that request.
    let response = streamgate_tests::client()
        .post(format!("{endpoint}/v1/streams/s/records"))
        .header("s2-basin", BASIN)
        .json(&json!({"records": [{"body": "boom"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 500);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["code"], "other", "{body}");

    // An S2S append session: the session ends, without an ack for that input.
    let h2 = streamgate_tests::client_builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let session = h2
        .post(format!("{endpoint}/v1/streams/s/records"))
        .header("s2-basin", BASIN)
        .header("content-type", "s2s/proto")
        .body(wire::s2s_frame(&wire::encode_append_input(&[b"boom"])))
        .send()
        .await
        .unwrap();
    let received = session.bytes().await.unwrap_or_default();
    let mut frames = received.to_vec();
    let mut acks = 0;
    while let Some((flags, _)) = wire::take_s2s_frame(&mut frames) {
        acks += usize::from(flags & 0x80 == 0);
    }
    assert_eq!(
        acks, 0,
        "no ack for the input that panicked (without the panic there is one)"
    );

    // A RESP connection: closed; others are not.
    let mut resp = resp_authenticating(&server).await;
    assert_eq!(
        read_until(&mut resp, |text| text.ends_with("\r\n")).await,
        "+OK\r\n"
    );
    resp.write_all(&command(&["XADD", "s", "*", "f", "boom"]))
        .await
        .unwrap();
    let reply = read_until(&mut resp, |_| false).await;
    assert_eq!(reply, "", "the connection closed without a reply");

    assert!(server
        .pid()
        .is_some_and(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists()));
    still_serving(&server).await;
    let records = streamgate_tests::read_stream(endpoint, BASIN, "s").await;
    assert!(
        records.iter().all(|r| r["body"] != "boom"),
        "nothing that panicked was appended"
    );
}
