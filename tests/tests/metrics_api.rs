//! The metrics API against the real binary: known appends, reads and control calls are
//! counted exactly (operations per connection and minute, metered bytes, by storage
//! class and read kind), buckets start on their interval's boundaries and sum to the
//! same totals, storage gauges follow compaction, the numbers survive kill -9, bad
//! ranges and sets are refused, and a token sees only what its scope allows.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};
use streamgate_tests::{client, Server, ROOT_TOKEN};

const BASIN: &str = "metered-basin";

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn minute() -> u64 {
    now() / 60
}

async fn get_with(token: &str, url: String) -> (StatusCode, Value) {
    let response = reqwest::Client::new()
        .get(url)
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// A metrics call as root: `path` after `/v1/metrics`, then `query`.
async fn metrics(server: &Server, path: &str, query: &str) -> Value {
    let (status, body) = get_with(
        ROOT_TOKEN,
        format!("{}/v1/metrics{path}?{query}", server.endpoint),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{path}?{query}: {body}");
    body
}

/// The metric named `name` in an answer, and its type.
fn metric<'a>(answer: &'a Value, name: &str) -> Option<(&'a str, &'a Value)> {
    answer["values"].as_array().unwrap().iter().find_map(|m| {
        let (kind, body) = m.as_object().unwrap().iter().next().unwrap();
        (body["name"] == name).then_some((kind.as_str(), body))
    })
}

/// The sum of an accumulation's values (0 when the series is absent).
fn total(answer: &Value, name: &str) -> f64 {
    metric(answer, name).map_or(0.0, |(kind, body)| {
        assert_eq!(kind, "accumulation", "{body}");
        body["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p[1].as_f64().unwrap())
            .sum()
    })
}

/// Waits (up to 30 s: counts are written every 5 s) until `ready` holds for the answer.
async fn eventually(
    server: &Server,
    path: &str,
    query: &str,
    ready: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = metrics(server, path, query).await;
        if ready(&answer) {
            return answer;
        }
        assert!(
            Instant::now() < deadline,
            "{path}?{query} never got there: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn append(http: &reqwest::Client, server: &Server, stream: &str, bodies: &[&str]) {
    let records: Vec<Value> = bodies.iter().map(|b| json!({ "body": b })).collect();
    let response = http
        .post(format!("{}/v1/streams/{stream}/records", server.endpoint))
        .bearer_auth(ROOT_TOKEN)
        .header("s2-basin", BASIN)
        .json(&json!({ "records": records }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn usage_is_counted_exactly_bucketed_and_survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start_with(dir.path(), &["--storage-metrics-interval-secs", "1"]);
    let start = now() - 120;
    let api = client();
    let call = |method: reqwest::Method, path: &str| {
        api.request(method, format!("{}/v1{path}", server.endpoint))
            .header("s2-basin", BASIN)
    };
    // Control calls: one of each.
    let created = call(reqwest::Method::POST, "/basins")
        .json(&json!({ "basin": BASIN }))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    call(reqwest::Method::POST, "/streams")
        .json(&json!({"stream": "s", "config": {"storage_class": "standard"}}))
        .send()
        .await
        .unwrap();
    call(reqwest::Method::POST, "/streams")
        .json(&json!({ "stream": "x" }))
        .send()
        .await
        .unwrap();
    call(reqwest::Method::GET, "/streams/s")
        .send()
        .await
        .unwrap();
    call(reqwest::Method::GET, "/streams").send().await.unwrap();
    call(reqwest::Method::GET, "/streams/s/records/tail")
        .send()
        .await
        .unwrap();

    // Appends: three on one connection (one operation per minute it spans), two on
    // connections of their own; 12 metered bytes per 4-byte record.
    let pooled = reqwest::Client::new();
    let mut minutes = std::collections::BTreeSet::new();
    for _ in 0..3 {
        minutes.insert(minute());
        append(&pooled, &server, "s", &["aaaa", "bbbb"]).await;
        minutes.insert(minute());
    }
    for _ in 0..2 {
        append(&reqwest::Client::new(), &server, "s", &["cccc"]).await;
    }
    append(&pooled, &server, "x", &["dddddddd"]).await;
    let appended_standard = 8.0 * 12.0;
    let appended_express = 16.0;

    // Reads: two unary reads of the 8 records, and one read session (SSE) of them.
    for _ in 0..2 {
        let response = call(reqwest::Method::GET, "/streams/s/records?seq_num=0&count=8")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    let sse = call(reqwest::Method::GET, "/streams/s/records?seq_num=0&count=8")
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(sse.contains("cccc"), "{sse}");
    let read_bytes = 3.0 * appended_standard;

    let range = |interval: &str| format!("start={start}&end={}&interval={interval}", now());
    let basin_path = format!("/{BASIN}");
    let append_ops = eventually(
        &server,
        &basin_path,
        &format!("set=append-ops&{}", range("minute")),
        |a| total(a, "standard") > 0.0 && total(a, "express") > 0.0,
    )
    .await;
    assert_eq!(
        total(&append_ops, "standard"),
        (minutes.len() + 2) as f64,
        "{append_ops}"
    );
    assert_eq!(total(&append_ops, "express"), 1.0);
    let throughput = metrics(
        &server,
        &basin_path,
        &format!("set=append-throughput&{}", range("minute")),
    )
    .await;
    assert_eq!(
        total(&throughput, "standard"),
        appended_standard,
        "{throughput}"
    );
    assert_eq!(total(&throughput, "express"), appended_express);
    let (_, body) = metric(&throughput, "standard").unwrap();
    assert_eq!(body["unit"], "bytes");
    assert_eq!(body["interval"], "minute");

    let read_ops = eventually(
        &server,
        &basin_path,
        &format!("set=read-ops&{}", range("minute")),
        |a| total(a, "unary") >= 2.0 && total(a, "streaming") >= 1.0,
    )
    .await;
    assert_eq!(total(&read_ops, "unary"), 2.0, "{read_ops}");
    assert_eq!(total(&read_ops, "streaming"), 1.0, "{read_ops}");
    let read_throughput = metrics(
        &server,
        &basin_path,
        &format!("set=read-throughput&{}", range("minute")),
    )
    .await;
    assert_eq!(
        total(&read_throughput, "read-throughput"),
        read_bytes,
        "{read_throughput}"
    );

    let basin_ops = metrics(
        &server,
        &basin_path,
        &format!("set=basin-ops&{}", range("hour")),
    )
    .await;
    for (op, count) in [
        ("create-stream", 2.0),
        ("get-stream-config", 1.0),
        ("list-streams", 1.0),
        ("check-tail", 1.0),
    ] {
        assert_eq!(total(&basin_ops, op), count, "{op}: {basin_ops}");
    }

    // Buckets start on their interval's boundaries, and every interval sums the same.
    for (interval, secs) in [("minute", 60), ("hour", 3600), ("day", 86_400)] {
        let answer = metrics(&server, "", &format!("set=account-ops&{}", range(interval))).await;
        assert_eq!(total(&answer, "create-basin"), 1.0, "{interval}: {answer}");
        let (_, body) = metric(&answer, "create-basin").unwrap();
        assert_eq!(body["interval"], interval);
        for point in body["values"].as_array().unwrap() {
            assert_eq!(point[0].as_u64().unwrap() % secs, 0, "{interval}: {point}");
        }
        let answer = metrics(
            &server,
            &basin_path,
            &format!("set=append-throughput&{}", range(interval)),
        )
        .await;
        assert_eq!(total(&answer, "standard"), appended_standard, "{interval}");
    }
    // The account-ops set's default interval is the hour.
    let answer = metrics(
        &server,
        "",
        &format!("set=account-ops&start={start}&end={}", now()),
    )
    .await;
    assert_eq!(
        metric(&answer, "create-basin").unwrap().1["interval"],
        "hour"
    );

    // Storage: the bytes of the stream's segments, once compacted, at every step.
    let stream_storage = eventually(
        &server,
        &format!("{basin_path}/s"),
        &format!("set=storage&start={}&end={}", now() - 600, now()),
        |a| {
            metric(a, "storage").is_some_and(|(_, body)| {
                body["values"].as_array().unwrap().last().unwrap()[1]
                    .as_f64()
                    .unwrap()
                    > 0.0
            })
        },
    )
    .await;
    let (kind, body) = metric(&stream_storage, "storage").unwrap();
    assert_eq!(kind, "gauge");
    let points = body["values"].as_array().unwrap();
    assert_eq!(
        points.len(),
        11,
        "one reading per minute of the 10 minutes: {body}"
    );
    assert!(points
        .windows(2)
        .all(|w| w[1][0].as_u64().unwrap() - w[0][0].as_u64().unwrap() == 60));
    let stored = points.last().unwrap()[1].as_f64().unwrap();
    assert!(
        stored >= appended_standard,
        "{stored}: segments hold at least the metered bytes"
    );
    let basin_storage = eventually(
        &server,
        &basin_path,
        &format!("set=storage&start={}&end={}", now() - 7200, now()),
        |a| {
            metric(a, "storage").is_some_and(|(_, body)| {
                body["values"].as_array().unwrap().last().unwrap()[1]
                    .as_f64()
                    .unwrap()
                    > stored
            })
        },
    )
    .await;
    let (_, body) = metric(&basin_storage, "storage").unwrap();
    assert_eq!(
        body["values"].as_array().unwrap().len(),
        3,
        "hourly over two hours: {body}"
    );

    let active = metrics(
        &server,
        "",
        &format!("set=active-basins&start={start}&end={}", now()),
    )
    .await;
    assert_eq!(
        metric(&active, "active_basins").unwrap().1["values"],
        json!([BASIN])
    );

    // Everything written survives kill -9.
    server.kill9();
    server.restart();
    let again = metrics(
        &server,
        &basin_path,
        &format!("set=append-throughput&{}", range("hour")),
    )
    .await;
    assert_eq!(total(&again, "standard"), appended_standard);
    let again = metrics(
        &server,
        &basin_path,
        &format!("set=read-ops&{}", range("day")),
    )
    .await;
    assert_eq!(total(&again, "unary"), 2.0);
}

#[tokio::test]
async fn bad_requests_are_refused_and_scopes_apply() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    streamgate_tests::create_streams(&server.endpoint, BASIN, &["s"]).await;
    streamgate_tests::create_streams(&server.endpoint, "other-basin", &["s"]).await;
    let now = now();
    let cases = [
        (
            "",
            format!("set=active-basins&start={now}&end={}", now - 3600),
            "after `end`",
        ),
        (
            "",
            format!("set=active-basins&start={}&end={}", now - 3600, now + 600),
            "future",
        ),
        (
            "",
            format!("set=active-basins&start={}&end={now}", now - 91 * 86_400),
            "90 days",
        ),
        (
            "",
            format!("set=account-ops&start={}", now - 60),
            "required",
        ),
        (
            "",
            format!("set=storage&start={}&end={now}", now - 60),
            "unknown metric set",
        ),
        (
            "/metered-basin",
            format!("set=storage&start={}&end={now}&interval=minute", now - 60),
            "interval",
        ),
        (
            "/metered-basin/s",
            format!(
                "set=storage&start={}&end={now}&interval=fortnight",
                now - 60
            ),
            "fortnight",
        ),
        (
            "",
            format!("set=estimated-billable-usage&start={}&end={now}", now - 60),
            "price sheet",
        ),
    ];
    for (path, query, says) in cases {
        let (status, body) = get_with(
            ROOT_TOKEN,
            format!("{}/v1/metrics{path}?{query}", server.endpoint),
        )
        .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{query}: {body}");
        assert_eq!(body["code"], "invalid");
        assert!(
            body["message"].as_str().unwrap().contains(says),
            "{query}: {body}"
        );
    }
    // start=0, end=3600: a valid (empty) period.
    let empty = metrics(&server, "/metered-basin/s", "set=storage&start=0&end=3600").await;
    assert_eq!(
        metric(&empty, "storage").unwrap().1["values"]
            .as_array()
            .unwrap()
            .len(),
        61
    );

    // A token for one basin's metrics sees that basin's, and nothing else.
    let scope = json!({
        "basins": {"exact": BASIN},
        "streams": {"prefix": ""},
        "ops": ["basin-metrics", "stream-metrics", "account-metrics"],
    });
    let response = client()
        .post(format!("{}/v1/access-tokens", server.endpoint))
        .json(&json!({"id": "metrics-reader", "scope": scope}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let token: Value = response.json().await.unwrap();
    let token = token["access_token"].as_str().unwrap();
    let range = format!("start={}&end={now}", now - 600);
    let url =
        |path: &str, set: &str| format!("{}/v1/metrics{path}?set={set}&{range}", server.endpoint);
    assert_eq!(
        get_with(token, url("/metered-basin", "basin-ops")).await.0,
        StatusCode::OK
    );
    assert_eq!(
        get_with(token, url("/metered-basin/s", "storage")).await.0,
        StatusCode::OK
    );
    let (status, body) = get_with(token, url("/other-basin", "basin-ops")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["code"], "permission_denied");
    let (status, active) = get_with(token, url("", "active-basins")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        metric(&active, "active_basins").unwrap().1["values"],
        json!([BASIN])
    );
    let (status, all) = get_with(ROOT_TOKEN, url("", "active-basins")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        metric(&all, "active_basins").unwrap().1["values"],
        json!([BASIN, "other-basin"])
    );
}
