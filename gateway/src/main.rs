//! The `streamgate` binary: configuration, start-up, serving and draining.

use streamgate::cors::CorsPolicy;
use streamgate::{api, cli, dashboard, init_file, operator_metrics, server, tls};

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use streamgate_core::storage::local_dir::{open_dir_durably, LocalDirObjectStore};
use streamgate_core::storage::s3::{S3Location, S3ObjectStore};
use streamgate_core::storage::sql::SqlMetadataStore;
use streamgate_core::storage::ObjectStore;
use streamgate_core::{ClusterSettings, Engine, EngineSettings, FlushSettings};
use tracing_subscriber::EnvFilter;

use cli::{parse_store_url, Args, StoreLocation};

/// How long a node that handed its streams over keeps accepting connections before it
/// drains: requests that other nodes sent its way just before the hand-off was recorded
/// are still arriving, and are forwarded to the new owners rather than refused. Other
/// nodes remember a stream's owner for half as long (`owner_cache` in the core).
const HAND_OFF_SETTLE: Duration = Duration::from_secs(1);

#[tokio::main]
async fn main() {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&args.log).unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        .init();
    // A panic ends only the task (request, session or connection) it happened in; say so
    // in the log, where the operator looks.
    std::panic::set_hook(Box::new(|panic| {
        tracing::error!(%panic, "a task panicked: the request, session or connection it served has ended");
    }));
    raise_open_files_limit();
    if let Err(err) = run(args).await {
        eprintln!("streamgate: {err:#}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let cors = CorsPolicy::from_flags(args.no_cors, &args.cors_allow_origin)?;
    // Checked before anything starts: a bad file stops start-up with the field named.
    let init = args
        .init_file
        .as_deref()
        .map(|path| init_file::load(path).map(|spec| (path, spec)))
        .transpose()?;
    // Durably: a power cut must not take a fresh data directory away with the metadata
    // and records acknowledged inside it.
    open_dir_durably(&args.data_dir).with_context(|| {
        format!(
            "cannot create the data directory {}; choose another with --data-dir",
            args.data_dir.display()
        )
    })?;
    let _lock = lock_data_dir(&args.data_dir)?;
    // The metrics endpoint first, so that what opening the stores and recovery report
    // (the chunk log's chunks, say) is recorded, and an operator can watch a long start.
    let metrics_listener = match args.metrics_listen.as_str() {
        "off" | "" => None,
        listen => {
            let address: std::net::SocketAddr = listen.parse().with_context(|| {
                format!("--metrics-listen: `{listen}` is not an address (or `off`)")
            })?;
            Some(operator_metrics::listen(address).await?)
        }
    };
    let metrics_addr = metrics_listener
        .as_ref()
        .map(|(l, _)| l.local_addr())
        .transpose()?;
    if let Some((listener, handle)) = metrics_listener {
        tokio::spawn(operator_metrics::serve(listener, handle));
    }
    let metadata_location = match &args.metadata {
        Some(url) => parse_store_url("metadata", url, "sqlite", &["postgres", "postgresql"])?,
        None => StoreLocation::Path(args.data_dir.join("metadata.db")),
    };
    let objects_location = match &args.objects {
        Some(url) => parse_store_url("objects", url, "file", &["s3"])?,
        None => StoreLocation::Path(args.data_dir.join("objects")),
    };
    if let StoreLocation::Path(objects_dir) = &objects_location {
        let mut ours = vec![args.data_dir.clone()];
        if let StoreLocation::Path(sqlite) = &metadata_location {
            ours.push(sqlite.clone());
        }
        refuse_objects_dir_holding(objects_dir, &ours)?;
    }
    let (metadata, metadata_description) = match &metadata_location {
        StoreLocation::Path(path) => (
            SqlMetadataStore::open_sqlite(path)
                .await
                .with_context(|| format!("opening the metadata store {}", path.display()))?,
            format!("SQLite {}", path.display()),
        ),
        StoreLocation::Server(url) => (
            SqlMetadataStore::connect_postgres(url)
                .await
                .context("opening the PostgreSQL metadata store")?,
            format!("PostgreSQL {}", redact_password(url)),
        ),
    };
    // Defaults tuned for each store: a local disk acks fastest with no linger; S3's
    // writes take tens of ms and are billed per request, so appends wait a little to
    // share a PUT and more PUTs are kept in flight.
    let (objects, default_linger_ms, default_in_flight, parallel_min_bytes): (
        Arc<dyn ObjectStore>,
        u64,
        usize,
        usize,
    ) = match &objects_location {
        StoreLocation::Path(path) => (
            Arc::new(
                LocalDirObjectStore::open(path)
                    .with_context(|| format!("opening the record store {}", path.display()))?,
            ),
            0,
            4,
            FlushSettings::default().parallel_min_bytes,
        ),
        StoreLocation::Server(url) => {
            let location = S3Location {
                endpoint: args.s3_endpoint.clone(),
                ..S3Location::parse(url)?
            };
            (
                Arc::new(
                    S3ObjectStore::connect(location)
                        .await
                        .with_context(|| format!("opening the record store {url}"))?,
                ),
                10,
                16,
                0,
            )
        }
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(tls::acceptor(cert, key)?),
        _ => None,
    };
    let peer_tls = tls::peer_client_config(args.peer_ca.as_deref())?;
    // Bound before the engine starts, so the advertised URL can name the port.
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {}; pick another with --listen",
                args.listen
            )
        })?;
    let addr = listener.local_addr()?;
    let identity = node_identity(&args.data_dir)?;
    if matches!(objects_location, StoreLocation::Path(_))
        && matches!(metadata_location, StoreLocation::Server(_))
    {
        refuse_cluster_without_shared_records(&metadata, &identity).await?;
    }
    let cluster = ClusterSettings {
        identity,
        advertise_url: match &args.advertise_url {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None => derived_advertise_url(addr, tls.is_some()),
        },
        lease: Duration::from_secs(args.lease_secs.max(1)),
    };
    let settings = EngineSettings {
        flush: FlushSettings {
            linger: Duration::from_millis(args.flush_linger_ms.unwrap_or(default_linger_ms)),
            max_chunk_bytes: args.flush_max_bytes.max(1),
            max_in_flight: args
                .flush_in_flight
                .unwrap_or(default_in_flight)
                .clamp(1, streamgate_core::MAX_TORN_TAIL),
            parallel_min_bytes,
        },
        cache_bytes: args.cache_mib * 1024 * 1024,
        location: location_name(&args.location)?,
        storage_metrics_interval: Duration::from_secs(args.storage_metrics_interval_secs.max(1)),
        max_inflight_bytes: args.max_inflight_mib.max(2) * 1024 * 1024,
        reap_interval: Duration::from_secs(args.reap_interval_secs.max(1)),
        compaction_interval: Duration::from_millis(args.compaction_interval_ms.max(10)),
        segment_cache_bytes: args.segment_cache_mib * 1024 * 1024,
        cluster,
        ..EngineSettings::default()
    };
    let engine = Engine::open(Arc::new(metadata), objects, settings)
        .await
        .context("recovering streams")?;
    let root_token = root_token(&engine, &args).await?;
    let init = match &init {
        Some((path, spec)) => {
            let applied = init_file::apply(&streamgate_core::Caller::root(&engine), spec)
                .await
                .with_context(|| format!("--init-file {}", path.display()))?;
            Some((*path, applied))
        }
        None => None,
    };

    let resp_listener = match args.resp_listen.as_str() {
        "off" | "" => None,
        listen => {
            let listen: std::net::SocketAddr = listen.parse().with_context(|| {
                format!("--resp-listen: `{listen}` is not an address (or `off`)")
            })?;
            Some(tokio::net::TcpListener::bind(listen).await.with_context(|| {
                format!("cannot listen for RESP on {listen}; pick another with --resp-listen, or `off`")
            })?)
        }
    };
    let resp_settings = streamgate_resp::RespSettings {
        default_basin: match &args.resp_default_basin {
            Some(name) => Some(
                streamgate_core::names::BasinName::new(name.as_str())
                    .map_err(|e| anyhow::anyhow!("--resp-default-basin: {e}"))?,
            ),
            None => None,
        },
    };
    let resp_addr = resp_listener.as_ref().map(|l| l.local_addr()).transpose()?;
    // Only nodes that share PostgreSQL and a bucket can form a cluster.
    let shared = matches!(metadata_location, StoreLocation::Server(_))
        && matches!(objects_location, StoreLocation::Server(_));
    print_banner(
        &args,
        &Listeners {
            http: addr,
            resp: resp_addr,
            metrics: metrics_addr,
            tls: tls.is_some(),
        },
        (&metadata_description, shared),
        &engine,
        &root_token,
        &cors,
        init.as_ref(),
    );

    let connections =
        streamgate_core::connections::ConnectionSlots::new(args.max_connections.max(1));
    let (start_drain, drain) = api::sessions::Drain::new();
    let resp_task = resp_listener.map(|listener| {
        tokio::spawn(streamgate_resp::serve(
            listener,
            engine.clone(),
            resp_settings,
            tls.clone(),
            connections.clone(),
            start_drain.subscribe(),
        ))
    });
    let pages = dashboard::router(
        !args.no_dashboard,
        dashboard::ServerInfo {
            version: env!("CARGO_PKG_VERSION"),
            resp: resp_addr.map(|resp| {
                let scheme = if tls.is_some() { "rediss" } else { "redis" };
                format!("{scheme}://{resp}")
            }),
        },
    );
    let app = api::app(engine.clone(), drain, pages, peer_tls, cors.layer());
    let draining = engine.clone();
    let fenced = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let fenced_flag = fenced.clone();
    let shutdown = async move {
        tokio::select! {
            _ = shutdown_signal() => {
                // Other nodes take this node's streams before it stops serving, so no
                // append fails for the shutdown; requests that still arrive here are
                // forwarded to them until the connections are drained.
                if draining.hand_off().await > 0 {
                    tokio::time::sleep(HAND_OFF_SETTLE).await;
                }
            }
            _ = draining.lease_lost() => {
                fenced_flag.store(true, std::sync::atomic::Ordering::SeqCst);
                tracing::error!("fenced: this node's streams were taken over by other nodes while it could not renew its lease; stopping (start it again to rejoin as a new node)");
            }
        }
        draining.begin_drain();
        // Sessions see this first: append sessions acknowledge what they accepted and end
        // with `server_draining`, read sessions end.
        let _ = start_drain.send(true);
    };
    server::serve(
        listener,
        app,
        tls,
        connections,
        shutdown,
        Duration::from_secs(30),
    )
    .await;
    if let Some(task) = resp_task {
        let _ = task.await;
    }
    tracing::info!("draining: waiting for accepted appends to become durable");
    engine.shutdown().await;
    tracing::info!("stopped");
    if fenced.load(std::sync::atomic::Ordering::SeqCst) {
        anyhow::bail!(
            "fenced: other nodes took over this node's streams while it could not renew its \
             lease; start it again to rejoin the cluster"
        );
    }
    Ok(())
}

/// `--location`: 1 to 64 lowercase letters, digits, `-`, `:` or `.`.
fn location_name(name: &str) -> anyhow::Result<String> {
    let valid = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-:.".contains(&b));
    if !valid {
        anyhow::bail!(
            "--location: `{name}` is not a location name (1 to 64 lowercase letters, digits, \
             `-`, `:` or `.`, e.g. `local` or `aws:us-east-1`)"
        );
    }
    Ok(name.to_owned())
}

/// A node whose records are in a local directory cannot share a cluster: the others
/// could not read its log to take its streams over.
async fn refuse_cluster_without_shared_records(
    metadata: &SqlMetadataStore,
    identity: &str,
) -> anyhow::Result<()> {
    use streamgate_core::storage::MetadataStore;
    let nodes = metadata
        .cluster_nodes()
        .await
        .context("reading the cluster's nodes")?;
    // An earlier run of this same node (same data directory) does not count.
    if let Some(node) = nodes.iter().find(|n| n.live && n.identity != identity) {
        let url = &node.advertise_url;
        anyhow::bail!(
            "another streamgate node ({url}) is live on this PostgreSQL database, but this one \
             keeps its records in a local directory, which other nodes cannot read: nodes of a \
             cluster share one bucket; give every node the same --objects s3://…"
        );
    }
    Ok(())
}

/// This node's identity: kept in `<data-dir>/node-id`, made at the first start. A node
/// started again with the same data directory ends its earlier run's leases at once.
fn node_identity(data_dir: &std::path::Path) -> anyhow::Result<String> {
    let file = data_dir.join("node-id");
    match std::fs::read_to_string(&file) {
        Ok(id) if !id.trim().is_empty() => Ok(id.trim().to_owned()),
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
            Err(err).with_context(|| format!("reading {}", file.display()))
        }
        _ => {
            let id = uuid::Uuid::new_v4().to_string();
            write_private_file(&file, &id)?;
            Ok(id)
        }
    }
}

/// The URL other nodes reach this one at, from the address it listens on: this
/// machine's host name when that is every address.
fn derived_advertise_url(addr: std::net::SocketAddr, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    let host = if addr.ip().is_unspecified() {
        host_name().unwrap_or_else(|| "127.0.0.1".into())
    } else {
        match addr.ip() {
            std::net::IpAddr::V6(ip) => format!("[{ip}]"),
            ip => ip.to_string(),
        }
    };
    format!("{scheme}://{host}:{}", addr.port())
}

fn host_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into the buffer it is given.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|b| *b == 0)?;
    let name = std::str::from_utf8(&buf[..end]).ok()?;
    (ok && !name.is_empty()).then(|| name.to_owned())
}

/// Where this process listens, for the banner.
struct Listeners {
    http: std::net::SocketAddr,
    resp: Option<std::net::SocketAddr>,
    metrics: Option<std::net::SocketAddr>,
    tls: bool,
}

fn print_banner(
    args: &Args,
    listeners: &Listeners,
    (metadata, shared): (&str, bool),
    engine: &Engine,
    root_token: &str,
    cors: &CorsPolicy,
    init: Option<&(&std::path::Path, init_file::Applied)>,
) {
    let &Listeners {
        http: addr,
        resp,
        metrics,
        tls,
    } = listeners;
    let flush = engine.settings().flush;
    let (endpoint, protocols) = if tls {
        (format!("https://{addr}"), "HTTP/2 and HTTP/1.1 over TLS")
    } else {
        (format!("http://{addr}"), "HTTP/1.1 and cleartext HTTP/2")
    };
    println!(
        "streamgate {} listening on {endpoint}",
        env!("CARGO_PKG_VERSION")
    );
    println!("  S2 REST API:   {endpoint}/v1   ({protocols})");
    println!(
        "  OTLP/HTTP:     {endpoint}/otlp   (traces, metrics, logs; routed by the `s2.stream` resource attribute)"
    );
    if let Some(resp) = resp {
        let (scheme, how) = if tls {
            ("rediss", "TLS; the SNI host name {basin}.… names the basin")
        } else {
            ("redis", "AUTH <basin> <token> names the basin")
        };
        println!("  RESP:          {scheme}://{resp}   (Redis Streams; {how})");
    }
    println!("  data dir:      {}", args.data_dir.display());
    println!("  metadata:      {metadata}");
    println!("  records:       {}", engine.describe_storage());
    println!(
        "  WAL flush:     linger {} ms, chunks up to {} KiB, {} in flight{}; acks once durable",
        flush.linger.as_millis(),
        flush.max_chunk_bytes / 1024,
        flush.max_in_flight,
        match flush.parallel_min_bytes {
            0 => String::new(),
            bytes => format!(" (more than one from {} KiB)", bytes / 1024),
        }
    );
    let settings = engine.settings();
    println!(
        "  compaction:    every {} ms into per-stream segments (small ones merged); lifecycle every {} s",
        settings.compaction_interval.as_millis(),
        settings.reap_interval.as_secs()
    );
    let node = engine.node();
    if shared {
        println!(
            "  cluster:       node {} at {} (lease {} s); streams served here: {}; view: {endpoint}/cluster",
            engine.epoch(),
            node.advertise_url,
            node.lease.as_secs(),
            engine.streams_served()
        );
    } else {
        println!(
            "  cluster:       one node (nodes started with the same --metadata postgres://… and --objects s3://… form a cluster)"
        );
    }
    let cors = match cors {
        CorsPolicy::AnyOrigin => {
            "pages of any origin (--cors-allow-origin to narrow, --no-cors to stop)".to_owned()
        }
        CorsPolicy::Origins(_) => format!("pages of {}", cors.describe()),
        CorsPolicy::Off => "same origin only (CORS off)".to_owned(),
    };
    println!("  browsers:      {cors}");
    if let Some((path, applied)) = init {
        println!("  init file:     {} ({applied})", path.display());
    }
    match metrics {
        Some(metrics) => println!("  metrics:       http://{metrics}/metrics   (Prometheus; the S2 metrics API is at {endpoint}/v1/metrics)"),
        None => println!("  metrics:       Prometheus metrics off (--metrics-listen 127.0.0.1:9464 serves them); usage: {endpoint}/v1/metrics"),
    }
    println!("  operations:    {endpoint}/health (liveness), {endpoint}/ready (readiness: 503 and why while appends cannot be made durable)");
    if !args.no_dashboard {
        // The token rides in the fragment, which browsers never send to the server.
        let token = if root_token.starts_with('<') {
            String::new()
        } else {
            format!("#token={}", api::peers::percent_encoded(root_token))
        };
        println!("  dashboard:     {endpoint}/dashboard{token}");
    }
    println!("Point the s2 CLI and SDKs at it:");
    println!("  export S2_ACCOUNT_ENDPOINT={endpoint}");
    println!("  export S2_BASIN_ENDPOINT={endpoint}");
    println!("  export S2_ACCESS_TOKEN={root_token}   # the root token: full access");
}

/// A URL with its password (if any) replaced by `***`, for printing.
fn redact_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((credentials, host)) => match credentials.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// Makes sure the root token exists and returns what the banner shows for it: the
/// secret from `--root-token`, or the one generated at first start, which is written to
/// `<data-dir>/root-token` (readable only by this user) before the token exists, so a
/// crash in between never leaves a root token nobody knows.
async fn root_token(engine: &Engine, args: &Args) -> anyhow::Result<String> {
    let file = args.data_dir.join("root-token");
    let tokens = engine.tokens();
    if let Some(secret) = &args.root_token {
        tokens
            .set_root(secret, false)
            .await
            .map_err(|e| anyhow::anyhow!("--root-token: {e}"))?;
        // A generated secret kept from an earlier start no longer works.
        match std::fs::remove_file(&file) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("removing {}", file.display()))
            }
            _ => {}
        }
        return Ok(secret.clone());
    }
    if tokens
        .has_root()
        .await
        .context("reading the access tokens")?
    {
        return Ok(std::fs::read_to_string(&file)
            .map(|t| t.trim().to_owned())
            .unwrap_or_else(|_| {
                format!(
                    "<the root token; {} is gone: restart with --root-token to set a new one>",
                    file.display()
                )
            }));
    }
    let generated = streamgate_core::access::secret::generate();
    write_private_file(&file, &generated)?;
    tokens
        .set_root(&generated, true)
        .await
        .context("creating the root token")?;
    tracing::info!(file = %file.display(), "created the root access token");
    Ok(generated)
}

/// Writes `contents` to `path` durably and readable only by this user: a temporary
/// file made with mode 0600, fsync'd, renamed over `path`, and the directory fsync'd.
fn write_private_file(path: &std::path::Path, contents: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let temporary = path.with_extension("tmp");
    let _ = std::fs::remove_file(&temporary); // so the mode below applies
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)
        .with_context(|| format!("writing {}", temporary.display()))?;
    writeln!(out, "{contents}")?;
    out.sync_all()?;
    std::fs::rename(&temporary, path).with_context(|| format!("writing {}", path.display()))?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Takes an exclusive lock on the data directory for the life of the process: two
/// servers on one directory would hand out the same sequence numbers.
/// The local object store owns every file under its directory (at start it removes the
/// temporary and prepared files it finds there, which are empty), so the data directory
/// and a SQLite metadata file must not be inside it.
fn refuse_objects_dir_holding(
    objects_dir: &std::path::Path,
    ours: &[std::path::PathBuf],
) -> anyhow::Result<()> {
    let absolute =
        |path: &std::path::Path| std::fs::canonicalize(path).or_else(|_| std::path::absolute(path));
    let objects = absolute(objects_dir)?;
    for path in ours {
        if absolute(path)?.starts_with(&objects) {
            anyhow::bail!(
                "the objects directory {} contains {}; the object store owns every file under \
                 its directory, so give --objects a directory of its own (by default it is \
                 <data-dir>/objects)",
                objects_dir.display(),
                path.display()
            );
        }
    }
    Ok(())
}

fn lock_data_dir(dir: &std::path::Path) -> anyhow::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    let path = dir.join("LOCK");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: flock on a file descriptor this function owns; no memory is involved.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        anyhow::bail!(
            "another streamgate is already using the data directory {}; stop it or choose another --data-dir (the embedded default, SQLite and a local directory, is one node; for a cluster, start every node with the same --metadata postgres://… and --objects s3://…, each with a data directory of its own)",
            dir.display()
        );
    }
    Ok(file)
}

/// Raises the soft limit on open files to the hard limit, so `--max-connections` (and
/// the files of the local store) are not cut short by a low default such as 1024.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write and read only the struct passed to them.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
    tracing::info!("shutdown requested: no new connections; finishing requests in flight");
}
