//! Gathering a connection's small writes into fewer system calls.
//!
//! hyper's HTTP/2 connection task writes out whatever frames are queued each time it is
//! woken, and a stream sending one small frame wakes it at once. With thousands of read
//! sessions on one connection, each following a stream that just got a record, that made
//! a `writev` for every few frames, and on loopback or a virtual NIC each call costs tens
//! of microseconds however little it carries (23,000 calls a second, about 60% of the
//! server's CPU, with 10,000 tailing readers). Here small writes are kept until a flush,
//! and while many tasks are ready (the runtime is backlogged) a flush waits, so the
//! frames queued in the meantime go out in the same call. Large writes (catch-up reads)
//! pass straight through, uncopied.
//!
//! How long it waits depends on what the connection carries. While followers woken on
//! it by a record are still reading (`ConnectionFollowers::deliveries_pending`: a stream
//! wakes its followers connection by connection, and counts them), a flush is held until
//! the last of them has queued its frame, so a record for 10,000 followers goes out in
//! about one write per connection, each as soon as that connection's followers are
//! done (measured in BENCHMARKS.md, "Live readers"). The release thread lets a held
//! flush go after `HOLD_RELEASE_INTERVAL` at the latest, should a follower be slow to
//! read. Any other flush (an appender waiting for its acknowledgement, a unary request)
//! only yields once, so it is not held behind a burst of deliveries.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use streamgate_core::follow::ConnectionFollowers;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes kept before they must be written out.
const GATHER_LIMIT: usize = 64 * 1024;
/// The gathering buffer a connection keeps between bursts (so a busy one does not grow a
/// new buffer for each); a larger one is freed once written.
const RETAINED_CAPACITY: usize = GATHER_LIMIT;

/// Whether tasks are waiting in the runtime's shared queue: a worker's own queue
/// overflows into it when a wake-up makes many tasks ready at once (a record for thousands
/// of followers). Otherwise neither a flush nor a woken read session waits: a yield costs
/// a lone request tens of microseconds (another worker is woken to take the yielded task)
/// and gathers nothing.
pub(crate) fn runtime_is_backlogged() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|runtime| runtime.metrics().global_queue_depth() > 0)
}

/// Where a flush that waits is in its wait.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Waiting {
    No,
    /// Yielded once (no deliveries were pending).
    Yielded,
    /// Held for the connection's pending deliveries, since this release of the release
    /// thread.
    Held(u64),
}

/// An IO whose small writes are gathered until a flush, which waits for the ready
/// tasks first when the runtime is backlogged.
pub struct CoalescedWrites<IO> {
    inner: IO,
    gathered: Vec<u8>,
    /// How much of `gathered` the inner IO has taken (a write may take part of it).
    written: usize,
    waiting: Waiting,
    /// Whether a flush should wait now.
    worth_waiting: fn() -> bool,
    followers: Arc<ConnectionFollowers>,
}

impl<IO> CoalescedWrites<IO> {
    pub fn new(inner: IO, followers: Arc<ConnectionFollowers>) -> Self {
        Self::waiting_when(inner, followers, runtime_is_backlogged)
    }

    fn waiting_when(
        inner: IO,
        followers: Arc<ConnectionFollowers>,
        worth_waiting: fn() -> bool,
    ) -> Self {
        Self {
            inner,
            gathered: Vec::new(),
            written: 0,
            waiting: Waiting::No,
            worth_waiting,
            followers,
        }
    }

    /// Whether the flush goes ahead now; otherwise it has arranged to be polled again.
    fn may_flush(&mut self, cx: &mut Context<'_>) -> bool {
        if self.gathered.is_empty() || !(self.worth_waiting)() {
            return true;
        }
        match self.waiting {
            Waiting::No
                if hold_release::available() && self.followers.deliveries_pending(cx.waker()) =>
            {
                self.waiting = Waiting::Held(hold_release::hold(cx.waker()));
                false
            }
            Waiting::No => {
                // Back of the run queue: the tasks already woken run first.
                self.waiting = Waiting::Yielded;
                cx.waker().wake_by_ref();
                false
            }
            // Polled again: the last pending delivery was made, or the release came, or
            // another stream of the connection queued a frame (gathered above).
            Waiting::Held(release) => {
                release != hold_release::current() || !self.followers.deliveries_pending(cx.waker())
            }
            Waiting::Yielded => true,
        }
    }
}

/// The release thread of held flushes: the latest a held flush waits (see the module's
/// comment).
mod hold_release {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Condvar, LazyLock, Mutex};
    use std::task::Waker;
    use std::time::Duration;

    /// How long a flush is held at most (after which it still waits its turn in the
    /// queue).
    const HOLD_RELEASE_INTERVAL: Duration = Duration::from_millis(2);

    struct Held {
        wakers: Mutex<Vec<Waker>>,
        /// Counts the releases: a flush held in an earlier one is free to go.
        releases: AtomicU64,
        some_held: Condvar,
    }

    static HELD: LazyLock<Held> = LazyLock::new(|| Held {
        wakers: Mutex::new(Vec::new()),
        releases: AtomicU64::new(0),
        some_held: Condvar::new(),
    });

    /// The current release.
    pub fn current() -> u64 {
        HELD.releases.load(Ordering::Acquire)
    }

    /// Whether the release thread runs (started on first use). Without it (the
    /// system refused a thread) flushes are never held: they yield once.
    pub fn available() -> bool {
        static STARTED: LazyLock<bool> = LazyLock::new(|| {
            let started = std::thread::Builder::new()
                .name("flush-release".into())
                .spawn(release_held_flushes);
            if let Err(err) = &started {
                tracing::warn!(error = %err, "no thread for releasing held flushes; connections with many read sessions write more often instead");
            }
            started.is_ok()
        });
        *STARTED
    }

    /// Holds a flush until the next release, which wakes `waker`; the release it is
    /// held in. Only once `available` said so.
    pub fn hold(waker: &Waker) -> u64 {
        let mut wakers = HELD.wakers.lock().unwrap_or_else(|e| e.into_inner());
        wakers.push(waker.clone());
        if wakers.len() == 1 {
            HELD.some_held.notify_one();
        }
        // Read under the lock that a release takes: a flush held here is in the
        // release that takes its waker.
        HELD.releases.load(Ordering::Acquire)
    }

    fn release_held_flushes() {
        loop {
            {
                let mut wakers = HELD.wakers.lock().unwrap_or_else(|e| e.into_inner());
                while wakers.is_empty() {
                    wakers = HELD
                        .some_held
                        .wait(wakers)
                        .unwrap_or_else(|e| e.into_inner());
                }
            }
            std::thread::sleep(HOLD_RELEASE_INTERVAL);
            let released = {
                let mut wakers = HELD.wakers.lock().unwrap_or_else(|e| e.into_inner());
                HELD.releases.fetch_add(1, Ordering::AcqRel);
                std::mem::take(&mut *wakers)
            };
            for waker in released {
                waker.wake();
            }
        }
    }
}

impl<IO: AsyncWrite + Unpin> CoalescedWrites<IO> {
    /// Writes out everything gathered.
    fn poll_write_gathered(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.gathered.len() {
            let n =
                ready!(Pin::new(&mut self.inner).poll_write(cx, &self.gathered[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.gathered.clear();
        self.written = 0;
        // A burst's buffer is not kept by a connection that goes idle.
        if self.gathered.capacity() > RETAINED_CAPACITY {
            self.gathered = Vec::new();
        }
        Poll::Ready(Ok(()))
    }

    /// Makes room for `len` more bytes: `true` when they may be gathered, `false` when
    /// they are too many and go straight to the inner IO (after what was gathered).
    fn poll_room_for(&mut self, cx: &mut Context<'_>, len: usize) -> Poll<io::Result<bool>> {
        if self.gathered.len() + len <= GATHER_LIMIT {
            return Poll::Ready(Ok(true));
        }
        ready!(self.poll_write_gathered(cx))?;
        Poll::Ready(Ok(len <= GATHER_LIMIT))
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for CoalescedWrites<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for CoalescedWrites<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if ready!(self.poll_room_for(cx, buf.len()))? {
            self.gathered.extend_from_slice(buf);
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let len = bufs.iter().map(|buf| buf.len()).sum();
        if ready!(self.poll_room_for(cx, len))? {
            for buf in bufs {
                self.gathered.extend_from_slice(buf);
            }
            return Poll::Ready(Ok(len));
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        // Gathered writes are one buffer; a large one is handed on as it came.
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.may_flush(cx) {
            return Poll::Pending;
        }
        ready!(self.poll_write_gathered(cx))?;
        self.waiting = Waiting::No;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_write_gathered(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::{Wake, Waker};
    use streamgate_core::follow::StreamFollowers;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn small_writes_go_out_together_at_the_flush_and_large_ones_in_order() {
        let (near, mut far) = tokio::io::duplex(1024 * 1024);
        let mut io = CoalescedWrites::new(near, Arc::default());
        io.write_all(b"one ").await.unwrap();
        io.write_all(b"two ").await.unwrap();
        // hyper writes through the vectored call on a socket: its slices, in order.
        let slices = [io::IoSlice::new(b"thr"), io::IoSlice::new(b"ee ")];
        assert_eq!(io.write_vectored(&slices).await.unwrap(), 6);
        let mut seen = [0u8; 14];
        let early = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            far.read_exact(&mut seen),
        )
        .await;
        assert!(early.is_err(), "nothing is written before a flush");
        io.flush().await.unwrap();
        far.read_exact(&mut seen).await.unwrap();
        assert_eq!(&seen, b"one two three ");

        // A write too large to gather follows what was gathered before it.
        let large = vec![7u8; GATHER_LIMIT + 1];
        io.write_all(b"head").await.unwrap();
        io.write_all(&large).await.unwrap();
        io.write_all(b"tail").await.unwrap();
        io.shutdown().await.unwrap();
        let mut rest = Vec::new();
        far.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest.len(), 4 + large.len() + 4);
        assert_eq!(&rest[..4], b"head");
        assert!(rest[4..4 + large.len()].iter().all(|&b| b == 7));
        assert_eq!(&rest[4 + large.len()..], b"tail");
    }

    /// Which of a flush and a task spawned just before it comes first, on a
    /// current-thread runtime (where the task runs only once the flushing one waits).
    async fn flush_or_other_task_first(worth_waiting: fn() -> bool) -> Vec<&'static str> {
        let (near, mut far) = tokio::io::duplex(1024);
        let mut io = CoalescedWrites::waiting_when(near, Arc::default(), worth_waiting);
        let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        io.write_all(b"x").await.unwrap();
        let other = {
            let order = order.clone();
            tokio::spawn(async move { order.lock().unwrap().push("other task") })
        };
        io.flush().await.unwrap();
        order.lock().unwrap().push("flushed");
        other.await.unwrap();
        let mut byte = [0u8; 1];
        far.read_exact(&mut byte).await.unwrap();
        assert_eq!(&byte, b"x");
        let order = order.lock().unwrap().clone();
        order
    }

    #[tokio::test]
    async fn a_flush_lets_other_ready_tasks_run_first_only_when_worth_it() {
        assert_eq!(
            flush_or_other_task_first(|| true).await,
            ["other task", "flushed"]
        );
        assert_eq!(
            flush_or_other_task_first(|| false).await,
            ["flushed", "other task"]
        );
    }

    struct Woken(AtomicBool);

    impl Wake for Woken {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// While a follower woken on the connection has not read its records, a flush is
    /// held; the follower's delivery wakes it, and it goes out then.
    #[tokio::test]
    async fn a_flush_waits_for_the_deliveries_pending_on_its_connection() {
        let stream = StreamFollowers::default();
        let connection = Arc::new(ConnectionFollowers::default());
        let group = stream.group(&connection);
        let mut owed = None;
        {
            let wait = group.wait(None, || false, &mut owed);
            tokio::pin!(wait);
            assert!(futures::poll!(wait.as_mut()).is_pending());
            stream.wake();
            assert!(wait.await, "woken");
        }
        let (near, mut far) = tokio::io::duplex(1024);
        let mut io = CoalescedWrites::waiting_when(near, connection, || true);
        io.write_all(b"x").await.unwrap();
        let woken = Arc::new(Woken(AtomicBool::new(false)));
        let waker = Waker::from(woken.clone());
        let held_in = hold_release::current();
        let flush = Pin::new(&mut io).poll_flush(&mut Context::from_waker(&waker));
        assert!(flush.is_pending(), "held while a delivery is pending");
        drop(owed);
        // The release thread may have let it go meanwhile: only a wake-up without one
        // shows that the delivery woke it.
        if hold_release::current() == held_in {
            assert!(woken.0.load(Ordering::SeqCst), "woken by the delivery");
        }
        let flush = Pin::new(&mut io).poll_flush(&mut Context::from_waker(&waker));
        assert!(flush.is_ready(), "flushed once the delivery was made");
        let mut byte = [0u8; 1];
        far.read_exact(&mut byte).await.unwrap();
        assert_eq!(&byte, b"x");
    }

    #[test]
    fn a_runtime_is_backlogged_while_tasks_wait_in_its_shared_queue() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let (started_tx, started) = std::sync::mpsc::channel();
        let (queued_tx, queued) = std::sync::mpsc::channel::<()>();
        // This task holds the only worker while a task is spawned from outside.
        let holder = runtime.spawn(async move {
            started_tx.send(()).unwrap();
            queued.recv().unwrap();
            runtime_is_backlogged()
        });
        started.recv().unwrap();
        let waiting = runtime.spawn(async {});
        queued_tx.send(()).unwrap();
        assert!(runtime.block_on(holder).unwrap(), "a task was waiting");
        runtime.block_on(waiting).unwrap();
        let idle =
            runtime.block_on(async { tokio::spawn(async { runtime_is_backlogged() }).await });
        assert!(!idle.unwrap(), "nothing was waiting");
        assert!(!runtime_is_backlogged(), "outside a runtime");
    }
}
