//! Test support: start the real `streamgate` binary on a free port with its own data
//! directory, stop it gently (SIGTERM) or brutally (SIGKILL), and restart it on the same
//! data. Used by the black-box tests here and by the compatibility suites.

pub mod cluster;
mod exits;
pub mod history;
pub mod linearizability;
pub mod power_loss_fs;
pub mod proxy;
pub mod resp;
pub mod s2s;
pub mod sse;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Which storage backends the suites run on, chosen by the environment (scripts/test.sh
/// runs them once on the embedded default and once on PostgreSQL + S3). Each data
/// directory gets a database and a bucket of its own, the same ones across restarts.
pub mod backends {
    use std::path::Path;

    /// The PostgreSQL server of `STREAMGATE_TEST_POSTGRES` (default: the local one).
    pub fn postgres_server() -> String {
        std::env::var("STREAMGATE_TEST_POSTGRES")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
    }

    /// The S3 server of `STREAMGATE_TEST_S3_ENDPOINT` (scripts/test.sh starts moto).
    pub fn s3_endpoint() -> String {
        std::env::var("STREAMGATE_TEST_S3_ENDPOINT")
            .expect("set STREAMGATE_TEST_S3_ENDPOINT to an S3 server (scripts/test.sh starts moto)")
    }

    /// A short name unique to a data directory and this test process.
    fn tag_of(dir: &Path) -> String {
        let tag: String = dir
            .to_string_lossy()
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .collect::<String>()
            .to_ascii_lowercase();
        format!(
            "{}-{}",
            std::process::id(),
            &tag[tag.len().saturating_sub(16)..]
        )
    }

    /// The PostgreSQL database URL for `dir` under `STREAMGATE_TEST_METADATA=postgres`;
    /// `None` for SQLite in the directory (the default).
    pub fn postgres_url(dir: &Path) -> Option<String> {
        match std::env::var("STREAMGATE_TEST_METADATA").as_deref() {
            Ok("postgres") => Some(format!(
                "{}/streamgate_test_{}",
                postgres_server(),
                tag_of(dir).replace('-', "_")
            )),
            Ok("sqlite") | Err(_) => None,
            Ok(other) => panic!("STREAMGATE_TEST_METADATA={other}: use sqlite or postgres"),
        }
    }

    /// The `s3://` URL of `dir`'s bucket under `STREAMGATE_TEST_OBJECTS=s3`; `None` for
    /// a local directory (the default).
    pub fn s3_url(dir: &Path) -> Option<String> {
        match std::env::var("STREAMGATE_TEST_OBJECTS").as_deref() {
            Ok("s3") => Some(format!("s3://streamgate-test-{}/records", tag_of(dir))),
            Ok("local") | Err(_) => None,
            Ok(other) => panic!("STREAMGATE_TEST_OBJECTS={other}: use local or s3"),
        }
    }
}

/// The storage flags of a test server (see `backends`), unless its test sets its own.
fn backend_args(data_dir: &Path, extra_args: &[String]) -> Vec<String> {
    let mut args = Vec::new();
    let given = |flag: &str| extra_args.iter().any(|a| a == flag);
    if let Some(url) = backends::postgres_url(data_dir).filter(|_| !given("--metadata")) {
        args.extend(["--metadata".into(), url]);
    }
    if let Some(url) = backends::s3_url(data_dir).filter(|_| !given("--objects")) {
        args.extend([
            "--objects".into(),
            url,
            "--s3-endpoint".into(),
            backends::s3_endpoint(),
        ]);
    }
    args
}

/// The root access token test servers are started with (`--root-token`).
pub const ROOT_TOKEN: &str = "streamgate-test-root-token-0123456789";

/// Certificates the tests' HTTP clients trust (the CAs of servers started with
/// --tls-cert).
static TRUSTED: std::sync::Mutex<Vec<reqwest::Certificate>> = std::sync::Mutex::new(Vec::new());

/// Makes the tests' HTTP clients built from now on trust the PEM certificate `ca`.
pub fn trust_certificate(ca: &[u8]) {
    let ca = reqwest::Certificate::from_pem(ca).expect("a PEM certificate");
    TRUSTED.lock().unwrap().push(ca);
}

/// An HTTP client that authenticates with the root token.
pub fn client() -> reqwest::Client {
    client_builder().build().expect("an HTTP client")
}

/// A client builder whose requests carry the root token.
pub fn client_builder() -> reqwest::ClientBuilder {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {ROOT_TOKEN}").parse().unwrap(),
    );
    let builder = reqwest::Client::builder().default_headers(headers);
    TRUSTED.lock().unwrap().iter().fold(builder, |builder, ca| {
        builder.add_root_certificate(ca.clone())
    })
}

/// The `streamgate` binary, built once per test process so tests never run a stale one.
pub fn binary() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            if let Ok(path) = std::env::var("STREAMGATE_BIN") {
                return PathBuf::from(path);
            }
            let root = Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .unwrap()
                .to_path_buf();
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let release = !cfg!(debug_assertions);
            let mut build = Command::new(cargo);
            build.current_dir(&root).args([
                "build",
                "--quiet",
                "-p",
                "streamgate",
                "--bin",
                "streamgate",
            ]);
            if release {
                build.arg("--release");
            }
            let status = build
                .status()
                .expect("running cargo build for the streamgate binary");
            assert!(status.success(), "building the streamgate binary failed");
            let target = std::env::var("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|_| root.join("target"));
            target
                .join(if release { "release" } else { "debug" })
                .join("streamgate")
        })
        .clone()
}

/// A running streamgate process.
pub struct Server {
    child: Option<Child>,
    data_dir: PathBuf,
    extra_args: Vec<String>,
    /// `http://127.0.0.1:PORT`
    pub endpoint: String,
    /// The RESP listener's port.
    pub resp_port: u16,
    /// What the server printed at start-up.
    pub banner: String,
    port: u16,
    resp_listen: u16,
    /// Whether the server is given `ROOT_TOKEN` as its root token.
    test_root_token: bool,
    /// Extra environment variables of the process.
    env: Vec<(String, String)>,
    /// The current process's run: whether the test stops it.
    run: exits::Run,
}

/// A port nothing listens on now, below the range the kernel hands out for outgoing
/// connections (32768 and up on Linux). A server restarted on its ports must find them
/// free: one the kernel picked (port 0) could meanwhile have become the local port of
/// one of the many connections a test makes, and the restart would fail. Ports are
/// handed out in turn from a start that differs per test process.
pub fn unused_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const COUNT: u32 = 12_000;
    static NEXT: OnceLock<AtomicU32> = OnceLock::new();
    let start = u64::from(std::process::id()) * 7919 % u64::from(COUNT);
    let next = NEXT.get_or_init(|| AtomicU32::new(start as u32));
    for _ in 0..COUNT {
        let port = (FIRST + next.fetch_add(1, Ordering::Relaxed) % COUNT) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port between {FIRST} and {}", FIRST + COUNT);
}

impl Server {
    /// Starts a server on a free port over `data_dir`.
    pub fn start(data_dir: &Path) -> Server {
        Self::start_with(data_dir, &[])
    }

    /// Starts a server with extra command-line flags.
    pub fn start_with(data_dir: &Path, extra_args: &[&str]) -> Server {
        Self::launch(data_dir, extra_args, true)
    }

    /// Starts a server that makes its own root token, as a first start does.
    pub fn start_without_root_token(data_dir: &Path) -> Server {
        Self::launch(data_dir, &[], false)
    }

    fn launch(data_dir: &Path, extra_args: &[&str], test_root_token: bool) -> Server {
        let mut server = Server {
            child: None,
            data_dir: data_dir.to_path_buf(),
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            endpoint: String::new(),
            resp_port: 0,
            banner: String::new(),
            port: unused_port(),
            resp_listen: unused_port(),
            test_root_token,
            env: Vec::new(),
            run: exits::Run::default(),
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let listen = format!("127.0.0.1:{}", self.port);
        // Test defaults, each unless the test gives that flag itself: deletions finish
        // within a second; records move into segments within a third of one, so every
        // suite reads history through the segment index; every server shares one known
        // root token (unless the test wants a first start's own).
        let mut defaults = vec![
            ("--reap-interval-secs", "1"),
            ("--compaction-interval-ms", "300"),
        ];
        if self.test_root_token {
            defaults.push(("--root-token", ROOT_TOKEN));
        }
        let defaults: Vec<&str> = defaults
            .into_iter()
            .filter(|(flag, _)| !self.extra_args.iter().any(|a| a == flag))
            .flat_map(|(flag, value)| [flag, value])
            .collect();
        let mut child = Command::new(binary())
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(backend_args(&self.data_dir, &self.extra_args))
            .arg("--listen")
            .arg(&listen)
            .arg("--resp-listen")
            .arg(format!("127.0.0.1:{}", self.resp_listen))
            .args(defaults)
            .args(&self.extra_args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env(
                "STREAMGATE_LOG",
                std::env::var("STREAMGATE_TEST_LOG").unwrap_or("warn".into()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting streamgate");
        self.run = exits::Run::default();
        self.run
            .follow_log(child.stderr.take().unwrap(), &listen, child.id());
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // The banner names the HTTP endpoint first, then the RESP one, and ends with
            // the lines for the s2 CLI, the access token last.
            let (mut endpoint, mut resp) = (String::new(), 0u16);
            let mut banner = String::new();
            let mut lines = BufReader::new(stdout).lines();
            while let Some(Ok(line)) = lines.next() {
                banner.push_str(&line);
                banner.push('\n');
                if let Some(rest) = line.split(" listening on ").nth(1) {
                    endpoint = rest.trim().to_owned();
                } else if let Some(rest) = line.trim().strip_prefix("RESP:") {
                    let address = rest.split_whitespace().next().unwrap_or("");
                    resp = address
                        .rsplit(':')
                        .next()
                        .and_then(|p| p.parse().ok())
                        .unwrap_or(0);
                } else if line.contains("export S2_ACCESS_TOKEN=") {
                    let _ = tx.send((endpoint.clone(), resp, std::mem::take(&mut banner)));
                }
            }
        });
        let (endpoint, resp_port, banner) = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(started) => started,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                panic!("streamgate did not report its address within 60 s")
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                let status = child.wait();
                panic!("streamgate stopped before it reported its address: {status:?}")
            }
        };
        self.banner = banner;
        self.port = endpoint.rsplit(':').next().unwrap().parse().unwrap();
        self.resp_port = resp_port;
        self.resp_listen = resp_port;
        self.endpoint = endpoint;
        self.child = Some(child);
    }

    /// SIGKILL: the process gets no chance to flush or clean up.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            self.run.expect_exit();
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits for the process to drain and exit; returns its exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        self.run.expect_exit();
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("streamgate did not exit within 30 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sets (or with `None` removes) an environment variable for the next start, e.g.
    /// `STREAMGATE_CRASH_AT`, which makes the server abort at a named point.
    /// Gives `flag` this `value` from the next start on (in place of any it had).
    pub fn set_flag(&mut self, flag: &str, value: &str) {
        match self.extra_args.iter().position(|a| a == flag) {
            Some(at) if at + 1 < self.extra_args.len() => self.extra_args[at + 1] = value.into(),
            _ => self.extra_args.extend([flag.to_owned(), value.to_owned()]),
        }
    }

    /// The Prometheus endpoint the banner names (with `--metrics-listen`).
    pub fn metrics_url(&self) -> Option<String> {
        self.banner
            .lines()
            .find_map(|l| l.trim().strip_prefix("metrics:"))
            .and_then(|rest| rest.split_whitespace().next())
            .map(str::to_owned)
    }

    /// What the Prometheus endpoint (with `--metrics-listen`) shows now.
    pub async fn scrape_metrics(&self) -> String {
        let url = self
            .metrics_url()
            .expect("the banner names the metrics endpoint (--metrics-listen)");
        client()
            .get(url)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// The WAL chunks a server on the local-directory backend (with `--metrics-listen`)
    /// holds now: files of their own under `objects_dir/wal`, and records in its chunk
    /// log (from its metrics). 0 once compaction has caught up.
    pub async fn local_wal_chunks(&self, objects_dir: &Path) -> usize {
        object_files(&objects_dir.join("wal"))
            + self.metric("streamgate_wal_log_chunks").await as usize
    }

    /// The value of the metric `name` (without labels) at the Prometheus endpoint now.
    pub async fn metric(&self, name: &str) -> f64 {
        let metrics = self.scrape_metrics().await;
        let value = metrics.lines().find_map(|line| {
            let (metric, value) = line.split_once(' ')?;
            (metric == name).then(|| value.trim().parse().ok())?
        });
        value.unwrap_or_else(|| panic!("no {name} in the metrics:\n{metrics}"))
    }

    pub fn set_env(&mut self, key: &str, value: Option<&str>) {
        self.env.retain(|(k, _)| k != key);
        if let Some(value) = value {
            self.env.push((key.into(), value.into()));
        }
    }

    /// Waits up to `timeout` for the running process to exit on its own; how it ended,
    /// or `None` if it is still running.
    pub fn wait_for_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        self.run.expect_exit();
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let child = self.child.as_mut().expect("the server is running");
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Starts the server again on the same data directory and port.
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Sends a request and parses the JSON it answers with, whatever the status.
/// The value of the sample `series` (name with labels, as Prometheus prints it) in a
/// scrape's text.
pub fn prometheus_sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

pub async fn json_of(request: reqwest::RequestBuilder) -> serde_json::Value {
    let response = request.send().await.expect("the server answers");
    response.json().await.expect("a JSON answer")
}

/// Creates `basin` (if it does not exist yet) and each of `streams` in it, over REST.
pub async fn create_streams(endpoint: &str, basin: &str, streams: &[&str]) {
    let client = client();
    let status = client
        .post(format!("{endpoint}/v1/basins"))
        .json(&serde_json::json!({ "basin": basin }))
        .send()
        .await
        .expect("creating the basin")
        .status();
    assert!(
        status == 201 || status == 409,
        "creating basin {basin}: {status}"
    );
    for stream in streams {
        let status = client
            .post(format!("{endpoint}/v1/streams"))
            .header("s2-basin", basin)
            .json(&serde_json::json!({ "stream": stream }))
            .send()
            .await
            .expect("creating a stream")
            .status();
        assert_eq!(status, 201, "creating stream {stream}");
    }
}

/// Exports one OTLP/HTTP (JSON) logs request to `endpoint` as root: one resource group
/// per `(stream, line)`, routed by its `s2.stream` attribute.
pub async fn export_logs(endpoint: &str, basin: &str, lines: &[(&str, &str)]) -> reqwest::Response {
    let groups: Vec<serde_json::Value> = lines
        .iter()
        .map(|(stream, line)| {
            serde_json::json!({
                "resource": {"attributes": [{"key": "s2.stream", "value": {"stringValue": stream}}]},
                "scopeLogs": [{"logRecords": [{"body": {"stringValue": line}}]}]
            })
        })
        .collect();
    client()
        .post(format!("{endpoint}/otlp/v1/logs"))
        .header("s2-basin", basin)
        .json(&serde_json::json!({ "resourceLogs": groups }))
        .send()
        .await
        .expect("the server answers")
}

/// A name as one URL path segment (percent-encoding `/` and anything not unreserved).
pub fn path_segment(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Every record of a stream from its first retained one to the tail, as the REST API
/// returns them (JSON objects), paging through single-batch reads.
pub async fn read_stream(endpoint: &str, basin: &str, stream: &str) -> Vec<serde_json::Value> {
    let client = client();
    let mut records: Vec<serde_json::Value> = Vec::new();
    loop {
        let next = records
            .last()
            .map_or(0, |r| r["seq_num"].as_u64().unwrap() + 1);
        let response = client
            .get(format!(
                "{endpoint}/v1/streams/{}/records?seq_num={next}&count=1000",
                path_segment(stream)
            ))
            .header("s2-basin", basin)
            .send()
            .await
            .expect("reading a stream");
        if response.status() == 416 {
            return records;
        }
        assert!(
            response.status().is_success(),
            "reading {stream}: {}",
            response.status()
        );
        let batch: serde_json::Value = response.json().await.expect("a JSON batch");
        records.extend(
            batch["records"]
                .as_array()
                .expect("records")
                .iter()
                .cloned(),
        );
    }
}

/// A minimal protobuf writer for `s2.v1.AppendInput` and reader for the messages that
/// answer it, written from the spec's field numbers, so tests and benchmarks check the
/// server against the wire format rather than against the server's own types.
pub mod wire {
    fn varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    fn length_delimited(field: u64, bytes: &[u8], out: &mut Vec<u8>) {
        varint(field << 3 | 2, out);
        varint(bytes.len() as u64, out);
        out.extend_from_slice(bytes);
    }

    /// An S2S frame around an uncompressed message.
    pub fn s2s_frame(message: &[u8]) -> Vec<u8> {
        let len = (message.len() + 1) as u32;
        let mut out = len.to_be_bytes()[1..].to_vec();
        out.push(0);
        out.extend_from_slice(message);
        out
    }

    /// One S2S frame from the front of `buffer`, if it holds a whole one:
    /// (flag byte, body). Removes it from the buffer.
    pub fn take_s2s_frame(buffer: &mut Vec<u8>) -> Option<(u8, Vec<u8>)> {
        if buffer.len() < 3 {
            return None;
        }
        let len = u32::from_be_bytes([0, buffer[0], buffer[1], buffer[2]]) as usize;
        if buffer.len() < 3 + len {
            return None;
        }
        let frame: Vec<u8> = buffer.drain(..3 + len).collect();
        Some((frame[3], frame[4..].to_vec()))
    }

    /// Reads a varint at `pos`, advancing it.
    fn read_varint(bytes: &[u8], pos: &mut usize) -> u64 {
        let mut value = 0u64;
        let mut shift = 0;
        loop {
            let byte = bytes[*pos];
            *pos += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return value;
            }
            shift += 7;
        }
    }

    /// The `seq_num` of `start` and `end` of an uncompressed `AppendAck`.
    pub fn decode_ack_range(ack: &[u8]) -> (u64, u64) {
        let (mut start, mut end) = (0, 0);
        let mut pos = 0;
        while pos < ack.len() {
            // AppendAck { start = 1, end = 2, .. }, each a StreamPosition { seq_num = 1 }
            let (field, Some(FieldValue::Bytes(position))) = next_field(ack, &mut pos) else {
                continue;
            };
            let mut p = 0;
            let mut seq_num = 0;
            while p < position.len() {
                if let (1, Some(FieldValue::Varint(value))) = next_field(position, &mut p) {
                    seq_num = value;
                }
            }
            match field {
                1 => start = seq_num,
                2 => end = seq_num,
                _ => {}
            }
        }
        (start, end)
    }

    /// One field of a protobuf message at `pos`, advancing past it: its number, and its
    /// value as a varint or as the bytes of a length-delimited field (`None` for the
    /// fixed-width types, which the messages read here do not use).
    fn next_field<'a>(message: &'a [u8], pos: &mut usize) -> (u64, Option<FieldValue<'a>>) {
        let key = read_varint(message, pos);
        let value = match key & 7 {
            0 => Some(FieldValue::Varint(read_varint(message, pos))),
            2 => {
                let len = read_varint(message, pos) as usize;
                *pos += len;
                Some(FieldValue::Bytes(&message[*pos - len..*pos]))
            }
            1 => {
                *pos += 8;
                None
            }
            _ => {
                *pos += 4;
                None
            }
        };
        (key >> 3, value)
    }

    enum FieldValue<'a> {
        Varint(u64),
        Bytes(&'a [u8]),
    }

    /// The bodies of the records of an uncompressed `ReadBatch` (empty for a heartbeat).
    pub fn read_batch_bodies(batch: &[u8]) -> Vec<&[u8]> {
        let mut bodies = Vec::new();
        let mut pos = 0;
        while pos < batch.len() {
            // ReadBatch { records = 1: SequencedRecord { body = 4 }, tail = 2 }
            let (1, Some(FieldValue::Bytes(record))) = next_field(batch, &mut pos) else {
                continue;
            };
            let mut p = 0;
            while p < record.len() {
                if let (4, Some(FieldValue::Bytes(body))) = next_field(record, &mut p) {
                    bodies.push(body);
                }
            }
        }
        bodies
    }

    /// `AppendInput { records: [AppendRecord { body }] }`, one record per body.
    pub fn encode_append_input(bodies: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for body in bodies {
            let mut record = Vec::new();
            length_delimited(3, body, &mut record);
            length_delimited(1, &record, &mut out);
        }
        out
    }
}

/// The objects a local-directory store keeps under `dir`: its non-empty files at any
/// depth (empty ones are prepared for coming puts), leaving out the directories whose
/// names start with a dot (the spare pool, the chunk log), whose files are kept for
/// reuse and are not objects.
pub fn object_files(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|entry| !entry.file_name().to_string_lossy().starts_with('.'))
        .map(|entry| match entry.metadata() {
            Ok(metadata) if metadata.is_dir() => object_files(&entry.path()),
            Ok(metadata) => usize::from(metadata.len() > 0),
            Err(_) => 0,
        })
        .sum()
}
