//! Faults in the services streamgate depends on. (Process crashes: `crash.rs`.)

use serde_json::json;
use streamgate_tests::proxy::{server_with_objects_behind_proxy, Mode};
use streamgate_tests::Server;

/// Every connection to the metadata database is killed from the PostgreSQL side, as a
/// database restart or failover does, while the server keeps serving: it reconnects on
/// its own, and every kind of metadata work goes on without a restart.
#[tokio::test]
async fn postgres_connections_killed_while_serving_are_reestablished() {
    let server_url = streamgate_tests::backends::postgres_server();
    let database = format!("streamgate_test_fault_{}", std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(
        dir.path(),
        &["--metadata", &format!("{server_url}/{database}")],
    );
    let endpoint = server.endpoint.clone();
    let client = streamgate_tests::client();
    streamgate_tests::create_streams(&endpoint, "fault-basin", &["before"]).await;

    let killed = std::process::Command::new("psql")
        .arg(format!("{server_url}/postgres"))
        .args(["-qAtc", &format!(
            "select count(pg_terminate_backend(pid)) from pg_stat_activity where datname = '{database}'"
        )])
        .output()
        .expect("psql runs");
    let killed: u32 = String::from_utf8_lossy(&killed.stdout)
        .trim()
        .parse()
        .unwrap();
    assert!(killed > 0, "the server had connections to kill");

    // Metadata writes and reads, and token lookups, all succeed right away.
    streamgate_tests::create_streams(&endpoint, "fault-basin", &["after"]).await;
    let listed: serde_json::Value = streamgate_tests::json_of(
        client
            .get(format!("{endpoint}/v1/streams"))
            .header("s2-basin", "fault-basin"),
    )
    .await;
    assert_eq!(listed["streams"].as_array().unwrap().len(), 2, "{listed}");
    let issued = client
        .post(format!("{endpoint}/v1/access-tokens"))
        .json(&json!({"id": "after-fault", "scope": {"streams": {"prefix": ""}, "basins": {"prefix": ""}, "ops": ["append"]}}))
        .send()
        .await
        .unwrap();
    assert_eq!(issued.status(), 201);
    let token = issued.json::<serde_json::Value>().await.unwrap()["access_token"]
        .as_str()
        .unwrap()
        .to_owned();
    let appended = reqwest::Client::new()
        .post(format!("{endpoint}/v1/streams/after/records"))
        .header("s2-basin", "fault-basin")
        .header("authorization", format!("Bearer {token}"))
        .json(&json!({"records": [{"body": "x"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(appended.status(), 200);
}

/// Appends run while the object store answers with 5xx, resets and multi-second
/// stalls: appends are delayed (or fail), never acknowledged without their data, and
/// once the store is healthy again everything acknowledged is there exactly once, in
/// order, and appends go on without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_store_faults_delay_appends_but_lose_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = format!("streamgate-test-fault-{}", std::process::id());
    let (proxy, server) = server_with_objects_behind_proxy(
        &streamgate_tests::backends::s3_endpoint(),
        dir.path(),
        &bucket,
    )
    .await;
    let endpoint = server.endpoint.clone();
    streamgate_tests::create_streams(&endpoint, "fault-basin", &["s"]).await;

    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(String, u64)>::new()));
    let slowest = std::sync::Arc::new(std::sync::Mutex::new(std::time::Duration::ZERO));
    let failed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let stop = std::time::Instant::now() + std::time::Duration::from_secs(9);
    let mut writers = Vec::new();
    for writer in 0..4 {
        let (endpoint, acked, failed, slowest) = (
            endpoint.clone(),
            acked.clone(),
            failed.clone(),
            slowest.clone(),
        );
        writers.push(tokio::spawn(async move {
            let client = streamgate_tests::client();
            let mut n = 0;
            while std::time::Instant::now() < stop {
                let id = format!("w{writer}-{n}");
                n += 1;
                let started = std::time::Instant::now();
                let response = client
                    .post(format!("{endpoint}/v1/streams/s/records"))
                    .header("s2-basin", "fault-basin")
                    .json(&json!({"records": [{"body": id}]}))
                    .send()
                    .await
                    .unwrap();
                {
                    let mut slowest = slowest.lock().unwrap();
                    *slowest = (*slowest).max(started.elapsed());
                }
                if response.status() == 200 {
                    let ack: serde_json::Value = response.json().await.unwrap();
                    acked
                        .lock()
                        .unwrap()
                        .push((id, ack["start"]["seq_num"].as_u64().unwrap()));
                } else {
                    failed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
        }));
    }
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let before_faults = acked.lock().unwrap().len();
    proxy.set(Mode::Faulty);
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    proxy.set(Mode::Forward);
    for writer in writers {
        writer.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    let injected = proxy.faulted_connections();
    let slowest = *slowest.lock().unwrap();
    eprintln!(
        "{} appends acknowledged ({before_faults} before the faults), {} failed; {injected} connections met a fault; slowest append {slowest:?}",
        acked.len(),
        failed.load(std::sync::atomic::Ordering::SeqCst)
    );
    assert!(
        injected >= 3,
        "every kind of fault was met ({injected} faulty connections)"
    );
    assert!(
        slowest >= std::time::Duration::from_secs(1),
        "the faults delayed appends"
    );
    assert!(
        acked.len() > before_faults,
        "appends went on after the faults"
    );

    let records = streamgate_tests::read_stream(&endpoint, "fault-basin", "s").await;
    let mut seen = std::collections::HashMap::new();
    for (i, record) in records.iter().enumerate() {
        assert_eq!(
            record["seq_num"].as_u64(),
            Some(i as u64),
            "dense sequence numbers"
        );
        let body = record["body"].as_str().unwrap().to_owned();
        assert!(
            seen.insert(body.clone(), i as u64).is_none(),
            "{body} appears twice"
        );
    }
    for (id, seq) in &acked {
        assert_eq!(
            seen.get(id),
            Some(seq),
            "acknowledged {id} is at its position"
        );
    }
}
