//! [`SingleFlight`]: one lookup in flight per key, whose outcome every request that asks
//! for the key meanwhile shares.
//!
//! Why: some lookups in the metadata store are made by many requests at the same moment,
//! and the pool's few connections would serve them one after another:
//!
//! - A verified token is cached for `CACHE_TTL`, and every batch a read session sends
//!   re-verifies its token. When the entry expires, every request that finds it expired
//!   would look it up: with 10,000 sessions on one token, thousands of lookups queued on
//!   the pool every few seconds, and their deliveries with them (`access::registry`).
//! - When compaction moves a stream's newest records into a segment, every follower a
//!   little behind the tail asks the segment index where its next records are
//!   (`segment_lookups`).
//!
//! A lookup is driven by the requests waiting for it, as an unshared one would be: when
//! they all go away it is dropped, so clients that send requests and hang up leave no
//! work behind.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use futures::future::{BoxFuture, FutureExt, Shared, WeakShared};
use parking_lot::Mutex;

use crate::error::Result;

type Flight<V> = Shared<BoxFuture<'static, Result<V>>>;

/// Entries kept before the map is pruned of lookups every request has left.
const PRUNE_AT: usize = 1024;

pub(crate) struct SingleFlight<K, V: Clone> {
    /// The lookups under way, held weakly: their requests keep them alive, so a lookup
    /// every request has left (clients that went away) is dropped, as an unshared one
    /// would be, rather than run on for nobody.
    in_flight: Arc<Mutex<Flights<K, V>>>,
}

struct Flights<K, V> {
    by_key: HashMap<K, WeakShared<BoxFuture<'static, Result<V>>>>,
    /// The size at which dead entries are pruned next: twice the live ones left by the
    /// last pruning (at least `PRUNE_AT`), so that pruning costs O(1) per insert.
    prune_at: usize,
}

impl<K, V> Default for Flights<K, V> {
    fn default() -> Self {
        Flights {
            by_key: HashMap::new(),
            prune_at: PRUNE_AT,
        }
    }
}

impl<K, V: Clone> Clone for SingleFlight<K, V> {
    fn clone(&self) -> Self {
        SingleFlight {
            in_flight: self.in_flight.clone(),
        }
    }
}

impl<K, V: Clone> Default for SingleFlight<K, V> {
    fn default() -> Self {
        SingleFlight {
            in_flight: Arc::default(),
        }
    }
}

impl<K, V> SingleFlight<K, V>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// The outcome of `lookup` for `key`: the one already in flight for `key` if there is
    /// one (and `lookup` is not run), otherwise a new one.
    pub(crate) async fn run<F>(&self, key: K, lookup: F) -> Result<V>
    where
        F: Future<Output = Result<V>> + Send + 'static,
    {
        let flight = {
            let mut in_flight = self.in_flight.lock();
            match in_flight.by_key.get(&key).and_then(WeakShared::upgrade) {
                Some(flight) => flight,
                None => {
                    let flight = self.start(key.clone(), lookup);
                    // Abandoned lookups leave dead entries (their keys may never come
                    // back): prune them before the map grows far past the live ones.
                    if in_flight.by_key.len() >= in_flight.prune_at {
                        in_flight.by_key.retain(|_, weak| weak.upgrade().is_some());
                        in_flight.prune_at = (2 * in_flight.by_key.len()).max(PRUNE_AT);
                    }
                    let weak = flight.downgrade().expect("a flight not yet polled");
                    in_flight.by_key.insert(key, weak);
                    flight
                }
            }
        };
        flight.await
    }

    /// A lookup that leaves the map once it is done. (A newer entry for its key can only
    /// have replaced it once it was dropped, and then it never finishes.)
    fn start<F>(&self, key: K, lookup: F) -> Flight<V>
    where
        F: Future<Output = Result<V>> + Send + 'static,
    {
        let map = self.in_flight.clone();
        async move {
            let outcome = lookup.await;
            map.lock().by_key.remove(&key);
            outcome
        }
        .boxed()
        .shared()
    }

    #[cfg(test)]
    fn entries(&self) -> usize {
        self.in_flight.lock().by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// A lookup that counts its runs and finishes when `gate` opens.
    fn counted(
        runs: &Arc<AtomicUsize>,
        gate: &tokio::sync::watch::Receiver<bool>,
        value: u32,
    ) -> impl Future<Output = Result<u32>> + Send + 'static {
        let (runs, mut gate) = (runs.clone(), gate.clone());
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            gate.wait_for(|open| *open).await.unwrap();
            Ok(value)
        }
    }

    #[tokio::test]
    async fn concurrent_requests_for_a_key_share_one_lookup() {
        let flights = SingleFlight::<&str, u32>::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let (open, gate) = tokio::sync::watch::channel(false);
        let waiters: Vec<_> = (0..100)
            .map(|i| {
                let (flights, lookup) = (flights.clone(), counted(&runs, &gate, i));
                tokio::spawn(async move { flights.run("token", lookup).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        open.send(true).unwrap();
        let mut outcomes = Vec::new();
        for waiter in waiters {
            outcomes.push(waiter.await.unwrap().unwrap());
        }
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "the key was looked up more than once"
        );
        assert!(
            outcomes.windows(2).all(|pair| pair[0] == pair[1]),
            "the requests did not all get the one lookup's outcome: {outcomes:?}"
        );
        assert_eq!(flights.entries(), 0, "a finished lookup stayed in the map");

        // Once it is done, the next request looks up again (the cache, not this, keeps
        // outcomes).
        flights
            .run("token", counted(&runs, &gate, 7))
            .await
            .unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn other_keys_are_looked_up_on_their_own() {
        let flights = SingleFlight::<u32, u32>::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let (open, gate) = tokio::sync::watch::channel(false);
        let waiters: Vec<_> = (0..10)
            .map(|key| {
                let (flights, lookup) = (flights.clone(), counted(&runs, &gate, key));
                tokio::spawn(async move { flights.run(key, lookup).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        open.send(true).unwrap();
        for (key, waiter) in waiters.into_iter().enumerate() {
            assert_eq!(waiter.await.unwrap().unwrap(), key as u32);
        }
        assert_eq!(runs.load(Ordering::SeqCst), 10);
    }

    #[tokio::test]
    async fn a_lookup_whose_requests_all_went_away_is_dropped_and_started_afresh() {
        let flights = SingleFlight::<&str, u32>::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let (open, gate) = tokio::sync::watch::channel(false);
        let gone = tokio::time::timeout(
            Duration::from_millis(20),
            flights.run("token", counted(&runs, &gate, 1)),
        )
        .await;
        assert!(gone.is_err(), "the gated lookup finished early");
        // Its one request went away: the lookup was dropped with it (the gate's
        // receiver with it), and the next request starts a new one.
        assert_eq!(
            open.receiver_count(),
            1,
            "the abandoned lookup is still alive (it holds a receiver of the gate)"
        );
        open.send(true).unwrap();
        assert_eq!(
            flights
                .run("token", counted(&runs, &gate, 2))
                .await
                .unwrap(),
            2
        );
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        assert_eq!(flights.entries(), 0);
    }

    #[tokio::test]
    async fn abandoned_lookups_of_many_keys_do_not_pile_up() {
        let flights = SingleFlight::<u32, u32>::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let (_open, gate) = tokio::sync::watch::channel(false);
        for key in 0..(4 * PRUNE_AT as u32) {
            // Polled once, then dropped: a client that sent a token and went away.
            let lookup = flights.run(key, counted(&runs, &gate, key));
            assert!(futures::poll!(Box::pin(lookup)).is_pending());
        }
        assert_eq!(runs.load(Ordering::SeqCst), 4 * PRUNE_AT);
        assert!(
            flights.entries() <= PRUNE_AT,
            "{} entries kept for lookups nobody waits for",
            flights.entries()
        );
    }
}
