//! `--init-file` against the real binary: basins and streams in the `s2 apply` format are
//! provisioned before the server takes requests; a restart with the same file changes
//! only what drifted from it (in the fields it gives), and a bad file stops start-up
//! with a message naming the field.

use serde_json::{json, Value};
use streamgate_tests::{client, Server};

const SPEC: &str = r#"{
  "$schema": "https://raw.githubusercontent.com/s2-streamstore/s2/main/cli/schema.json",
  "basins": [
    {
      "name": "init-basin",
      "config": {
        "create_stream_on_append": true,
        "default_stream_config": {"retention_policy": "7days"}
      },
      "streams": [
        {"name": "events", "config": {"storage_class": "standard", "retention_policy": "infinite"}},
        {"name": "audit", "config": {"retention_policy": "2h 30m", "timestamping": {"mode": "arrival"}}}
      ]
    },
    {"name": "secret-basin", "config": {"stream_cipher": "aes-256-gcm"}, "streams": [{"name": "vault"}]}
  ]
}"#;

async fn get(server: &Server, path: &str, basin: Option<&str>) -> Value {
    let mut request = client().get(format!("{}/v1{path}", server.endpoint));
    if let Some(basin) = basin {
        request = request.header("s2-basin", basin);
    }
    let response = request.send().await.unwrap();
    assert!(
        response.status().is_success(),
        "GET {path}: {}",
        response.status()
    );
    response.json().await.unwrap()
}

#[tokio::test]
async fn the_file_provisions_at_start_and_a_restart_restores_only_what_it_names() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("spec.json");
    std::fs::write(&spec, SPEC).unwrap();
    let spec_arg = spec.to_str().unwrap();
    let mut server = Server::start_with(dir.path(), &["--init-file", spec_arg]);
    assert!(
        server
            .banner
            .contains("5 created, 0 reconfigured, 0 unchanged"),
        "{}",
        server.banner
    );

    let basin = get(&server, "/basins/init-basin", None).await;
    assert_eq!(basin["create_stream_on_append"], true);
    assert_eq!(
        basin["default_stream_config"]["retention_policy"],
        json!({"age": 7 * 86_400})
    );
    let events = get(&server, "/streams/events", Some("init-basin")).await;
    assert_eq!(events["storage_class"], "standard");
    assert_eq!(events["retention_policy"], json!({"infinite": {}}));
    let audit = get(&server, "/streams/audit", Some("init-basin")).await;
    assert_eq!(audit["retention_policy"], json!({"age": 9000}));
    assert_eq!(audit["timestamping"]["mode"], "arrival");
    let streams = get(&server, "/streams", Some("secret-basin")).await;
    assert_eq!(streams["streams"][0]["cipher"], "aes-256-gcm");

    // An operator changes a field the file names and one it does not.
    let response = client()
        .patch(format!("{}/v1/streams/events", server.endpoint))
        .header("s2-basin", "init-basin")
        .json(&json!({"retention_policy": {"age": 60}, "timestamping": {"mode": "client-require"}}))
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success());

    server.terminate();
    server.restart();
    assert!(
        server
            .banner
            .contains("0 created, 1 reconfigured, 4 unchanged"),
        "{}",
        server.banner
    );
    let events = get(&server, "/streams/events", Some("init-basin")).await;
    assert_eq!(
        events["retention_policy"],
        json!({"infinite": {}}),
        "the file's field is restored"
    );
    assert_eq!(
        events["timestamping"]["mode"], "client-require",
        "a field it leaves out is kept"
    );

    server.terminate();
    server.restart();
    assert!(
        server
            .banner
            .contains("0 created, 0 reconfigured, 5 unchanged"),
        "{}",
        server.banner
    );
}

#[test]
fn a_bad_file_stops_start_up_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            r#"{"basins": [{"name": "init-basin", "streams": [{"name": "s", "config": {"retention_policy": "forever"}}]}]}"#,
            "basins[0].streams[0].config.retention_policy: `forever` is not a duration",
        ),
        (
            r#"{"basins": [{"name": "init-basin", "config": {"create_streams_on_append": true}}]}"#,
            "basins[0].config.create_streams_on_append: unknown field",
        ),
    ];
    for (text, expected) in cases {
        let spec = dir.path().join("bad.json");
        std::fs::write(&spec, text).unwrap();
        let output = std::process::Command::new(streamgate_tests::binary())
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--listen", "127.0.0.1:0", "--resp-listen", "off"])
            .arg("--init-file")
            .arg(&spec)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("--init-file"), "{stderr}");
        assert!(stderr.contains(expected), "{stderr}");
        assert!(
            !String::from_utf8_lossy(&output.stdout).contains("listening on"),
            "nothing was served"
        );
    }
}
