//! The tokens a server knows: authenticates secrets (with a short-lived cache, so
//! revocation reaches every node within `CACHE_TTL`), and issues, lists and revokes
//! tokens in the metadata store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use time::OffsetDateTime;

use super::principal::Principal;
use super::{secret, AccessTokenInfo, Scope, ROOT_TOKEN_ID};
use crate::error::{Error, Result};
use crate::storage::metadata::{ListPage, ListRange, MetadataStore};

/// How long a verified token is trusted without asking the metadata store again: the
/// longest a revocation on another node takes to apply here.
pub const CACHE_TTL: Duration = Duration::from_secs(5);

/// Cached verifications (only of valid tokens), bounded in memory.
const CACHE_CAPACITY: usize = 10_000;

/// Secret digest → the principal and when it was verified.
type VerifiedTokens = HashMap<[u8; 32], (Arc<Principal>, Instant)>;

pub struct TokenRegistry {
    metadata: Arc<dyn MetadataStore>,
    cache: Mutex<VerifiedTokens>,
}

impl TokenRegistry {
    pub fn new(metadata: Arc<dyn MetadataStore>) -> TokenRegistry {
        TokenRegistry {
            metadata,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The principal a bearer secret stands for: `authn` when the secret is unknown,
    /// revoked or expired. Also returns the secret's digest, which `verified` takes.
    pub async fn authenticate(&self, bearer: &str) -> Result<(Arc<Principal>, [u8; 32])> {
        let digest = secret::digest(bearer);
        Ok((self.verified(&digest).await?, digest))
    }

    /// The principal of the token whose secret has `digest`, if it is still valid: from
    /// the cache within `CACHE_TTL`, otherwise from the metadata store. Long-lived
    /// sessions call this as they go, so a revocation reaches them too.
    pub async fn verified(&self, digest: &[u8; 32]) -> Result<Arc<Principal>> {
        let cached = self.cache.lock().unwrap().get(digest).cloned();
        let principal = match cached {
            Some((principal, at)) if at.elapsed() < CACHE_TTL => principal,
            _ => {
                let found = self.metadata.access_token_by_digest(digest).await?;
                let Some((info, _)) = found.filter(|(_, stored)| {
                    subtle::ConstantTimeEq::ct_eq(&stored[..], &digest[..]).into()
                }) else {
                    self.cache.lock().unwrap().remove(digest);
                    return Err(Error::Unauthenticated(
                        "the access token is not valid (unknown or revoked)".into(),
                    ));
                };
                let principal = Arc::new(Principal::new(&info));
                let mut cache = self.cache.lock().unwrap();
                if cache.len() >= CACHE_CAPACITY {
                    cache.retain(|_, (_, at)| at.elapsed() < CACHE_TTL);
                    if cache.len() >= CACHE_CAPACITY {
                        cache.clear();
                    }
                }
                cache.insert(*digest, (principal.clone(), Instant::now()));
                principal
            }
        };
        if principal.is_expired(OffsetDateTime::now_utc()) {
            return Err(Error::Unauthenticated(
                "the access token has expired".into(),
            ));
        }
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
            .unwrap()
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
        // An earlier root secret stops working here at once.
        self.cache.lock().unwrap().clear();
        Ok(())
    }
}
