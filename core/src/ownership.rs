//! Ownership: which streams this node sequences, and taking streams over. A stream is
//! taken when no live node holds it: on first use, or when its owner's lease ran out.
//! Taking it means claiming its lease (a new, higher lease epoch), rebuilding its tail
//! from its checkpoint plus the batches the previous owner's log holds after it, and
//! writing those batches again into this node's own log. Only once they are durable
//! here does the metadata store record that the stream's log is now this node's; from
//! then on nothing the previous owner writes (a paused node waking up) is ever read as
//! part of the stream, and compaction here sees the copied batches like any others.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::appender::Appender;
use crate::compaction::Compactor;
use crate::error::{Error, Result};
use crate::membership::Membership;
use crate::names::{BasinName, StreamName};
use crate::owner_cache::OwnerCache;
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

/// Streams handed to another node per rebalancing step, so that each step's pause of
/// new takeovers (and of the requests for the streams it moves) stays short.
const MOVES_PER_STEP: usize = 200;

/// How long a request forwarded here for a stream this node has just handed over is
/// passed on to the new owner (other nodes may have looked the owner up before).
const FORWARD_AFTER_HAND_OVER: Duration = Duration::from_secs(10);

/// What a request's takeover of a stream takes with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TakenAlong {
    /// Every stream handed to this node and not rebuilt yet.
    HandedHere,
    /// This node's share of the streams whose owner is gone.
    Orphans,
    /// Nothing: the stream has no owner (it never had one, or was given up to
    /// nobody), or this node's lease has not held long enough to take orphans.
    Nothing,
}

/// Where a stream without a live owner should be taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    /// Streams this node handed over, and when.
    handed_over: parking_lot::Mutex<HashMap<(BasinName, StreamName), Instant>>,
    /// Which live nodes were found holding streams lately, for requests to pass on.
    owners: OwnerCache,
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
            handed_over: parking_lot::Mutex::new(HashMap::new()),
            owners: OwnerCache::default(),
        }
    }

    fn epoch(&self) -> u64 {
        self.membership.epoch()
    }

    /// The state of a live stream this node sequences, taken over first if no live
    /// node holds it (and, with `Balanced`, if it falls to this node).
    /// `OwnedElsewhere` names the node that serves it, or should take it.
    pub async fn acquire(
        self: &Arc<Self>,
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
        // Twice at most: a take that finds the stream claimed by another node meanwhile,
        // or this node starting to leave, looks again at who holds it now.
        for _ in 0..2 {
            let asked_at = Instant::now();
            let owner = self.metadata.stream_owner(record.id).await?;
            match &owner {
                StreamOwner::Live {
                    epoch,
                    advertise_url,
                } if *epoch != self.epoch() => {
                    let (basin, name) = (&record.basin, &record.name);
                    self.owners.remember(basin, name, advertise_url, asked_at);
                    let advertise_url = advertise_url.clone();
                    return Err(Error::OwnedElsewhere { advertise_url });
                }
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
                // Handed to this node by another, or a takeover here failed part way: it
                // is this node's to rebuild, wherever the placement rule would put it.
                StreamOwner::Live { .. } => {}
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
            // Streams change owner in groups (a hand-over, a node that died), and
            // requests for each arrive at once: the group is rebuilt in one replay of
            // the log its records are in, not in a replay per stream, each behind the
            // last. Orphans only once this node's lease has held a while, as on the
            // steady beat. The group's takeover runs in a task of its own, so that a
            // client that gives up does not cut it short. If it fails (a damaged log,
            // say), the one asked for is still taken alone.
            let group = match owner {
                StreamOwner::Live { .. } => TakenAlong::HandedHere,
                StreamOwner::Lapsed { .. } if self.membership.settled() => TakenAlong::Orphans,
                StreamOwner::Lapsed { .. } | StreamOwner::Nobody => TakenAlong::Nothing,
            };
            if group != TakenAlong::Nothing {
                let ownership = Arc::clone(self);
                let together = tokio::spawn(async move { ownership.take_group(group).await })
                    .await
                    .unwrap_or_else(|join| {
                        Err(Error::internal("the group takeover did not finish", join))
                    });
                if let Err(err) = together {
                    tracing::warn!(error = %err, "could not take over the streams that changed owner with this one; taking it alone");
                }
            }
            self.take(&[record.id]).await?;
            if let Some(state) = self.registry.get_id(&record.basin, &record.name, record.id) {
                return Ok(state);
            }
        }
        Err(changing_owner())
    }

    /// Takes over a group of streams that changed owner together (see `TakenAlong`).
    async fn take_group(&self, group: TakenAlong) -> Result<usize> {
        match group {
            TakenAlong::HandedHere => self.take_owned().await,
            TakenAlong::Orphans => self.take_orphans(false).await,
            TakenAlong::Nothing => Ok(0),
        }
    }

    /// The node found holding the stream's lease a moment ago, if any (see
    /// `OwnerCache`): where a client's request for it may be passed on without a look
    /// in the metadata store.
    pub fn remembered_owner(&self, basin: &BasinName, name: &StreamName) -> Option<String> {
        self.owners.get(basin, name)
    }

    /// Drops the remembered owner of a stream: it did not take a request.
    pub fn forget_owner(&self, basin: &BasinName, name: &StreamName) {
        self.owners.forget(basin, name);
    }

    /// Hands every stream this node sequences to the other nodes, for a shutdown that
    /// fails no append (see `hand_over`): each goes to the node the placement rule
    /// gives it, which takes it over from this node's log. How many streams it handed
    /// over; nothing is handed over when no other node that has started is live.
    /// Cancelled part way (the
    /// caller's time limit), it leaves the streams out of service here and their leases
    /// with this node, which others take from its log once it has left.
    pub async fn hand_off(&self) -> Result<usize> {
        // Held from before this node counts as leaving: a request for a stream either
        // got its way before (a takeover it made is handed off with the rest), or
        // finds the hand-off done.
        let settled = self.handing_off.write().await;
        if !self.membership.begin_leaving().await? {
            return Ok(0);
        }
        self.hand_over_settled(settled, None, None).await
    }

    /// Hands streams this node sequences (`only` these, or all) to node `to`, or with
    /// `None` (shutting down) to the nodes that stay: each is taken out of service
    /// here, everything accepted on it becomes durable, and then its lease is given up,
    /// so its next owner rebuilds it from this node's log. Requests that arrive
    /// meanwhile wait and then go there; a batch that was waiting for a stream's
    /// sequencer is passed on whole. How many it handed over. Streams it took out but
    /// could not hand over (the store refused, or `to` is no longer live) stay this
    /// node's: they are rebuilt here from its own log on their next request, or by
    /// `take_owned`.
    async fn hand_over(&self, only: Option<&HashSet<u64>>, to: Option<u64>) -> Result<usize> {
        let settled = self.handing_off.write().await;
        self.hand_over_settled(settled, only, to).await
    }

    /// `hand_over`, holding `handing_off` already: no request looks for a stream's
    /// owner meanwhile.
    async fn hand_over_settled(
        &self,
        _no_requests_meanwhile: tokio::sync::RwLockWriteGuard<'_, ()>,
        only: Option<&HashSet<u64>>,
        to: Option<u64>,
    ) -> Result<usize> {
        let _no_takeovers = self.takeovers.lock().await;
        // No compaction commit may race the release: it would index records of a stream
        // whose new owner rebuilds them from the log.
        let _no_compaction = self.compactor.pause().await;
        let ids = match only {
            Some(only) => only.clone(),
            None => self.registry.ids(),
        };
        let moved = self.registry.move_out(&ids);
        for (_, state) in &moved {
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
        {
            let now = Instant::now();
            let mut handed = self.handed_over.lock();
            handed.retain(|_, at| now.duration_since(*at) < FORWARD_AFTER_HAND_OVER);
            for (basin, state) in &moved {
                handed.insert((basin.clone(), state.name.clone()), now);
                // An owner remembered from before this node took the stream is stale.
                self.owners.forget(basin, &state.name);
            }
        }
        let mut ids: Vec<u64> = moved.iter().map(|(_, state)| state.id).collect();
        if only.is_none() {
            // Also those handed to this node that it has not rebuilt yet (nothing of
            // them is in flight here): else they would wait out this node's lease.
            let served: HashSet<u64> = ids.iter().copied().collect();
            let owned = self.metadata.streams_owned(self.epoch()).await?;
            ids.extend(owned.into_iter().filter(|id| !served.contains(id)));
        }
        let released = match to {
            Some(to) => self.release(&ids, Some(to)).await?,
            None => self.release_to_the_nodes_that_stay(&ids).await?,
        };
        if released > 0 {
            crate::telemetry::hand_over(released);
        }
        Ok(released)
    }

    /// Gives up the leases of `ids` to node `to` (or to nobody), in one transaction.
    async fn release(&self, ids: &[u64], to: Option<u64>) -> Result<usize> {
        let released = self.metadata.release_streams(self.epoch(), ids, to).await?;
        Ok(released as usize)
    }

    /// Gives up the leases of `ids` on shutdown: to the nodes that stay, each the
    /// streams the placement rule gives it (a transaction per node), so that each
    /// rebuilds its group in one replay of this node's log, at its next beat or at the
    /// first request for one of them. A group whose node is no longer live goes to
    /// nobody: whichever node the next request for one of them reaches takes it.
    async fn release_to_the_nodes_that_stay(&self, ids: &[u64]) -> Result<usize> {
        // This node is leaving, so it is no longer among the live nodes it places on.
        self.membership.refresh_live_nodes().await?;
        let mut groups: HashMap<Option<u64>, Vec<u64>> = HashMap::new();
        for id in ids {
            let node = self.membership.placement(*id).map(|(epoch, _)| epoch);
            groups.entry(node).or_default().push(*id);
        }
        let mut released = 0;
        for (node, group) in groups {
            let mut done = self.release(&group, node).await?;
            if done == 0 && node.is_some() {
                done = self.release(&group, None).await?;
            }
            released += done;
        }
        Ok(released)
    }

    /// Whether this node handed the stream over a moment ago: a request another node
    /// forwarded here for it is passed on to its new owner.
    pub fn handed_over_recently(&self, basin: &BasinName, name: &StreamName) -> bool {
        let key = (basin.clone(), name.clone());
        self.handed_over
            .lock()
            .get(&key)
            .is_some_and(|at| at.elapsed() < FORWARD_AFTER_HAND_OVER)
    }

    /// One step towards every live node holding its fair share of the streams: a node
    /// holding more than the node with the fewest (by two or more) hands it some,
    /// never so many that either ends up past its share. Run by every node on a steady
    /// beat, this gives a node that joined its share within a few steps, and moves no
    /// stream once the shares are even. How many streams it handed over.
    pub async fn rebalance(&self) -> Result<usize> {
        if self.membership.is_leaving() {
            return Ok(0);
        }
        let nodes = self.metadata.cluster_nodes().await?;
        let serving: Vec<_> = nodes
            .iter()
            .filter(|n| n.live && n.ready && !n.leaving)
            .collect();
        let Some(me) = serving.iter().find(|n| n.epoch == self.epoch()) else {
            return Ok(0);
        };
        let Some(target) = serving
            .iter()
            .filter(|n| n.epoch != self.epoch())
            .min_by_key(|n| (n.streams_owned, n.epoch))
        else {
            return Ok(0);
        };
        let count = moves_towards_fair_share(
            me.streams_owned,
            target.streams_owned,
            serving.iter().map(|n| n.streams_owned).sum(),
            serving.len() as u64,
        )
        .min(MOVES_PER_STEP as u64) as usize;
        if count == 0 {
            return Ok(0);
        }
        // Those the placement rule gives the target go first, so ownership and
        // placement agree where they can.
        let target_epoch = target.epoch;
        let mut ids: Vec<u64> = self.registry.ids().into_iter().collect();
        ids.sort_by_key(|id| {
            let placed_there = self
                .membership
                .placement(*id)
                .is_some_and(|(epoch, _)| epoch == target_epoch);
            (!placed_there, *id)
        });
        ids.truncate(count);
        let chosen: HashSet<u64> = ids.into_iter().collect();
        let handed = self.hand_over(Some(&chosen), Some(target_epoch)).await?;
        if handed > 0 {
            tracing::info!(
                streams = handed,
                to = %target.advertise_url,
                "handed streams to a node holding fewer, for an even share"
            );
        }
        Ok(handed)
    }

    /// Takes over the streams whose lease this node holds but which it does not serve:
    /// those another node handed it, and any whose takeover here failed part way (or
    /// whose hand-over from here did). How many it took.
    pub async fn take_owned(&self) -> Result<usize> {
        self.membership.check()?;
        if self.membership.is_leaving() {
            return Ok(0);
        }
        let served = self.registry.ids();
        let unserved: Vec<u64> = self
            .metadata
            .streams_owned(self.epoch())
            .await?
            .into_iter()
            .filter(|id| !served.contains(id))
            .collect();
        if unserved.is_empty() {
            return Ok(0);
        }
        self.take(&unserved).await
    }

    /// Takes over those of the streams `ids` that no other live node holds: claims
    /// them, rebuilds them, and serves them from here. How many it took.
    pub async fn take(&self, ids: &[u64]) -> Result<usize> {
        let _one_at_a_time = self.takeovers.lock().await;
        // A take that waited for a hand-off on shutdown takes nothing after it.
        if self.membership.is_leaving() {
            return Ok(0);
        }
        let served = self.registry.ids();
        let wanted: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|id| !served.contains(id))
            .collect();
        let mut taken = 0;
        for ids in wanted.chunks(CLAIMS_PER_STEP) {
            let claims = self.metadata.claim_streams(self.epoch(), ids).await?;
            if claims.is_empty() {
                continue;
            }
            taken += claims.len();
            if let Err(err) = self.rebuild(claims).await {
                // Claimed and not served: the next attempt takes them (`take_owned`).
                crate::telemetry::takeover_failed();
                return Err(err);
            }
        }
        Ok(taken)
    }

    /// Rebuilds claimed streams into this node's log and starts serving them.
    async fn rebuild(&self, claims: Vec<StreamClaim>) -> Result<()> {
        crate::crash_point::pause_point("takeover-claimed").await;
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
            // A stream may be rebuilt from this node's own log, too: one it handed to a
            // node that never took it, or whose hand-over from here failed. Its batches
            // are then copied within the log, and replay and compaction skip the copy
            // of what they already have.
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
        crate::telemetry::takeover(claims.len());
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
        if self.membership.is_leaving() {
            return Ok(0);
        }
        let identity = &self.membership.settings().identity;
        // A node still starting is not among the nodes streams are placed on, so it has
        // no share of others' streams yet (the nodes that serve take them), only its own.
        let share = self.membership.rank();
        let mut taken = 0;
        loop {
            let orphans = self.metadata.orphaned_streams(10_000).await?;
            let mine: Vec<u64> = orphans
                .iter()
                .filter(|o| {
                    let was_ours = o.previous_identity.as_deref() == Some(identity.as_str());
                    let in_share = share
                        .is_some_and(|(rank, nodes)| (o.stream.id % nodes as u64) as usize == rank);
                    was_ours || in_share || (at_start && o.legacy)
                })
                .map(|o| o.stream.id)
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

/// How many streams a node holding `mine` hands to the node holding the fewest
/// (`theirs`), when the live nodes hold `total` between `nodes` of them: enough to even
/// the two out, but neither may end up past its fair share (so that several nodes
/// handing streams to the same node at once do not overshoot).
fn moves_towards_fair_share(mine: u64, theirs: u64, total: u64, nodes: u64) -> u64 {
    if nodes == 0 || mine < theirs + 2 {
        return 0;
    }
    let (floor, ceil) = (total / nodes, total.div_ceil(nodes));
    ((mine - theirs) / 2)
        .min(mine.saturating_sub(floor))
        .min(ceil.saturating_sub(theirs))
}

#[cfg(test)]
mod tests {
    use super::moves_towards_fair_share;

    /// Every node takes one step in turn, against the node holding the fewest, until
    /// no step moves anything; the shares it ends with and the streams it moved.
    fn settle(mut shares: Vec<u64>) -> (Vec<u64>, u64) {
        let total: u64 = shares.iter().sum();
        let mut moved = 0;
        for _ in 0..100 {
            let mut any = false;
            for node in 0..shares.len() {
                let (fewest, _) = shares
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i != node)
                    .min_by_key(|(i, s)| (**s, *i))
                    .unwrap();
                let n = moves_towards_fair_share(
                    shares[node],
                    shares[fewest],
                    total,
                    shares.len() as u64,
                );
                shares[node] -= n;
                shares[fewest] += n;
                moved += n;
                any |= n > 0;
            }
            if !any {
                return (shares, moved);
            }
        }
        panic!("no fixed point: {shares:?}");
    }

    #[test]
    fn a_node_that_joins_gets_its_share_and_only_that_many_streams_move() {
        let (shares, moved) = settle(vec![500, 500, 0]);
        assert!(shares.iter().all(|s| (333..=334).contains(s)), "{shares:?}");
        assert_eq!(moved, 333);
        let (shares, moved) = settle(vec![1000, 0]);
        assert_eq!((shares, moved), (vec![500, 500], 500));
    }

    #[test]
    fn even_or_nearly_even_shares_move_nothing() {
        for shares in [vec![4, 4, 3], vec![3, 4, 4], vec![0, 1], vec![0, 0, 0]] {
            assert_eq!(settle(shares.clone()), (shares, 0));
        }
    }

    #[test]
    fn uneven_shares_end_within_one_of_each_other() {
        for shares in [
            vec![10, 0, 0, 0],
            vec![4, 4, 2],
            vec![9, 1, 5],
            vec![2, 0, 0],
        ] {
            let (settled, _) = settle(shares);
            let (min, max) = (settled.iter().min(), settled.iter().max());
            assert!(max.unwrap() - min.unwrap() <= 1, "{settled:?}");
        }
    }
}
