//! TLS on the HTTP port: the Rust SDK negotiates HTTP/2 through ALPN and runs an append
//! session and a read session; curl negotiates HTTP/1.1 and reads over SSE.

use std::process::Command;

use futures::StreamExt;
use s2_sdk::append_session::AppendSessionConfig;
use s2_sdk::types::*;
use streamgate_compat::{sdk_client, Server};

#[tokio::test]
async fn https_serves_http2_sessions_and_http1_sse() {
    let dir = tempfile::tempdir().unwrap();
    let certified =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    let server = Server::start_with(
        &dir.path().join("data"),
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    assert!(
        server.endpoint.starts_with("https://"),
        "{}",
        server.endpoint
    );

    let s2 = sdk_client(&server);
    let basin_name: BasinName = "tls-basin-1".parse().unwrap();
    s2.create_basin(CreateBasinInput::new(basin_name.clone()))
        .await
        .unwrap();
    let basin = s2.basin(basin_name);
    basin
        .create_stream(CreateStreamInput::new("secure".parse().unwrap()))
        .await
        .unwrap();
    let stream = basin.stream("secure".parse().unwrap());

    let session = stream.append_session(AppendSessionConfig::new());
    let ticket = session
        .submit(AppendInput::new(
            AppendRecordBatch::try_from_iter([AppendRecord::new("over tls").unwrap()]).unwrap(),
        ))
        .await
        .unwrap();
    assert_eq!(ticket.await.unwrap().start.seq_num, 0);
    session.close().await.unwrap();

    let input = ReadInput::new()
        .with_start(ReadStart::new().with_from(ReadFrom::SeqNum(0)))
        .with_stop(ReadStop::new().with_limits(ReadLimits::new().with_count(1)));
    let mut reads = stream
        .read_session(input, ReadSessionConfig::new())
        .await
        .unwrap();
    let batch = reads.next().await.unwrap().unwrap();
    assert_eq!(batch.records[0].body.as_ref(), b"over tls");

    let port = server.endpoint.rsplit(':').next().unwrap().to_owned();
    let output = Command::new("curl")
        .args([
            "-sk",
            "--http1.1",
            "-N",
            "-H",
            "s2-basin: tls-basin-1",
            "-H",
            "accept: text/event-stream",
            "-H",
            &format!("authorization: Bearer {}", streamgate_compat::ROOT_TOKEN),
        ])
        .arg(format!(
            "https://localhost:{port}/v1/streams/secure/records?seq_num=0&count=1"
        ))
        .output()
        .expect("curl is installed");
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(text.contains("event: batch"), "{text}");
    assert!(text.contains("over tls"), "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
}
