//! Stream encryption through the official Rust SDK: a basin's `stream_cipher`, the
//! stream's `cipher` in its info, pipelined append sessions and read sessions (S2S)
//! carrying the key, unary calls, and a wrong key refused with `decryption_failed`.

use std::time::Duration;

use futures::StreamExt;
use s2_sdk::append_session::AppendSessionConfig;
use s2_sdk::types::*;
use streamgate_compat::{sdk_client, Server};

fn batch(bodies: impl IntoIterator<Item = String>) -> AppendInput {
    let records: Vec<AppendRecord> = bodies
        .into_iter()
        .map(|b| {
            AppendRecord::new(b)
                .unwrap()
                .with_headers([Header::new("kind", "secret")])
                .unwrap()
        })
        .collect();
    AppendInput::new(AppendRecordBatch::try_from_iter(records).unwrap())
}

#[tokio::test]
async fn sessions_and_unary_calls_carry_the_key_on_both_ciphers() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let s2 = sdk_client(&server);
    let basin_name: BasinName = "sdk-encrypted".parse().unwrap();
    s2.create_basin(
        CreateBasinInput::new(basin_name.clone())
            .with_config(BasinConfig::new().with_stream_cipher(EncryptionAlgorithm::Aegis256)),
    )
    .await
    .unwrap();
    let basin = s2.basin(basin_name.clone());
    let config = s2.get_basin_config(basin_name.clone()).await.unwrap();
    assert_eq!(config.stream_cipher, Some(EncryptionAlgorithm::Aegis256));

    for (name, cipher) in [
        ("aegis", EncryptionAlgorithm::Aegis256),
        ("gcm", EncryptionAlgorithm::Aes256Gcm),
    ] {
        s2.reconfigure_basin(ReconfigureBasinInput::new(
            basin_name.clone(),
            BasinReconfiguration::new().with_stream_cipher(cipher),
        ))
        .await
        .unwrap();
        let info = basin
            .create_stream(CreateStreamInput::new(name.parse().unwrap()))
            .await
            .unwrap();
        assert_eq!(info.cipher, Some(cipher), "{name}");

        let key = EncryptionKey::new([name.len() as u8; 32]);
        let stream = basin
            .stream(name.parse().unwrap())
            .with_encryption_key(key.clone());

        // A read session following the tail, opened before anything is appended.
        let input = ReadInput::new().with_start(ReadStart::new().with_from(ReadFrom::SeqNum(0)));
        let mut follower = stream
            .read_session(input, ReadSessionConfig::new())
            .await
            .unwrap();

        let session = stream.append_session(AppendSessionConfig::new());
        let mut tickets = Vec::new();
        for i in 0..50 {
            tickets.push(
                session
                    .submit(batch((0..4).map(|j| format!("{name}-{i}-{j}"))))
                    .await
                    .unwrap(),
            );
        }
        for (i, ticket) in tickets.into_iter().enumerate() {
            assert_eq!(ticket.await.unwrap().start.seq_num, i as u64 * 4);
        }
        session.close().await.unwrap();

        let mut followed = Vec::new();
        while followed.len() < 200 {
            let batch = tokio::time::timeout(Duration::from_secs(20), follower.next())
                .await
                .expect("the follower gets the appended records")
                .expect("the session is open")
                .expect("no session error");
            for record in batch.records {
                assert_eq!(record.headers, vec![Header::new("kind", "secret")]);
                followed.push(String::from_utf8(record.body.to_vec()).unwrap());
            }
        }
        assert_eq!(followed[0], format!("{name}-0-0"));
        assert_eq!(followed[199], format!("{name}-49-3"));

        let unary = stream
            .read(ReadInput::new().with_start(ReadStart::new().with_from(ReadFrom::SeqNum(198))))
            .await
            .unwrap();
        let bodies: Vec<_> = unary
            .records
            .iter()
            .map(|r| String::from_utf8(r.body.to_vec()).unwrap())
            .collect();
        assert_eq!(bodies, [format!("{name}-49-2"), format!("{name}-49-3")]);

        // The same stream read with another key: refused, nothing opened.
        let wrong = basin
            .stream(name.parse().unwrap())
            .with_encryption_key(EncryptionKey::new([0xee; 32]));
        let err = wrong.read(ReadInput::new()).await.unwrap_err();
        assert!(format!("{err:?}").contains("decryption_failed"), "{err:?}");
        let input = ReadInput::new().with_start(ReadStart::new().with_from(ReadFrom::SeqNum(0)));
        let mut session = wrong
            .read_session(input, ReadSessionConfig::new())
            .await
            .unwrap();
        let outcome = tokio::time::timeout(Duration::from_secs(20), session.next())
            .await
            .expect("the session ends")
            .expect("with an item");
        let err = outcome.expect_err("a wrong key reads nothing");
        assert!(format!("{err:?}").contains("decryption_failed"), "{err:?}");
        // Without a key at all.
        let keyless = basin.stream(name.parse().unwrap());
        let err = keyless.append(batch(["x".into()])).await.unwrap_err();
        assert!(format!("{err:?}").contains("invalid"), "{err:?}");
        assert_eq!(stream.check_tail().await.unwrap().seq_num, 200);
    }
}
