//! One stream's live state. Two halves with separate locks:
//! - the **sequencer** (async mutex, held across the hand-off to the WAL writer so batches
//!   enter the log in sequence order): checks append conditions, assigns sequence numbers
//!   and timestamps, and tracks the fencing token and trim point including batches not yet
//!   durable;
//! - the **visible** state: the durable tail, trim point and where each durable batch lies
//!   in the WAL. Readers only ever see this half, so they never see a record before it is
//!   durable. Followers wait on `tail_tx`, or, for read sessions on a known connection,
//!   in `followers`, grouped by connection.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

use tokio::sync::{watch, Mutex};

use crate::config::{StreamConfig, TimestampingMode};
use crate::encryption::Cipher;
use crate::error::{Error, Resource, Result};
use crate::follow::StreamFollowers;
use crate::groups::{GroupOp, GroupTurn, Groups, ReadAhead};
use crate::names::StreamName;
use crate::record::{AppendInput, Command, StreamPosition};
use crate::wal::{EntryKind, EntrySpan, StoredRecord};

pub(crate) struct StreamState {
    pub id: u64,
    pub name: StreamName,
    /// Fixed when the stream was created: its records are sealed with it.
    pub cipher: Option<Cipher>,
    config: RwLock<StreamConfig>,
    sequencer: Mutex<SequencerState>,
    visible: RwLock<VisibleState>,
    tail_tx: watch::Sender<StreamPosition>,
    followers: StreamFollowers,
    group_ops_durable: GroupOpsDurable,
    /// Taken by group changes decided from records read first (see `GroupTurn`).
    group_turn: Arc<tokio::sync::Mutex<ReadAhead>>,
    /// `OPEN`, `MOVED` or `DELETED`: whether this node still sequences the stream.
    closed: AtomicU8,
}

/// The stream is served here.
const OPEN: u8 = 0;
/// Handed to another node: nothing more is sequenced here, followers end.
const MOVED: u8 = 1;
/// Deleted.
const DELETED: u8 = 2;

#[derive(Debug, Clone, Default)]
pub(crate) struct SequencerState {
    pub next_seq: u64,
    pub last_timestamp: u64,
    pub fencing_token: String,
    pub trim_point: u64,
    /// The stream's consumer groups, with every op sequenced so far (shared until
    /// changed: checkpoints copy it cheaply).
    pub groups: Arc<Groups>,
    /// The number the next group op gets.
    pub next_group_op: u64,
}

#[derive(Debug, Default)]
pub(crate) struct VisibleState {
    pub tail: StreamPosition,
    pub trim_point: u64,
    /// The end of the records that are in segments: those before `compacted.seq_num`
    /// are found through the segment index, the rest through `batches`.
    pub compacted: StreamPosition,
    /// Durable batches still only in the WAL, in sequence order.
    pub batches: Vec<BatchLocation>,
}

/// What a stream keeps: its records from `trim_point` on, in segments written at or after
/// `written_since_ms` (its retention age ago). Lifecycle drops the segments outside it
/// from the index; readers take no answer kept from before of such a segment
/// (`segment_lookups`), because it may have been dropped since.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Retained {
    pub trim_point: u64,
    pub written_since_ms: u64,
}

impl Retained {
    /// Whether a segment ending at `end_seq`, written at `written_at_ms`, lies outside
    /// what the stream keeps.
    pub fn excludes(&self, end_seq: u64, written_at_ms: u64) -> bool {
        end_seq <= self.trim_point || written_at_ms < self.written_since_ms
    }
}

/// The group ops durable so far, for answers that must wait until what they saw is.
type GroupOpsDurable = watch::Sender<u64>;

/// Which kind of object holds a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stored {
    WalChunk,
    Segment,
}

/// Where a durable batch lies: an object and the entry's byte span in it.
#[derive(Debug, Clone)]
pub(crate) struct BatchLocation {
    pub start_seq: u64,
    pub end_seq: u64,
    pub last_timestamp: u64,
    pub object: Arc<str>,
    pub stored: Stored,
    pub span: EntrySpan,
}

impl BatchLocation {
    /// Where a batch of a segment lies, from the segment's index entry.
    pub fn in_segment(key: Arc<str>, entry: &crate::segment::SegmentEntry) -> Self {
        BatchLocation {
            start_seq: entry.start_seq,
            end_seq: entry.end_seq,
            last_timestamp: entry.last_timestamp,
            object: key,
            stored: Stored::Segment,
            span: entry.span,
        }
    }
}

/// A batch the sequencer has accepted, on its way to the WAL: records at positions
/// `first_seq..`, or (`kind` group ops) consumer-group ops numbered `first_seq..`.
pub(crate) struct SequencedBatch {
    pub stream: Arc<StreamState>,
    pub kind: EntryKind,
    pub first_seq: u64,
    pub records: Arc<[StoredRecord]>,
    pub trim_point: u64,
}

impl SequencedBatch {
    /// The stream id its WAL entry carries (marked for group ops).
    pub fn entry_stream_id(&self) -> u64 {
        match self.kind {
            EntryKind::Records => self.stream.id,
            EntryKind::GroupOps => self.stream.id | crate::wal::GROUP_OPS,
        }
    }

    pub fn start(&self) -> StreamPosition {
        StreamPosition {
            seq_num: self.first_seq,
            timestamp: self.records[0].timestamp,
        }
    }

    pub fn end(&self) -> StreamPosition {
        StreamPosition {
            seq_num: self.first_seq + self.records.len() as u64,
            timestamp: self.records[self.records.len() - 1].timestamp,
        }
    }
}

impl StreamState {
    pub fn new(
        id: u64,
        name: StreamName,
        config: StreamConfig,
        cipher: Option<Cipher>,
        recovered: SequencerState,
        compacted: StreamPosition,
        batches: Vec<BatchLocation>,
    ) -> Arc<Self> {
        let tail = StreamPosition {
            seq_num: recovered.next_seq,
            timestamp: recovered.last_timestamp,
        };
        let group_ops = recovered.next_group_op;
        let visible = VisibleState {
            tail,
            trim_point: recovered.trim_point,
            compacted,
            batches,
        };
        Arc::new(Self {
            id,
            name,
            cipher,
            config: RwLock::new(config),
            sequencer: Mutex::new(recovered),
            visible: RwLock::new(visible),
            tail_tx: watch::Sender::new(tail),
            followers: StreamFollowers::default(),
            group_ops_durable: watch::Sender::new(group_ops),
            group_turn: Arc::default(),
            closed: AtomicU8::new(OPEN),
        })
    }

    pub fn config(&self) -> StreamConfig {
        *self.config.read()
    }

    pub fn set_config(&self, config: StreamConfig) {
        *self.config.write() = config;
    }

    /// Marks the stream deleted and wakes its followers so they can end.
    pub fn mark_deleted(&self) {
        self.closed.store(DELETED, Ordering::SeqCst);
        self.tail_tx.send_modify(|_| {});
        self.followers.wake();
    }

    /// Marks the stream as handed to another node (unless deleted): nothing more is
    /// sequenced here, and followers are woken so they can end.
    pub fn mark_moved(&self) {
        let _ = self
            .closed
            .compare_exchange(OPEN, MOVED, Ordering::SeqCst, Ordering::SeqCst);
        self.tail_tx.send_modify(|_| {});
        self.followers.wake();
    }

    pub fn is_deleted(&self) -> bool {
        self.closed.load(Ordering::SeqCst) == DELETED
    }

    pub fn is_moved(&self) -> bool {
        self.closed.load(Ordering::SeqCst) == MOVED
    }

    /// Why nothing more can be appended here or followed here, if so.
    pub fn closed(&self) -> Option<Error> {
        match self.closed.load(Ordering::SeqCst) {
            OPEN => None,
            MOVED => Some(Error::StreamMoved),
            _ => Some(Error::DeletionPending(Resource::Stream(self.name.clone()))),
        }
    }

    /// Waits for this stream's turn at a group change decided from records read first.
    pub async fn group_turn(&self) -> GroupTurn {
        GroupTurn::new(self.group_turn.clone().lock_owned().await)
    }

    pub fn sequencer(&self) -> &Mutex<SequencerState> {
        &self.sequencer
    }

    /// What the stream keeps now, by its trim point and retention age. (Records arrived
    /// no later than their segment was written, so a segment's age bounds theirs.)
    pub fn retained(&self) -> Retained {
        let written_since_ms = match self.config().retention_policy {
            Some(crate::config::RetentionPolicy::Age(secs)) => {
                crate::record::now_ms().saturating_sub(secs.saturating_mul(1000))
            }
            _ => 0,
        };
        Retained {
            trim_point: self.visible().trim_point,
            written_since_ms,
        }
    }

    pub fn visible(&self) -> parking_lot::RwLockReadGuard<'_, VisibleState> {
        self.visible.read()
    }

    pub fn tail(&self) -> StreamPosition {
        self.visible().tail
    }

    pub fn subscribe(&self) -> watch::Receiver<StreamPosition> {
        self.tail_tx.subscribe()
    }

    /// The stream's followers grouped by connection.
    pub fn followers(&self) -> &StreamFollowers {
        &self.followers
    }

    /// Waits until every record before `seq_num` is durable (visible), or the stream is
    /// deleted (a stream handed over still becomes durable: the hand-off waits for it).
    pub async fn durable_through(&self, seq_num: u64) -> Result<()> {
        let mut tail = self.subscribe();
        loop {
            if self.is_deleted() {
                return Err(Error::DeletionPending(Resource::Stream(self.name.clone())));
            }
            if tail.borrow_and_update().seq_num >= seq_num {
                return Ok(());
            }
            // The sender lives as long as `self`, so this only ever wakes on a change.
            let _ = tail.changed().await;
        }
    }

    /// Checks conditions and assigns positions. The caller holds the sequencer lock and
    /// hands the batch to the WAL writer before releasing it.
    pub fn sequence(
        self: &Arc<Self>,
        state: &mut SequencerState,
        input: AppendInput,
        commands: &[(usize, Command)],
        arrival_ms: u64,
    ) -> Result<SequencedBatch> {
        if let Some(closed) = self.closed() {
            return Err(closed);
        }
        if let Some(token) = &input.fencing_token {
            if *token != state.fencing_token {
                return Err(Error::FencingTokenMismatch(state.fencing_token.clone()));
            }
        }
        if let Some(expected) = input.match_seq_num {
            if expected != state.next_seq {
                return Err(Error::SeqNumMismatch(state.next_seq));
            }
        }
        if let Some(cipher) = self.cipher {
            check_record_limit(cipher, state.next_seq, input.records.len(), commands)?;
        }
        let config = self.config();
        let mode = config.timestamping_mode();
        let uncapped = config.timestamping_uncapped();
        let mut last_timestamp = state.last_timestamp;
        let mut records = Vec::with_capacity(input.records.len());
        for record in input.records {
            let mut timestamp = match (mode, record.timestamp) {
                (TimestampingMode::Arrival, _) => arrival_ms,
                (_, Some(client)) => client,
                (TimestampingMode::ClientPrefer, None) => arrival_ms,
                (TimestampingMode::ClientRequire, None) => {
                    return Err(Error::invalid(
                        "this stream's timestamping mode is client-require: every record needs a timestamp",
                    ))
                }
            };
            if !uncapped {
                timestamp = timestamp.min(arrival_ms);
            }
            timestamp = timestamp.max(last_timestamp);
            last_timestamp = timestamp;
            records.push(StoredRecord {
                timestamp,
                headers: record.headers,
                body: record.body,
            });
        }
        let first_seq = state.next_seq;
        let mut effects = CommandEffects::from(&*state);
        effects.apply(first_seq, commands.iter().map(|(i, c)| (*i, c)));
        state.next_seq += records.len() as u64;
        state.last_timestamp = last_timestamp;
        state.fencing_token = effects.fencing_token;
        state.trim_point = effects.trim_point;
        Ok(SequencedBatch {
            stream: self.clone(),
            kind: EntryKind::Records,
            first_seq,
            records: records.into(),
            trim_point: effects.trim_point,
        })
    }

    /// Applies consumer-group ops (checked against the bounds first) and numbers them:
    /// the batch that logs them. The caller holds the sequencer lock, as for records.
    pub fn sequence_group_ops(
        self: &Arc<Self>,
        state: &mut SequencerState,
        ops: &[GroupOp],
    ) -> Result<SequencedBatch> {
        if let Some(closed) = self.closed() {
            return Err(closed);
        }
        for op in ops {
            state.groups.check(op)?;
        }
        let groups = Arc::make_mut(&mut state.groups);
        let records: Vec<StoredRecord> = ops
            .iter()
            .map(|op| {
                groups.apply(op);
                StoredRecord {
                    timestamp: 0,
                    headers: Vec::new(),
                    body: crate::groups::encode(op),
                }
            })
            .collect();
        let first_seq = state.next_group_op;
        state.next_group_op += records.len() as u64;
        Ok(SequencedBatch {
            stream: self.clone(),
            kind: EntryKind::GroupOps,
            first_seq,
            records: records.into(),
            trim_point: state.trim_point,
        })
    }

    /// Waits until every group op numbered below `through` is durable (or the stream
    /// is deleted).
    pub async fn group_ops_durable_through(&self, through: u64) -> Result<()> {
        let mut durable = self.group_ops_durable.subscribe();
        loop {
            if self.is_deleted() {
                return Err(Error::DeletionPending(Resource::Stream(self.name.clone())));
            }
            if *durable.borrow_and_update() >= through {
                return Ok(());
            }
            if durable.changed().await.is_err() {
                return Ok(());
            }
        }
    }

    /// Makes a durable batch visible to readers (followers are woken by
    /// `wake_followers`, once the batch's acknowledgement is on its way); for group ops,
    /// marks them durable.
    pub fn publish(&self, batch: &SequencedBatch, chunk: Arc<str>, span: EntrySpan) {
        if batch.kind == EntryKind::GroupOps {
            let end = batch.first_seq + batch.records.len() as u64;
            self.group_ops_durable
                .send_modify(|durable| *durable = (*durable).max(end));
            return;
        }
        let end = batch.end();
        let mut visible = self.visible.write();
        visible.tail = end;
        visible.trim_point = visible.trim_point.max(batch.trim_point);
        visible.batches.push(BatchLocation {
            start_seq: batch.first_seq,
            end_seq: end.seq_num,
            last_timestamp: end.timestamp,
            object: chunk,
            stored: Stored::WalChunk,
            span,
        });
    }

    /// Wakes the followers of the stream (and whoever waits for records to be durable)
    /// to what `publish` made visible.
    pub fn wake_followers(&self) {
        let tail = self.visible.read().tail;
        let moved = self.tail_tx.send_if_modified(|seen| {
            let moved = *seen != tail;
            *seen = tail;
            moved
        });
        if moved {
            self.followers.wake();
        }
    }

    /// Records before `through` are now in segments: reads find them through the index,
    /// and their WAL locations are forgotten.
    pub fn mark_compacted(&self, through: StreamPosition) {
        let mut visible = self.visible.write();
        if through.seq_num <= visible.compacted.seq_num {
            return;
        }
        visible.compacted = through;
        let done = visible
            .batches
            .partition_point(|b| b.end_seq <= through.seq_num);
        visible.batches.drain(..done);
    }
}

/// Refuses a batch that would put a record (other than a command record) at a position
/// past what its cipher allows (2^32 records for AES-256-GCM).
fn check_record_limit(
    cipher: Cipher,
    next_seq: u64,
    records: usize,
    commands: &[(usize, Command)],
) -> Result<()> {
    let last_record = (0..records)
        .rev()
        .find(|i| !commands.iter().any(|(at, _)| at == i));
    match last_record {
        Some(i) if next_seq.saturating_add(i as u64) >= cipher.max_records() => {
            Err(Error::invalid(format!(
                "a stream encrypted with {cipher} can hold at most {} records (sequence \
                 numbers up to {}); this append would place one at {}. Create a new stream \
                 (aegis-256 has no such limit) and move writers to it",
                cipher.max_records(),
                cipher.max_records() - 1,
                next_seq.saturating_add(i as u64)
            )))
        }
        _ => Ok(()),
    }
}

impl SequencerState {
    /// Applies one durable batch of group ops (`records` numbered from `next_group_op`,
    /// never empty): how recovery and compaction follow a stream's groups.
    pub fn replay_group_ops(&mut self, records: &[crate::record::SequencedRecord]) -> Result<()> {
        let groups = Arc::make_mut(&mut self.groups);
        for record in records {
            groups.apply(&crate::groups::decode(&record.body)?);
        }
        self.next_group_op = records[records.len() - 1].seq_num + 1;
        Ok(())
    }

    /// Advances past one durable batch (`records` in sequence order, never empty),
    /// applying its command records: how recovery replays the log and compaction moves
    /// a stream's checkpoint, with the same rules as [`StreamState::sequence`].
    pub fn replay(&mut self, records: &[crate::record::SequencedRecord]) {
        let first_seq = records[0].seq_num;
        let commands: Vec<(usize, Command)> = records
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                Command::parse(&r.headers, &r.body)
                    .ok()
                    .flatten()
                    .map(|c| (i, c))
            })
            .collect();
        let mut effects = CommandEffects::from(&*self);
        effects.apply(first_seq, commands.iter().map(|(i, c)| (*i, c)));
        let last = &records[records.len() - 1];
        self.next_seq = last.seq_num + 1;
        self.last_timestamp = last.timestamp;
        self.fencing_token = effects.fencing_token;
        self.trim_point = effects.trim_point;
    }
}

/// The fencing token and trim point as command records change them. One piece of code
/// for the sequencer and for recovery, so both always agree.
pub(crate) struct CommandEffects {
    pub fencing_token: String,
    pub trim_point: u64,
}

impl From<&SequencerState> for CommandEffects {
    fn from(state: &SequencerState) -> Self {
        Self {
            fencing_token: state.fencing_token.clone(),
            trim_point: state.trim_point,
        }
    }
}

impl<'a> CommandEffects {
    /// Applies commands found at `index` within a batch that starts at `first_seq`.
    pub fn apply(&mut self, first_seq: u64, commands: impl Iterator<Item = (usize, &'a Command)>) {
        for (index, command) in commands {
            let seq_num = first_seq + index as u64;
            match command {
                Command::Fence(token) => self.fencing_token = token.clone(),
                Command::Trim(requested) => {
                    self.trim_point = self.trim_point.max((*requested).min(seq_num + 1));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TimestampingConfig;
    use crate::record::AppendRecord;
    use bytes::Bytes;
    use futures::FutureExt;

    fn stream(mode: TimestampingMode, uncapped: bool) -> Arc<StreamState> {
        let config = StreamConfig {
            timestamping: Some(TimestampingConfig {
                mode: Some(mode),
                uncapped: Some(uncapped),
            }),
            ..Default::default()
        };
        StreamState::new(
            1,
            StreamName::new("s").unwrap(),
            config,
            None,
            SequencerState::default(),
            StreamPosition::default(),
            Vec::new(),
        )
    }

    fn input(timestamps: &[Option<u64>]) -> AppendInput {
        AppendInput {
            records: timestamps
                .iter()
                .map(|ts| AppendRecord {
                    timestamp: *ts,
                    headers: vec![],
                    body: Bytes::from_static(b"x"),
                })
                .collect(),
            ..Default::default()
        }
    }

    fn timestamps(batch: &SequencedBatch) -> Vec<u64> {
        batch.records.iter().map(|r| r.timestamp).collect()
    }

    #[tokio::test]
    async fn timestamps_follow_mode_cap_and_monotonicity() {
        let s = stream(TimestampingMode::ClientPrefer, false);
        let mut st = s.sequencer().lock().await;
        // Client values are used, capped at arrival (1000), and never go backwards.
        let b = s
            .sequence(
                &mut st,
                input(&[Some(500), None, Some(5000), Some(100)]),
                &[],
                1000,
            )
            .unwrap();
        assert_eq!(timestamps(&b), vec![500, 1000, 1000, 1000]);
        assert_eq!(b.first_seq, 0);
        let b = s.sequence(&mut st, input(&[Some(10)]), &[], 2000).unwrap();
        assert_eq!(timestamps(&b), vec![1000]);
        assert_eq!(b.first_seq, 4);

        let s = stream(TimestampingMode::ClientPrefer, true);
        let mut st = s.sequencer().lock().await;
        let b = s
            .sequence(&mut st, input(&[Some(5000)]), &[], 1000)
            .unwrap();
        assert_eq!(timestamps(&b), vec![5000]);

        let s = stream(TimestampingMode::Arrival, true);
        let mut st = s.sequencer().lock().await;
        let b = s
            .sequence(&mut st, input(&[Some(5000), None]), &[], 1000)
            .unwrap();
        assert_eq!(timestamps(&b), vec![1000, 1000]);

        let s = stream(TimestampingMode::ClientRequire, false);
        let mut st = s.sequencer().lock().await;
        let err = s.sequence(&mut st, input(&[Some(1), None]), &[], 1000);
        assert_eq!(err.err().unwrap().code(), "invalid");
        assert_eq!(st.next_seq, 0, "a rejected batch assigns nothing");
    }

    #[tokio::test]
    async fn conditions_are_checked_against_the_sequencer() {
        let s = stream(TimestampingMode::ClientPrefer, false);
        let mut st = s.sequencer().lock().await;
        s.sequence(&mut st, input(&[None, None]), &[], 1).unwrap();
        let mut wrong = input(&[None]);
        wrong.match_seq_num = Some(1);
        assert!(matches!(
            s.sequence(&mut st, wrong, &[], 1),
            Err(Error::SeqNumMismatch(2))
        ));
        let mut right = input(&[None]);
        right.match_seq_num = Some(2);
        assert!(s.sequence(&mut st, right, &[], 1).is_ok());

        // Fence, then appends with another token fail with the current token.
        let fence = [(0usize, Command::Fence("w1".into()))];
        s.sequence(&mut st, input(&[None]), &fence, 1).unwrap();
        let mut other = input(&[None]);
        other.fencing_token = Some("w2".into());
        assert!(matches!(
            s.sequence(&mut st, other, &[], 1),
            Err(Error::FencingTokenMismatch(t)) if t == "w1"
        ));
        let mut same = input(&[None]);
        same.fencing_token = Some("w1".into());
        assert!(s.sequence(&mut st, same, &[], 1).is_ok());
    }

    #[tokio::test]
    async fn durable_through_waits_for_the_visible_tail() {
        let s = stream(TimestampingMode::ClientPrefer, false);
        let batch = {
            let mut st = s.sequencer().lock().await;
            s.sequence(&mut st, input(&[None, None]), &[], 1).unwrap()
        };
        assert!(s.durable_through(0).now_or_never().is_some());
        let mut waiting = Box::pin(s.durable_through(2));
        assert!(
            (&mut waiting).now_or_never().is_none(),
            "sequenced is not durable"
        );
        s.publish(&batch, "chunk".into(), EntrySpan { offset: 0, len: 1 });
        assert_eq!(s.tail().seq_num, 2, "readers see a published batch at once");
        assert!(
            (&mut waiting).now_or_never().is_none(),
            "followers wait to be woken (after the acknowledgements)"
        );
        s.wake_followers();
        assert!(matches!(waiting.now_or_never(), Some(Ok(()))));
        let mut beyond = Box::pin(s.durable_through(3));
        assert!((&mut beyond).now_or_never().is_none());
        s.mark_deleted();
        assert!(matches!(
            beyond.now_or_never(),
            Some(Err(Error::DeletionPending(_)))
        ));
    }

    #[tokio::test]
    async fn a_moved_stream_sequences_nothing_more_but_what_it_had_still_becomes_durable() {
        let s = stream(TimestampingMode::ClientPrefer, false);
        let batch = {
            let mut st = s.sequencer().lock().await;
            s.sequence(&mut st, input(&[None]), &[], 1).unwrap()
        };
        let mut follower = s.subscribe();
        follower.borrow_and_update();
        s.mark_moved();
        assert!(s.is_moved() && !s.is_deleted());
        assert!(
            follower.has_changed().unwrap(),
            "followers are woken to end"
        );
        assert!(matches!(s.closed(), Some(Error::StreamMoved)));
        {
            let mut st = s.sequencer().lock().await;
            assert!(matches!(
                s.sequence(&mut st, input(&[None]), &[], 2),
                Err(Error::StreamMoved)
            ));
            assert_eq!(st.next_seq, 1, "nothing was sequenced");
        }
        // What was sequenced before the mark: the hand-off waits for it.
        let mut waiting = Box::pin(s.durable_through(1));
        assert!((&mut waiting).now_or_never().is_none());
        s.publish(&batch, "chunk".into(), EntrySpan { offset: 0, len: 1 });
        s.wake_followers();
        assert!(matches!(waiting.now_or_never(), Some(Ok(()))));
        // Deletion still wins over a move, and a move never undoes a deletion.
        s.mark_deleted();
        s.mark_moved();
        assert!(s.is_deleted());
    }

    #[test]
    fn aes_gcm_streams_take_records_up_to_two_to_the_32_and_commands_past_it() {
        let max = Cipher::Aes256Gcm.max_records();
        let trim = [(1usize, Command::Trim(0))];
        // The last record lands at max - 1: allowed.
        assert!(check_record_limit(Cipher::Aes256Gcm, max - 2, 2, &[]).is_ok());
        // One past it: refused, and the message says why.
        let err = check_record_limit(Cipher::Aes256Gcm, max - 1, 2, &[]).unwrap_err();
        assert_eq!(err.code(), "invalid");
        assert!(
            err.to_string().contains("at most 4294967296 records"),
            "{err}"
        );
        // A command record may take the position past the limit.
        assert!(check_record_limit(Cipher::Aes256Gcm, max - 1, 2, &trim).is_ok());
        assert!(
            check_record_limit(Cipher::Aes256Gcm, max + 5, 1, &[(0, Command::Trim(0))]).is_ok()
        );
        // AEGIS-256 has no such limit.
        assert!(check_record_limit(Cipher::Aegis256, max + 5, 1000, &[]).is_ok());
    }

    #[test]
    fn trim_point_follows_the_documented_formula() {
        let mut effects = CommandEffects {
            fencing_token: String::new(),
            trim_point: 0,
        };
        // A trim at seq 10 asking for 100 trims through itself only: 11.
        effects.apply(10, [(0, &Command::Trim(100))].into_iter());
        assert_eq!(effects.trim_point, 11);
        // It never moves backwards.
        effects.apply(20, [(0, &Command::Trim(5))].into_iter());
        assert_eq!(effects.trim_point, 11);
        effects.apply(20, [(1, &Command::Trim(15))].into_iter());
        assert_eq!(effects.trim_point, 15);
    }
}
