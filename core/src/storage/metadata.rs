//! `MetadataStore`: basins, streams, access tokens and the node epoch. Not on the append hot path: the
//! engine caches what it needs and only comes here to create, reconfigure, delete or list.

use async_trait::async_trait;
use time::OffsetDateTime;

use crate::access::AccessTokenInfo;
use crate::config::{BasinConfig, StreamConfig};
use crate::error::Result;
use crate::names::{BasinName, StreamName};

#[derive(Debug, Clone, PartialEq)]
pub struct BasinRecord {
    pub name: BasinName,
    pub location: String,
    pub config: BasinConfig,
    pub created_at: OffsetDateTime,
    pub deleted_at: Option<OffsetDateTime>,
    /// What identifies the create call that made it (request token and requested config), so a retry of that call is answered with the existing resource.
    pub idempotency_key: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StreamRecord {
    /// Immutable and never reused: a recreated stream gets a new id, so it can never
    /// see records of the stream that had its name before.
    pub id: u64,
    pub basin: BasinName,
    pub name: StreamName,
    pub config: StreamConfig,
    pub created_at: OffsetDateTime,
    pub deleted_at: Option<OffsetDateTime>,
    pub idempotency_key: Option<String>,
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq)]
pub struct ListPage<T> {
    pub items: Vec<T>,
    pub has_more: bool,
}

/// Listing bounds: names starting with `prefix`, strictly after `start_after`.
#[derive(Debug, Clone, Default)]
pub struct ListRange {
    pub prefix: String,
    pub start_after: String,
    pub limit: usize,
}

/// What a create did: made the resource, or found the one an earlier call with the same
/// request token made.
#[derive(Debug, Clone, PartialEq)]
pub enum Created<T> {
    New(T),
    Existing(T),
}

#[async_trait]
pub trait MetadataStore: Send + Sync + 'static {
    /// Creates a basin. Fails with `AlreadyExists` (or `BasinDeletionPending` while a
    /// basin of that name is being deleted), unless the existing basin was created with
    /// the same request token, which returns it as `Created::Existing`.
    async fn create_basin(&self, basin: BasinRecord) -> Result<Created<BasinRecord>>;
    /// A basin, including one being deleted.
    async fn get_basin(&self, name: &BasinName) -> Result<Option<BasinRecord>>;
    async fn list_basins(&self, range: &ListRange) -> Result<ListPage<BasinRecord>>;
    async fn set_basin_config(&self, name: &BasinName, config: &BasinConfig) -> Result<()>;
    /// Marks a basin and all its streams deleted at `at`; they stay listed until removed.
    async fn mark_basin_deleted(&self, name: &BasinName, at: OffsetDateTime) -> Result<()>;
    /// Forgets a basin whose deletion has completed.
    async fn remove_basin(&self, name: &BasinName) -> Result<()>;

    /// Creates a stream, with the same rules as `create_basin` (`StreamDeletionPending`
    /// while a stream of that name is being deleted). The id is assigned by the store.
    async fn create_stream(&self, stream: StreamRecord) -> Result<Created<StreamRecord>>;
    async fn get_stream(
        &self,
        basin: &BasinName,
        name: &StreamName,
    ) -> Result<Option<StreamRecord>>;
    async fn list_streams(
        &self,
        basin: &BasinName,
        range: &ListRange,
    ) -> Result<ListPage<StreamRecord>>;
    async fn set_stream_config(&self, id: u64, config: &StreamConfig) -> Result<()>;
    async fn mark_stream_deleted(&self, id: u64, at: OffsetDateTime) -> Result<()>;
    async fn remove_stream(&self, id: u64) -> Result<()>;
    /// Every stream marked deleted, and every basin marked deleted, for the reaper.
    async fn pending_deletions(&self) -> Result<(Vec<StreamRecord>, Vec<BasinName>)>;
    /// Every stream that is not deleted, for recovery.
    async fn live_streams(&self) -> Result<Vec<StreamRecord>>;

    /// Returns a number greater than every number it returned before, durably: each
    /// process start takes one, and names its write-ahead log after it.
    async fn next_epoch(&self) -> Result<u64>;

    /// Stores a new token with the digest of its secret; `AlreadyExists` if the id is
    /// taken. With `replace`, an existing token of that id is overwritten instead (how
    /// `--root-token` sets the root token's secret).
    async fn put_access_token(
        &self,
        token: &AccessTokenInfo,
        secret_digest: &[u8],
        replace: bool,
    ) -> Result<()>;
    /// The token whose secret has this digest, with the digest as stored.
    async fn access_token_by_digest(
        &self,
        digest: &[u8],
    ) -> Result<Option<(AccessTokenInfo, Vec<u8>)>>;
    async fn list_access_tokens(&self, range: &ListRange) -> Result<ListPage<AccessTokenInfo>>;
    /// Deletes a token; whether it existed.
    async fn delete_access_token(&self, id: &str) -> Result<bool>;
}

/// The behaviour every `MetadataStore` must show; each backend's tests call this.
#[cfg(test)]
pub(crate) async fn conformance(store: &dyn MetadataStore) {
    use crate::error::Error;

    let now = OffsetDateTime::now_utc().replace_nanosecond(0).unwrap();
    let basin = |name: &str, token: Option<&str>| BasinRecord {
        name: BasinName::new(name).unwrap(),
        location: "local".into(),
        config: BasinConfig::default(),
        created_at: now,
        deleted_at: None,
        idempotency_key: token.map(str::to_owned),
    };

    // Basins: create, idempotent retry, conflict, list with pagination.
    let created = store
        .create_basin(basin("basin-one", Some("t1")))
        .await
        .unwrap();
    assert!(matches!(created, Created::New(_)));
    let retried = store
        .create_basin(basin("basin-one", Some("t1")))
        .await
        .unwrap();
    assert!(matches!(retried, Created::Existing(b) if b.name.as_str() == "basin-one"));
    let conflict = store.create_basin(basin("basin-one", Some("t2"))).await;
    assert!(matches!(conflict, Err(Error::AlreadyExists(_))));
    for name in ["basin-two", "basin-three", "other-basin"] {
        store.create_basin(basin(name, None)).await.unwrap();
    }
    let page = store
        .list_basins(&ListRange {
            prefix: "basin-".into(),
            start_after: String::new(),
            limit: 2,
        })
        .await
        .unwrap();
    let names: Vec<_> = page.items.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["basin-one", "basin-three"]);
    assert!(page.has_more);
    let page = store
        .list_basins(&ListRange {
            prefix: "basin-".into(),
            start_after: "basin-three".into(),
            limit: 2,
        })
        .await
        .unwrap();
    let names: Vec<_> = page.items.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["basin-two"]);
    assert!(!page.has_more);

    let one = BasinName::new("basin-one").unwrap();
    let config = BasinConfig {
        create_stream_on_append: true,
        ..Default::default()
    };
    store.set_basin_config(&one, &config).await.unwrap();
    assert_eq!(store.get_basin(&one).await.unwrap().unwrap().config, config);

    // Streams: ids are never reused across delete and recreate.
    let stream = |name: &str| StreamRecord {
        id: 0,
        basin: one.clone(),
        name: StreamName::new(name).unwrap(),
        config: StreamConfig::default(),
        created_at: now,
        deleted_at: None,
        idempotency_key: None,
    };
    let Created::New(a) = store.create_stream(stream("a/1")).await.unwrap() else {
        panic!("expected a new stream")
    };
    let Created::New(b) = store.create_stream(stream("a/2")).await.unwrap() else {
        panic!("expected a new stream")
    };
    assert_ne!(a.id, b.id);
    assert!(matches!(
        store.create_stream(stream("a/1")).await,
        Err(Error::AlreadyExists(_))
    ));
    store.mark_stream_deleted(a.id, now).await.unwrap();
    assert!(matches!(
        store.create_stream(stream("a/1")).await,
        Err(Error::StreamDeletionPending(_))
    ));
    let listed = store
        .list_streams(
            &one,
            &ListRange {
                limit: 10,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 2);
    assert_eq!(listed.items[0].deleted_at, Some(now));
    let live: Vec<u64> = store
        .live_streams()
        .await
        .unwrap()
        .iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(live, vec![b.id]);
    let (streams, basins) = store.pending_deletions().await.unwrap();
    assert_eq!(streams.iter().map(|s| s.id).collect::<Vec<_>>(), vec![a.id]);
    assert!(basins.is_empty());
    store.remove_stream(a.id).await.unwrap();
    let Created::New(again) = store.create_stream(stream("a/1")).await.unwrap() else {
        panic!("expected a new stream")
    };
    assert!(again.id > b.id, "stream ids must never be reused");

    // Streams can only be created in an existing basin that is not being deleted.
    let orphan = StreamRecord {
        basin: BasinName::new("no-such-basin").unwrap(),
        ..stream("x")
    };
    assert!(matches!(
        store.create_stream(orphan).await,
        Err(Error::BasinNotFound(_))
    ));

    // Deleting a basin marks its streams deleted too, and blocks the name until removed.
    store.mark_basin_deleted(&one, now).await.unwrap();
    assert!(matches!(
        store.create_stream(stream("late")).await,
        Err(Error::BasinDeletionPending(_))
    ));
    assert!(store.live_streams().await.unwrap().is_empty());
    assert!(matches!(
        store.create_basin(basin("basin-one", None)).await,
        Err(Error::BasinDeletionPending(_))
    ));
    let (streams, basins) = store.pending_deletions().await.unwrap();
    assert_eq!(streams.len(), 2);
    assert_eq!(basins, vec![one.clone()]);
    for s in streams {
        store.remove_stream(s.id).await.unwrap();
    }
    store.remove_basin(&one).await.unwrap();
    assert!(store.get_basin(&one).await.unwrap().is_none());
    store.create_basin(basin("basin-one", None)).await.unwrap();

    let first = store.next_epoch().await.unwrap();
    assert!(store.next_epoch().await.unwrap() > first);

    // Access tokens: stored with their digest, found by it, listed, replaced, deleted.
    let token = |id: &str| AccessTokenInfo {
        id: id.into(),
        expires_at: Some(now),
        auto_prefix_streams: false,
        scope: crate::access::Scope::everything(),
    };
    for (id, digest) in [
        ("svc/a", [1u8; 32]),
        ("svc/b", [2; 32]),
        ("user/c", [3; 32]),
    ] {
        store
            .put_access_token(&token(id), &digest, false)
            .await
            .unwrap();
    }
    let duplicate = store
        .put_access_token(&token("svc/a"), &[9; 32], false)
        .await;
    assert!(matches!(duplicate, Err(Error::AlreadyExists(_))));
    let (found, digest) = store
        .access_token_by_digest(&[2; 32])
        .await
        .unwrap()
        .unwrap();
    assert_eq!((found, digest), (token("svc/b"), vec![2; 32]));
    assert!(store
        .access_token_by_digest(&[9; 32])
        .await
        .unwrap()
        .is_none());
    let page = store
        .list_access_tokens(&ListRange {
            prefix: "svc/".into(),
            start_after: String::new(),
            limit: 1,
        })
        .await
        .unwrap();
    assert_eq!(page.items, vec![token("svc/a")]);
    assert!(page.has_more);
    store
        .put_access_token(&token("svc/a"), &[7; 32], true)
        .await
        .unwrap();
    assert!(store
        .access_token_by_digest(&[1; 32])
        .await
        .unwrap()
        .is_none());
    assert!(store
        .access_token_by_digest(&[7; 32])
        .await
        .unwrap()
        .is_some());
    assert!(store.delete_access_token("svc/a").await.unwrap());
    assert!(!store.delete_access_token("svc/a").await.unwrap());
    assert!(store
        .access_token_by_digest(&[7; 32])
        .await
        .unwrap()
        .is_none());
}
