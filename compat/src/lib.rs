//! Compatibility suites driven by the official S2 clients (see `tests/`, `python/`,
//! `node/`), and the benchmark programs (see `src/bin/`). The server under test is the
//! real binary, started through `streamgate_tests::Server`.

pub use streamgate_tests::{client, client_builder, wire, Server, ROOT_TOKEN};

/// The official Rust SDK pointed at `server` (plain http or https; certificates are not
/// verified, since test servers use self-signed ones).
pub fn sdk_client(server: &Server) -> s2_sdk::S2 {
    sdk_client_with_token(server, ROOT_TOKEN)
}

/// The official Rust SDK pointed at `server`, authenticating with `token`.
pub fn sdk_client_with_token(server: &Server, token: &str) -> s2_sdk::S2 {
    use s2_sdk::types::{S2Config, S2Endpoints};
    let config = S2Config::new(token)
        .with_endpoints(S2Endpoints::for_endpoint(&server.endpoint).expect("a valid endpoint"))
        .with_insecure_skip_cert_verification(true)
        .with_request_timeout(std::time::Duration::from_secs(30));
    s2_sdk::S2::new(config).expect("an SDK client")
}

/// The official Rust SDK pointed at `server` for a benchmark: no retries (a failed
/// request is a finding, and ends the run), a 30 s request timeout.
pub fn benchmark_sdk_client(server: &Server) -> std::sync::Arc<s2_sdk::S2> {
    use s2_sdk::types::{RetryConfig, S2Config, S2Endpoints};
    let config = S2Config::new(ROOT_TOKEN)
        .with_endpoints(S2Endpoints::for_endpoint(&server.endpoint).expect("a valid endpoint"))
        .with_insecure_skip_cert_verification(true)
        .with_request_timeout(std::time::Duration::from_secs(30))
        .with_retry(RetryConfig::new().with_max_attempts(std::num::NonZeroU32::MIN));
    std::sync::Arc::new(s2_sdk::S2::new(config).expect("an SDK client"))
}

/// The services the benchmark programs need, found or started.
pub mod services {
    use std::process::{Child, Command, Stdio};
    use std::time::Duration;

    /// The S3 endpoint to use (`STREAMGATE_TEST_S3_ENDPOINT`, or a moto server started
    /// from `.venv-compat`, which scripts/test.sh creates), and the moto process started
    /// for it, if any; why not, if neither is there.
    pub fn s3_endpoint() -> Result<(String, Option<KillOnDrop>), String> {
        if let Ok(endpoint) = std::env::var("STREAMGATE_TEST_S3_ENDPOINT") {
            return Ok((endpoint, None));
        }
        let moto = std::path::Path::new(".venv-compat/bin/moto_server");
        if !moto.exists() {
            return Err("no S3 server: set STREAMGATE_TEST_S3_ENDPOINT or create .venv-compat (scripts/test.sh)".into());
        }
        let port = free_port()?;
        let child = Command::new(moto)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting moto: {e}"))?;
        let moto = answering(child, port, "moto")?;
        let endpoint = format!("http://127.0.0.1:{port}");
        std::env::set_var("AWS_ACCESS_KEY_ID", "test");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "test");
        std::env::set_var("AWS_REGION", "us-east-1");
        std::env::set_var("STREAMGATE_TEST_S3_ENDPOINT", &endpoint);
        Ok((endpoint, Some(moto)))
    }

    /// A `redis-server` of this machine's on a free port, with `settings` (such as
    /// `--appendonly yes`) and its files in `dir`; its port, or why it could not start.
    pub fn redis_server(
        dir: &std::path::Path,
        settings: &[&str],
    ) -> Result<(u16, KillOnDrop), String> {
        let port = free_port()?;
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .arg("--dir")
            .arg(dir)
            .args(settings)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting redis-server (install Debian's redis-server): {e}"))?;
        Ok((port, answering(child, port, "redis-server")?))
    }

    fn free_port() -> Result<u16, String> {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| e.to_string())
    }

    /// `child` once it accepts connections on `port` (within 10 s).
    fn answering(child: Child, port: u16, name: &str) -> Result<KillOnDrop, String> {
        let child = KillOnDrop(child);
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(child);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!("{name} did not start"))
    }

    /// Whether PostgreSQL answers at `server` (a `postgres://…` server URL).
    pub fn postgres_answers(server: &str) -> bool {
        Command::new("psql")
            .arg(format!("{server}/postgres"))
            .args(["-qAtc", "select 1"])
            .output()
            .is_ok_and(|o| o.status.success())
    }

    /// A child process killed when this is dropped.
    pub struct KillOnDrop(Child);

    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The `p` quantile (0 to 1) of sorted latencies.
pub fn percentile(sorted: &[std::time::Duration], p: f64) -> std::time::Duration {
    if sorted.is_empty() {
        return std::time::Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// The resident memory of process `pid`, in KiB (0 if it cannot be read).
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse().ok())
        .unwrap_or(0)
}

/// CPU seconds (user + system) process `pid` has used so far.
pub fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which is in parentheses): utime and stime are 14 and 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks: f64 = fields.get(11..13).map_or(0.0, |f| {
        f.iter().filter_map(|v| v.parse::<f64>().ok()).sum()
    });
    ticks / 100.0
}
