//! The appender: admission of appends into the write-ahead log. It refuses appends while
//! the log cannot be written or the server drains, holds each batch to its share of the
//! in-flight byte budget, sequences it under its stream's sequencer lock and hands it to
//! the WAL writer, which acknowledges it once durable.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::JoinHandle;

use crate::error::{Error, Result};
use crate::groups::{GroupOp, Groups};
use crate::membership::Membership;
use crate::record::{AppendAck, AppendInput, ValidBatch};
use crate::stream::{SequencedBatch, StreamState};
use crate::wal::writer::{PendingAppend, WalHealth};

/// The longest an append waits for room in the in-flight budget before it is refused
/// with a retryable error.
const MAX_BUDGET_WAIT: Duration = Duration::from_secs(10);

/// How long a shutdown waits for accepted appends to become durable. Past it (the store
/// is away), the process exits with them unacknowledged: nothing acknowledged is lost.
const MAX_SHUTDOWN_WAIT: Duration = Duration::from_secs(20);

pub(crate) struct Appender {
    /// `None` once shutdown began: no append enters the log after that.
    wal: RwLock<Option<mpsc::Sender<PendingAppend>>>,
    wal_task: Mutex<Option<JoinHandle<()>>>,
    wal_health: WalHealth,
    draining: AtomicBool,
    /// The in-flight byte budget, in KiB permits.
    inflight: Arc<Semaphore>,
    max_inflight_bytes: usize,
    membership: Arc<Membership>,
}

/// What became of a submitted append that was not refused.
pub(crate) enum Submission {
    /// Sequenced here: its acknowledgement, to await.
    Sequenced(PendingAck),
    /// The stream was handed to another node before the batch could be sequenced
    /// here: nothing of it was appended, and it is given back to go there instead.
    Moved(AppendInput, ValidBatch),
}

/// What became of a change to consumer groups: logged (answer once `ack` resolves),
/// or nothing to log (answer once the ops before `durable_at` are durable).
pub(crate) enum GroupChange<R> {
    Sequenced { ack: PendingAck, answer: R },
    Unchanged { durable_at: u64, answer: R },
}

/// The acknowledgement of a submitted append: resolves once the batch is durable.
pub struct PendingAck(oneshot::Receiver<Result<AppendAck>>);

impl PendingAck {
    /// An acknowledgement already decided (an append made at another node).
    pub(crate) fn ready(outcome: Result<AppendAck>) -> PendingAck {
        let (done, ack) = oneshot::channel();
        let _ = done.send(outcome);
        PendingAck(ack)
    }
}

impl std::future::Future for PendingAck {
    type Output = Result<AppendAck>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx).map(|outcome| {
            outcome
                .unwrap_or_else(|_| Err(Error::Unavailable("the write-ahead log stopped".into())))
        })
    }
}

impl Appender {
    pub fn new(
        appends: mpsc::Sender<PendingAppend>,
        wal_task: JoinHandle<()>,
        wal_health: WalHealth,
        max_inflight_bytes: usize,
        membership: Arc<Membership>,
    ) -> Self {
        Self {
            wal: RwLock::new(Some(appends)),
            wal_task: Mutex::new(Some(wal_task)),
            wal_health,
            draining: AtomicBool::new(false),
            inflight: Arc::new(Semaphore::new((max_inflight_bytes / 1024).max(1))),
            max_inflight_bytes,
            membership,
        }
    }

    /// Sequences a checked batch on `stream` now and returns its acknowledgement to
    /// await. Batches submitted one after another are sequenced, made durable and
    /// acknowledged in that order. An error means the batch was not appended.
    pub async fn submit(
        &self,
        stream: &Arc<StreamState>,
        input: AppendInput,
        valid: ValidBatch,
        now_ms: u64,
    ) -> Result<Submission> {
        let budget = self.budget(valid.metered).await?;
        // The store may have started failing while this append waited.
        self.check_accepting()?;
        let (done, ack) = oneshot::channel();
        // Holding a sender keeps the writer running until this batch is in its queue.
        let wal = self.wal.read().clone();
        let wal = wal.ok_or(Error::ServerDraining)?;
        let mut sequencer = stream.sequencer().lock().await;
        // Checked under the sequencer lock, which the hand-off takes after marking the
        // stream: every batch sequenced here is one the hand-off waits for.
        if stream.is_moved() {
            return Ok(Submission::Moved(input, valid));
        }
        // The queue slot is reserved before anything is sequenced: if this future is
        // dropped while waiting (a client hanging up under load), nothing has changed.
        // Once sequenced, the hand-off below cannot wait or fail, and it happens while
        // the sequencer is held, so batches enter the log in sequence order.
        let slot = wal
            .reserve()
            .await
            .map_err(|_| Error::Unavailable("the write-ahead log writer stopped".into()))?;
        let batch = match stream.sequence(&mut sequencer, input, &valid.commands, now_ms) {
            Ok(batch) => batch,
            Err(refusal @ (Error::SeqNumMismatch(_) | Error::FencingTokenMismatch(_))) => {
                // A refused condition names the tail or the token as the sequencer has
                // them, counting batches still on their way to durability. Answered
                // now, it would tell the client of a state a crash can still take back
                // (the tail would go backwards), so, like an acknowledgement, it waits
                // until everything sequenced before it is durable.
                let sequenced = sequencer.next_seq;
                // Nothing of this append is on its way: it holds no lock, queue slot or
                // share of the in-flight budget while it waits.
                drop((sequencer, slot, budget));
                return match tokio::time::timeout(
                    MAX_BUDGET_WAIT,
                    stream.durable_through(sequenced),
                )
                .await
                {
                    Ok(durable) => durable.and(Err(refusal)),
                    Err(_) => Err(Error::Unavailable(format!(
                        "the appends before this one did not become durable within {} s; \
                         retry shortly",
                        MAX_BUDGET_WAIT.as_secs()
                    ))),
                };
            }
            Err(err) => return Err(err),
        };
        slot.send(PendingAppend {
            batch,
            done,
            _budget: budget,
        });
        Ok(Submission::Sequenced(PendingAck(ack)))
    }

    /// Takes a batch's share of the in-flight budget. Waiting for it changes nothing,
    /// so a request dropped here leaves no trace. A budget that stays spent this long
    /// means the store is not keeping up (or is away): the client is told to retry
    /// rather than left waiting without end.
    async fn budget(&self, metered: u64) -> Result<tokio::sync::OwnedSemaphorePermit> {
        tokio::time::timeout(
            MAX_BUDGET_WAIT,
            self.inflight
                .clone()
                .acquire_many_owned(self.budget_kib(metered)),
        )
        .await
        .map_err(|_| {
            Error::Unavailable(format!(
                "the server's {} MiB of memory for appends on their way to durability \
                 stayed full for {} s; retry shortly",
                self.max_inflight_bytes / (1024 * 1024),
                MAX_BUDGET_WAIT.as_secs()
            ))
        })?
        .map_err(|_| Error::ServerDraining)
    }

    /// Decides changes to a stream's consumer groups under its sequencer lock and logs
    /// them: `plan` sees the groups with every op sequenced before (durable or not);
    /// its answer is to be given once its ops, and every op before them, are durable.
    pub async fn change_groups<R>(
        &self,
        stream: &Arc<StreamState>,
        plan: impl FnOnce(&Groups) -> Result<(Vec<GroupOp>, R)>,
    ) -> Result<GroupChange<R>> {
        // Group ops are small: a token share of the budget keeps them in its accounting.
        let budget = self.budget(1024).await?;
        self.check_accepting()?;
        let wal = self.wal.read().clone();
        let wal = wal.ok_or(Error::ServerDraining)?;
        let mut sequencer = stream.sequencer().lock().await;
        if stream.is_moved() {
            return Err(Error::StreamMoved);
        }
        let (ops, answer) = plan(&sequencer.groups)?;
        if ops.is_empty() {
            return Ok(GroupChange::Unchanged {
                durable_at: sequencer.next_group_op,
                answer,
            });
        }
        let slot = wal
            .reserve()
            .await
            .map_err(|_| Error::Unavailable("the write-ahead log writer stopped".into()))?;
        let batch = stream.sequence_group_ops(&mut sequencer, &ops)?;
        let (done, ack) = oneshot::channel();
        slot.send(PendingAppend {
            batch,
            done,
            _budget: budget,
        });
        Ok(GroupChange::Sequenced {
            ack: PendingAck(ack),
            answer,
        })
    }

    /// Writes again into this node's log a batch another node's log holds, for a stream
    /// this node is taking over (not serving yet, so nothing else sequences it): its
    /// acknowledgement says it is durable here.
    pub async fn relog(&self, batch: SequencedBatch) -> Result<PendingAck> {
        let metered = batch.records.iter().map(|r| r.body.len() as u64 + 8).sum();
        let budget = self.budget(metered).await?;
        self.check_accepting()?;
        let wal = self.wal.read().clone().ok_or(Error::ServerDraining)?;
        let (done, ack) = oneshot::channel();
        wal.send(PendingAppend {
            batch,
            done,
            _budget: budget,
        })
        .await
        .map_err(|_| Error::Unavailable("the write-ahead log writer stopped".into()))?;
        Ok(PendingAck(ack))
    }

    /// The share of the in-flight byte budget a batch of `metered` bytes takes, in KiB.
    fn budget_kib(&self, metered: u64) -> u32 {
        let total = self.max_inflight_bytes / 1024;
        (metered.div_ceil(1024) as usize).clamp(1, total.max(1)) as u32
    }

    /// Bytes of appends accepted and not yet durable (to the KiB).
    pub fn inflight_bytes(&self) -> usize {
        let total = (self.max_inflight_bytes / 1024).max(1);
        total.saturating_sub(self.inflight.available_permits()) * 1024
    }

    /// Whether an append of `metered` bytes would have to wait now because the bytes
    /// already on their way to durability use up the in-flight budget.
    pub fn is_congested(&self, metered: u64) -> bool {
        self.inflight.available_permits() < self.budget_kib(metered) as usize
    }

    /// Refuses appends, before they are sequenced, while the log cannot take them.
    pub fn check_accepting(&self) -> Result<()> {
        self.membership.check()?;
        if let Some(reason) = self.wal_health.borrow().refusal() {
            return Err(Error::Unavailable(reason));
        }
        if self.wal_writer_stopped() {
            return Err(Error::Unavailable(
                "the write-ahead log writer stopped unexpectedly (see the server log); \
                 restart streamgate, which recovers every acknowledged record"
                    .into(),
            ));
        }
        if self.draining.load(Ordering::SeqCst) {
            return Err(Error::ServerDraining);
        }
        Ok(())
    }

    /// Why appends cannot be served now, if they cannot (for readiness).
    pub fn unready_reason(&self) -> Option<String> {
        if self.draining.load(Ordering::SeqCst) {
            return Some("the server is shutting down".into());
        }
        if self.wal_writer_stopped() {
            return Some("the write-ahead log writer stopped; see the server log".into());
        }
        if let Err(err) = self.membership.check() {
            return Some(err.to_string());
        }
        self.wal_health.borrow().unready_reason()
    }

    /// Whether the WAL writer ended while the server was not shutting down (it
    /// panicked): no append can be made durable any more.
    fn wal_writer_stopped(&self) -> bool {
        self.wal_task
            .lock()
            .as_ref()
            .is_some_and(JoinHandle::is_finished)
    }

    /// New appends are refused with `server_draining`; accepted ones go on.
    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Closes the log to appends and waits (a bounded time) until every accepted one is
    /// durable and acknowledged.
    pub async fn close(&self) {
        self.begin_drain();
        self.wal.write().take();
        let task = self.wal_task.lock().take();
        if let Some(task) = task {
            if tokio::time::timeout(MAX_SHUTDOWN_WAIT, task).await.is_err() {
                tracing::error!(
                    "the record store did not take the last appends within {} s; exiting \
                     without them (they were never acknowledged)",
                    MAX_SHUTDOWN_WAIT.as_secs()
                );
            }
        }
    }
}
