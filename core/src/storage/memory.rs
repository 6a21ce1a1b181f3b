//! An in-memory `ObjectStore`, for unit tests only: it keeps nothing across restarts.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::ops::Range;

use async_trait::async_trait;
use bytes::Bytes;

use super::objects::ObjectStore;
use crate::error::{Error, Result};

#[derive(Default)]
pub struct MemoryObjectStore {
    objects: Mutex<BTreeMap<String, Bytes>>,
}

#[async_trait]
impl ObjectStore for MemoryObjectStore {
    async fn put(&self, key: &str, data: Bytes) -> Result<()> {
        self.objects.lock().insert(key.to_owned(), data);
        Ok(())
    }

    async fn get(&self, key: &str) -> Result<Option<Bytes>> {
        Ok(self.objects.lock().get(key).cloned())
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes> {
        let data = self
            .get(key)
            .await?
            .ok_or_else(|| Error::storage(format!("object `{key}` does not exist")))?;
        slice_range(key, &data, range)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        let objects = self.objects.lock();
        Ok(objects
            .range(prefix.to_owned()..)
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(key, _)| key.clone())
            .collect())
    }

    async fn delete(&self, key: &str) -> Result<()> {
        self.objects.lock().remove(key);
        Ok(())
    }

    fn describe(&self) -> String {
        "in-memory (not durable)".into()
    }
}

/// Cuts `range` out of a whole object, refusing ranges past its end.
pub(crate) fn slice_range(key: &str, data: &Bytes, range: Range<u64>) -> Result<Bytes> {
    if range.start > range.end || range.end > data.len() as u64 {
        return Err(Error::storage(format!(
            "range {range:?} is outside object `{key}` of {} bytes",
            data.len()
        )));
    }
    Ok(data.slice(range.start as usize..range.end as usize))
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn passes_the_object_store_conformance_suite() {
        super::super::objects::conformance(&super::MemoryObjectStore::default()).await;
    }
}
