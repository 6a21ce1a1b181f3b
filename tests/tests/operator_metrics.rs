//! Operator metrics (`--metrics-listen`) against the real binary: after known requests
//! over REST, RESP and OTLP, the Prometheus endpoint counts them per front end,
//! operation and outcome with latency histograms, and shows the WAL, the stores,
//! compaction, open sessions (closed when their client goes away) and the build; without
//! the flag nothing listens.

use std::time::{Duration, Instant};

use serde_json::json;
use streamgate_tests::prometheus_sample as sample;
use streamgate_tests::{client, create_streams, resp, Server, ROOT_TOKEN};

const BASIN: &str = "operator-basin";

/// The Prometheus endpoint's text as it is now.
async fn scrape(metrics_url: &str) -> String {
    reqwest::get(metrics_url)
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test]
async fn requests_stores_and_sessions_are_counted_for_prometheus() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(dir.path(), &["--metrics-listen", "127.0.0.1:0"]);
    let metrics_url = server
        .metrics_url()
        .expect("the banner names the metrics endpoint");
    create_streams(&server.endpoint, BASIN, &["s", "otel"]).await;
    let http = client();
    for _ in 0..3 {
        let response = http
            .post(format!("{}/v1/streams/s/records", server.endpoint))
            .header("s2-basin", BASIN)
            .json(&json!({"records": [{"body": "x"}]}))
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success());
    }
    let missing = http
        .get(format!(
            "{}/v1/streams/missing/records/tail",
            server.endpoint
        ))
        .header("s2-basin", BASIN)
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let mut redis = resp::Connection::open(server.resp_port, Some(BASIN))
        .await
        .unwrap();
    redis.call(&["AUTH", BASIN, ROOT_TOKEN]).await.unwrap();
    redis.call(&["XADD", "s", "*", "f", "v"]).await.unwrap();
    // Four more in one write, which the server appends together and records in one
    // metrics call: each XADD must still count (and be timed) as a request of its own.
    let pipelined: Vec<Vec<String>> = (0..4)
        .map(|i| {
            ["XADD", "s", "*", "f", &i.to_string()]
                .map(String::from)
                .to_vec()
        })
        .collect();
    redis.send_pipelined(&pipelined).await.unwrap();
    for _ in 0..4 {
        redis.reply().await.unwrap();
    }
    let exported =
        streamgate_tests::export_logs(&server.endpoint, BASIN, &[("otel", "line")]).await;
    assert!(exported.status().is_success());
    // An SSE read that stays open while the metrics are read.
    let follower = http
        .get(format!(
            "{}/v1/streams/s/records?seq_num=0&wait=30",
            server.endpoint
        ))
        .header("s2-basin", BASIN)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    // Compaction runs every 300 ms; on a slow machine its first segment may take longer.
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = scrape(&metrics_url).await;
        if sample(&text, "streamgate_compaction_segments_total").is_some_and(|n| n >= 1.0) {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "no compaction round wrote a segment within 30 s: {text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let rest = |op: &str, outcome: &str| {
        sample(
            &text,
            &format!("streamgate_requests_total{{frontend=\"rest\",operation=\"{op}\",outcome=\"{outcome}\"}}"),
        )
    };
    assert_eq!(
        rest("POST /v1/streams/{stream}/records", "2xx"),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        rest("GET /v1/streams/{stream}/records/tail", "4xx"),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            "streamgate_requests_total{frontend=\"resp\",operation=\"xadd\",outcome=\"ok\"}"
        ),
        Some(5.0)
    );
    assert_eq!(
        sample(
            &text,
            "streamgate_request_duration_seconds_count{frontend=\"resp\",operation=\"xadd\"}"
        ),
        Some(5.0)
    );
    assert_eq!(
        sample(
            &text,
            "streamgate_requests_total{frontend=\"otlp\",operation=\"logs\",outcome=\"2xx\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            "streamgate_otlp_exports_total{signal=\"logs\",outcome=\"ok\"}"
        ),
        Some(1.0)
    );
    assert!(text.contains(
        "streamgate_request_duration_seconds_bucket{frontend=\"rest\",operation=\"POST /v1/streams/{stream}/records\",le=\"0.005\"}"
    ));
    assert!(sample(&text, "streamgate_wal_flushes_total").unwrap() >= 5.0);
    assert!(sample(&text, "streamgate_wal_flushed_bytes_total").unwrap() > 0.0);
    assert!(text.contains("streamgate_wal_flush_duration_seconds_bucket"));
    assert!(
        sample(
            &text,
            "streamgate_object_store_requests_total{operation=\"put\",outcome=\"ok\"}"
        )
        .unwrap()
            >= 5.0
    );
    assert!(text.contains(
        "streamgate_metadata_requests_total{operation=\"creating a stream\",outcome=\"ok\"}"
    ));
    assert!(sample(&text, "streamgate_compaction_rounds_total{outcome=\"ok\"}").unwrap() >= 1.0);
    assert!(sample(&text, "streamgate_compaction_segments_total").unwrap() >= 1.0);
    assert_eq!(
        sample(&text, "streamgate_open_sessions{kind=\"sse\"}"),
        Some(1.0)
    );
    assert_eq!(sample(&text, "streamgate_resp_connections"), Some(1.0));
    assert_eq!(
        sample(
            &text,
            &format!(
                "streamgate_build_info{{version=\"{}\"}}",
                env!("CARGO_PKG_VERSION")
            )
        ),
        Some(1.0)
    );
    assert!(text.contains("# HELP streamgate_requests_total"));

    // A client that goes away ends its session on the server (the body it was reading
    // is dropped with the connection's stream), long before the session's own 30 s
    // idle timeout would have.
    drop(follower);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = scrape(&metrics_url).await;
        let open = sample(&text, "streamgate_open_sessions{kind=\"sse\"}");
        if open == Some(0.0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the SSE session is still open 10 s after its client went away: {open:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Off by default: the banner says how to turn it on, and nothing else listens.
    let off_dir = tempfile::tempdir().unwrap();
    let off = Server::start(off_dir.path());
    assert!(
        off.banner
            .contains("Prometheus metrics off (--metrics-listen"),
        "{}",
        off.banner
    );
}
