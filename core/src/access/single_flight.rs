//! [`SingleFlight`]: one lookup in flight per key, whose outcome every request that asks
//! for the key meanwhile shares.
//!
//! Why: a verified token is cached for `CACHE_TTL`, and every batch a read session sends
//! re-verifies its token. When the entry expires, every request that finds it expired
//! would start its own metadata lookup until one of them refreshed it: with 10,000
//! sessions on one token, thousands of lookups queued on the metadata pool every few
//! seconds, and their deliveries with them.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use futures::future::{BoxFuture, FutureExt, Shared};
use parking_lot::Mutex;

use crate::error::{Error, Result};

type Flight<V> = Shared<BoxFuture<'static, Result<V>>>;

pub(super) struct SingleFlight<K, V: Clone> {
    in_flight: Arc<Mutex<HashMap<K, Flight<V>>>>,
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
    ///
    /// The lookup runs as a task of its own, so it finishes (and leaves the map) even if
    /// every request waiting for it goes away: the map holds only lookups under way.
    pub(super) async fn run<F>(&self, key: K, lookup: F) -> Result<V>
    where
        F: Future<Output = Result<V>> + Send + 'static,
    {
        let flight = {
            let mut in_flight = self.in_flight.lock();
            match in_flight.get(&key) {
                Some(flight) => flight.clone(),
                None => {
                    let map = self.in_flight.clone();
                    let done_key = key.clone();
                    let task = tokio::spawn(async move {
                        let outcome = lookup.await;
                        map.lock().remove(&done_key);
                        outcome
                    });
                    let flight = async move {
                        task.await.unwrap_or_else(|join| {
                            Err(Error::internal("a token lookup did not finish", join))
                        })
                    }
                    .boxed()
                    .shared();
                    in_flight.insert(key, flight.clone());
                    flight
                }
            }
        };
        flight.await
    }

    #[cfg(test)]
    fn in_flight(&self) -> usize {
        self.in_flight.lock().len()
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
        assert_eq!(
            flights.in_flight(),
            0,
            "a finished lookup stayed in the map"
        );

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
    async fn a_lookup_whose_requests_all_went_away_still_finishes_and_leaves() {
        let flights = SingleFlight::<&str, u32>::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let (open, gate) = tokio::sync::watch::channel(false);
        let gone = tokio::time::timeout(
            Duration::from_millis(20),
            flights.run("token", counted(&runs, &gate, 1)),
        )
        .await;
        assert!(gone.is_err(), "the gated lookup finished early");
        assert_eq!(flights.in_flight(), 1);
        open.send(true).unwrap();
        for _ in 0..100 {
            if flights.in_flight() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            flights.in_flight(),
            0,
            "an abandoned lookup stayed in the map"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}
