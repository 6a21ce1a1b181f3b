//! Membership: this node's place in the cluster. It joins with its advertised URL,
//! renews its lease on a steady beat (one statement, whatever the number of streams it
//! holds), and knows two things from that: until when its leases surely hold, by its
//! own monotonic clock, and which nodes are live, for placing streams and forwarding.
//!
//! The lease is taken to hold until the *start* of the last successful renewal plus the
//! lease time, less a margin: the store set the expiry later than that start, so no
//! other node can take a stream before this node has stopped acknowledging.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::storage::cluster::LiveNode;
use crate::storage::MetadataStore;

/// How this node takes part in the cluster.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    /// Stable across restarts (kept in the data directory): a node that starts again
    /// ends the leases of its earlier run at once instead of waiting for them to lapse.
    pub identity: String,
    /// How other nodes reach this one (forwarded requests).
    pub advertise_url: String,
    /// How long a lease lasts without renewal; another node takes the streams of a node
    /// silent that long.
    pub lease: Duration,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        Self {
            identity: "standalone".into(),
            advertise_url: "http://127.0.0.1:8080".into(),
            lease: Duration::from_secs(10),
        }
    }
}

impl ClusterSettings {
    /// How often the lease is renewed: four times per lease, so a renewal or two can
    /// fail without the lease lapsing.
    pub fn renew_interval(&self) -> Duration {
        self.lease / 4
    }

    /// How long before the store's expiry this node stops acknowledging.
    fn margin(&self) -> Duration {
        self.lease / 5
    }
}

/// Whether this node's leases hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseState {
    /// Until this instant (monotonic), unless renewed before.
    HoldsUntil(Instant),
    /// Another node took streams of this one: it must never acknowledge again.
    Lost,
}

impl LeaseState {
    pub fn holds(&self) -> bool {
        matches!(self, LeaseState::HoldsUntil(until) if Instant::now() < *until)
    }
}

pub(crate) struct Membership {
    metadata: Arc<dyn MetadataStore>,
    epoch: u64,
    settings: ClusterSettings,
    state: watch::Sender<LeaseState>,
    /// The live nodes that are not leaving, in epoch order, as of the last look.
    live_nodes: RwLock<Vec<LiveNode>>,
    /// Since when the lease has held without a break.
    holding_since: RwLock<Option<Instant>>,
    /// Shutting down: handing its streams to the others, taking none.
    leaving: AtomicBool,
    /// Start-up is over (its streams taken back; requests are answered from now on);
    /// each renewal tells the metadata store, and other nodes may hand streams here.
    ready: AtomicBool,
}

impl Membership {
    pub async fn join(
        metadata: Arc<dyn MetadataStore>,
        epoch: u64,
        settings: ClusterSettings,
    ) -> Result<Arc<Membership>> {
        let started = Instant::now();
        metadata
            .join_cluster(
                epoch,
                &settings.identity,
                &settings.advertise_url,
                settings.lease.as_millis() as u64,
            )
            .await?;
        let membership = Arc::new(Membership {
            state: watch::Sender::new(LeaseState::HoldsUntil(
                started + settings.lease - settings.margin(),
            )),
            metadata,
            epoch,
            settings,
            live_nodes: RwLock::default(),
            holding_since: RwLock::new(Some(started)),
            leaving: AtomicBool::new(false),
            ready: AtomicBool::new(false),
        });
        membership.refresh_live_nodes().await?;
        Ok(membership)
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn settings(&self) -> &ClusterSettings {
        &self.settings
    }

    pub fn state(&self) -> watch::Receiver<LeaseState> {
        self.state.subscribe()
    }

    pub fn holds(&self) -> bool {
        self.state.borrow().holds()
    }

    pub fn is_lost(&self) -> bool {
        *self.state.borrow() == LeaseState::Lost
    }

    /// Whether this node is shutting down and handing its streams over.
    pub fn is_leaving(&self) -> bool {
        self.leaving.load(Ordering::SeqCst)
    }

    /// Start-up is over: other nodes may hand streams here. Said at once by a renewal
    /// (else an operator would see the node as starting for up to a quarter of a lease);
    /// if that renewal fails, the next one on the steady beat says it.
    pub async fn become_ready(&self) {
        self.ready.store(true, Ordering::SeqCst);
        if let Err(err) = self.renew().await {
            tracing::warn!(error = %err, "could not tell the cluster this node has started; the next lease renewal will");
        }
    }

    /// Starts leaving: the metadata store stops placing streams here, and so does this
    /// node. `false` (and nothing changes) when no other node that has started is live
    /// to take over.
    pub async fn begin_leaving(&self) -> Result<bool> {
        self.refresh_live_nodes().await?;
        if !self.with_serving_nodes(|nodes| nodes.iter().any(|n| n.epoch != self.epoch)) {
            return Ok(false);
        }
        self.metadata.begin_leaving(self.epoch).await?;
        self.leaving.store(true, Ordering::SeqCst);
        self.refresh_live_nodes().await?;
        Ok(true)
    }

    /// How long the lease has held without a break, if it holds.
    pub fn held_for(&self) -> Option<Duration> {
        if !self.holds() {
            return None;
        }
        self.holding_since.read().map(|since| since.elapsed())
    }

    /// Whether the lease has held for a whole lease length: only then does this node
    /// take over other nodes' streams in bulk, so that after a metadata outage every
    /// node can renew before any takes the streams of the others.
    pub fn settled(&self) -> bool {
        self.held_for()
            .is_some_and(|held| held >= self.settings.lease)
    }

    /// Refuses work that needs the leases while they may not hold.
    pub fn check(&self) -> Result<()> {
        match *self.state.borrow() {
            LeaseState::Lost => Err(Error::LeaseLost),
            state if state.holds() => Ok(()),
            _ => Err(Error::Unavailable(
                "this node could not renew its lease in the metadata store in time, so it \
                 serves no stream until it does (if this goes on, other nodes take its \
                 streams over); retry shortly"
                    .into(),
            )),
        }
    }

    /// Renews the lease once; `LeaseLost` if streams of this node were taken meanwhile.
    pub async fn renew(&self) -> Result<()> {
        if self.is_lost() {
            return Err(Error::LeaseLost);
        }
        let started = Instant::now();
        let lease_ms = self.settings.lease.as_millis() as u64;
        let ready = self.ready.load(Ordering::SeqCst);
        match self.metadata.renew_lease(self.epoch, lease_ms, ready).await {
            Ok(true) => {
                let held = self.holds();
                self.state.send_replace(LeaseState::HoldsUntil(
                    started + self.settings.lease - self.settings.margin(),
                ));
                if !held {
                    *self.holding_since.write() = Some(started);
                    tracing::info!("renewed this node's lease again: serving its streams again");
                }
                Ok(())
            }
            Ok(false) => {
                self.state.send_replace(LeaseState::Lost);
                *self.holding_since.write() = None;
                Err(Error::LeaseLost)
            }
            Err(err) => {
                if !self.holds() {
                    *self.holding_since.write() = None;
                }
                Err(err)
            }
        }
    }

    pub async fn refresh_live_nodes(&self) -> Result<()> {
        let mut nodes = self.metadata.live_nodes().await?;
        // Its own renewal is what counts for this node, not the store's last word.
        nodes.retain(|n| n.epoch != self.epoch);
        if self.holds() && !self.is_leaving() {
            nodes.push(LiveNode {
                epoch: self.epoch,
                advertise_url: self.settings.advertise_url.clone(),
                ready: self.ready.load(Ordering::SeqCst),
            });
            nodes.sort_by_key(|n| n.epoch);
        }
        *self.live_nodes.write() = nodes;
        Ok(())
    }

    /// `f` of the live nodes that have started, which streams are placed on: a node
    /// still starting answers no request yet.
    fn with_serving_nodes<R>(&self, f: impl FnOnce(&[&LiveNode]) -> R) -> R {
        // Its own readiness as it is now: it may have started since the last look.
        let ready_here = self.ready.load(Ordering::SeqCst);
        let nodes = self.live_nodes.read();
        let serving: Vec<&LiveNode> = nodes
            .iter()
            .filter(|n| n.ready || (n.epoch == self.epoch && ready_here))
            .collect();
        f(&serving)
    }

    /// The node a stream without an owner should go to (epoch, advertised URL): streams
    /// are spread over the serving nodes by id, so each takes about its share.
    pub fn placement(&self, stream_id: u64) -> Option<(u64, String)> {
        self.with_serving_nodes(|nodes| {
            let node = nodes.get((stream_id % nodes.len().max(1) as u64) as usize)?;
            Some((node.epoch, node.advertise_url.clone()))
        })
    }

    /// This node's rank among the serving nodes and their number; `None` while it is
    /// not one of them (still starting, leaving, or its lease lapsed).
    pub fn rank(&self) -> Option<(usize, usize)> {
        self.with_serving_nodes(|nodes| {
            let rank = nodes.iter().position(|n| n.epoch == self.epoch)?;
            Some((rank, nodes.len()))
        })
    }

    /// Whether other nodes may sequence streams: another node is live (started or not),
    /// or this node does not know, having lost its place among them.
    pub fn may_have_peers(&self) -> bool {
        let nodes = self.live_nodes.read();
        !nodes.iter().any(|n| n.epoch == self.epoch) || nodes.len() > 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::sql::SqlMetadataStore;

    /// Streams are placed only on nodes that have started, this one included as soon
    /// as it has; a node still starting still counts as a peer that may hold streams.
    #[tokio::test]
    async fn streams_are_placed_only_on_nodes_that_have_started() {
        let (store, _dir) = SqlMetadataStore::temporary().await;
        let store: Arc<dyn MetadataStore> = Arc::new(store);
        let settings = ClusterSettings {
            lease: Duration::from_secs(60),
            ..ClusterSettings::default()
        };
        let here = Membership::join(store.clone(), store.next_epoch().await.unwrap(), settings)
            .await
            .unwrap();
        let peer = store.next_epoch().await.unwrap();
        store
            .join_cluster(peer, "peer", "http://peer", 60_000)
            .await
            .unwrap();
        here.refresh_live_nodes().await.unwrap();
        // Both starting: nothing is placed anywhere, and this node has no share.
        assert_eq!(here.placement(7), None);
        assert_eq!(here.rank(), None);
        assert!(here.may_have_peers());

        // Started: at once, before its next look at the cluster.
        here.become_ready().await;
        assert_eq!(here.rank(), Some((0, 1)));
        assert_eq!(
            here.placement(7).map(|(epoch, _)| epoch),
            Some(here.epoch())
        );

        // The peer has started too: the streams are spread over both.
        assert!(store.renew_lease(peer, 60_000, true).await.unwrap());
        here.refresh_live_nodes().await.unwrap();
        assert_eq!(here.rank(), Some((0, 2)));
        let placed: Vec<u64> = (0..4).map(|id| here.placement(id).unwrap().0).collect();
        assert_eq!(placed, [here.epoch(), peer, here.epoch(), peer]);
    }
}
