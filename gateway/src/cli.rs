//! Command-line flags; each one can also be set by `STREAMGATE_<FLAG>` in the environment.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;

/// streamgate: a self-hosted, durable stream store that speaks the S2 API (REST, S2S
/// sessions, SSE), Redis Streams (RESP) and OpenTelemetry (OTLP/HTTP).
///
/// With no flags it serves the S2 API and OTLP on 127.0.0.1:8080 and RESP on
/// 127.0.0.1:6380, and keeps everything in ./streamgate-data (metadata in SQLite, records
/// in a local directory); --metadata postgres://… and --objects s3://… move them to
/// PostgreSQL and S3; every process started with the same PostgreSQL and bucket is a
/// node of one cluster, and any node serves any request. Every request needs an access
/// token: the first start creates a root token and prints it. Every acknowledged append
/// is durable first.
#[derive(Debug, Parser)]
#[command(name = "streamgate", version, about, long_about)]
pub struct Args {
    /// Address for the HTTP API (S2 REST v1). Port 0 picks a free port.
    #[arg(long, env = "STREAMGATE_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// Address for the RESP (Redis Streams) listener; `off` disables it.
    #[arg(long, env = "STREAMGATE_RESP_LISTEN", default_value = "127.0.0.1:6380")]
    pub resp_listen: String,

    /// Basin for RESP connections over plain TCP whose AUTH names no basin (username
    /// `default`). With TLS, the SNI host name `{basin}.…` names the basin instead.
    #[arg(long, env = "STREAMGATE_RESP_DEFAULT_BASIN")]
    pub resp_default_basin: Option<String>,

    /// The root access token's secret (full access), for automation; at least 24
    /// characters. Without it, the first start generates one, prints it and keeps it in
    /// `<data-dir>/root-token` (mode 0600).
    #[arg(long, env = "STREAMGATE_ROOT_TOKEN", hide_env_values = true)]
    pub root_token: Option<String>,

    /// How other nodes of the cluster reach this one (`http://HOST:PORT`, or `https://`
    /// with --tls-cert), for requests they forward to it. Default: derived from --listen
    /// (its port once bound; this machine's host name when it listens on every address).
    #[arg(long, env = "STREAMGATE_ADVERTISE_URL")]
    pub advertise_url: Option<String>,

    /// Lease time (seconds, at least 1): a node that cannot renew its lease for this
    /// long stops acknowledging, and other nodes take its streams over. Shorter means
    /// faster failover and more sensitivity to pauses of the node or PostgreSQL.
    #[arg(long, env = "STREAMGATE_LEASE_SECS", default_value_t = 10)]
    pub lease_secs: u64,

    /// The name of the one location this server offers (what `GET /v1/locations`
    /// reports, and what a basin's `scope` or `location` must name when given), e.g.
    /// `aws:us-east-1` for clients that send a scope.
    #[arg(long, env = "STREAMGATE_LOCATION", default_value = "local")]
    pub location: String,

    /// Directory for the embedded default storage (and anything else kept on disk).
    #[arg(long, env = "STREAMGATE_DATA_DIR", default_value = "./streamgate-data")]
    pub data_dir: PathBuf,

    /// Metadata store: `sqlite://PATH` (or a plain path), or
    /// `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE` (created if missing; shared by
    /// every node). Default: `metadata.db` in the data directory.
    #[arg(long, env = "STREAMGATE_METADATA")]
    pub metadata: Option<String>,

    /// Record store: `file://PATH` (or a plain path) for a local directory of its own, or
    /// `s3://BUCKET[/PREFIX]` for an S3-compatible bucket (created if missing), with
    /// region and credentials from the standard AWS environment. Default: `objects/` in
    /// the data directory.
    #[arg(long, env = "STREAMGATE_OBJECTS")]
    pub objects: Option<String>,

    /// An S3-compatible server instead of AWS for `s3://` records (also read from
    /// `AWS_ENDPOINT_URL`); addressed path-style, as local S3 servers need.
    #[arg(long, env = "STREAMGATE_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,

    /// How long (ms) an append may wait for others to share its WAL flush. 0 flushes as
    /// soon as a flush slot is free: lowest latency. Default: 0 on a local directory,
    /// 10 on S3 (fewer PUT requests for a few ms of ack latency).
    #[arg(long, env = "STREAMGATE_FLUSH_LINGER_MS")]
    pub flush_linger_ms: Option<u64>,

    /// A WAL chunk is cut once it holds this many bytes.
    #[arg(long, env = "STREAMGATE_FLUSH_MAX_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub flush_max_bytes: usize,

    /// WAL chunks written concurrently, 1 to 64 (acknowledged strictly in order).
    /// Default: 4 on a local directory, 16 on S3 (whose writes take longer). On a local
    /// directory a chunk joins others in flight only once it holds 256 KiB; smaller ones
    /// wait and share the next write.
    #[arg(long, env = "STREAMGATE_FLUSH_IN_FLIGHT")]
    pub flush_in_flight: Option<usize>,

    /// Memory for appends accepted but not yet durable (MiB, at least 2: smaller values
    /// count as 2); past it, appends wait and append sessions stop reading, so clients
    /// feel backpressure instead of the server buffering without bound.
    #[arg(long, env = "STREAMGATE_MAX_INFLIGHT_MIB", default_value_t = 256)]
    pub max_inflight_mib: usize,

    /// Memory for recently written records, which serves recent and tailing reads (MiB).
    #[arg(long, env = "STREAMGATE_CACHE_MIB", default_value_t = 256)]
    pub cache_mib: usize,

    /// Memory for segments, which serves reads of older records (MiB).
    #[arg(long, env = "STREAMGATE_SEGMENT_CACHE_MIB", default_value_t = 256)]
    pub segment_cache_mib: usize,

    /// How often WAL chunks are compacted into per-stream segments (milliseconds).
    /// Longer: fewer and larger segment objects (fewer requests), more WAL to keep and to
    /// replay at start-up. Compacted chunks are deleted one interval (at least 5 s) later.
    #[arg(
        long,
        env = "STREAMGATE_COMPACTION_INTERVAL_MS",
        default_value_t = 30_000
    )]
    pub compaction_interval_ms: u64,

    /// How often lifecycle work runs (seconds): retention, trims, delete-on-empty, and
    /// finishing deleted basins and streams (until then their names cannot be reused).
    #[arg(long, env = "STREAMGATE_REAP_INTERVAL_SECS", default_value_t = 5)]
    pub reap_interval_secs: u64,

    /// How often the stored bytes of every stream are read for the storage metrics of
    /// the metrics API (seconds; one metadata query each time, on one node of the
    /// cluster).
    #[arg(
        long,
        env = "STREAMGATE_STORAGE_METRICS_INTERVAL_SECS",
        default_value_t = 60
    )]
    pub storage_metrics_interval_secs: u64,

    /// Client connections open at once, HTTP and RESP together. Past it, a new
    /// connection is refused at once (`503` over HTTP, `-ERR max number of clients
    /// reached` over RESP) until others close.
    #[arg(long, env = "STREAMGATE_MAX_CONNECTIONS", default_value_t = 10_000)]
    pub max_connections: usize,

    /// PEM certificate chain: serve HTTPS (HTTP/2 and HTTP/1.1 via ALPN) and RESP over TLS
    /// instead of cleartext. Requires --tls-key.
    #[arg(long, env = "STREAMGATE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key for --tls-cert.
    #[arg(long, env = "STREAMGATE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// PEM certificates to trust when this node calls other nodes of its cluster at
    /// `https://` advertised URLs (nodes started with --tls-cert): the private CA that
    /// issued the nodes' certificates, say. Given, only these are trusted for peers;
    /// without it, the system's root certificates are.
    #[arg(long, env = "STREAMGATE_PEER_CA")]
    pub peer_ca: Option<PathBuf>,

    /// Basins and streams to provision at start-up, before serving: a JSON file in the
    /// format of `s2 apply -f` (`{"basins": [{"name", "config", "streams": [{"name",
    /// "config"}]}]}`). What is missing is created and what exists is reconfigured in the
    /// fields the file gives, so it is safe on every restart; a bad file stops start-up.
    #[arg(long, env = "STREAMGATE_INIT_FILE")]
    pub init_file: Option<PathBuf>,

    /// Address for operator metrics in Prometheus' format (`GET /metrics`: requests
    /// and latency per front end and operation, WAL flushes, object and metadata store
    /// calls, compaction, sessions, connections, ...). A listener of its own, without
    /// access tokens: keep it where only Prometheus reaches it. `off` (the default)
    /// disables it; `127.0.0.1:9464` is a usual choice.
    #[arg(long, env = "STREAMGATE_METRICS_LISTEN", default_value = "off")]
    pub metrics_listen: String,

    /// Do not serve the dashboard at /dashboard (it is served by default: a client of
    /// the REST API that needs an access token like any other).
    #[arg(long, env = "STREAMGATE_NO_DASHBOARD")]
    pub no_dashboard: bool,

    /// Origins whose pages may call the API from a browser (CORS), e.g.
    /// `https://app.example.com`; repeat the flag (or separate with commas) for several.
    /// Default: every origin, as s2-lite does, so the TypeScript SDK and dashboards work
    /// from any page (every call still needs an access token).
    #[arg(long, env = "STREAMGATE_CORS_ALLOW_ORIGIN", value_delimiter = ',')]
    pub cors_allow_origin: Vec<String>,

    /// Send no CORS headers: browsers then allow calls only from pages of this server's
    /// own origin.
    #[arg(long, env = "STREAMGATE_NO_CORS")]
    pub no_cors: bool,

    /// Log filter, in `tracing` / RUST_LOG syntax (e.g. `info`, `streamgate=debug`).
    #[arg(long, env = "STREAMGATE_LOG", default_value = "info")]
    pub log: String,
}

/// Where a store URL points, for the backends this build offers.
pub enum StoreLocation {
    Path(PathBuf),
    /// A server URL, passed on as given (`postgres://…`).
    Server(String),
}

/// Parses `--metadata` / `--objects`: a path, a URL with the given local scheme, or a
/// URL with one of the server schemes.
pub fn parse_store_url(
    flag: &str,
    value: &str,
    local_scheme: &str,
    server_schemes: &[&str],
) -> anyhow::Result<StoreLocation> {
    if let Some(path) = value.strip_prefix(&format!("{local_scheme}://")) {
        return Ok(StoreLocation::Path(PathBuf::from(path)));
    }
    if let Some((scheme, _)) = value.split_once("://") {
        if server_schemes.contains(&scheme) {
            return Ok(StoreLocation::Server(value.to_owned()));
        }
        let mut offered = vec![format!("`{local_scheme}://PATH`")];
        offered.extend(server_schemes.iter().map(|s| format!("`{s}://…`")));
        anyhow::bail!(
            "--{flag}: `{scheme}://` is not supported; use {} or a plain path",
            offered.join(", ")
        );
    }
    Ok(StoreLocation::Path(PathBuf::from(value)))
}
