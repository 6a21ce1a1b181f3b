//! Ownership: which streams this node sequences, and taking streams over. A stream is
//! taken when no live node holds it: on first use, or when its owner's lease ran out.
//! Taking it means claiming its lease (a new, higher lease epoch), rebuilding its tail
//! from its checkpoint plus the batches the previous owner's log holds after it, and
//! writing those batches again into this node's own log. Only once they are durable
//! here does the metadata store record that the stream's log is now this node's; from
//! then on nothing the previous owner writes (a paused node waking up) is ever read as
//! part of the stream, and compaction here sees the copied batches like any others.

use std::collections::HashMap;
use std::sync::Arc;

use crate::appender::Appender;
use crate::compaction::Compactor;
use crate::error::{Error, Result};
use crate::membership::Membership;
use crate::record::StreamPosition;
use crate::registry::StreamRegistry;
use crate::storage::cluster::{StreamClaim, StreamLog, StreamOwner};
use crate::storage::{MetadataStore, ObjectStore, StreamRecord};
use crate::stream::{SequencedBatch, SequencerState, StreamState};
use crate::wal::recovery::{legacy_epochs, replay_logs, StreamReplay};
use crate::wal::EntryKind;
use crate::wal::StoredRecord;

fn changing_owner() -> Error {
    Error::Unavailable("the stream is changing owner; retry shortly".into())
}

/// Streams claimed per metadata transaction in a bulk takeover.
const CLAIMS_PER_STEP: usize = 500;

/// Where a stream without a live owner should be taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// On the node the placement rule gives (this one or another, which the request is
    /// forwarded to), so streams spread over the nodes.
    Balanced,
    /// Here (the request was forwarded here, or its front end cannot forward).
    Here,
}

pub(crate) struct Ownership {
    metadata: Arc<dyn MetadataStore>,
    objects: Arc<dyn ObjectStore>,
    membership: Arc<Membership>,
    registry: Arc<StreamRegistry>,
    appender: Arc<Appender>,
    compactor: Arc<Compactor>,
    /// One takeover at a time: a stream wanted by several requests is taken once.
    takeovers: tokio::sync::Mutex<()>,
    /// Held (written) while streams are handed to other nodes: a request for one of
    /// them waits until the hand-off is recorded, then finds its new home.
    handing_off: tokio::sync::RwLock<()>,
}

impl Ownership {
    pub fn new(
        metadata: Arc<dyn MetadataStore>,
        objects: Arc<dyn ObjectStore>,
        membership: Arc<Membership>,
        registry: Arc<StreamRegistry>,
        appender: Arc<Appender>,
        compactor: Arc<Compactor>,
    ) -> Self {
        Self {
            metadata,
            objects,
            membership,
            registry,
            appender,
            compactor,
            takeovers: tokio::sync::Mutex::new(()),
            handing_off: tokio::sync::RwLock::new(()),
        }
    }

    fn epoch(&self) -> u64 {
        self.membership.epoch()
    }

    /// The state of a live stream this node sequences, taken over first if no live
    /// node holds it (and, with `Balanced`, if it falls to this node).
    /// `OwnedElsewhere` names the node that serves it, or should take it.
    pub async fn acquire(
        &self,
        record: &StreamRecord,
        placement: Placement,
    ) -> Result<Arc<StreamState>> {
        if let Some(state) = self.registry.get_id(&record.basin, &record.name, record.id) {
            return Ok(state);
        }
        self.membership.check()?;
        // A stream being handed over is found again once the hand-off is recorded.
        let _settled = self.handing_off.read().await;
        if let Some(state) = self.registry.get_id(&record.basin, &record.name, record.id) {
            return Ok(state);
        }
        match self.metadata.stream_owner(record.id).await? {
            StreamOwner::Live {
                epoch,
                advertise_url,
            } if epoch != self.epoch() => return Err(Error::OwnedElsewhere { advertise_url }),
            // Still this node's: its hand-off failed; others take it once this node
            // has left.
            StreamOwner::Live { .. } if self.membership.is_leaving() => {
                return Err(changing_owner())
            }
            _ if self.membership.is_leaving() => {
                // Shutting down: the stream goes to one of the nodes that stay.
                self.membership.refresh_live_nodes().await?;
                return match self.membership.placement(record.id) {
                    Some((_, advertise_url)) => Err(Error::OwnedElsewhere { advertise_url }),
                    None => Err(Error::ServerDraining),
                };
            }
            _ if placement == Placement::Balanced => {
                // Placed by the nodes live now, not as of the last look: a node that
                // just started must not take every new stream for itself.
                self.membership.refresh_live_nodes().await?;
                if let Some((epoch, advertise_url)) = self.membership.placement(record.id) {
                    if epoch != self.epoch() {
                        return Err(Error::OwnedElsewhere { advertise_url });
                    }
                }
            }
            _ => {}
        }
        self.take(std::slice::from_ref(record)).await?;
        match self.registry.get_id(&record.basin, &record.name, record.id) {
            Some(state) => Ok(state),
            // Another node claimed it first.
            None => match self.metadata.stream_owner(record.id).await? {
                StreamOwner::Live {
                    epoch,
                    advertise_url,
                } if epoch != self.epoch() => Err(Error::OwnedElsewhere { advertise_url }),
                _ => Err(changing_owner()),
            },
        }
    }

    /// Hands every stream this node sequences to the other nodes, for a shutdown that
    /// fails no append: each stream is taken out of service here, everything accepted
    /// on it becomes durable, and then its lease is given up, so the next request for
    /// it (at any node) has another node take it over from this node's log. Requests
    /// that arrive meanwhile wait and then go there. How many streams it handed over;
    /// nothing is handed over when no other node is live. Cancelled part way (the
    /// caller's time limit), it leaves the streams out of service here and their leases
    /// with this node, which others take from its log once it has left.
    pub async fn hand_off(&self) -> Result<usize> {
        if !self.membership.begin_leaving().await? {
            return Ok(0);
        }
        let _no_requests_meanwhile = self.handing_off.write().await;
        let _no_takeovers = self.takeovers.lock().await;
        // No compaction commit may race the release: it would index records of a stream
        // whose new owner rebuilds them from the log.
        let _no_compaction = self.compactor.pause().await;
        let streams = self.registry.by_id();
        // Out of the registry first, so a batch refused as moved finds the stream gone.
        for id in streams.keys() {
            self.registry.remove_id(*id);
        }
        for state in streams.values() {
            state.mark_moved();
        }
        for state in streams.values() {
            // Once the sequencer is free, every batch sequenced before the mark is on
            // its way to the log, and none after it.
            // The same for consumer-group ops: the next owner replays them from this
            // node's log, so every one answered must be in it first.
            let (sequenced, group_ops) = {
                let sequencer = state.sequencer().lock().await;
                (sequencer.next_seq, sequencer.next_group_op)
            };
            let durable = async {
                state.durable_through(sequenced).await?;
                state.group_ops_durable_through(group_ops).await
            };
            match durable.await {
                Ok(()) | Err(Error::DeletionPending(_)) => {}
                Err(err) => return Err(err),
            }
        }
        let ids: Vec<u64> = streams.keys().copied().collect();
        self.metadata.release_streams(self.epoch(), &ids).await?;
        Ok(ids.len())
    }

    /// Takes over those of `records` that no live node holds: claims them, rebuilds
    /// them, and serves them from here. How many it took.
    pub async fn take(&self, records: &[StreamRecord]) -> Result<usize> {
        let _one_at_a_time = self.takeovers.lock().await;
        let wanted: Vec<u64> = records
            .iter()
            .filter(|r| self.registry.get_id(&r.basin, &r.name, r.id).is_none())
            .map(|r| r.id)
            .collect();
        let mut taken = 0;
        for ids in wanted.chunks(CLAIMS_PER_STEP) {
            let claims = self.metadata.claim_streams(self.epoch(), ids).await?;
            if claims.is_empty() {
                continue;
            }
            taken += claims.len();
            self.rebuild(claims).await?;
        }
        Ok(taken)
    }

    /// Rebuilds claimed streams into this node's log and starts serving them.
    async fn rebuild(&self, claims: Vec<StreamClaim>) -> Result<()> {
        let mut compaction = self.compactor.pause().await;
        let checkpoints = if claims.len() > 16 {
            self.metadata.stream_checkpoints().await?
        } else {
            let mut found = std::collections::BTreeMap::new();
            for claim in &claims {
                if let Some(c) = self.metadata.stream_checkpoint(claim.stream.id).await? {
                    found.insert(claim.stream.id, c);
                }
            }
            found
        };
        let mut by_log: HashMap<StreamLog, HashMap<u64, StreamReplay>> = HashMap::new();
        for claim in &claims {
            if claim.log == StreamLog::Epoch(self.epoch()) {
                return Err(Error::storage(format!(
                    "stream {} is recorded as in this node's own log but is not served here",
                    claim.stream.id
                )));
            }
            let state = checkpoints
                .get(&claim.stream.id)
                .map(SequencerState::from)
                .unwrap_or_default();
            by_log.entry(claim.log).or_default().insert(
                claim.stream.id,
                StreamReplay {
                    state,
                    batches: Vec::new(),
                },
            );
        }
        let mut replayed: HashMap<u64, StreamReplay> = HashMap::new();
        let mut chunks = 0;
        for (log, mut replays) in by_log {
            let epochs = match log {
                StreamLog::Nowhere => Vec::new(),
                StreamLog::Epoch(epoch) => vec![epoch],
                StreamLog::Legacy => legacy_epochs(self.metadata.as_ref(), self.objects.as_ref())
                    .await?
                    .into_iter()
                    .filter(|e| *e < self.epoch())
                    .collect(),
            };
            chunks += replay_logs(
                self.metadata.as_ref(),
                self.objects.as_ref(),
                &epochs,
                &mut replays,
            )
            .await?;
            replayed.extend(replays);
        }

        crate::crash_point::pause_point("takeover-replayed").await;
        // Each stream starts from its checkpoint; its batches are copied into this
        // node's log, which publishes them as they become durable.
        let mut acks = Vec::new();
        let mut states = Vec::new();
        let mut copied = 0usize;
        for claim in &claims {
            let id = claim.stream.id;
            let replay = replayed.remove(&id).unwrap_or_default();
            let at_checkpoint = checkpoints
                .get(&id)
                .map(SequencerState::from)
                .unwrap_or_default();
            compaction.checkpoints.insert(id, at_checkpoint.clone());
            let compacted = StreamPosition {
                seq_num: at_checkpoint.next_seq,
                timestamp: at_checkpoint.last_timestamp,
            };
            let state = StreamState::new(
                id,
                claim.stream.name.clone(),
                claim.stream.config,
                claim.stream.cipher,
                at_checkpoint.clone(),
                compacted,
                Vec::new(),
            );
            let mut sequencer = at_checkpoint;
            for (kind, records) in replay.batches {
                match kind {
                    EntryKind::Records => sequencer.replay(&records),
                    EntryKind::GroupOps => sequencer.replay_group_ops(&records)?,
                }
                let batch = SequencedBatch {
                    stream: state.clone(),
                    kind,
                    first_seq: records[0].seq_num,
                    records: records
                        .into_iter()
                        .map(|r| StoredRecord {
                            timestamp: r.timestamp,
                            headers: r.headers,
                            body: r.body,
                        })
                        .collect::<Vec<_>>()
                        .into(),
                    trim_point: sequencer.trim_point,
                };
                copied += 1;
                acks.push(self.appender.relog(batch).await?);
            }
            *state.sequencer().lock().await = sequencer;
            states.push((claim, state));
        }
        for ack in acks {
            ack.await?;
        }
        crate::crash_point::fail_point("takeover-relogged")?;
        let committed: Vec<(u64, u64)> = claims
            .iter()
            .map(|c| (c.stream.id, c.lease_epoch))
            .collect();
        self.metadata
            .commit_takeover(self.epoch(), &committed)
            .await?;
        // Served before compaction goes on: a round that began in between would find
        // the stream's records in this node's log (now the stream's log) but the stream
        // not served here, and fail.
        for (claim, state) in states {
            self.registry.insert(claim.stream.basin.clone(), state);
        }
        drop(compaction);
        tracing::info!(
            streams = claims.len(),
            batches = copied,
            chunks,
            "took over streams: rebuilt their tails from the previous owner's log"
        );
        Ok(())
    }

    /// Takes over streams whose owner's lease ran out, this node's share of them: every
    /// one an earlier run of this node held, and those the placement rule gives this
    /// node (every node takes its share, so all are taken). At start, also every stream
    /// from before clusters.
    pub async fn take_orphans(&self, at_start: bool) -> Result<usize> {
        self.membership.check()?;
        let identity = &self.membership.settings().identity;
        let Some((rank, nodes)) = self.membership.rank() else {
            return Ok(0); // leaving, or not live: it takes nothing
        };
        let mut taken = 0;
        loop {
            let orphans = self.metadata.orphaned_streams(10_000).await?;
            let mine: Vec<StreamRecord> = orphans
                .iter()
                .filter(|o| {
                    let was_ours = o.previous_identity.as_deref() == Some(identity.as_str());
                    let share = (o.stream.id % nodes as u64) as usize == rank;
                    was_ours || share || (at_start && o.legacy)
                })
                .map(|o| o.stream.clone())
                .collect();
            if mine.is_empty() {
                return Ok(taken);
            }
            let took = self.take(&mine).await?;
            taken += took;
            if took == 0 || orphans.len() < 10_000 {
                return Ok(taken);
            }
        }
    }
}
