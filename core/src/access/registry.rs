//! The tokens a server knows: authenticates secrets (with a short-lived cache, so
//! revocation reaches every node within `CACHE_TTL`), and issues, lists and revokes
//! tokens in the metadata store.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use time::OffsetDateTime;

use super::principal::Principal;
use super::throttle::FailedAuthThrottle;
use super::{secret, AccessTokenInfo, Scope, ROOT_TOKEN_ID};
use crate::error::{Error, Result};
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
    metadata: Arc<dyn MetadataStore>,
    cache: Mutex<VerifiedTokens>,
    /// Digests a lookup found no token for, and when: asked again only after `CACHE_TTL`,
    /// so a client repeating a bad token costs the metadata store nothing.
    unknown: Mutex<HashMap<[u8; 32], Instant>>,
    /// When a lookup last found the metadata store unavailable.
    unavailable_at: Mutex<Option<Instant>>,
    throttle: FailedAuthThrottle,
}

impl TokenRegistry {
    pub fn new(metadata: Arc<dyn MetadataStore>) -> TokenRegistry {
        TokenRegistry {
            metadata,
            cache: Mutex::new(HashMap::new()),
            unknown: Mutex::new(HashMap::new()),
            unavailable_at: Mutex::new(None),
            throttle: FailedAuthThrottle::default(),
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
        let known = self.cache.lock().contains_key(&digest);
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
        self.unknown
            .lock()
            .get(digest)
            .is_some_and(|at| at.elapsed() < CACHE_TTL)
    }

    /// The principal of the token whose secret has `digest`, if it is still valid: from
    /// the cache within `CACHE_TTL`, otherwise from the metadata store (or from the
    /// cache, up to `MAX_STALE_WHILE_UNAVAILABLE`, while the store is unavailable).
    /// Long-lived sessions call this as they go, so a revocation reaches them too.
    pub async fn verified(&self, digest: &[u8; 32]) -> Result<Arc<Principal>> {
        let cached = self.cache.lock().get(digest).cloned();
        let principal = match cached {
            Some((principal, at)) if at.elapsed() < CACHE_TTL => principal,
            cached => {
                let stale = cached
                    .filter(|(_, at)| at.elapsed() < MAX_STALE_WHILE_UNAVAILABLE)
                    .map(|(principal, _)| principal);
                match stale {
                    Some(principal) if !self.probe_now() => principal,
                    stale => match self.look_up(digest).await {
                        Err(Error::Unavailable(why)) => {
                            *self.unavailable_at.lock() = Some(Instant::now());
                            let Some(principal) = stale else {
                                return Err(Error::Unavailable(why));
                            };
                            tracing::debug!(error = %why, "metadata store unavailable: honouring a token verified earlier");
                            principal
                        }
                        outcome => outcome?,
                    },
                }
            }
        };
        if principal.is_expired(OffsetDateTime::now_utc()) {
            return Err(Error::Unauthenticated(
                "the access token has expired".into(),
            ));
        }
        Ok(principal)
    }

    /// Whether a lookup should be made now for a token this node verified earlier. While
    /// the metadata store is known to be unavailable, one request per
    /// `UNAVAILABLE_BACKOFF` probes it and the others use the cache at once, so requests
    /// do not each wait for an answer that will not come.
    fn probe_now(&self) -> bool {
        let mut unavailable_at = self.unavailable_at.lock();
        match *unavailable_at {
            None => true,
            Some(at) if at.elapsed() < UNAVAILABLE_BACKOFF => false,
            Some(_) => {
                *unavailable_at = Some(Instant::now());
                true
            }
        }
    }

    /// Asks the metadata store for the token with this digest, and caches the answer.
    async fn look_up(&self, digest: &[u8; 32]) -> Result<Arc<Principal>> {
        let found = self.metadata.access_token_by_digest(digest).await?;
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

    /// Issues `info` on behalf of `issuer`; returns the secret, the only time it exists
    /// outside the client.
    pub(crate) async fn issue(
        &self,
        issuer: &Principal,
        mut info: AccessTokenInfo,
    ) -> Result<String> {
        super::check_issue(issuer, &mut info)?;
        let secret = secret::generate();
        self.metadata
            .put_access_token(&info, &secret::digest(&secret), false)
            .await?;
        Ok(secret)
    }

    pub(crate) async fn list(&self, range: &ListRange) -> Result<ListPage<AccessTokenInfo>> {
        self.metadata.list_access_tokens(range).await
    }

    pub(crate) async fn revoke(&self, id: &str) -> Result<()> {
        if !self.metadata.delete_access_token(id).await? {
            return Err(Error::AccessTokenNotFound(id.to_owned()));
        }
        // This node stops honouring it at once; others within CACHE_TTL.
        self.cache
            .lock()
            .retain(|_, (principal, _)| principal.token_id() != id);
        Ok(())
    }

    /// Whether the root token (full access, no expiry) exists.
    pub async fn has_root(&self) -> Result<bool> {
        let page = self
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
        self.metadata
            .put_access_token(&root, &secret::digest(secret), !only_if_absent)
            .await?;
        // An earlier root secret stops working here at once, and a new one works at once.
        self.cache.lock().clear();
        self.unknown.lock().clear();
        Ok(())
    }
}
