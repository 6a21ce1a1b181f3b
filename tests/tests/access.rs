//! Access tokens on the real binary: issue / list / revoke with the documented rules,
//! and one authorization matrix — each operation × token scope — asserted identically
//! through REST, S2S sessions, SSE, RESP and OTLP.

use std::time::Duration;

use reqwest::{Client, StatusCode};
use serde_json::{json, Value};
use streamgate_tests::resp::{Connection, Reply};
use streamgate_tests::sse::SseSession;
use streamgate_tests::{path_segment, wire, Server, ROOT_TOKEN};

const BASIN_A: &str = "access-basin-a";
const BASIN_B: &str = "access-basin-b";

fn bearer(client: reqwest::RequestBuilder, token: &str) -> reqwest::RequestBuilder {
    client.header("authorization", format!("Bearer {token}"))
}

/// A client that sends no token of its own.
fn anonymous() -> Client {
    Client::builder().build().unwrap()
}

async fn issue(endpoint: &str, issuer: &str, body: Value) -> (StatusCode, Value) {
    let response = bearer(
        anonymous().post(format!("{endpoint}/v1/access-tokens")),
        issuer,
    )
    .json(&body)
    .send()
    .await
    .unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn issue_ok(endpoint: &str, body: Value) -> String {
    let (status, reply) = issue(endpoint, ROOT_TOKEN, body).await;
    assert_eq!(status, 201, "{reply}");
    reply["access_token"].as_str().unwrap().to_owned()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Allowed,
    Denied,
    Unauthenticated,
}

/// An HTTP answer as an outcome, checking the documented error codes.
async fn outcome(response: reqwest::Response) -> Outcome {
    let status = response.status();
    if status.is_success() {
        return Outcome::Allowed;
    }
    let body = response.text().await.unwrap_or_default();
    match status.as_u16() {
        401 => {
            if !body.is_empty() && !body.starts_with('\n') && body.starts_with('{') {
                let error: Value = serde_json::from_str(&body).unwrap();
                // REST errors carry `authn`; OTLP carries a google.rpc.Status.
                assert!(error["code"] == "authn" || error["code"] == 16, "{body}");
            }
            Outcome::Unauthenticated
        }
        403 => {
            let error: Value = serde_json::from_str(&body).unwrap();
            assert!(
                error["code"] == "permission_denied" || error["code"] == 7,
                "{body}"
            );
            Outcome::Denied
        }
        _ => panic!("unexpected {status}: {body}"),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Append,
    Read,
    CheckTail,
}

async fn list_tokens(endpoint: &str, token: &str) -> Value {
    let response = bearer(
        anonymous().get(format!("{endpoint}/v1/access-tokens?prefix=")),
        token,
    )
    .send()
    .await
    .unwrap();
    assert_eq!(response.status(), 200);
    response.json::<Value>().await.unwrap()
}

/// Each front end's way to perform `op` on a stream with `token`.
struct FrontEnds {
    endpoint: String,
    resp_port: u16,
}

impl FrontEnds {
    async fn rest(&self, token: &str, op: Op, basin: &str, stream: &str) -> Outcome {
        let url = format!(
            "{}/v1/streams/{}/records",
            self.endpoint,
            path_segment(stream)
        );
        let request = match op {
            Op::Append => anonymous()
                .post(&url)
                .json(&json!({"records": [{"body": "x"}]})),
            Op::Read => anonymous().get(format!("{url}?seq_num=0&count=1")),
            Op::CheckTail => anonymous().get(format!("{url}/tail")),
        };
        outcome(
            bearer(request, token)
                .header("s2-basin", basin)
                .send()
                .await
                .unwrap(),
        )
        .await
    }

    async fn sse(&self, token: &str, basin: &str, stream: &str) -> Outcome {
        let url = format!(
            "{}/v1/streams/{}/records?seq_num=0&count=1",
            self.endpoint,
            path_segment(stream)
        );
        let request = bearer(anonymous().get(url), token)
            .header("s2-basin", basin)
            .header("accept", "text/event-stream");
        let response = request.send().await.unwrap();
        let result = outcome(response).await;
        result
    }

    /// One input through an S2S append session over HTTP/2; allowed means acknowledged.
    async fn s2s_append(&self, token: &str, basin: &str, stream: &str) -> Outcome {
        let frame = wire::s2s_frame(&wire::encode_append_input(&[b"s2s"]));
        let h2 = Client::builder().http2_prior_knowledge().build().unwrap();
        let url = format!(
            "{}/v1/streams/{}/records",
            self.endpoint,
            path_segment(stream)
        );
        let response = bearer(h2.post(url), token)
            .header("s2-basin", basin)
            .header("content-type", "s2s/proto")
            .body(frame)
            .send()
            .await
            .unwrap();
        if !response.status().is_success() {
            return outcome(response).await;
        }
        let mut buffer = response.bytes().await.unwrap().to_vec();
        let (flags, _) = wire::take_s2s_frame(&mut buffer).expect("a frame");
        assert_eq!(
            flags & 0x80,
            0,
            "the first frame is an ack, not a terminal error"
        );
        Outcome::Allowed
    }

    /// A Redis command after `AUTH <basin> <token>`: `WRONGPASS` is unauthenticated,
    /// `NOPERM` denied, any other reply (not an error) allowed.
    async fn resp(&self, token: &str, basin: &str, command: &[&str]) -> Outcome {
        let mut connection = Connection::open(self.resp_port, None).await.unwrap();
        match connection.call(&["AUTH", basin, token]).await.unwrap() {
            Reply::Error(error) if error.starts_with("WRONGPASS") => {
                return Outcome::Unauthenticated
            }
            Reply::Simple(ok) if ok == "OK" => {}
            other => panic!("AUTH answered {other:?}"),
        }
        match connection.call(command).await.unwrap() {
            Reply::Error(error) if error.starts_with("NOPERM") => Outcome::Denied,
            Reply::Error(error) => panic!("{command:?}: {error}"),
            _ => Outcome::Allowed,
        }
    }

    async fn otlp_append(&self, token: &str, basin: &str, stream: &str) -> Outcome {
        let export = json!({"resourceLogs": [{
            "resource": {"attributes": [{"key": "s2.stream", "value": {"stringValue": stream}}]},
            "scopeLogs": [{"logRecords": [{"body": {"stringValue": "otlp"}}]}]
        }]});
        let response = bearer(
            anonymous().post(format!("{}/otlp/v1/logs", self.endpoint)),
            token,
        )
        .header("s2-basin", basin)
        .json(&export)
        .send()
        .await
        .unwrap();
        outcome(response).await
    }

    /// `op` through every front end that can perform it, named.
    async fn all(
        &self,
        token: &str,
        op: Op,
        basin: &str,
        stream: &str,
    ) -> Vec<(&'static str, Outcome)> {
        let mut results = vec![("rest", self.rest(token, op, basin, stream).await)];
        match op {
            Op::Append => {
                results.push(("s2s", self.s2s_append(token, basin, stream).await));
                results.push((
                    "resp",
                    self.resp(token, basin, &["XADD", stream, "*", "f", "v"])
                        .await,
                ));
                results.push(("otlp", self.otlp_append(token, basin, stream).await));
            }
            Op::Read => {
                results.push(("sse", self.sse(token, basin, stream).await));
                results.push((
                    "resp",
                    self.resp(token, basin, &["XRANGE", stream, "-", "+", "COUNT", "1"])
                        .await,
                ));
            }
            Op::CheckTail => {
                results.push(("resp", self.resp(token, basin, &["XLEN", stream]).await));
            }
        }
        results
    }
}

fn scope(basins: Value, streams: Value, stream_read: bool, stream_write: bool) -> Value {
    json!({
        "basins": basins,
        "streams": streams,
        "op_groups": {"stream": {"read": stream_read, "write": stream_write}}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_front_end_enforces_the_same_authorization_matrix() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let endpoint = server.endpoint.clone();
    let targets = [
        (BASIN_A, "allowed/s"),
        (BASIN_A, "other"),
        (BASIN_B, "allowed/s"),
    ];
    for (basin, stream) in targets {
        streamgate_tests::create_streams(&endpoint, basin, &[stream]).await;
    }
    let everything = json!({"prefix": ""});
    let mut tokens = vec![
        ("all", issue_ok(&endpoint, json!({"id": "m/all", "scope": scope(everything.clone(), everything.clone(), true, true)})).await),
        ("basin-exact", issue_ok(&endpoint, json!({"id": "m/basin", "scope": scope(json!({"exact": BASIN_A}), everything.clone(), true, true)})).await),
        ("stream-prefix", issue_ok(&endpoint, json!({"id": "m/prefix", "scope": scope(everything.clone(), json!({"prefix": "allowed/"}), true, true)})).await),
        ("read-only", issue_ok(&endpoint, json!({"id": "m/read", "scope": scope(everything.clone(), everything.clone(), true, false)})).await),
    ];
    let expires_at = time::OffsetDateTime::now_utc() + time::Duration::seconds(2);
    let expiring = issue_ok(&endpoint, json!({
        "id": "m/expired",
        "expires_at": expires_at.format(&time::format_description::well_known::Rfc3339).unwrap(),
        "scope": scope(everything.clone(), everything.clone(), true, true)
    }))
    .await;
    let revoked = issue_ok(&endpoint, json!({"id": "m/revoked", "scope": scope(everything.clone(), everything.clone(), true, true)})).await;
    let response = bearer(
        anonymous().delete(format!("{endpoint}/v1/access-tokens/m%2Frevoked")),
        ROOT_TOKEN,
    )
    .send()
    .await
    .unwrap();
    assert_eq!(response.status(), 204);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    tokens.push(("expired", expiring));
    tokens.push(("revoked", revoked));
    tokens.push((
        "unknown",
        "sgt_0000000000000000000000000000000000000000000000000000000000000000".into(),
    ));

    let expected = |token: &str, op: Op, basin: &str, stream: &str| match token {
        "all" => Outcome::Allowed,
        "basin-exact" if basin == BASIN_A => Outcome::Allowed,
        "basin-exact" => Outcome::Denied,
        "stream-prefix" if stream.starts_with("allowed/") => Outcome::Allowed,
        "stream-prefix" => Outcome::Denied,
        "read-only" if op == Op::Append => Outcome::Denied,
        "read-only" => Outcome::Allowed,
        _ => Outcome::Unauthenticated,
    };
    let front_ends = FrontEnds {
        endpoint: endpoint.clone(),
        resp_port: server.resp_port,
    };
    let mut checked = 0;
    for (name, token) in &tokens {
        for op in [Op::Append, Op::Read, Op::CheckTail] {
            for (basin, stream) in targets {
                let want = expected(name, op, basin, stream);
                for (front_end, got) in front_ends.all(token, op, basin, stream).await {
                    assert_eq!(
                        got, want,
                        "{name} token, {op:?} on {basin}/{stream} via {front_end}"
                    );
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 7 * 3 * (4 + 3 + 2));

    // No token at all.
    let response = anonymous()
        .get(format!("{endpoint}/v1/basins"))
        .send()
        .await
        .unwrap();
    assert_eq!(outcome(response).await, Outcome::Unauthenticated);
}

#[tokio::test]
async fn tokens_are_issued_listed_and_revoked_by_the_rules() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let endpoint = server.endpoint.clone();

    // A service token that may manage tokens under `svc/`, and use streams under `app/`.
    let issuer = issue_ok(
        &endpoint,
        json!({
            "id": "svc/issuer",
            "scope": {
                "basins": {"prefix": ""},
                "streams": {"prefix": "app/"},
                "access_tokens": {"prefix": "svc/"},
                "op_groups": {"stream": {"read": true, "write": true}},
                "ops": ["issue-access-token", "list-access-tokens", "revoke-access-token"]
            }
        }),
    )
    .await;

    // Narrower: fine. Broader streams, another id space, or a group it lacks: 403.
    let narrower = json!({"id": "svc/reader", "scope": {"basins": {"prefix": ""}, "streams": {"prefix": "app/x/"}, "ops": ["read", "check-tail"]}});
    let (status, reply) = issue(&endpoint, &issuer, narrower.clone()).await;
    assert_eq!(status, 201, "{reply}");
    let reader = reply["access_token"].as_str().unwrap().to_owned();
    for (what, body) in [
        (
            "broader streams",
            json!({"id": "svc/wide", "scope": {"streams": {"prefix": ""}, "ops": ["read"]}}),
        ),
        (
            "id outside svc/",
            json!({"id": "user/x", "scope": {"streams": {"prefix": "app/"}, "ops": ["read"]}}),
        ),
        (
            "account group",
            json!({"id": "svc/acct", "scope": {"op_groups": {"account": {"read": true}}}}),
        ),
        (
            "stream group from ops",
            json!({"id": "svc/grp", "scope": {"streams": {"prefix": "app/"}, "op_groups": {"basin": {"read": true}}}}),
        ),
    ] {
        let (status, reply) = issue(&endpoint, &issuer, body).await;
        assert_eq!(status, 403, "{what}: {reply}");
        assert_eq!(reply["code"], "permission_denied", "{what}");
    }
    // Invalid requests and duplicates.
    let (status, reply) = issue(&endpoint, &issuer, json!({"id": "svc/none", "scope": {}})).await;
    assert_eq!(
        (status.as_u16(), reply["code"].as_str()),
        (422, Some("invalid"))
    );
    let (status, reply) = issue(&endpoint, &issuer, narrower).await;
    assert_eq!(
        (status.as_u16(), reply["code"].as_str()),
        (409, Some("resource_already_exists"))
    );

    // The reader reads under app/x/ only; it cannot issue or list tokens.
    streamgate_tests::create_streams(&endpoint, BASIN_A, &["app/x/1", "app/y"]).await;
    let read = |stream: &str| {
        let url = format!(
            "{endpoint}/v1/streams/{}/records/tail",
            path_segment(stream)
        );
        bearer(anonymous().get(url), &reader)
            .header("s2-basin", BASIN_A)
            .send()
    };
    assert_eq!(read("app/x/1").await.unwrap().status(), 200);
    assert_eq!(read("app/y").await.unwrap().status(), 403);
    let (status, _) = issue(
        &endpoint,
        &reader,
        json!({"id": "svc/z", "scope": {"ops": ["read"]}}),
    )
    .await;
    assert_eq!(status, 403);

    // Listing shows only what the issuer's matcher covers, never a secret.
    let listed = list_tokens(&endpoint, &issuer).await;
    let ids: Vec<&str> = listed["access_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["svc/issuer", "svc/reader"]);
    let text = listed.to_string();
    assert!(
        !text.contains(&reader) && !text.contains("sgt_"),
        "no secrets in listings"
    );
    let entry = &listed["access_tokens"][1];
    assert_eq!(entry["scope"]["streams"], json!({"prefix": "app/x/"}));
    assert_eq!(entry["scope"]["ops"], json!(["read", "check-tail"]));
    assert_eq!(
        entry["scope"]["op_groups"]["account"],
        json!({"read": false, "write": false})
    );
    assert_eq!(entry["expires_at"], Value::Null);
    assert_eq!(entry["auto_prefix_streams"], false);
    let all = list_tokens(&endpoint, ROOT_TOKEN).await;
    assert_eq!(
        all["access_tokens"].as_array().unwrap().len(),
        3,
        "root sees root too"
    );

    // Revocation: immediate here; unknown ids are 404.
    let revoke = |id: &str, token: &str| {
        bearer(
            anonymous().delete(format!("{endpoint}/v1/access-tokens/{id}")),
            token,
        )
        .send()
    };
    assert_eq!(revoke("svc%2Freader", &issuer).await.unwrap().status(), 204);
    assert_eq!(read("app/x/1").await.unwrap().status(), 401);
    let gone = revoke("svc%2Freader", &issuer).await.unwrap();
    assert_eq!(gone.status(), 404);
    assert_eq!(
        gone.json::<Value>().await.unwrap()["code"],
        "access_token_not_found"
    );
    assert_eq!(revoke("root", &issuer).await.unwrap().status(), 403);
}

#[tokio::test]
async fn auto_prefixed_tokens_see_a_namespace_on_every_front_end() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let endpoint = server.endpoint.clone();
    streamgate_tests::create_streams(&endpoint, BASIN_A, &["elsewhere"]).await;
    let tenant = issue_ok(&endpoint, json!({
        "id": "tenant-1",
        "auto_prefix_streams": true,
        "scope": {
            "basins": {"exact": BASIN_A},
            "streams": {"prefix": "tenant-1/"},
            "op_groups": {"basin": {"read": true, "write": true}, "stream": {"read": true, "write": true}}
        }
    }))
    .await;
    let as_tenant =
        |request: reqwest::RequestBuilder| bearer(request, &tenant).header("s2-basin", BASIN_A);
    let created = as_tenant(anonymous().post(format!("{endpoint}/v1/streams")))
        .json(&json!({"stream": "events"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    assert_eq!(created.json::<Value>().await.unwrap()["name"], "events");

    let front_ends = FrontEnds {
        endpoint: endpoint.clone(),
        resp_port: server.resp_port,
    };
    assert_eq!(
        front_ends
            .rest(&tenant, Op::Append, BASIN_A, "events")
            .await,
        Outcome::Allowed
    );
    assert_eq!(
        front_ends
            .resp(&tenant, BASIN_A, &["XADD", "events", "*", "f", "v"])
            .await,
        Outcome::Allowed
    );
    assert_eq!(
        front_ends.otlp_append(&tenant, BASIN_A, "events").await,
        Outcome::Allowed
    );

    // The tenant lists its own streams without the prefix, and nothing else.
    let listed =
        streamgate_tests::json_of(as_tenant(anonymous().get(format!("{endpoint}/v1/streams"))))
            .await;
    let names: Vec<&str> = listed["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["events"]);

    // Stored under the prefix, with all three appends.
    let records = streamgate_tests::read_stream(&endpoint, BASIN_A, "tenant-1/events").await;
    assert_eq!(records.len(), 3);
    let missing = as_tenant(anonymous().get(format!("{endpoint}/v1/streams/nope/records/tail")))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let message = missing.json::<Value>().await.unwrap()["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains("`nope`") && !message.contains("tenant-1/"),
        "{message}"
    );
}

#[test]
fn the_first_start_creates_a_root_token_file_readable_only_by_its_owner() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let status = |server: &Server, token: &str| {
        runtime.block_on(async {
            bearer(
                anonymous().get(format!("{}/v1/basins", server.endpoint)),
                token,
            )
            .send()
            .await
            .unwrap()
            .status()
        })
    };
    let mut server = Server::start_without_root_token(dir.path());
    let file = dir.path().join("root-token");
    let secret = std::fs::read_to_string(&file).unwrap().trim().to_owned();
    assert!(secret.starts_with("sgt_") && secret.len() == 68);
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert!(server
        .banner
        .contains(&format!("export S2_ACCESS_TOKEN={secret}")));
    assert_eq!(status(&server, &secret), 200);

    // A restart keeps the same root token and shows it again.
    server.restart();
    assert!(server
        .banner
        .contains(&format!("export S2_ACCESS_TOKEN={secret}")));
    assert_eq!(status(&server, &secret), 200);
    server.kill9();

    // --root-token replaces it, and the file of the old one goes.
    let chosen = "an-operator-chosen-root-token-42";
    let server = Server::start_with(dir.path(), &["--root-token", chosen]);
    assert_eq!(status(&server, chosen), 200);
    assert_eq!(status(&server, &secret), 401);
    assert!(!file.exists());
}

#[tokio::test]
async fn redis_commands_need_the_operations_of_the_documented_permission_table() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let endpoint = server.endpoint.clone();
    streamgate_tests::create_streams(&endpoint, BASIN_A, &["k"]).await;
    let with_ops = |id: &str, ops: Value| json!({"id": id, "scope": {"basins": {"prefix": ""}, "streams": {"prefix": ""}, "ops": ops}});
    let append_only = issue_ok(&endpoint, with_ops("r/append", json!(["append"]))).await;
    let read_only = issue_ok(&endpoint, with_ops("r/read", json!(["read"]))).await;
    let config_only = issue_ok(
        &endpoint,
        with_ops("r/config", json!(["get-stream-config"])),
    )
    .await;
    let trimmer = issue_ok(
        &endpoint,
        with_ops("r/trim", json!(["append", "read", "check-tail", "trim"])),
    )
    .await;
    let resp = FrontEnds {
        endpoint,
        resp_port: server.resp_port,
    };
    use Outcome::*;
    let cases: [(&str, &[&str], Outcome); 12] = [
        (&append_only, &["XADD", "k", "*", "f", "v"], Allowed),
        (
            &append_only,
            &["XADD", "k", "NOMKSTREAM", "*", "f", "v"],
            Denied,
        ),
        (
            &append_only,
            &["XADD", "k", "MAXLEN", "~", "5", "*", "f", "v"],
            Denied,
        ),
        (&append_only, &["XLEN", "k"], Denied),
        (&read_only, &["XRANGE", "k", "-", "+"], Denied),
        (
            &read_only,
            &["XREAD", "BLOCK", "10", "STREAMS", "k", "0-0"],
            Allowed,
        ),
        (&read_only, &["XREAD", "STREAMS", "k", "0-0"], Denied),
        (&config_only, &["EXISTS", "k"], Allowed),
        (&config_only, &["TYPE", "k"], Allowed),
        (&config_only, &["XLEN", "k"], Denied),
        (&trimmer, &["XTRIM", "k", "MAXLEN", "~", "0"], Allowed),
        (
            &trimmer,
            &["XADD", "k", "MINID", "~", "0", "*", "f", "v"],
            Allowed,
        ),
    ];
    for (token, command, want) in cases {
        assert_eq!(
            resp.resp(token, BASIN_A, command).await,
            want,
            "{command:?}"
        );
    }
}

/// Appends one record to `stream` of `BASIN_A` with the root token.
async fn append_as_root(endpoint: &str, stream: &str, body: &str) -> reqwest::StatusCode {
    streamgate_tests::client()
        .post(format!("{endpoint}/v1/streams/{stream}/records"))
        .header("s2-basin", BASIN_A)
        .json(&json!({"records": [{"body": body}]}))
        .send()
        .await
        .unwrap()
        .status()
}

/// A following SSE session of the stream `stream`, as the holder of `token`.
async fn open_sse(endpoint: &str, token: &str, stream: &str) -> SseSession {
    SseSession::open(
        bearer(
            anonymous().get(format!("{endpoint}/v1/streams/{stream}/records?seq_num=0")),
            token,
        )
        .header("s2-basin", BASIN_A)
        .header("accept", "text/event-stream"),
    )
    .await
}

#[tokio::test]
async fn revocation_reaches_open_sessions_and_connections() {
    use futures::StreamExt;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let endpoint = server.endpoint.clone();
    streamgate_tests::create_streams(&endpoint, BASIN_A, &["live"]).await;
    let everything = json!({"prefix": ""});
    let token = issue_ok(
        &endpoint,
        json!({"id": "live", "scope": scope(everything.clone(), everything, true, true)}),
    )
    .await;
    // A following SSE session and an authenticated RESP connection, both working.
    let mut sse = open_sse(&endpoint, &token, "live").await;
    assert_eq!(append_as_root(&endpoint, "live", "before").await, 200);
    sse.read_until("before").await;

    // An S2S append session, with one input acknowledged.
    let (inputs, input_stream) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
    let input_stream = futures::stream::unfold(input_stream, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let input = |body: &[u8]| Ok(wire::s2s_frame(&wire::encode_append_input(&[body])));
    inputs.send(input(b"via-session-1")).await.unwrap();
    let h2 = Client::builder().http2_prior_knowledge().build().unwrap();
    let session = bearer(
        h2.post(format!("{endpoint}/v1/streams/live/records")),
        &token,
    )
    .header("s2-basin", BASIN_A)
    .header("content-type", "s2s/proto")
    .body(reqwest::Body::wrap_stream(input_stream))
    .send()
    .await
    .unwrap();
    assert_eq!(session.status(), 200);
    let mut session_frames = session.bytes_stream();
    let mut session_buffer = Vec::new();
    macro_rules! next_frame {
        () => {
            loop {
                if let Some(frame) = wire::take_s2s_frame(&mut session_buffer) {
                    break frame;
                }
                let chunk = tokio::time::timeout(Duration::from_secs(20), session_frames.next())
                    .await
                    .expect("the session answers")
                    .expect("the session is open")
                    .unwrap();
                session_buffer.extend_from_slice(&chunk);
            }
        };
    }
    let (flags, _) = next_frame!();
    assert_eq!(
        flags & 0x80,
        0,
        "the append session acknowledges before revocation"
    );

    let mut resp = Connection::open(server.resp_port, None).await.unwrap();
    let xadd = ["XADD", "live", "*", "f", "v"];
    let auth = ["AUTH", BASIN_A, token.as_str()];
    assert_eq!(resp.call(&auth).await.unwrap(), Reply::Simple("OK".into()));
    assert!(
        matches!(resp.call(&xadd).await.unwrap(), Reply::Bulk(Some(_))),
        "XADD works before revocation"
    );

    let revoked = bearer(
        anonymous().delete(format!("{endpoint}/v1/access-tokens/live")),
        ROOT_TOKEN,
    )
    .send()
    .await
    .unwrap();
    assert_eq!(revoked.status(), 204);

    // The RESP connection is no longer authenticated, and stays open for a new AUTH.
    let refused = resp.call(&xadd).await.unwrap();
    assert!(
        matches!(&refused, Reply::Error(e) if e.starts_with("NOAUTH") && e.contains("revoked")),
        "{refused:?}"
    );
    let again = resp.call(&auth).await.unwrap();
    assert!(
        matches!(&again, Reply::Error(e) if e.starts_with("WRONGPASS")),
        "{again:?}"
    );

    // The append session's next input is refused: a terminal `401 authn` frame.
    inputs.send(input(b"via-session-2")).await.unwrap();
    let (flags, terminal) = next_frame!();
    assert_ne!(flags & 0x80, 0, "a terminal frame, not an ack");
    assert_eq!(u16::from_be_bytes([terminal[0], terminal[1]]), 401);
    let error: Value = serde_json::from_slice(&terminal[2..]).unwrap();
    assert_eq!(error["code"], "authn", "{error}");

    // The SSE session ends with an authn error instead of delivering the next record.
    assert_eq!(append_as_root(&endpoint, "live", "after").await, 200);
    sse.read_until("event: error").await;
    assert!(sse.seen.contains("authn"), "{}", sse.seen);
    assert!(!sse.seen.contains("after"), "{}", sse.seen);

    // What was acknowledged is there; what the revoked token sent is not.
    let bodies: Vec<String> = streamgate_tests::read_stream(&endpoint, BASIN_A, "live")
        .await
        .iter()
        .map(|r| r["body"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert!(bodies.iter().any(|b| b == "via-session-1"), "{bodies:?}");
    assert!(!bodies.iter().any(|b| b == "via-session-2"), "{bodies:?}");
}

/// An open session ends when its token expires: a batch after the expiry is refused,
/// though the token's last verification is younger than the verification cache's TTL.
#[tokio::test]
async fn an_open_session_ends_when_its_token_expires() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let endpoint = server.endpoint.clone();
    streamgate_tests::create_streams(&endpoint, BASIN_A, &["expiring"]).await;
    let everything = json!({"prefix": ""});
    let expires_at = time::OffsetDateTime::now_utc() + time::Duration::seconds(3);
    let token = issue_ok(
        &endpoint,
        json!({
            "id": "expiring",
            "expires_at": expires_at.format(&time::format_description::well_known::Rfc3339).unwrap(),
            "scope": scope(everything.clone(), everything, true, true)
        }),
    )
    .await;
    let mut sse = open_sse(&endpoint, &token, "expiring").await;
    assert_eq!(append_as_root(&endpoint, "expiring", "before").await, 200);
    sse.read_until("before").await;
    assert!(
        time::OffsetDateTime::now_utc() < expires_at,
        "the first record was delivered before the expiry"
    );

    let left = expires_at - time::OffsetDateTime::now_utc();
    tokio::time::sleep(Duration::try_from(left).unwrap() + Duration::from_millis(300)).await;
    assert_eq!(append_as_root(&endpoint, "expiring", "after").await, 200);
    sse.read_until("event: error").await;
    assert!(sse.seen.contains("authn"), "{}", sse.seen);
    assert!(!sse.seen.contains("after"), "{}", sse.seen);
}

/// A RESP connection that has not authenticated is served (with `NOAUTH`) until its
/// 30 s are up, then told why and closed; one that authenticated at once stays.
#[tokio::test]
async fn redis_connections_must_authenticate_within_30_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    streamgate_tests::create_streams(&server.endpoint, BASIN_A, &[]).await;
    let mut idle = Connection::open(server.resp_port, None).await.unwrap();
    let mut authenticated = Connection::open(server.resp_port, Some(BASIN_A))
        .await
        .unwrap();
    let ping = ["PING"];

    // Well inside its 30 s (and past any shorter limit a bug might set), the
    // unauthenticated connection is still open and answered.
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(
        idle.call(&ping).await.unwrap(),
        Reply::Error("NOAUTH Authentication required.".into())
    );

    // Then the server gives up on it (the bound only keeps a broken build from hanging).
    let reply = tokio::time::timeout(Duration::from_secs(40), idle.reply())
        .await
        .expect("the server gives up on the connection")
        .unwrap();
    assert!(
        matches!(&reply, Reply::Error(e) if e.starts_with("ERR not authenticated within 30 seconds")),
        "{reply:?}"
    );
    let closed = idle.reply().await.map(|r| format!("{r:?}"));
    assert!(
        matches!(&closed, Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof),
        "and closes it: {closed:?}"
    );

    // The connection that authenticated at once is served as before.
    assert_eq!(
        authenticated.call(&ping).await.unwrap(),
        Reply::Simple("PONG".into())
    );
}
