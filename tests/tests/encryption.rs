//! Stream encryption against the real binary: a stream captures its basin's cipher at
//! creation; appends and reads carry the key in `s2-encryption-key` (unary, SSE);
//! errors for a missing, malformed or wrong key; keys ignored on plaintext streams;
//! RESP and OTLP refused; records that survive kill -9 and compaction; and no byte of a
//! marker sent only inside encrypted records, nor the key, in any file the server wrote.

use base64::Engine as _;
use reqwest::StatusCode;
use serde_json::{json, Value};
use streamgate_tests::{client, path_segment, resp, Server};

const BASIN: &str = "secure-events";

fn key_of(byte: u8) -> String {
    base64::engine::general_purpose::STANDARD.encode([byte; 32])
}

struct Api<'a> {
    server: &'a Server,
    http: reqwest::Client,
}

impl Api<'_> {
    fn new(server: &Server) -> Api<'_> {
        Api {
            server,
            http: client(),
        }
    }

    fn records_url(&self, stream: &str) -> String {
        format!(
            "{}/v1/streams/{}/records",
            self.server.endpoint,
            path_segment(stream)
        )
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let response = self
            .http
            .post(format!("{}/v1{path}", self.server.endpoint))
            .header("s2-basin", BASIN)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> Value {
        let response = self
            .http
            .get(format!("{}/v1{path}", self.server.endpoint))
            .header("s2-basin", BASIN)
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success(), "GET {path}");
        response.json().await.unwrap()
    }

    async fn append(&self, stream: &str, key: Option<&str>, records: Value) -> (StatusCode, Value) {
        let mut request = self
            .http
            .post(self.records_url(stream))
            .header("s2-basin", BASIN)
            .header("s2-format", "raw")
            .json(&json!({ "records": records }));
        if let Some(key) = key {
            request = request.header("s2-encryption-key", key);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn read(&self, stream: &str, key: Option<&str>) -> (StatusCode, Value) {
        let mut request = self
            .http
            .get(format!("{}?seq_num=0&count=1000", self.records_url(stream)))
            .header("s2-basin", BASIN)
            .header("s2-format", "raw");
        if let Some(key) = key {
            request = request.header("s2-encryption-key", key);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

fn bodies(batch: &Value) -> Vec<String> {
    batch["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| r["body"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test]
async fn streams_capture_the_basin_cipher_and_need_the_key_for_appends_and_reads() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let api = Api::new(&server);
    let (status, _) = api
        .post(
            "/basins",
            json!({"basin": BASIN, "config": {"stream_cipher": "aegis-256"}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let config = api.get(&format!("/basins/{BASIN}")).await;
    assert_eq!(config["stream_cipher"], "aegis-256");
    let (status, info) = api.post("/streams", json!({"stream": "audit"})).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(info["cipher"], "aegis-256");

    // New streams take the basin's cipher as it is when they are created; existing ones
    // keep theirs.
    let response = client()
        .patch(format!("{}/v1/basins/{BASIN}", server.endpoint))
        .json(&json!({"stream_cipher": "aes-256-gcm"}))
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success());
    api.post("/streams", json!({"stream": "gcm"})).await;
    let response = client()
        .patch(format!("{}/v1/basins/{BASIN}", server.endpoint))
        .json(&json!({"stream_cipher": null}))
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success());
    api.post("/streams", json!({"stream": "plain"})).await;
    let listed = api.get("/streams").await;
    let ciphers: Vec<(String, Value)> = listed["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["name"].as_str().unwrap().to_owned(), s["cipher"].clone()))
        .collect();
    assert_eq!(
        ciphers,
        vec![
            ("audit".into(), json!("aegis-256")),
            ("gcm".into(), json!("aes-256-gcm")),
            ("plain".into(), Value::Null),
        ]
    );

    let key = key_of(7);
    for stream in ["audit", "gcm"] {
        let records = json!([
            {"body": "top secret", "headers": [["who", "alice"]]},
            {"body": ""},
        ]);
        let (status, ack) = api.append(stream, Some(&key), records).await;
        assert_eq!(status, StatusCode::OK, "{stream}: {ack}");
        assert_eq!(ack["end"]["seq_num"], 2);
        let (status, batch) = api.read(stream, Some(&key)).await;
        assert_eq!(status, StatusCode::OK, "{stream}: {batch}");
        assert_eq!(bodies(&batch), ["top secret", ""]);
        assert_eq!(batch["records"][0]["headers"], json!([["who", "alice"]]));

        // A missing key, or one that is not a 32-byte key: 422 invalid, nothing written.
        let short_key = key_of(1)[..24].to_owned();
        for (bad_key, says) in [
            (None, "s2-encryption-key"),
            (Some("not base64!"), "not valid base64"),
            (Some(short_key.as_str()), "must be 32 bytes"),
        ] {
            let (status, body) = api.append(stream, bad_key, json!([{"body": "x"}])).await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
            assert_eq!(body["code"], "invalid");
            assert!(body["message"].as_str().unwrap().contains(says), "{body}");
            let (status, body) = api.read(stream, bad_key).await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        }
        // Not a key at all (too long): bad_header, whatever the stream.
        let (status, body) = api
            .append(stream, Some(&"A".repeat(45)), json!([{"body": "x"}]))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(body["code"], "bad_header");
        // A wrong key opens nothing.
        let (status, body) = api.read(stream, Some(&key_of(8))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(body["code"], "decryption_failed");
        // The tail needs no key.
        let tail = api.get(&format!("/streams/{stream}/records/tail")).await;
        assert_eq!(tail["tail"]["seq_num"], 2);
    }

    // A key sent for a plaintext stream is ignored, even one that would not decode.
    let (status, _) = api
        .append("plain", Some("not base64!"), json!([{"body": "open"}]))
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, batch) = api.read("plain", Some(&key_of(3))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(bodies(&batch), ["open"]);

    // Command records stay plaintext and work as always; they need the key too.
    let fence = json!([{"headers": [["", "fence"]], "body": "writer-1"}]);
    let (status, _) = api.append("audit", None, fence.clone()).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, _) = api.append("audit", Some(&key), fence).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = api
        .append("audit", Some(&key), json!([{"body": "unfenced"}]))
        .await;
    assert_eq!(status, StatusCode::OK, "no fencing token was given: {body}");
    let (_, batch) = api.read("audit", Some(&key)).await;
    assert_eq!(bodies(&batch), ["top secret", "", "writer-1", "unfenced"]);
    assert_eq!(batch["records"][2]["headers"], json!([["", "fence"]]));
}

#[tokio::test]
async fn sse_reads_open_records_with_the_key_and_fail_with_a_wrong_one() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let api = Api::new(&server);
    api.post(
        "/basins",
        json!({"basin": BASIN, "config": {"stream_cipher": "aes-256-gcm"}}),
    )
    .await;
    api.post("/streams", json!({"stream": "live"})).await;
    let key = key_of(5);
    let (status, _) = api
        .append(
            "live",
            Some(&key),
            json!([{"body": "sse-one"}, {"body": "sse-two"}]),
        )
        .await;
    assert_eq!(status, StatusCode::OK);

    let sse = |key: String| {
        client()
            .get(format!("{}?seq_num=0&count=2", api.records_url("live")))
            .header("s2-basin", BASIN)
            .header("s2-format", "raw")
            .header("accept", "text/event-stream")
            .header("s2-encryption-key", key)
    };
    let text = sse(key.clone()).send().await.unwrap().text().await.unwrap();
    assert!(
        text.contains("sse-one") && text.contains("sse-two"),
        "{text}"
    );
    // With a wrong key, the session ends with an error event and no record.
    let response = sse(key_of(6)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let text = response.text().await.unwrap();
    assert!(text.contains("event: error"), "{text}");
    assert!(text.contains("decryption_failed"), "{text}");
    assert!(!text.contains("sse-one"), "{text}");
    // Without a key, the session is refused before it starts.
    let response = client()
        .get(format!("{}?seq_num=0", api.records_url("live")))
        .header("s2-basin", BASIN)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn resp_and_otlp_refuse_encrypted_streams_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let api = Api::new(&server);
    api.post(
        "/basins",
        json!({"basin": BASIN, "config": {"stream_cipher": "aegis-256"}}),
    )
    .await;
    api.post("/streams", json!({"stream": "redis"})).await;
    let mut redis = resp::Connection::open(server.resp_port, Some(BASIN))
        .await
        .unwrap();
    let token = streamgate_tests::ROOT_TOKEN;
    redis.call(&["AUTH", BASIN, token]).await.unwrap();
    for command in [
        vec!["XADD", "redis", "*", "f", "v"],
        vec!["XRANGE", "redis", "-", "+"],
    ] {
        let reply = match redis.call(&command).await.unwrap() {
            resp::Reply::Error(text) => text,
            other => panic!("{command:?}: expected an error, got {other:?}"),
        };
        assert!(
            reply.starts_with("ERR") && reply.contains("encrypted"),
            "{command:?}: {reply}"
        );
    }

    api.post("/streams", json!({"stream": "otel"})).await;
    let response =
        streamgate_tests::export_logs(&server.endpoint, BASIN, &[("otel", "log line")]).await;
    let status = response.status();
    let body = response.text().await.unwrap();
    assert!(
        body.contains("encrypted"),
        "OTLP export into an encrypted stream: {status} {body}"
    );
    // Nothing reached either stream.
    for stream in ["redis", "otel"] {
        let tail = api.get(&format!("/streams/{stream}/records/tail")).await;
        assert_eq!(tail["tail"]["seq_num"], 0, "{stream}");
    }
}

/// Every file under `dir`, with its bytes.
fn files_under(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if let Ok(bytes) = std::fs::read(&path) {
                files.push((path, bytes));
            }
        }
    }
    files
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test]
async fn nothing_written_holds_the_plaintext_or_the_key_and_records_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    // The embedded default whatever the suite's backend: every byte the server writes is
    // then a file under the data directory.
    let metadata = dir.path().join("metadata.db");
    let objects = dir.path().join("objects");
    let mut server = Server::start_with(
        dir.path(),
        &[
            "--metadata",
            metadata.to_str().unwrap(),
            "--objects",
            objects.to_str().unwrap(),
        ],
    );
    let api = Api::new(&server);
    api.post(
        "/basins",
        json!({"basin": BASIN, "config": {"stream_cipher": "aegis-256"}}),
    )
    .await;
    let marker = "ZEBRA-MARKER-7f3a";
    let key_bytes = [0x5au8; 32];
    let key = base64::engine::general_purpose::STANDARD.encode(key_bytes);
    let mut expected = Vec::new();
    for (stream, cipher) in [("a", "aegis-256"), ("g", "aes-256-gcm")] {
        let response = client()
            .patch(format!("{}/v1/basins/{BASIN}", server.endpoint))
            .json(&json!({ "stream_cipher": cipher }))
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success());
        api.post("/streams", json!({ "stream": stream })).await;
        for batch in 0..20 {
            let records: Vec<Value> = (0..10)
                .map(|i| {
                    json!({
                        "headers": [[format!("{marker}-name"), format!("{marker}-value")]],
                        "body": format!("{marker} {stream} {batch} {i}"),
                    })
                })
                .collect();
            let (status, body) = api.append(stream, Some(&key), json!(records)).await;
            assert_eq!(status, StatusCode::OK, "{body}");
        }
        expected.push((stream, 200));
    }
    // Records move into segments within a third of a second (the test servers'
    // compaction interval), later on a slow machine: wait until some have, so that the
    // reads below find history in segments too.
    let has_segments = || {
        files_under(dir.path()).iter().any(|(p, _)| {
            p.strip_prefix(dir.path())
                .unwrap()
                .display()
                .to_string()
                .contains("seg")
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !has_segments() {
        assert!(
            std::time::Instant::now() < deadline,
            "no segment written within 30 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    server.kill9();
    server.restart();
    let api = Api::new(&server);
    for (stream, count) in &expected {
        let (status, batch) = api.read(stream, Some(&key)).await;
        assert_eq!(status, StatusCode::OK, "{stream} after kill -9: {batch}");
        let got = bodies(&batch);
        assert_eq!(got.len(), *count, "{stream}");
        assert_eq!(got[0], format!("{marker} {stream} 0 0"));
        assert_eq!(
            batch["records"][0]["headers"][0][0],
            format!("{marker}-name")
        );
    }
    server.kill9();

    let files = files_under(dir.path());
    let names: Vec<String> = files
        .iter()
        .map(|(p, _)| p.strip_prefix(dir.path()).unwrap().display().to_string())
        .collect();
    assert!(
        names.iter().any(|n| n.contains("wal")) && names.iter().any(|n| n.contains("seg")),
        "expected WAL chunks and segments among {names:?}"
    );
    for (path, bytes) in &files {
        for (what, needle) in [
            ("the marker", marker.as_bytes()),
            ("the key", &key_bytes[..]),
            ("the key in base64", key.as_bytes()),
        ] {
            assert!(!contains(bytes, needle), "{} holds {what}", path.display());
        }
    }
}
