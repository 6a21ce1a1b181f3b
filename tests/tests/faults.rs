//! Faults in the services streamgate depends on. (Process crashes: `crash.rs`.)

use serde_json::json;
use streamgate_tests::Server;

/// Every connection to the metadata database is killed from the PostgreSQL side, as a
/// database restart or failover does, while the server keeps serving: it reconnects on
/// its own, and every kind of metadata work goes on without a restart.
#[tokio::test]
async fn postgres_connections_killed_while_serving_are_reestablished() {
    let server_url = std::env::var("STREAMGATE_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
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
    let listed: serde_json::Value = client
        .get(format!("{endpoint}/v1/streams"))
        .header("s2-basin", "fault-basin")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
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
