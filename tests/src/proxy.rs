//! A TCP proxy between streamgate and a service it depends on (the S3 server, or
//! PostgreSQL), that can play that service's outages:
//!
//! - `Forward`: a healthy network;
//! - `Refuse`: the service is down: connections are refused (nothing listens on the
//!   port), and open ones are reset;
//! - `BlackHole`: a network partition: connections are accepted but nothing is ever
//!   answered, and open ones go silent; when the network heals, they are reset (as a
//!   NAT or load balancer that lost its state does), and new ones work;
//! - `Faulty`: a sick service over HTTP: each new connection in turn gets a `503`, is
//!   reset at once, or stalls for 3 s before being forwarded.
//!
//! Turning any mode on cuts or silences the connections opened before, so pooled
//! connections meet the outage too. `cut` resets every open connection while new ones
//! keep working, as a restart of the service (or of a NAT between) does.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Forward,
    Refuse,
    BlackHole,
    Faulty,
}

pub struct Proxy {
    pub port: u16,
    mode: watch::Sender<Mode>,
    /// Connections accepted while the mode was not `Forward`.
    faulted: Arc<AtomicUsize>,
    cuts: Arc<Cuts>,
}

/// What `cut` needs to end exactly the connections open when it is called, and to know
/// when it has: the forwarding connections open now, by the cut generation they were
/// opened in, and a generation counter each of them watches.
#[derive(Default)]
struct Cuts {
    open: Mutex<OpenConnections>,
    generation: watch::Sender<u64>,
}

#[derive(Default)]
struct OpenConnections {
    generation: u64,
    by_generation: BTreeMap<u64, usize>,
}

/// A forwarding connection counted open (in the generation it was opened in) until it
/// is dropped, however its task ends.
struct Open<'a> {
    cuts: &'a Cuts,
    generation: u64,
}

impl<'a> Open<'a> {
    fn register(cuts: &'a Cuts) -> Open<'a> {
        let mut open = cuts.open.lock().unwrap();
        let generation = open.generation;
        *open.by_generation.entry(generation).or_default() += 1;
        Open { cuts, generation }
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        let mut open = self.cuts.open.lock().unwrap();
        if let Some(count) = open.by_generation.get_mut(&self.generation) {
            *count -= 1;
            if *count == 0 {
                open.by_generation.remove(&self.generation);
            }
        }
    }
}

impl Proxy {
    /// A proxy on a free local port to `upstream` (`host:port`), forwarding.
    pub async fn start(upstream: &str) -> Proxy {
        let listener = bind(0).await;
        let port = listener.local_addr().unwrap().port();
        let (mode, modes) = watch::channel(Mode::Forward);
        let faulted = Arc::new(AtomicUsize::new(0));
        let cuts = Arc::new(Cuts::default());
        tokio::spawn(run(
            listener,
            port,
            upstream.to_owned(),
            modes,
            faulted.clone(),
            cuts.clone(),
        ));
        Proxy {
            port,
            mode,
            faulted,
            cuts,
        }
    }

    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// How many connections met a fault (were accepted while not forwarding).
    pub fn faulted_connections(&self) -> usize {
        self.faulted.load(Ordering::SeqCst)
    }

    /// Resets every forwarding connection open now, in the middle of whatever it carries,
    /// and returns once they are all closed; connections opened from then on are
    /// forwarded as before. Returns how many were cut.
    pub async fn cut(&self) -> usize {
        let (generation, cut) = {
            let mut open = self.cuts.open.lock().unwrap();
            open.generation += 1;
            let cut = open.by_generation.values().sum();
            (open.generation, cut)
        };
        self.cuts.generation.send_replace(generation);
        for _ in 0..5000 {
            let closed = {
                let open = self.cuts.open.lock().unwrap();
                open.by_generation.range(..generation).next().is_none()
            };
            if closed {
                return cut;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("the proxy's connections did not close within 5 s of a cut");
    }
}

async fn bind(port: u16) -> TcpListener {
    // Re-binding the port after a refusal must not wait for old connections' TIME_WAIT.
    for _ in 0..100 {
        let socket = TcpSocket::new_v4().unwrap();
        socket.set_reuseaddr(true).unwrap();
        if socket
            .bind(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
            .is_ok()
        {
            return socket.listen(1024).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the proxy cannot listen on port {port} again");
}

async fn run(
    mut listener: TcpListener,
    port: u16,
    upstream: String,
    mut modes: watch::Receiver<Mode>,
    faulted: Arc<AtomicUsize>,
    cuts: Arc<Cuts>,
) {
    let mut turn = 0u64;
    loop {
        if *modes.borrow_and_update() == Mode::Refuse {
            drop(listener);
            if modes.wait_for(|mode| *mode != Mode::Refuse).await.is_err() {
                return;
            }
            listener = bind(port).await;
            continue;
        }
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                let mode = *modes.borrow();
                if mode != Mode::Forward {
                    faulted.fetch_add(1, Ordering::SeqCst);
                }
                turn += 1;
                tokio::spawn(connection(client, upstream.clone(), mode, turn, modes.clone(), cuts.clone()));
            }
            changed = modes.changed() => if changed.is_err() { return },
        }
    }
}

/// Serves one connection in the mode it was accepted in, until the mode changes.
async fn connection(
    mut client: TcpStream,
    upstream: String,
    accepted_in: Mode,
    turn: u64,
    mut modes: watch::Receiver<Mode>,
    cuts: Arc<Cuts>,
) {
    match accepted_in {
        Mode::Refuse => return reset(client),
        Mode::BlackHole => {
            let _ = modes.wait_for(|mode| *mode != Mode::BlackHole).await;
            return reset(client);
        }
        Mode::Faulty => match turn % 3 {
            0 => {
                let mut head = [0u8; 4096];
                let _ = client.read(&mut head).await;
                let _ = client
                    .write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
                return;
            }
            1 => return reset(client),
            _ => tokio::time::sleep(Duration::from_secs(3)).await,
        },
        Mode::Forward => {}
    }
    let Ok(mut server) = TcpStream::connect(upstream.as_str()).await else {
        return reset(client);
    };
    let open = Open::register(&cuts);
    let mut generations = cuts.generation.subscribe();
    // A connection is cut when an outage starts (a stalled one of a faulty spell stays),
    // or by a `cut` after it opened.
    let outage = move |mode: &Mode| *mode != Mode::Forward && *mode != accepted_in;
    let cut_by = tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => None,
        mode = modes.wait_for(outage) => mode.ok().map(|mode| *mode),
        _ = generations.wait_for(|g| *g > open.generation) => None,
    };
    if cut_by == Some(Mode::BlackHole) {
        // Silence: both sockets stay open, nothing moves (until the network heals, or a
        // cut ends them).
        tokio::select! {
            _ = modes.wait_for(|mode| *mode != Mode::BlackHole) => {}
            _ = generations.wait_for(|g| *g > open.generation) => {}
        }
    }
    reset(server);
    reset(client);
}

/// Closes with a reset rather than a clean close, as a crashed peer's host does.
fn reset(stream: TcpStream) {
    // A zero linger does not block on drop (the deprecation is about non-zero ones).
    #[allow(deprecated)]
    let _ = stream.set_linger(Some(Duration::ZERO));
    drop(stream);
}

/// A server on `dir` whose records go to the S3 server at `s3` (an `http://` endpoint),
/// in `bucket`, through a proxy that can play its outages.
pub async fn server_with_objects_behind_proxy(
    s3: &str,
    dir: &std::path::Path,
    bucket: &str,
) -> (Proxy, crate::Server) {
    server_with_objects_behind_proxy_and_flags(s3, dir, bucket, &[]).await
}

/// `server_with_objects_behind_proxy`, with more command-line flags.
pub async fn server_with_objects_behind_proxy_and_flags(
    s3: &str,
    dir: &std::path::Path,
    bucket: &str,
    flags: &[&str],
) -> (Proxy, crate::Server) {
    let proxy = Proxy::start(s3.trim_start_matches("http://")).await;
    let objects = format!("s3://{bucket}/records");
    let endpoint = format!("http://127.0.0.1:{}", proxy.port);
    let mut args = vec!["--objects", &objects, "--s3-endpoint", &endpoint];
    args.extend_from_slice(flags);
    let server = crate::Server::start_with(dir, &args);
    (proxy, server)
}

/// A server on `dir` whose metadata is `database` on the PostgreSQL server `postgres`
/// (`postgres://USER[:PASSWORD]@HOST:PORT`), reached through a proxy that can play its
/// outages; records stay in the data directory.
pub async fn server_with_metadata_behind_proxy(
    postgres: &str,
    dir: &std::path::Path,
    database: &str,
) -> (Proxy, crate::Server) {
    server_with_metadata_behind_proxy_and_flags(postgres, dir, database, &[]).await
}

/// Like `server_with_metadata_behind_proxy`, with extra flags for the server.
pub async fn server_with_metadata_behind_proxy_and_flags(
    postgres: &str,
    dir: &std::path::Path,
    database: &str,
    flags: &[&str],
) -> (Proxy, crate::Server) {
    let (credentials, upstream) = postgres
        .trim_start_matches("postgres://")
        .rsplit_once('@')
        .expect("a PostgreSQL server URL is postgres://USER[:PASSWORD]@HOST:PORT");
    let proxy = Proxy::start(upstream).await;
    let objects = dir.join("objects");
    let server = crate::Server::start_with(
        dir,
        &[
            "--metadata",
            &format!(
                "postgres://{credentials}@127.0.0.1:{}/{database}",
                proxy.port
            ),
            "--objects",
            objects.to_str().expect("a UTF-8 path"),
        ]
        .into_iter()
        .chain(flags.iter().copied())
        .collect::<Vec<_>>(),
    );
    (proxy, server)
}
