//! Where streams that other nodes sequence were found, for a moment. A node that passes
//! a client's requests on to a stream's owner would otherwise look the owner up in the
//! metadata store (the stream's record, then its lease: two round trips) for every
//! request; with this, once per `FRESH_FOR`.
//!
//! Only owners found holding a live lease are remembered, never where the placement
//! rule would put a stream nobody holds. A stale entry costs a detour, never a wrong
//! answer: the node it names serves a request passed on to it only if it sequences the
//! stream (or takes it, when no live node holds it), and otherwise passes it on once
//! more to the owner it finds itself (see `Arrival::Forwarded`). An entry is dropped at
//! once when its node could not be reached or answered `503`, and when this node hands
//! the stream over.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::names::{BasinName, StreamName};

/// How long a stream's owner, once looked up, is taken as known, from when the lookup
/// began. Well under the second a node that handed its streams over at shutdown goes
/// on taking requests (`HAND_OFF_SETTLE` in the gateway): a request sent by an entry
/// made just before the hand-off still reaches that node, which passes it on.
const FRESH_FOR: Duration = Duration::from_millis(500);

/// Most streams remembered at once (clients choose which streams they name).
const MOST_ENTRIES: usize = 65_536;

#[derive(Default)]
pub(crate) struct OwnerCache {
    seen: parking_lot::Mutex<HashMap<(BasinName, StreamName), (String, Instant)>>,
}

impl OwnerCache {
    /// The advertised URL of the node found to serve the stream, if found lately.
    pub fn get(&self, basin: &BasinName, name: &StreamName) -> Option<String> {
        let seen = self.seen.lock();
        // A lookup by reference would need an owned key: two short strings cloned,
        // tens of nanoseconds against the hop to the owner this lookup saves.
        let (url, at) = seen.get(&(basin.clone(), name.clone()))?;
        (at.elapsed() < FRESH_FOR).then(|| url.clone())
    }

    /// Forgets where the stream was found (its node did not take a request).
    pub fn forget(&self, basin: &BasinName, name: &StreamName) {
        self.seen.lock().remove(&(basin.clone(), name.clone()));
    }

    /// Notes that the stream is served by the node at `advertise_url`, as found by a
    /// lookup that began at `asked_at`.
    pub fn remember(
        &self,
        basin: &BasinName,
        name: &StreamName,
        advertise_url: &str,
        asked_at: Instant,
    ) {
        let mut seen = self.seen.lock();
        if seen.len() >= MOST_ENTRIES {
            seen.retain(|_, (_, at)| at.elapsed() < FRESH_FOR);
            if seen.len() >= MOST_ENTRIES {
                seen.clear();
            }
        }
        seen.insert(
            (basin.clone(), name.clone()),
            (advertise_url.to_owned(), asked_at),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(stream: &str) -> (BasinName, StreamName) {
        (
            BasinName::new("basin-one").unwrap(),
            StreamName::new(stream).unwrap(),
        )
    }

    #[test]
    fn an_owner_is_known_for_a_moment_and_only_for_its_stream() {
        let cache = OwnerCache::default();
        let (basin, s) = names("s");
        let (_, t) = names("t");
        assert_eq!(cache.get(&basin, &s), None);
        cache.remember(&basin, &s, "http://node-b:8080", Instant::now());
        assert_eq!(cache.get(&basin, &s).as_deref(), Some("http://node-b:8080"));
        assert_eq!(cache.get(&basin, &t), None);
        cache.remember(&basin, &s, "http://node-c:8080", Instant::now());
        assert_eq!(cache.get(&basin, &s).as_deref(), Some("http://node-c:8080"));
        cache.forget(&basin, &s);
        assert_eq!(cache.get(&basin, &s), None);
        cache.remember(&basin, &s, "http://node-c:8080", Instant::now());
        // Aged past `FRESH_FOR`, the entry no longer answers.
        cache
            .seen
            .lock()
            .get_mut(&(basin.clone(), s.clone()))
            .unwrap()
            .1 -= FRESH_FOR;
        assert_eq!(cache.get(&basin, &s), None);
    }

    #[test]
    fn the_cache_stays_bounded() {
        let cache = OwnerCache::default();
        let (basin, _) = names("s");
        for i in 0..MOST_ENTRIES + 10 {
            let (_, stream) = names(&format!("s{i}"));
            cache.remember(&basin, &stream, "http://node-b:8080", Instant::now());
        }
        assert!(cache.seen.lock().len() <= MOST_ENTRIES);
        let (_, last) = names(&format!("s{}", MOST_ENTRIES + 9));
        assert!(cache.get(&basin, &last).is_some());
    }
}
