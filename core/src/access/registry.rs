//! The tokens a server knows: authenticates secrets (with a short-lived cache, so
//! revocation reaches every node within `CACHE_TTL`), and issues, lists and revokes
//! tokens in the metadata store.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use time::OffsetDateTime;

use super::principal::Principal;
use super::throttle::FailedAuthThrottle;
use super::{secret, AccessTokenInfo, Scope, ROOT_TOKEN_ID};
use crate::error::{Error, Resource, Result};
use crate::single_flight::SingleFlight;
use crate::storage::metadata::{ListPage, ListRange, MetadataStore};

/// How long a verified token is trusted without asking the metadata store again: the
/// longest a revocation on another node takes to apply here.
pub const CACHE_TTL: Duration = Duration::from_secs(5);

/// How long a token verified earlier keeps working while the metadata store cannot be
/// asked (an outage must not lock every client out; a revocation cannot be made while
/// the store is away anyway, except on a node that still reaches it).
pub const MAX_STALE_WHILE_UNAVAILABLE: Duration = Duration::from_secs(600);

/// While the metadata store is unavailable, how often it is asked again about a token
/// verified earlier (see `probe_now`).
const UNAVAILABLE_BACKOFF: Duration = Duration::from_secs(2);

/// Cached verifications (only of valid tokens), bounded in memory.
const CACHE_CAPACITY: usize = 10_000;

/// Secret digest → the principal and when it was verified.
type VerifiedTokens = HashMap<[u8; 32], (Arc<Principal>, Instant)>;

fn unknown_token() -> Error {
    Error::Unauthenticated("the access token is not valid (unknown or revoked)".into())
}

/// Inserts into a cache of at most `CACHE_CAPACITY` entries: when full, entries older
/// than `CACHE_TTL` go first, and if all are recent, all go.
fn insert_bounded<V>(
    cache: &mut HashMap<[u8; 32], V>,
    digest: [u8; 32],
    value: V,
    verified_at: impl Fn(&V) -> Instant,
) {
    if cache.len() >= CACHE_CAPACITY {
        cache.retain(|_, v| verified_at(v).elapsed() < CACHE_TTL);
        if cache.len() >= CACHE_CAPACITY {
            cache.clear();
        }
    }
    cache.insert(digest, value);
}

pub struct TokenRegistry {
    lookups: Lookups,
    throttle: FailedAuthThrottle,
    /// Revocations made on this node so far: a verification remembered outside the
    /// registry (`Caller`) is not relied on once one was made after it.
    revocations: AtomicU64,
}

/// What a lookup in the metadata store reads and updates; cheap to clone, so a lookup
/// can run in the background.
#[derive(Clone)]
struct Lookups {
    metadata: Arc<dyn MetadataStore>,
    cache: Arc<Mutex<VerifiedTokens>>,
    /// Digests a lookup found no token for, and when: asked again only after `CACHE_TTL`,
    /// so a client repeating a bad token costs the metadata store nothing.
    unknown: Arc<Mutex<HashMap<[u8; 32], Instant>>>,
    /// When a lookup last found the metadata store unavailable (`None` once one succeeds).
    unavailable_at: Arc<Mutex<Option<Instant>>>,
    /// The lookup under way for each digest, which the requests meanwhile share.
    flights: SingleFlight<[u8; 32], Arc<Principal>>,
}

/// What to do about a token verified earlier whose verification is older than `CACHE_TTL`.
enum Recheck {
    /// Ask the metadata store now, and answer from what it says.
    Now,
    /// The store is away: answer from the cache, and ask it in the background.
    InBackground,
    /// The store is away and was asked moments ago: answer from the cache.
    NotYet,
}

impl TokenRegistry {
    pub fn new(metadata: Arc<dyn MetadataStore>) -> TokenRegistry {
        TokenRegistry {
            lookups: Lookups {
                metadata,
                cache: Arc::default(),
                unknown: Arc::default(),
                unavailable_at: Arc::default(),
                flights: SingleFlight::default(),
            },
            throttle: FailedAuthThrottle::default(),
            revocations: AtomicU64::new(0),
        }
    }

    /// The principal a bearer secret stands for: `authn` when the secret is unknown,
    /// revoked or expired; `rate_limited` when `client` (the peer address, if the front
    /// end knows it) failed too often lately and the secret is not one verified before.
    /// Also returns the secret's digest, which `verified` takes.
    pub async fn authenticate(
        &self,
        bearer: &str,
        client: Option<IpAddr>,
    ) -> Result<(Arc<Principal>, [u8; 32])> {
        let digest = secret::digest(bearer);
        if self.is_known_unknown(&digest) {
            return Err(unknown_token());
        }
        let known = self.lookups.cache.lock().contains_key(&digest);
        if let Some(wait) = client
            .filter(|_| !known)
            .and_then(|c| self.throttle.wait_needed(c))
        {
            return Err(Error::RateLimited {
                message: "too many failed authentications from this address; wait before \
                          trying again"
                    .into(),
                retry_after: wait,
            });
        }
        match self.verified(&digest).await {
            // Only lookups that found nothing cost the metadata store and count against
            // the client; an expired or revoked token it knows does not.
            Err(err @ Error::Unauthenticated(_)) if self.is_known_unknown(&digest) => {
                if let Some(client) = client {
                    self.throttle.failed(client);
                }
                Err(err)
            }
            outcome => Ok((outcome?, digest)),
        }
    }

    /// Whether a lookup of `digest` found no token within the last `CACHE_TTL`.
    fn is_known_unknown(&self, digest: &[u8; 32]) -> bool {
        self.lookups
            .unknown
            .lock()
            .get(digest)
            .is_some_and(|at| at.elapsed() < CACHE_TTL)
    }

    /// The principal of the token whose secret has `digest`, if it is still valid: from
    /// the cache within `CACHE_TTL`, otherwise from the metadata store (or from the
    /// cache, up to `MAX_STALE_WHILE_UNAVAILABLE`, while the store is unavailable).
    /// Long-lived sessions call this as they go, so a revocation reaches them too.
    pub async fn verified(&self, digest: &[u8; 32]) -> Result<Arc<Principal>> {
        Ok(self.verified_until(digest).await?.0)
    }

    /// Like `verified`, and until when its answer holds without asking again: until
    /// `CACHE_TTL` after the verification it relied on, or the token's expiry if that
    /// comes first, unless a revocation is made on this node meanwhile (`revocations`).
    /// `None` for an answer kept while the metadata store is unavailable, which is
    /// asked again on every call.
    pub async fn verified_until(
        &self,
        digest: &[u8; 32],
    ) -> Result<(Arc<Principal>, Option<Instant>)> {
        let cached = self.lookups.cache.lock().get(digest).cloned();
        let (principal, fresh_until) = match cached {
            Some((principal, at)) if at.elapsed() < CACHE_TTL => (principal, Some(at + CACHE_TTL)),
            cached => {
                let stale = cached
                    .filter(|(_, at)| at.elapsed() < MAX_STALE_WHILE_UNAVAILABLE)
                    .map(|(principal, _)| principal);
                match (stale, self.recheck()) {
                    (Some(principal), Recheck::NotYet) => (principal, None),
                    (Some(principal), Recheck::InBackground) => {
                        let (lookups, digest) = (self.lookups.clone(), *digest);
                        tokio::spawn(async move { lookups.look_up_once(&digest).await });
                        (principal, None)
                    }
                    (stale, _) => match self.lookups.look_up_once(digest).await {
                        Err(Error::Unavailable(why)) => {
                            let Some(principal) = stale else {
                                return Err(Error::Unavailable(why));
                            };
                            tracing::debug!(error = %why, "metadata store unavailable: honouring a token verified earlier");
                            (principal, None)
                        }
                        // Held as long as the cache holds what the lookup found.
                        outcome => (outcome?, Some(Instant::now() + CACHE_TTL)),
                    },
                }
            }
        };
        let now = OffsetDateTime::now_utc();
        if principal.is_expired(now) {
            return Err(Error::Unauthenticated(
                "the access token has expired".into(),
            ));
        }
        let until = fresh_until.map(|until| match principal.expires_at() {
            Some(expiry) => {
                let left = Duration::try_from(expiry - now).unwrap_or(Duration::ZERO);
                until.min(Instant::now() + left)
            }
            None => until,
        });
        Ok((principal, until))
    }

    /// How many revocations this node has made: an answer of `verified_until` holds
    /// only while this stays what it was before the call.
    pub fn revocations(&self) -> u64 {
        self.revocations.load(Ordering::Acquire)
    }

    /// How to recheck a token verified earlier. While the metadata store is known to be
    /// unavailable, it is asked again once per `UNAVAILABLE_BACKOFF`, in the background,
    /// and requests are answered from the cache meanwhile: none waits for an answer that
    /// will not come.
    fn recheck(&self) -> Recheck {
        let mut unavailable_at = self.lookups.unavailable_at.lock();
        match *unavailable_at {
            None => Recheck::Now,
            Some(at) if at.elapsed() < UNAVAILABLE_BACKOFF => Recheck::NotYet,
            Some(_) => {
                *unavailable_at = Some(Instant::now());
                Recheck::InBackground
            }
        }
    }
}

impl Lookups {
    /// [`Lookups::look_up`], shared with the requests that ask for the same digest while
    /// it is under way (see `single_flight`).
    async fn look_up_once(&self, digest: &[u8; 32]) -> Result<Arc<Principal>> {
        let (lookups, key) = (self.clone(), *digest);
        self.flights
            .run(key, async move { lookups.look_up(&key).await })
            .await
    }

    /// Asks the metadata store for the token with this digest, and caches the answer.
    async fn look_up(&self, digest: &[u8; 32]) -> Result<Arc<Principal>> {
        let found = match self.metadata.access_token_by_digest(digest).await {
            Err(err @ Error::Unavailable(_)) => {
                *self.unavailable_at.lock() = Some(Instant::now());
                return Err(err);
            }
            found => found?,
        };
        *self.unavailable_at.lock() = None;
        let Some((info, _)) = found
            .filter(|(_, stored)| subtle::ConstantTimeEq::ct_eq(&stored[..], &digest[..]).into())
        else {
            self.cache.lock().remove(digest);
            insert_bounded(&mut self.unknown.lock(), *digest, Instant::now(), |at| *at);
            return Err(unknown_token());
        };
        let principal = Arc::new(Principal::new(&info));
        let verified = (principal.clone(), Instant::now());
        insert_bounded(&mut self.cache.lock(), *digest, verified, |(_, at)| *at);
        Ok(principal)
    }
}

impl TokenRegistry {
    /// Issues `info` on behalf of `issuer`; returns the secret, the only time it exists
    /// outside the client.
    pub(crate) async fn issue(
        &self,
        issuer: &Principal,
        mut info: AccessTokenInfo,
    ) -> Result<String> {
        super::check_issue(issuer, &mut info)?;
        let secret = secret::generate();
        self.lookups
            .metadata
            .put_access_token(&info, &secret::digest(&secret), false)
            .await?;
        Ok(secret)
    }

    pub(crate) async fn list(&self, range: &ListRange) -> Result<ListPage<AccessTokenInfo>> {
        self.lookups.metadata.list_access_tokens(range).await
    }

    pub(crate) async fn revoke(&self, id: &str) -> Result<()> {
        if !self.lookups.metadata.delete_access_token(id).await? {
            return Err(Error::NotFound(Resource::AccessToken(id.to_owned())));
        }
        // This node stops honouring it at once; others within CACHE_TTL.
        self.lookups
            .cache
            .lock()
            .retain(|_, (principal, _)| principal.token_id() != id);
        // After the cache: a caller that reads the count after this verifies afresh.
        self.revocations.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Whether the root token (full access, no expiry) exists.
    pub async fn has_root(&self) -> Result<bool> {
        let page = self
            .lookups
            .metadata
            .list_access_tokens(&ListRange {
                prefix: ROOT_TOKEN_ID.into(),
                start_after: String::new(),
                limit: 1,
            })
            .await?;
        Ok(page.items.first().is_some_and(|t| t.id == ROOT_TOKEN_ID))
    }

    /// Makes `secret` the root token's, creating the root token if needed (or, with
    /// `only_if_absent`, only creating it: `AlreadyExists` if there is one).
    pub async fn set_root(&self, secret: &str, only_if_absent: bool) -> Result<()> {
        if secret.len() < secret::MIN_SECRET_LEN {
            return Err(Error::invalid(format!(
                "the root token must be at least {} characters long",
                secret::MIN_SECRET_LEN
            )));
        }
        let root = AccessTokenInfo {
            id: ROOT_TOKEN_ID.into(),
            expires_at: None,
            auto_prefix_streams: false,
            scope: Scope::everything(),
        };
        self.lookups
            .metadata
            .put_access_token(&root, &secret::digest(secret), !only_if_absent)
            .await?;
        // An earlier root secret stops working here at once, and a new one works at once.
        self.lookups.cache.lock().clear();
        self.lookups.unknown.lock().clear();
        Ok(())
    }
}
