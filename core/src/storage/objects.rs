//! `ObjectStore`: immutable objects addressed by key. Every backend passes the same
//! conformance suite (`conformance` below).

use std::ops::Range;

use async_trait::async_trait;
use bytes::Bytes;

use crate::error::Result;

#[async_trait]
pub trait ObjectStore: Send + Sync + 'static {
    /// Stores an object. When this returns `Ok`, the object survives any crash and is
    /// visible whole to every later `get` and `list`; a crash before that leaves either
    /// no object or the whole object, never a part of it.
    async fn put(&self, key: &str, data: Bytes) -> Result<()>;
    /// The whole object, or `None` if there is no object at `key`.
    async fn get(&self, key: &str) -> Result<Option<Bytes>>;
    /// A byte range of an object that must exist.
    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes>;
    /// Keys that start with `prefix`, in lexicographic order.
    async fn list(&self, prefix: &str) -> Result<Vec<String>>;
    /// Removes an object; removing a missing object is not an error. The removal may
    /// not survive a crash until `sync_deletes` covers it.
    async fn delete(&self, key: &str) -> Result<()>;
    /// Makes the removal of `keys` (deleted already) durable, so that a crash cannot
    /// bring them back once the metadata forgets them: they would stay as orphans no
    /// one deletes. Nothing to do where a delete is durable when it returns (S3).
    async fn sync_deletes(&self, _keys: &[String]) -> Result<()> {
        Ok(())
    }
    /// A short description for logs and the start-up banner.
    fn describe(&self) -> String;
    /// Gets ready for puts of `keys` expected soon, where a store can do part of a put's
    /// work ahead of time. Puts never depend on it: a key put before (or without) its
    /// preparation is stored the usual way. The local directory makes log files for its
    /// chunk log ahead of the one being written, and while that log has no room,
    /// creates the keys' files and makes their directory entries durable, so that such
    /// a put costs one `fdatasync`.
    /// This creates no object: `get` and `list` see a key once it is put.
    async fn prepare(&self, _keys: &[String]) -> Result<()> {
        Ok(())
    }
    /// Puts a prepared key's object on the calling thread, where that is one short
    /// blocking write (the local directory: an append and an `fdatasync` to its chunk
    /// log, or a write and an `fdatasync` into the file `prepare` made), with the
    /// guarantees of `put`. `None`, having done nothing, where the store has no such put
    /// or `key` is not prepared: the caller uses `put`. The WAL
    /// writer puts its small chunks this way when nothing else is being written, so that
    /// an append waits for the disk alone, not for hand-offs between threads as well.
    fn put_prepared_blocking(&self, _key: &str, _data: &[u8]) -> Option<Result<()>> {
        None
    }
}

/// The behaviour every `ObjectStore` must show; each backend's tests call this.
#[cfg(test)]
pub(crate) async fn conformance(store: &dyn ObjectStore) {
    assert_eq!(store.get("a/missing").await.unwrap(), None);
    assert!(store.list("").await.unwrap().is_empty());

    store
        .put("wal/2/b", Bytes::from_static(b"second"))
        .await
        .unwrap();
    store
        .put("wal/1/a", Bytes::from_static(b"first!"))
        .await
        .unwrap();
    store
        .put("other/x", Bytes::from_static(b"x"))
        .await
        .unwrap();
    assert_eq!(
        store.get("wal/1/a").await.unwrap(),
        Some(Bytes::from_static(b"first!"))
    );
    assert_eq!(
        store.get_range("wal/2/b", 1..4).await.unwrap(),
        Bytes::from_static(b"eco")
    );
    assert_eq!(
        store.list("wal/").await.unwrap(),
        vec!["wal/1/a", "wal/2/b"]
    );
    assert_eq!(store.list("").await.unwrap().len(), 3);

    // Overwriting replaces the whole object.
    store
        .put("other/x", Bytes::from_static(b"replaced"))
        .await
        .unwrap();
    assert_eq!(
        store.get("other/x").await.unwrap(),
        Some(Bytes::from_static(b"replaced"))
    );

    // Prepared keys are not objects until they are put.
    store
        .prepare(&["wal/3/c".into(), "wal/3/d".into()])
        .await
        .unwrap();
    assert_eq!(store.get("wal/3/c").await.unwrap(), None);
    assert_eq!(
        store.list("wal/").await.unwrap(),
        vec!["wal/1/a", "wal/2/b"]
    );
    store
        .put("wal/3/c", Bytes::from_static(b"prepared"))
        .await
        .unwrap();
    assert_eq!(
        store.get("wal/3/c").await.unwrap(),
        Some(Bytes::from_static(b"prepared"))
    );
    store.delete("wal/3/c").await.unwrap();
    store.delete("wal/3/d").await.unwrap();

    store.delete("wal/1/a").await.unwrap();
    store.delete("wal/1/a").await.unwrap();
    assert_eq!(store.get("wal/1/a").await.unwrap(), None);
    assert_eq!(store.list("wal/").await.unwrap(), vec!["wal/2/b"]);
    assert!(store.get_range("wal/1/a", 0..1).await.is_err());

    // Large ranges (read-ahead, catch-ups) at every kind of offset: from the start, from
    // the middle to the middle, up to the very end; and one past the end is refused.
    let big: Bytes = (0..(1 << 20) + 1000u32).map(|i| (i % 251) as u8).collect();
    store.put("wal/4/big", big.clone()).await.unwrap();
    let len = big.len() as u64;
    for range in [
        0..200_000,
        5_000..300_001,
        len - 150_000..len,
        4_096..len - 1,
    ] {
        let read = store.get_range("wal/4/big", range.clone()).await.unwrap();
        assert!(
            read == big.slice(range.start as usize..range.end as usize),
            "range {range:?}"
        );
    }
    assert!(store
        .get_range("wal/4/big", len - 200_000..len + 1)
        .await
        .is_err());
    store.delete("wal/4/big").await.unwrap();
}
