//! Consumer groups: state that belongs to a stream (Redis Streams semantics), kept by
//! the node that sequences the stream. Every change is a [`GroupOp`], decided under the
//! stream's sequencer lock, written to the write-ahead log with the stream's records and
//! answered only once durable; recovery and takeover replay the ops, and compaction
//! checkpoints the state with the stream. Nothing here is visible to S2 readers, and no
//! op takes a sequence number of the stream.
//!
//! Entry IDs are `<timestamp>-<seq_num>`: ordered by timestamp, then sequence number,
//! which for a stream's records is the order of their positions.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Most consumer groups one stream may have.
pub const MAX_GROUPS: usize = 1_000;
/// Most consumers one group may have.
pub const MAX_CONSUMERS: usize = 10_000;
/// Longest group or consumer name, in bytes.
pub const MAX_NAME: usize = 256;

/// A stream entry ID, or a bound given as one.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct EntryId {
    pub timestamp: u64,
    pub seq_num: u64,
}

impl EntryId {
    pub const MIN: EntryId = EntryId {
        timestamp: 0,
        seq_num: 0,
    };
    pub const MAX: EntryId = EntryId {
        timestamp: u64::MAX,
        seq_num: u64::MAX,
    };

    pub fn new(timestamp: u64, seq_num: u64) -> EntryId {
        EntryId { timestamp, seq_num }
    }

    /// The ID of a stream's record.
    pub fn of(record: &crate::record::SequencedRecord) -> EntryId {
        EntryId::new(record.timestamp, record.seq_num)
    }

    /// `<timestamp>-<seq_num>`, as replies carry it.
    pub fn to_bytes(self) -> bytes::Bytes {
        bytes::Bytes::from(self.to_string())
    }
}

impl std::fmt::Display for EntryId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.timestamp, self.seq_num)
    }
}

/// An entry delivered to a consumer and not acknowledged yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nack {
    pub consumer: String,
    /// When it was last delivered (ms since the Unix epoch).
    pub delivered_ms: u64,
    pub deliveries: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Consumer {
    /// When the consumer last read or claimed (ms since the Unix epoch).
    pub seen_ms: u64,
    /// The entries pending for it.
    pub pending: BTreeSet<EntryId>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Group {
    /// The last entry delivered to the group (new entries come after it).
    pub last_id: EntryId,
    /// How many entries the group has read, when known.
    pub entries_read: Option<u64>,
    #[serde(with = "pairs")]
    pub pending: BTreeMap<EntryId, Nack>,
    pub consumers: BTreeMap<String, Consumer>,
}

/// A map keyed by entry ID in its logged form: a list of pairs (JSON keys must be
/// strings).
mod pairs {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serializer};

    use super::{EntryId, Nack};

    pub fn serialize<S: Serializer>(
        map: &BTreeMap<EntryId, Nack>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(map.iter())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<BTreeMap<EntryId, Nack>, D::Error> {
        Ok(Vec::<(EntryId, Nack)>::deserialize(deserializer)?
            .into_iter()
            .collect())
    }
}

/// One change to a stream's groups, as logged. Each carries everything it needs
/// (times included), so replaying the log gives the same state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum GroupOp {
    Create {
        group: String,
        last_id: EntryId,
        entries_read: Option<u64>,
    },
    SetId {
        group: String,
        last_id: EntryId,
        entries_read: Option<u64>,
    },
    Destroy {
        group: String,
    },
    /// Creates the consumer if it does not exist, and marks it seen at `now_ms`.
    Touch {
        group: String,
        consumer: String,
        now_ms: u64,
    },
    /// Creates the consumer if it does not exist, without marking it seen.
    CreateConsumer {
        group: String,
        consumer: String,
        now_ms: u64,
    },
    DeleteConsumer {
        group: String,
        consumer: String,
    },
    /// New entries delivered to a consumer (XREADGROUP `>`): the group's last ID moves
    /// to `last_id`, and unless `noack` each entry becomes pending for the consumer.
    Deliver {
        group: String,
        consumer: String,
        now_ms: u64,
        ids: Vec<EntryId>,
        last_id: EntryId,
        entries_read: Option<u64>,
        noack: bool,
    },
    /// Pending entries delivered again: to `consumer` (claimed from whoever had them),
    /// at `delivered_ms`, with `deliveries` set or (when `None`) counted up by
    /// `count_up`. Entries not pending become pending when `create` (XCLAIM FORCE).
    Redeliver {
        group: String,
        consumer: String,
        now_ms: u64,
        ids: Vec<EntryId>,
        delivered_ms: u64,
        deliveries: Option<u64>,
        count_up: bool,
        create: bool,
    },
    /// Entries no longer pending: acknowledged, or gone from the stream.
    Ack {
        group: String,
        ids: Vec<EntryId>,
    },
    /// The group's last ID moves forward to `last_id` (XCLAIM LASTID).
    Advance {
        group: String,
        last_id: EntryId,
    },
    /// The whole state, written when a stream's log moves to another node.
    Snapshot {
        groups: Groups,
    },
}

/// What a consumer-group command sees of the stream besides its groups.
#[derive(Debug, Clone, Copy)]
pub struct GroupView {
    /// The durable tail: entries before it can be delivered.
    pub tail: crate::record::StreamPosition,
    /// Entries before this sequence number are gone (trimmed or expired).
    pub trim_point: u64,
    /// The wall clock, for delivery and idle times (ms since the Unix epoch).
    pub now_ms: u64,
}

impl GroupView {
    pub(crate) fn of(stream: &crate::stream::StreamState) -> GroupView {
        let visible = stream.visible();
        GroupView {
            tail: visible.tail,
            trim_point: visible.trim_point,
            now_ms: crate::record::now_ms(),
        }
    }

    /// The ID of the stream's last entry (`0-0` when it has none).
    pub fn last_entry(&self) -> EntryId {
        match self.tail.seq_num {
            0 => EntryId::MIN,
            n => EntryId::new(self.tail.timestamp, n - 1),
        }
    }
}

/// A turn at changing a stream's consumer groups after reading its records (XREADGROUP
/// reads the entries after the group's last ID, then delivers them if that ID has not
/// moved). Consumers of one group taking turns decide one after another, instead of all
/// reading the same entries and all but one starting again, which under many consumers
/// costs more than the deliveries. Held only while deciding, never while waiting for
/// durability; changes that read nothing first do not take it.
///
/// The turn also holds the records read past what the last delivery needed: consumers
/// of a group taking entries a few at a time then read the log once per many deliveries,
/// not once each. They are records of an immutable log, so they stay right; one trimmed
/// meanwhile may still be delivered, as a read just before the trim would have.
pub struct GroupTurn {
    held: tokio::sync::OwnedMutexGuard<ReadAhead>,
}

/// Per group, records that follow an entry, in order.
#[derive(Default)]
pub(crate) struct ReadAhead {
    groups: std::collections::HashMap<
        String,
        (
            EntryId,
            std::collections::VecDeque<crate::record::SequencedRecord>,
        ),
    >,
}

/// Groups of one stream whose records are kept read ahead at once (beyond this, all are
/// dropped: they are only a saving).
const READ_AHEAD_GROUPS: usize = 16;

impl GroupTurn {
    pub(crate) fn new(held: tokio::sync::OwnedMutexGuard<ReadAhead>) -> GroupTurn {
        GroupTurn { held }
    }

    /// The `count` records that follow the entry `last`, if they were read ahead for
    /// `group` (fewer are not taken: the log may hold more).
    pub fn take_after(
        &mut self,
        group: &str,
        last: EntryId,
        count: usize,
    ) -> Option<Vec<crate::record::SequencedRecord>> {
        let (after, records) = self.held.groups.get_mut(group)?;
        if *after != last || records.is_empty() || records.len() < count {
            return None;
        }
        let taken: Vec<_> = records.drain(..count).collect();
        *after = EntryId::of(&taken[taken.len() - 1]);
        Some(taken)
    }

    /// Keeps `records`, which follow the entry `last`, for the next deliveries to `group`.
    pub fn keep_after(
        &mut self,
        group: &str,
        last: EntryId,
        records: Vec<crate::record::SequencedRecord>,
    ) {
        let groups = &mut self.held.groups;
        if groups.len() >= READ_AHEAD_GROUPS && !groups.contains_key(group) {
            groups.clear();
        }
        groups.insert(group.to_owned(), (last, records.into()));
    }
}

/// Resolves once a consumer-group change, and every change sequenced before it, is
/// durable: the moment its answer may be given. Kept apart from the answer so a
/// connection can decide its next pipelined command meanwhile (it sees the change
/// already) and group commit can log many changes in one write.
pub struct Durable(futures::future::BoxFuture<'static, Result<()>>);

impl Durable {
    pub(crate) fn new(
        wait: impl std::future::Future<Output = Result<()>> + Send + 'static,
    ) -> Durable {
        Durable(Box::pin(wait))
    }

    /// Maps the error it may end with.
    pub fn map_err(self, map: impl FnOnce(Error) -> Error + Send + 'static) -> Durable {
        Durable::new(async move { self.await.map_err(map) })
    }
}

impl std::future::Future for Durable {
    type Output = Result<()>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<()>> {
        self.0.as_mut().poll(cx)
    }
}

/// Every consumer group of one stream.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Groups {
    pub groups: BTreeMap<String, Group>,
}

impl Groups {
    pub fn get(&self, group: &str) -> Option<&Group> {
        self.groups.get(group)
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Checks an op against the bounds before it is logged.
    pub fn check(&self, op: &GroupOp) -> Result<()> {
        let name_ok = |name: &str, what: &str| {
            if name.is_empty() || name.len() > MAX_NAME {
                Err(Error::invalid(format!(
                    "a {what} name must be 1 to {MAX_NAME} bytes"
                )))
            } else {
                Ok(())
            }
        };
        match op {
            GroupOp::Create { group, .. } => {
                name_ok(group, "consumer group")?;
                if self.groups.len() >= MAX_GROUPS && !self.groups.contains_key(group) {
                    return Err(Error::invalid(format!(
                        "a stream may have at most {MAX_GROUPS} consumer groups"
                    )));
                }
            }
            GroupOp::Touch {
                group, consumer, ..
            }
            | GroupOp::CreateConsumer {
                group, consumer, ..
            }
            | GroupOp::Deliver {
                group, consumer, ..
            }
            | GroupOp::Redeliver {
                group, consumer, ..
            } => {
                name_ok(consumer, "consumer")?;
                if let Some(g) = self.groups.get(group) {
                    if g.consumers.len() >= MAX_CONSUMERS && !g.consumers.contains_key(consumer) {
                        return Err(Error::invalid(format!(
                            "a consumer group may have at most {MAX_CONSUMERS} consumers"
                        )));
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Applies one op. Ops are decided against the current state (see the commands of
    /// the RESP front end), so an op naming a group that is gone changes nothing.
    pub fn apply(&mut self, op: &GroupOp) {
        match op {
            GroupOp::Create {
                group,
                last_id,
                entries_read,
            } => {
                self.groups.entry(group.clone()).or_insert_with(|| Group {
                    last_id: *last_id,
                    entries_read: *entries_read,
                    ..Group::default()
                });
            }
            GroupOp::SetId {
                group,
                last_id,
                entries_read,
            } => {
                if let Some(g) = self.groups.get_mut(group) {
                    g.last_id = *last_id;
                    g.entries_read = *entries_read;
                }
            }
            GroupOp::Destroy { group } => {
                self.groups.remove(group);
            }
            GroupOp::Touch {
                group,
                consumer,
                now_ms,
            } => {
                if let Some(g) = self.groups.get_mut(group) {
                    g.consumers.entry(consumer.clone()).or_default().seen_ms = *now_ms;
                }
            }
            GroupOp::CreateConsumer {
                group,
                consumer,
                now_ms,
            } => {
                if let Some(g) = self.groups.get_mut(group) {
                    g.consumers
                        .entry(consumer.clone())
                        .or_insert_with(|| Consumer {
                            seen_ms: *now_ms,
                            pending: BTreeSet::new(),
                        });
                }
            }
            GroupOp::DeleteConsumer { group, consumer } => {
                if let Some(g) = self.groups.get_mut(group) {
                    if let Some(gone) = g.consumers.remove(consumer) {
                        for id in gone.pending {
                            g.pending.remove(&id);
                        }
                    }
                }
            }
            GroupOp::Deliver {
                group,
                consumer,
                now_ms,
                ids,
                last_id,
                entries_read,
                noack,
            } => {
                let Some(g) = self.groups.get_mut(group) else {
                    return;
                };
                g.consumers.entry(consumer.clone()).or_default().seen_ms = *now_ms;
                if *last_id > g.last_id {
                    g.last_id = *last_id;
                }
                g.entries_read = *entries_read;
                if !noack {
                    for id in ids {
                        g.set_owner(*id, consumer, *now_ms, 1);
                    }
                }
            }
            GroupOp::Redeliver {
                group,
                consumer,
                now_ms,
                ids,
                delivered_ms,
                deliveries,
                count_up,
                create,
            } => {
                let Some(g) = self.groups.get_mut(group) else {
                    return;
                };
                g.consumers.entry(consumer.clone()).or_default().seen_ms = *now_ms;
                for id in ids {
                    let before = match g.pending.get(id) {
                        Some(nack) => nack.deliveries,
                        None if *create => 1,
                        None => continue,
                    };
                    let count = deliveries.unwrap_or(if *count_up { before + 1 } else { before });
                    g.set_owner(*id, consumer, *delivered_ms, count);
                }
            }
            GroupOp::Ack { group, ids } => {
                if let Some(g) = self.groups.get_mut(group) {
                    for id in ids {
                        g.forget(id);
                    }
                }
            }
            GroupOp::Advance { group, last_id } => {
                if let Some(g) = self.groups.get_mut(group) {
                    if *last_id > g.last_id {
                        g.last_id = *last_id;
                    }
                }
            }
            GroupOp::Snapshot { groups } => *self = groups.clone(),
        }
    }
}

impl Group {
    /// Makes `id` pending for `consumer` (taking it from another consumer if needed).
    fn set_owner(&mut self, id: EntryId, consumer: &str, delivered_ms: u64, deliveries: u64) {
        if let Some(previous) = self.pending.get(&id) {
            if previous.consumer != consumer {
                if let Some(other) = self.consumers.get_mut(&previous.consumer) {
                    other.pending.remove(&id);
                }
            }
        }
        self.pending.insert(
            id,
            Nack {
                consumer: consumer.to_owned(),
                delivered_ms,
                deliveries,
            },
        );
        self.consumers
            .entry(consumer.to_owned())
            .or_default()
            .pending
            .insert(id);
    }

    /// Removes `id` from the pending entries; whether it was pending.
    fn forget(&mut self, id: &EntryId) -> bool {
        match self.pending.remove(id) {
            Some(nack) => {
                if let Some(owner) = self.consumers.get_mut(&nack.consumer) {
                    owner.pending.remove(id);
                }
                true
            }
            None => false,
        }
    }
}

/// The ops of one logged batch, as bytes (one record body per op).
pub(crate) fn encode(op: &GroupOp) -> bytes::Bytes {
    bytes::Bytes::from(serde_json::to_vec(op).expect("group ops always serialize"))
}

pub(crate) fn decode(body: &[u8]) -> Result<GroupOp> {
    serde_json::from_slice(body)
        .map_err(|e| Error::storage_caused("a consumer group op in the log is corrupt", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(seq: u64) -> EntryId {
        EntryId::new(1000 + seq, seq)
    }

    fn record(seq: u64) -> crate::record::SequencedRecord {
        crate::record::SequencedRecord {
            seq_num: seq,
            timestamp: 1000 + seq,
            headers: Vec::new(),
            body: bytes::Bytes::new(),
        }
    }

    #[tokio::test]
    async fn records_read_ahead_serve_only_the_group_at_the_entry_they_follow() {
        let ahead = std::sync::Arc::new(tokio::sync::Mutex::new(ReadAhead::default()));
        let mut turn = GroupTurn::new(ahead.clone().lock_owned().await);
        turn.keep_after("g", id(0), (1..=4).map(record).collect());
        assert!(turn.take_after("other", id(0), 1).is_none());
        assert!(
            turn.take_after("g", id(1), 1).is_none(),
            "not after entry 1"
        );
        let seqs = |records: Vec<crate::record::SequencedRecord>| -> Vec<u64> {
            records.iter().map(|r| r.seq_num).collect()
        };
        assert_eq!(seqs(turn.take_after("g", id(0), 2).unwrap()), [1, 2]);
        assert!(
            turn.take_after("g", id(0), 1).is_none(),
            "moved on past entry 0"
        );
        assert!(
            turn.take_after("g", id(2), 3).is_none(),
            "two left: more may be in the log"
        );
        drop(turn);
        // What was read ahead outlasts the turn that read it.
        let mut next = GroupTurn::new(ahead.lock_owned().await);
        assert_eq!(seqs(next.take_after("g", id(2), 2).unwrap()), [3, 4]);
        assert!(next.take_after("g", id(4), 1).is_none(), "all taken");
    }

    fn create(groups: &mut Groups) {
        groups.apply(&GroupOp::Create {
            group: "g".into(),
            last_id: EntryId::MIN,
            entries_read: None,
        });
    }

    #[test]
    fn deliveries_acks_claims_and_deletions_keep_both_pending_indexes_in_step() {
        let mut groups = Groups::default();
        create(&mut groups);
        groups.apply(&GroupOp::Deliver {
            group: "g".into(),
            consumer: "alice".into(),
            now_ms: 10,
            ids: vec![id(0), id(1), id(2)],
            last_id: id(2),
            entries_read: Some(3),
            noack: false,
        });
        let g = groups.get("g").unwrap();
        assert_eq!(g.last_id, id(2));
        assert_eq!(g.pending.len(), 3);
        assert_eq!(g.consumers["alice"].pending.len(), 3);

        // Bob claims entry 1: it moves, its count goes up.
        groups.apply(&GroupOp::Redeliver {
            group: "g".into(),
            consumer: "bob".into(),
            now_ms: 20,
            ids: vec![id(1)],
            delivered_ms: 20,
            deliveries: None,
            count_up: true,
            create: false,
        });
        let g = groups.get("g").unwrap();
        assert_eq!(g.pending[&id(1)].consumer, "bob");
        assert_eq!(g.pending[&id(1)].deliveries, 2);
        assert!(!g.consumers["alice"].pending.contains(&id(1)));
        assert!(g.consumers["bob"].pending.contains(&id(1)));

        groups.apply(&GroupOp::Ack {
            group: "g".into(),
            ids: vec![id(0), id(1), id(7)],
        });
        let g = groups.get("g").unwrap();
        assert_eq!(g.pending.keys().copied().collect::<Vec<_>>(), [id(2)]);
        assert!(g.consumers["bob"].pending.is_empty());

        // Deleting a consumer drops its pending entries.
        groups.apply(&GroupOp::DeleteConsumer {
            group: "g".into(),
            consumer: "alice".into(),
        });
        assert!(groups.get("g").unwrap().pending.is_empty());

        // NOACK moves the last ID without pending entries.
        groups.apply(&GroupOp::Deliver {
            group: "g".into(),
            consumer: "carol".into(),
            now_ms: 30,
            ids: vec![id(3)],
            last_id: id(3),
            entries_read: Some(4),
            noack: true,
        });
        let g = groups.get("g").unwrap();
        assert_eq!(g.last_id, id(3));
        assert!(g.pending.is_empty());
        assert_eq!(g.consumers["carol"].seen_ms, 30);
    }

    #[test]
    fn ops_round_trip_through_their_logged_form_and_snapshots_restore() {
        let mut groups = Groups::default();
        create(&mut groups);
        let op = GroupOp::Redeliver {
            group: "g".into(),
            consumer: "c".into(),
            now_ms: 5,
            ids: vec![id(9)],
            delivered_ms: 1,
            deliveries: Some(7),
            count_up: false,
            create: true,
        };
        assert_eq!(decode(&encode(&op)).unwrap(), op);
        groups.apply(&op);
        assert_eq!(groups.get("g").unwrap().pending[&id(9)].deliveries, 7);
        let mut restored = Groups::default();
        let snapshot = GroupOp::Snapshot {
            groups: groups.clone(),
        };
        restored.apply(&decode(&encode(&snapshot)).unwrap());
        assert_eq!(restored, groups);
        assert!(decode(b"not json").is_err());
    }

    #[test]
    fn names_and_counts_are_bounded() {
        let mut groups = Groups::default();
        let long = GroupOp::Create {
            group: "g".repeat(MAX_NAME + 1),
            last_id: EntryId::MIN,
            entries_read: None,
        };
        assert_eq!(groups.check(&long).unwrap_err().code(), "invalid");
        for i in 0..MAX_GROUPS {
            groups.apply(&GroupOp::Create {
                group: format!("g{i}"),
                last_id: EntryId::MIN,
                entries_read: None,
            });
        }
        let one_more = GroupOp::Create {
            group: "extra".into(),
            last_id: EntryId::MIN,
            entries_read: None,
        };
        assert!(groups.check(&one_more).is_err());
    }
}
