//! A bounded cache of recently written WAL chunks, so that tailing readers and recent
//! reads are served from memory. Oldest chunks are evicted first.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;

use bytes::Bytes;

pub struct ChunkCache {
    capacity_bytes: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    chunks: HashMap<Arc<str>, Bytes>,
    order: VecDeque<Arc<str>>,
    bytes: usize,
}

impl ChunkCache {
    pub fn new(capacity_bytes: usize) -> Self {
        Self {
            capacity_bytes,
            inner: Mutex::new(Inner::default()),
        }
    }

    pub fn insert(&self, key: Arc<str>, chunk: Bytes) {
        if chunk.len() > self.capacity_bytes {
            return;
        }
        let mut inner = self.inner.lock();
        if inner.chunks.contains_key(&key) {
            return;
        }
        inner.bytes += chunk.len();
        inner.chunks.insert(key.clone(), chunk);
        inner.order.push_back(key);
        while inner.bytes > self.capacity_bytes {
            let Some(oldest) = inner.order.pop_front() else {
                break;
            };
            if let Some(evicted) = inner.chunks.remove(&oldest) {
                inner.bytes -= evicted.len();
            }
        }
    }

    pub fn contains(&self, key: &str) -> bool {
        self.inner.lock().chunks.contains_key(key)
    }

    pub fn get(&self, key: &str) -> Option<Bytes> {
        self.inner.lock().chunks.get(key).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_oldest_first_within_capacity() {
        let cache = ChunkCache::new(10);
        cache.insert("a".into(), Bytes::from_static(b"1234"));
        cache.insert("b".into(), Bytes::from_static(b"1234"));
        assert!(cache.get("a").is_some());
        cache.insert("c".into(), Bytes::from_static(b"1234"));
        assert!(cache.get("a").is_none());
        assert!(cache.get("b").is_some() && cache.get("c").is_some());
        cache.insert("huge".into(), Bytes::from(vec![0u8; 11]));
        assert!(cache.get("huge").is_none());
    }
}
