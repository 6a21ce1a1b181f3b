//! The stream registry: the in-memory state of every live stream, by name.
//!
//! Every live stream is here from start-up on (recovery fills it). The catalog adds and
//! removes streams as the metadata changes; appends, reads, compaction and lifecycle
//! look streams up here. Removing a stream marks its state deleted, so anyone still
//! holding it (a reader, a waiting append) sees the deletion.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::names::{BasinName, StreamName};
use crate::record::StreamPosition;
use crate::storage::StreamRecord;
use crate::stream::{SequencerState, StreamState};

pub(crate) type StreamKey = (BasinName, StreamName);

#[derive(Default)]
pub(crate) struct StreamRegistry {
    streams: RwLock<HashMap<StreamKey, Arc<StreamState>>>,
}

impl StreamRegistry {
    pub fn new(streams: HashMap<StreamKey, Arc<StreamState>>) -> Self {
        Self {
            streams: RwLock::new(streams),
        }
    }

    pub fn get(&self, basin: &BasinName, name: &StreamName) -> Option<Arc<StreamState>> {
        self.streams
            .read()
            .get(&(basin.clone(), name.clone()))
            .cloned()
    }

    /// Adds a stream just created, or found in the metadata but not here (idempotent for
    /// retried creates). A different id under this name is a deleted stream whose removal
    /// never ran: it is replaced, and must not receive the new stream's records.
    pub fn register(&self, record: &StreamRecord) {
        let key = (record.basin.clone(), record.name.clone());
        let mut streams = self.streams.write();
        if streams.get(&key).map(|state| state.id) == Some(record.id) {
            return;
        }
        let fresh = StreamState::new(
            record.id,
            record.name.clone(),
            record.config,
            SequencerState::default(),
            StreamPosition::default(),
            Vec::new(),
        );
        if let Some(stale) = streams.insert(key, fresh) {
            stale.mark_deleted();
        }
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

    /// The live streams by id.
    pub fn by_id(&self) -> HashMap<u64, Arc<StreamState>> {
        let streams = self.streams.read();
        streams.values().map(|s| (s.id, s.clone())).collect()
    }
}
