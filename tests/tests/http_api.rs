//! The REST API of the real binary, over HTTP/1.1 and cleartext HTTP/2.

use reqwest::{Client, Method, StatusCode};
use serde_json::{json, Value};
use streamgate_tests::Server;

struct Api {
    client: Client,
    endpoint: String,
}

impl Api {
    fn new(server: &Server) -> Api {
        Api {
            client: streamgate_tests::client(),
            endpoint: server.endpoint.clone(),
        }
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        basin: Option<&str>,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> (StatusCode, Value, reqwest::header::HeaderMap) {
        let mut request = self
            .client
            .request(method, format!("{}/v1{path}", self.endpoint));
        if let Some(basin) = basin {
            request = request.header("s2-basin", basin);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap();
        let value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        (status, value, headers)
    }
}

const BASIN: &str = "http-api-test";

async fn with_stream(api: &Api, stream: &str) {
    let (status, _, _) = api
        .call(
            Method::POST,
            "/basins",
            None,
            Some(json!({"basin": BASIN})),
            &[],
        )
        .await;
    assert!(status == StatusCode::CREATED || status == StatusCode::CONFLICT);
    let (status, body, _) = api
        .call(
            Method::POST,
            "/streams",
            Some(BASIN),
            Some(json!({"stream": stream})),
            &[],
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

#[tokio::test]
async fn basin_lifecycle_pagination_and_idempotent_create() {
    let dir = tempfile::tempdir().unwrap();
    // Deletions stay pending for the whole test, so their effects are deterministic.
    let server = Server::start_with(dir.path(), &["--reap-interval-secs", "600"]);
    let api = Api::new(&server);

    for name in ["page-basin-a", "page-basin-b", "page-basin-c"] {
        let (status, body, _) = api
            .call(
                Method::POST,
                "/basins",
                None,
                Some(json!({"basin": name})),
                &[("s2-request-token", "tok-1")],
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        assert_eq!(body["name"], name);
        assert!(body["created_at"].as_str().unwrap().ends_with('Z'));
        assert!(body["deleted_at"].is_null());
    }
    // Same token and body: the same basin again. Another token: a conflict.
    let (status, _, _) = api
        .call(
            Method::POST,
            "/basins",
            None,
            Some(json!({"basin": "page-basin-a"})),
            &[("s2-request-token", "tok-1")],
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, body, _) = api
        .call(
            Method::POST,
            "/basins",
            None,
            Some(json!({"basin": "page-basin-a"})),
            &[("s2-request-token", "tok-2")],
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["code"], "resource_already_exists");
    // Same token, different body: a conflict too.
    let (status, _, _) = api
        .call(
            Method::POST,
            "/basins",
            None,
            Some(json!({"basin": "page-basin-a", "config": {"create_stream_on_append": true}})),
            &[("s2-request-token", "tok-1")],
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);

    let (_, page, _) = api
        .call(Method::GET, "/basins?prefix=page-&limit=2", None, None, &[])
        .await;
    let names: Vec<_> = page["basins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].clone())
        .collect();
    assert_eq!(names, [json!("page-basin-a"), json!("page-basin-b")]);
    assert_eq!(page["has_more"], true);
    let (_, page, _) = api
        .call(
            Method::GET,
            "/basins?prefix=page-&start_after=page-basin-b&limit=2",
            None,
            None,
            &[],
        )
        .await;
    assert_eq!(page["basins"].as_array().unwrap().len(), 1);
    assert_eq!(page["has_more"], false);

    // Reconfigure changes only the fields given.
    let (status, config, _) = api
        .call(
            Method::PATCH,
            "/basins/page-basin-a",
            None,
            Some(json!({"create_stream_on_append": true, "default_stream_config": {"retention_policy": {"infinite": {}}}})),
            &[],
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(config["create_stream_on_append"], true);
    let (_, config, _) = api
        .call(
            Method::PATCH,
            "/basins/page-basin-a",
            None,
            Some(json!({"create_stream_on_read": true})),
            &[],
        )
        .await;
    assert_eq!(config["create_stream_on_append"], true);
    assert_eq!(
        config["default_stream_config"]["retention_policy"],
        json!({"infinite": {}})
    );
    let (_, fetched, _) = api
        .call(Method::GET, "/basins/page-basin-a", None, None, &[])
        .await;
    assert_eq!(fetched, config);

    // Ensure: created, then unchanged, then updated.
    let (status, _, headers) = api
        .call(Method::PUT, "/basins/page-basin-d", None, None, &[])
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["s2-provision-result"], "created");
    let (status, _, headers) = api
        .call(Method::PUT, "/basins/page-basin-d", None, None, &[])
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["s2-provision-result"], "noop");
    let (_, _, headers) = api
        .call(
            Method::PUT,
            "/basins/page-basin-d",
            None,
            Some(json!({"config": {"create_stream_on_read": true}})),
            &[],
        )
        .await;
    assert_eq!(headers["s2-provision-result"], "updated");

    // Delete is asynchronous: listed with deleted_at, name blocked until it completes.
    let (status, _, _) = api
        .call(Method::DELETE, "/basins/page-basin-c", None, None, &[])
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (status, body, _) = api
        .call(
            Method::POST,
            "/basins",
            None,
            Some(json!({"basin": "page-basin-c"})),
            &[],
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["code"], "basin_deletion_pending");
    let (_, listed, _) = api
        .call(Method::GET, "/basins?prefix=page-basin-c", None, None, &[])
        .await;
    assert_eq!(listed["basins"][0]["name"], "page-basin-c");
    assert!(
        listed["basins"][0]["deleted_at"].is_string(),
        "listed with deleted_at"
    );
    assert_eq!(listed["basins"][0]["state"], "deleting");
    let (status, body, _) = api
        .call(Method::GET, "/basins/no-such-basin", None, None, &[])
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["code"], "basin_not_found");
}

/// A request that must fail: method, path, basin header, body, other headers, and the
/// expected status and error code.
type ErrorCase<'a> = (
    Method,
    &'a str,
    Option<&'a str>,
    Option<Value>,
    Vec<(&'a str, &'a str)>,
    StatusCode,
    &'a str,
);

#[tokio::test]
async fn bad_requests_get_the_documented_errors() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let api = Api::new(&server);
    with_stream(&api, "s").await;
    let long_token = "t".repeat(37);

    let cases: Vec<ErrorCase> = vec![
        (
            Method::POST,
            "/basins",
            None,
            Some(json!({"basin": "Bad_Name"})),
            vec![],
            StatusCode::BAD_REQUEST,
            "bad_json",
        ),
        (
            Method::POST,
            "/basins",
            None,
            Some(json!({"nope": 1})),
            vec![],
            StatusCode::BAD_REQUEST,
            "bad_json",
        ),
        (
            Method::GET,
            "/basins/x",
            None,
            None,
            vec![],
            StatusCode::BAD_REQUEST,
            "bad_path",
        ),
        (
            Method::GET,
            "/streams",
            None,
            None,
            vec![],
            StatusCode::BAD_REQUEST,
            "bad_header",
        ),
        (
            Method::GET,
            "/streams",
            Some("NOT OK"),
            None,
            vec![],
            StatusCode::BAD_REQUEST,
            "bad_header",
        ),
        (
            Method::GET,
            "/streams/s/records?seq_num=-1",
            Some(BASIN),
            None,
            vec![],
            StatusCode::BAD_REQUEST,
            "bad_query",
        ),
        (
            Method::GET,
            "/streams/s/records?seq_num=0&tail_offset=1",
            Some(BASIN),
            None,
            vec![],
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
        ),
        (
            Method::POST,
            "/streams/s/records",
            Some(BASIN),
            Some(json!({"records": []})),
            vec![],
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
        ),
        (
            Method::POST,
            "/streams/s/records",
            Some(BASIN),
            Some(json!({"records": [{"headers": [["", "nope"]]}]})),
            vec![],
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
        ),
        (
            Method::POST,
            "/streams/s/records",
            Some(BASIN),
            Some(json!({"records": [{"body": "%%%"}]})),
            vec![("s2-format", "base64")],
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
        ),
        (
            Method::POST,
            "/streams/s/records",
            Some(BASIN),
            Some(json!({"records": [{"body": "x"}]})),
            vec![("s2-format", "hex")],
            StatusCode::BAD_REQUEST,
            "bad_header",
        ),
        (
            Method::POST,
            "/streams/s/records",
            Some(BASIN),
            Some(json!({"records": [{"body": "x"}], "fencing_token": "t".repeat(37)})),
            vec![],
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
        ),
        (
            Method::POST,
            "/streams",
            Some(BASIN),
            Some(json!({"stream": "r", "config": {"retention_policy": {"age": 0}}})),
            vec![],
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
        ),
        (
            Method::POST,
            "/streams",
            Some(BASIN),
            Some(json!({"stream": "r", "config": {"storage_class": "premium"}})),
            vec![],
            StatusCode::BAD_REQUEST,
            "bad_json",
        ),
        (
            Method::POST,
            "/basins",
            None,
            Some(json!({"basin": "scoped-basin", "scope": "aws:us-west-2"})),
            vec![],
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
        ),
        (
            Method::POST,
            "/basins",
            None,
            Some(json!({"basin": "cipher-basin", "config": {"stream_cipher": "rot13"}})),
            vec![],
            StatusCode::BAD_REQUEST,
            "bad_json",
        ),
        (
            Method::POST,
            "/basins",
            None,
            Some(json!({"basin": "long-token-basin"})),
            vec![("s2-request-token", &long_token)],
            StatusCode::BAD_REQUEST,
            "bad_header",
        ),
        (
            Method::GET,
            "/streams/missing/records/tail",
            Some(BASIN),
            None,
            vec![],
            StatusCode::NOT_FOUND,
            "stream_not_found",
        ),
        (
            Method::GET,
            "/streams/s/records",
            Some("missing-basin"),
            None,
            vec![],
            StatusCode::NOT_FOUND,
            "basin_not_found",
        ),
        (
            Method::POST,
            "/streams/s/records",
            Some(BASIN),
            Some(json!({"records": [{"body": "x"}]})),
            vec![("s2-stream-config", "{not json")],
            StatusCode::BAD_REQUEST,
            "bad_header",
        ),
        (
            Method::GET,
            "/basins",
            None,
            None,
            vec![("authorization", "Bearer not-a-token")],
            StatusCode::UNAUTHORIZED,
            "authn",
        ),
        (
            Method::GET,
            "/metrics?start=0&end=60",
            None,
            None,
            vec![],
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
        ),
    ];
    for (method, path, basin, body, headers, status, code) in cases {
        let (got, body, _) = api.call(method.clone(), path, basin, body, &headers).await;
        assert_eq!(got, status, "{method} {path}: {body}");
        assert_eq!(body["code"], code, "{method} {path}: {body}");
        assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    // Nothing above changed the stream.
    let (_, tail, _) = api
        .call(
            Method::GET,
            "/streams/s/records/tail",
            Some(BASIN),
            None,
            &[],
        )
        .await;
    assert_eq!(tail, json!({"tail": {"seq_num": 0, "timestamp": 0}}));
}

#[tokio::test]
async fn append_and_read_in_every_format() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let api = Api::new(&server);
    with_stream(&api, "logs/app 1").await;
    let path = "/streams/logs%2Fapp%201/records";

    let (status, ack, _) = api
        .call(
            Method::POST,
            path,
            Some(BASIN),
            Some(json!({"records": [{"body": "hello", "headers": [["k", "v"]]}, {"body": "", "timestamp": 1}]})),
            &[],
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{ack}");
    assert_eq!(ack["start"]["seq_num"], 0);
    assert_eq!(ack["end"]["seq_num"], 2);
    assert_eq!(ack["tail"]["seq_num"], 2);
    // Binary through base64: bytes that are not UTF-8 survive.
    let (_, ack, _) = api
        .call(
            Method::POST,
            path,
            Some(BASIN),
            Some(json!({"records": [{"body": "/wAB", "headers": [["AA==", "/w=="]]}]})),
            &[("s2-format", "base64")],
        )
        .await;
    assert_eq!(ack["start"]["seq_num"], 2);

    let (status, batch, _) = api
        .call(
            Method::GET,
            &format!("{path}?seq_num=0"),
            Some(BASIN),
            None,
            &[],
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let records = batch["records"].as_array().unwrap();
    assert_eq!(records.len(), 3);
    assert_eq!(records[0]["body"], "hello");
    assert_eq!(records[0]["headers"], json!([["k", "v"]]));
    assert!(records[1].get("body").is_none(), "empty bodies are omitted");
    assert!(
        records[1]["timestamp"].as_u64() >= records[0]["timestamp"].as_u64(),
        "monotonic"
    );
    assert_eq!(batch["tail"]["seq_num"], 3);
    let (_, batch, _) = api
        .call(
            Method::GET,
            &format!("{path}?seq_num=2"),
            Some(BASIN),
            None,
            &[("s2-format", "base64")],
        )
        .await;
    assert_eq!(batch["records"][0]["body"], "/wAB");
    assert_eq!(batch["records"][0]["headers"], json!([["AA==", "/w=="]]));

    // Protobuf both ways, with both media type spellings.
    let body = streamgate_tests::wire::encode_append_input(&[b"proto-1", b"proto-2"]);
    for media in ["application/protobuf", "application/x-protobuf"] {
        let response = api
            .client
            .post(format!("{}/v1{path}", api.endpoint))
            .header("s2-basin", BASIN)
            .header("content-type", media)
            .header("accept", media)
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["content-type"], "application/protobuf");
        let ack = response.bytes().await.unwrap();
        assert!(!ack.is_empty());
    }
    let response = api
        .client
        .get(format!("{}/v1{path}?seq_num=3&count=2", api.endpoint))
        .header("s2-basin", BASIN)
        .header("accept", "application/x-protobuf")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let bytes = response.bytes().await.unwrap();
    let window = bytes
        .windows(7)
        .filter(|w| w.starts_with(b"proto-"))
        .count();
    assert_eq!(window, 2, "both protobuf records come back");

    // Malformed protobuf is bad_proto.
    let response = api
        .client
        .post(format!("{}/v1{path}", api.endpoint))
        .header("s2-basin", BASIN)
        .header("content-type", "application/protobuf")
        .body(vec![0xff, 0xff, 0xff])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["code"], "bad_proto");
}

#[tokio::test]
async fn conditions_commands_and_the_416_table() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let api = Api::new(&server);
    with_stream(&api, "cc").await;
    let path = "/streams/cc/records";
    let append = |body: Value| api.call(Method::POST, path, Some(BASIN), Some(body), &[]);

    let (status, tail, _) = api.call(Method::GET, path, Some(BASIN), None, &[]).await;
    assert_eq!(status, StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(tail["tail"]["seq_num"], 0);

    append(json!({"records": [{"body": "a"}]})).await;
    let (status, body, _) = append(json!({"records": [{"body": "b"}], "match_seq_num": 0})).await;
    assert_eq!(status, StatusCode::PRECONDITION_FAILED);
    assert_eq!(body, json!({"seq_num_mismatch": 1}));
    let (status, _, _) = append(json!({"records": [{"body": "b"}], "match_seq_num": 1})).await;
    assert_eq!(status, StatusCode::OK);

    // Fence through a command record; then only the token holder may append with a token.
    let (status, _, _) =
        append(json!({"records": [{"headers": [["", "fence"]], "body": "w1"}]})).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body, _) =
        append(json!({"records": [{"body": "c"}], "fencing_token": "w2"})).await;
    assert_eq!(status, StatusCode::PRECONDITION_FAILED);
    assert_eq!(body, json!({"fencing_token_mismatch": "w1"}));
    let (status, _, _) = append(json!({"records": [{"body": "c"}], "fencing_token": "w1"})).await;
    assert_eq!(status, StatusCode::OK);

    // Trim to 2 (through base64, as in the docs): reads start at the first kept record.
    let (status, _, _) = api
        .call(
            Method::POST,
            path,
            Some(BASIN),
            Some(json!({"records": [{"headers": [["", "dHJpbQ=="]], "body": "AAAAAAAAAAI="}]})),
            &[("s2-format", "base64")],
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (_, batch, _) = api
        .call(
            Method::GET,
            &format!("{path}?seq_num=0"),
            Some(BASIN),
            None,
            &[],
        )
        .await;
    assert_eq!(batch["records"][0]["seq_num"], 2);

    // 416 rules: at the tail with wait=0, beyond the tail, and clamp.
    let (_, tail, _) = api
        .call(Method::GET, &format!("{path}/tail"), Some(BASIN), None, &[])
        .await;
    let tail_seq = tail["tail"]["seq_num"].as_u64().unwrap();
    assert_eq!(tail_seq, 5);
    for query in [
        format!("seq_num={tail_seq}"),
        format!("seq_num={}", tail_seq + 5),
        "tail_offset=0".into(),
    ] {
        let (status, body, _) = api
            .call(
                Method::GET,
                &format!("{path}?{query}"),
                Some(BASIN),
                None,
                &[],
            )
            .await;
        assert_eq!(status, StatusCode::RANGE_NOT_SATISFIABLE, "{query}");
        assert_eq!(body["tail"]["seq_num"], tail_seq);
    }
    let (status, batch, _) = api
        .call(
            Method::GET,
            &format!("{path}?seq_num=99&clamp=true&wait=1"),
            Some(BASIN),
            None,
            &[],
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(batch["records"], json!([]));

    // A long-poll read returns as soon as a record arrives.
    let reader = {
        let client = api.client.clone();
        let url = format!("{}/v1{path}?seq_num={tail_seq}&wait=30", api.endpoint);
        tokio::spawn(async move {
            client
                .get(url)
                .header("s2-basin", BASIN)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        })
    };
    // Time for the read to reach its wait at the tail (had it not, it would find the
    // record without waiting: the test would prove less, but still pass).
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!reader.is_finished(), "the read waits at the tail");
    append(json!({"records": [{"body": "late"}]})).await;
    // A read not woken by the append returns empty after its 30 s and fails below; the
    // bound, longer than that, only keeps a broken build from hanging.
    let batch = tokio::time::timeout(std::time::Duration::from_secs(60), reader)
        .await
        .expect("the read ends")
        .unwrap();
    assert_eq!(
        batch["records"][0]["body"], "late",
        "the read was woken by the append: {batch}"
    );
}

#[tokio::test]
async fn auto_creation_and_the_stream_config_header() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let api = Api::new(&server);
    let (status, _, _) = api
        .call(
            Method::POST,
            "/basins",
            None,
            Some(json!({"basin": "auto-basin", "config": {"create_stream_on_append": true, "create_stream_on_read": true}})),
            &[],
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _, _) = api
        .call(
            Method::POST,
            "/streams/made-by-append/records",
            Some("auto-basin"),
            Some(json!({"records": [{"body": "x"}]})),
            &[(
                "s2-stream-config",
                r#"{"retention_policy":{"age":3600},"delete_on_empty":{"min_age_secs":300}}"#,
            )],
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (_, config, _) = api
        .call(
            Method::GET,
            "/streams/made-by-append",
            Some("auto-basin"),
            None,
            &[],
        )
        .await;
    assert_eq!(config["retention_policy"], json!({"age": 3600}));
    assert_eq!(config["delete_on_empty"], json!({"min_age_secs": 300}));
    let (status, tail, _) = api
        .call(
            Method::GET,
            "/streams/made-by-read/records/tail",
            Some("auto-basin"),
            None,
            &[],
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(tail["tail"]["seq_num"], 0);
    let (_, list, _) = api
        .call(Method::GET, "/streams", Some("auto-basin"), None, &[])
        .await;
    assert_eq!(list["streams"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn http2_prior_knowledge_and_compression() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let h2 = streamgate_tests::client_builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let response = h2
        .post(format!("{}/v1/basins", server.endpoint))
        .json(&json!({"basin": "h2-basin-1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    assert_eq!(response.status(), StatusCode::CREATED);

    // `gzip` and `zstd` both ways: append bodies the client compressed are decoded (a
    // body not decoded is no JSON, and refused), and large responses are compressed
    // in the encoding asked for, holding what was stored.
    let api = Api::new(&server);
    let (status, _, _) = api
        .call(
            Method::POST,
            "/streams",
            Some("h2-basin-1"),
            Some(json!({"stream": "big"})),
            &[],
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let raw = streamgate_tests::client_builder()
        .no_gzip()
        .no_zstd()
        .build()
        .unwrap();
    let mut expected = Vec::new();
    for encoding in ["gzip", "zstd"] {
        let bodies: Vec<String> = (0..25)
            .map(|i| format!("{encoding} record {i} {}", "x".repeat(100)))
            .collect();
        let records: Vec<Value> = bodies.iter().map(|b| json!({ "body": b })).collect();
        let plain = serde_json::to_vec(&json!({ "records": records })).unwrap();
        let response = raw
            .post(format!("{}/v1/streams/big/records", server.endpoint))
            .header("s2-basin", "h2-basin-1")
            .header("content-type", "application/json")
            .header("content-encoding", encoding)
            .body(compress(encoding, &plain))
            .send()
            .await
            .unwrap();
        let status = response.status();
        assert_eq!(
            status,
            200,
            "{encoding}: {}",
            response.text().await.unwrap()
        );
        expected.extend(bodies);
    }
    for encoding in ["gzip", "zstd"] {
        let response = raw
            .get(format!(
                "{}/v1/streams/big/records?seq_num=0",
                server.endpoint
            ))
            .header("s2-basin", "h2-basin-1")
            .header("accept-encoding", encoding)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-encoding"], encoding);
        let compressed = response.bytes().await.unwrap();
        let batch: Value = serde_json::from_slice(&decompress(encoding, &compressed))
            .unwrap_or_else(|e| panic!("{encoding}: the decoded response is JSON: {e}"));
        let bodies: Vec<&str> = batch["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["body"].as_str().unwrap())
            .collect();
        assert_eq!(
            bodies, expected,
            "{encoding}: the response holds what was appended"
        );
    }
}

fn compress(encoding: &str, plain: &[u8]) -> Vec<u8> {
    use std::io::Write;
    match encoding {
        "gzip" => {
            let mut gzip =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            gzip.write_all(plain).unwrap();
            gzip.finish().unwrap()
        }
        "zstd" => zstd::encode_all(plain, 3).unwrap(),
        other => panic!("no encoder for {other}"),
    }
}

fn decompress(encoding: &str, compressed: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut plain = Vec::new();
    match encoding {
        "gzip" => {
            flate2::read::GzDecoder::new(compressed)
                .read_to_end(&mut plain)
                .unwrap();
        }
        "zstd" => plain = zstd::decode_all(compressed).unwrap(),
        other => panic!("no decoder for {other}"),
    }
    plain
}

/// Starts the binary with `args` (no RESP listener, any HTTP port), expecting it to
/// refuse to start: exit code 1 with a message on standard error, which is returned.
fn refused_start(args: &[&std::ffi::OsStr]) -> String {
    let refused = std::process::Command::new(streamgate_tests::binary())
        .args(args)
        .args(["--listen", "127.0.0.1:0", "--resp-listen", "off"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    stderr
}

#[tokio::test]
async fn a_second_server_on_the_same_data_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _server = Server::start(dir.path());
    let stderr = refused_start(&["--data-dir".as_ref(), dir.path().as_os_str()]);
    assert!(
        stderr.contains("already using the data directory"),
        "{stderr}"
    );
}

#[tokio::test]
async fn an_objects_directory_holding_the_data_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let stderr = refused_start(&[
        "--data-dir".as_ref(),
        data_dir.as_os_str(),
        "--objects".as_ref(),
        dir.path().as_os_str(),
    ]);
    assert!(
        stderr.contains("give --objects a directory of its own"),
        "{stderr}"
    );
}

/// The CORS answers a browser needs: preflights allowing the S2 headers (before any
/// token is checked), the origin echoed on every response including SSE, an allow-list
/// that leaves other origins out, and nothing at all with `--no-cors`.
#[tokio::test]
async fn browsers_get_cors_answers_for_the_s2_headers() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let api = Api::new(&server);
    with_stream(&api, "cors").await;
    let origin = "http://app.example.com:5173";
    let s2_headers =
        "authorization,content-type,s2-basin,s2-format,s2-encryption-key,s2-request-token";
    let bare = reqwest::Client::new();
    let preflight = |endpoint: &str, origin: &str| {
        bare.request(
            Method::OPTIONS,
            format!("{endpoint}/v1/streams/cors/records"),
        )
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", s2_headers)
    };
    let response = preflight(&server.endpoint, origin).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let header = |response: &reqwest::Response, name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    assert_eq!(
        header(&response, "access-control-allow-origin").as_deref(),
        Some(origin)
    );
    assert_eq!(
        header(&response, "access-control-allow-credentials").as_deref(),
        Some("true")
    );
    assert_eq!(
        header(&response, "access-control-allow-methods").as_deref(),
        Some("POST")
    );
    assert_eq!(
        header(&response, "access-control-allow-headers").as_deref(),
        Some(s2_headers)
    );

    // An SSE read from that origin carries the header too.
    let sse = api
        .client
        .get(format!(
            "{}/v1/streams/cors/records?seq_num=0&count=1&wait=1",
            server.endpoint
        ))
        .header("s2-basin", BASIN)
        .header("accept", "text/event-stream")
        .header("origin", origin)
        .send()
        .await
        .unwrap();
    assert_eq!(sse.status(), StatusCode::OK);
    assert_eq!(
        header(&sse, "access-control-allow-origin").as_deref(),
        Some(origin)
    );
    assert!(header(&sse, "content-type")
        .unwrap()
        .starts_with("text/event-stream"));

    // An allow-list: listed origins only.
    let listed_dir = tempfile::tempdir().unwrap();
    let listed = Server::start_with(listed_dir.path(), &["--cors-allow-origin", origin]);
    let allowed = preflight(&listed.endpoint, origin).send().await.unwrap();
    assert_eq!(
        header(&allowed, "access-control-allow-origin").as_deref(),
        Some(origin)
    );
    let other = preflight(&listed.endpoint, "https://elsewhere.example")
        .send()
        .await
        .unwrap();
    assert_eq!(header(&other, "access-control-allow-origin"), None);

    // Off: no CORS headers, and a preflight is just an unknown method.
    let off_dir = tempfile::tempdir().unwrap();
    let off = Server::start_with(off_dir.path(), &["--no-cors"]);
    let response = preflight(&off.endpoint, origin).send().await.unwrap();
    assert_eq!(header(&response, "access-control-allow-origin"), None);
    assert!(off.banner.contains("same origin only"), "{}", off.banner);
    assert!(
        server.banner.contains("pages of any origin"),
        "{}",
        server.banner
    );
}

/// A basin's `scope` (the v1 spec's field) must name the location the server offers
/// (`--location`); it is reported back when it is one of the spec's scope values.
#[tokio::test]
async fn basin_scope_is_checked_against_the_location() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(dir.path(), &["--location", "aws:us-east-1"]);
    let api = Api::new(&server);
    let (status, info, _) = api
        .call(
            Method::POST,
            "/basins",
            None,
            Some(json!({"basin": "scoped-basin", "scope": "aws:us-east-1"})),
            &[],
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{info}");
    assert_eq!(info["scope"], "aws:us-east-1");
    assert_eq!(info["location"], "aws:us-east-1");
    let (status, err, _) = api
        .call(
            Method::PUT,
            "/basins/other-basin",
            None,
            Some(json!({"scope": "aws:eu-north-1"})),
            &[],
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let message = err["message"].as_str().unwrap();
    assert!(
        message.contains("`aws:eu-north-1`") && message.contains("`aws:us-east-1`"),
        "{message}"
    );
    let (_, locations, _) = api.call(Method::GET, "/locations", None, None, &[]).await;
    assert_eq!(locations[0]["name"], "aws:us-east-1");
}

/// The dashboard's assets come from the binary, with a Content-Security-Policy that
/// allows only this origin; the banner links to it with the root token in the
/// fragment; `--no-dashboard` leaves a clear 404.
#[tokio::test]
async fn the_dashboard_is_served_with_a_strict_policy_and_can_be_turned_off() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    assert!(
        server.banner.contains(&format!(
            "dashboard:     {}/dashboard#token={}",
            server.endpoint,
            streamgate_tests::ROOT_TOKEN
        )),
        "{}",
        server.banner
    );
    let bare = reqwest::Client::new();
    for (path, content_type) in [
        ("/dashboard", "text/html"),
        ("/dashboard/app.js", "text/javascript"),
        ("/dashboard/app.css", "text/css"),
    ] {
        let response = bare
            .get(format!("{}{path}", server.endpoint))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default()
        };
        assert!(header("content-type").starts_with(content_type), "{path}");
        assert!(header("content-security-policy").contains("script-src 'self'"));
        assert_eq!(header("x-content-type-options"), "nosniff");
    }
    let info: Value = bare
        .get(format!("{}/dashboard/server.json", server.endpoint))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        info["resp"],
        format!("redis://127.0.0.1:{}", server.resp_port)
    );

    let off_dir = tempfile::tempdir().unwrap();
    let off = Server::start_with(off_dir.path(), &["--no-dashboard"]);
    assert!(!off.banner.contains("dashboard:"), "{}", off.banner);
    let response = bare
        .get(format!("{}/dashboard", off.endpoint))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert!(response.text().await.unwrap().contains("--no-dashboard"));
}
