//! The stream registry: the in-memory state of every live stream, by name.
//!
//! Every live stream this node sequences is here, from when it took the stream over
//! (see `ownership`). The catalog removes streams as they are deleted; appends, reads,
//! compaction and lifecycle look streams up here. Removing a stream marks its state deleted, so anyone still
//! holding it (a reader, a waiting append) sees the deletion.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::names::{BasinName, StreamName};
use crate::stream::StreamState;

pub(crate) type StreamKey = (BasinName, StreamName);

#[derive(Default)]
pub(crate) struct StreamRegistry {
    streams: RwLock<HashMap<StreamKey, Arc<StreamState>>>,
}

impl StreamRegistry {
    pub fn get(&self, basin: &BasinName, name: &StreamName) -> Option<Arc<StreamState>> {
        self.streams
            .read()
            .get(&(basin.clone(), name.clone()))
            .cloned()
    }

    /// The stream of this name if it is the one with this id.
    pub fn get_id(
        &self,
        basin: &BasinName,
        name: &StreamName,
        id: u64,
    ) -> Option<Arc<StreamState>> {
        self.get(basin, name).filter(|state| state.id == id)
    }

    /// Starts serving a stream this node has taken over. A different id under this name
    /// is a deleted stream whose removal never ran here: it is replaced.
    pub fn insert(&self, basin: BasinName, state: Arc<StreamState>) {
        let key = (basin, state.name.clone());
        if let Some(stale) = self.streams.write().insert(key, state) {
            stale.mark_deleted();
        }
    }

    /// Removes a stream by id (deleted through another node).
    pub fn remove_id(&self, id: u64) {
        self.streams.write().retain(|_, state| {
            if state.id == id {
                state.mark_deleted();
                false
            } else {
                true
            }
        });
    }

    /// Takes streams out of service here for a hand-over to another node: out of the
    /// registry first (so an append refused as moved finds them gone and goes to the new
    /// owner), then marked moved, not deleted: what was sequenced here still becomes
    /// durable, and the hand-over waits for it. The states it took out.
    pub fn move_out(&self, ids: &HashSet<u64>) -> Vec<(BasinName, Arc<StreamState>)> {
        let mut moved = Vec::new();
        let mut streams = self.streams.write();
        streams.retain(|(basin, _), state| {
            if ids.contains(&state.id) {
                moved.push((basin.clone(), state.clone()));
                false
            } else {
                true
            }
        });
        drop(streams);
        for (_, state) in &moved {
            state.mark_moved();
        }
        moved
    }

    /// Removes the stream with this id under this name, if it is still the one there.
    pub fn remove(&self, basin: &BasinName, name: &StreamName, id: u64) {
        let key = (basin.clone(), name.clone());
        let mut streams = self.streams.write();
        if streams.get(&key).is_some_and(|state| state.id == id) {
            if let Some(state) = streams.remove(&key) {
                state.mark_deleted();
            }
        }
    }

    /// Removes every stream of a basin.
    pub fn remove_basin(&self, name: &BasinName) {
        self.streams.write().retain(|(basin, _), state| {
            if basin == name {
                state.mark_deleted();
                false
            } else {
                true
            }
        });
    }

    /// The live streams with their basins.
    pub fn with_basins(&self) -> Vec<(BasinName, Arc<StreamState>)> {
        let streams = self.streams.read();
        streams
            .iter()
            .map(|((basin, _), state)| (basin.clone(), state.clone()))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.streams.read().len()
    }

    /// The ids of the live streams.
    pub fn ids(&self) -> HashSet<u64> {
        self.streams.read().values().map(|s| s.id).collect()
    }

    /// The live streams by id.
    pub fn by_id(&self) -> HashMap<u64, Arc<StreamState>> {
        let streams = self.streams.read();
        streams.values().map(|s| (s.id, s.clone())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::StreamPosition;
    use crate::stream::SequencerState;

    fn state(id: u64, name: &str) -> Arc<StreamState> {
        StreamState::new(
            id,
            StreamName::new(name).unwrap(),
            Default::default(),
            None,
            SequencerState::default(),
            StreamPosition::default(),
            Vec::new(),
        )
    }

    #[test]
    fn streams_moved_out_are_marked_moved_not_deleted_and_the_rest_stay() {
        let registry = StreamRegistry::default();
        let basin = BasinName::new("test-basin").unwrap();
        let (moving, staying) = (state(1, "moving"), state(2, "staying"));
        registry.insert(basin.clone(), moving.clone());
        registry.insert(basin.clone(), staying.clone());
        let moved = registry.move_out(&[1].into_iter().collect());
        assert_eq!(moved.len(), 1);
        assert_eq!((&moved[0].0, moved[0].1.id), (&basin, 1));
        // Moved, so the hand-over still waits for what it sequenced to be durable.
        assert!(moving.is_moved() && !moving.is_deleted());
        assert!(registry.get(&basin, &moving.name).is_none());
        assert!(registry.get(&basin, &staying.name).is_some());
        assert!(!staying.is_moved() && !staying.is_deleted());
    }
}
