//! The authenticated caller: which token, what it may do, and how its stream names map
//! to stored ones (auto-prefixing). Every engine operation checks its caller here, so
//! REST, sessions, RESP and OTLP enforce the same rules.

use time::OffsetDateTime;

use super::scope::{Operation, ResourceSet, Scope};
use super::AccessTokenInfo;
use crate::error::{Error, Result};
use crate::names::{BasinName, StreamName};

/// What an operation acts on.
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    Account,
    Basin(&'a BasinName),
    /// A stream, by its stored name (auto-prefix applied).
    Stream(&'a BasinName, &'a StreamName),
    AccessToken(&'a str),
}

#[derive(Debug, Clone)]
pub struct Principal {
    token_id: String,
    scope: Scope,
    expires_at: Option<OffsetDateTime>,
    /// The prefix added to stream names on the way in and removed on the way out.
    auto_prefix: Option<String>,
}

impl Principal {
    pub fn new(info: &AccessTokenInfo) -> Principal {
        let auto_prefix = match (&info.auto_prefix_streams, &info.scope.streams) {
            (true, Some(ResourceSet::Prefix(prefix))) => Some(prefix.clone()),
            _ => None,
        };
        Principal {
            token_id: info.id.clone(),
            scope: info.scope.clone(),
            expires_at: info.expires_at,
            auto_prefix,
        }
    }

    /// Full access, for the engine's own work and for tests of the engine.
    pub fn root() -> Principal {
        Principal {
            token_id: super::ROOT_TOKEN_ID.into(),
            scope: Scope::everything(),
            expires_at: None,
            auto_prefix: None,
        }
    }

    pub fn token_id(&self) -> &str {
        &self.token_id
    }

    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    pub fn expires_at(&self) -> Option<OffsetDateTime> {
        self.expires_at
    }

    pub fn is_expired(&self, now: OffsetDateTime) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }

    /// Allows `op` on `target`, or says why not (`permission_denied`).
    pub fn check(&self, op: Operation, target: Target<'_>) -> Result<()> {
        if self.is_expired(OffsetDateTime::now_utc()) {
            return Err(Error::Unauthenticated(
                "the access token has expired".into(),
            ));
        }
        let outside = |what: &str, name: &str| {
            Err(Error::PermissionDenied(format!(
                "{what} `{name}` is outside the access token's scope"
            )))
        };
        match target {
            Target::Account => Ok(()),
            Target::Basin(basin) | Target::Stream(basin, _)
                if !matches(&self.scope.basins, basin.as_str()) =>
            {
                outside("basin", basin.as_str())
            }
            Target::Stream(_, stream) if !matches(&self.scope.streams, stream.as_str()) => outside(
                "stream",
                self.visible(stream).as_deref().unwrap_or(stream.as_str()),
            ),
            Target::AccessToken(id) if !matches(&self.scope.access_tokens, id) => {
                outside("access token", id)
            }
            _ => Ok(()),
        }?;
        // The operation last, so that for a resource outside the scope the answer is the
        // same whether or not it exists.
        if !self.scope.allows(op) {
            return Err(Error::PermissionDenied(format!(
                "the access token does not grant the `{}` operation",
                op.name()
            )));
        }
        Ok(())
    }

    /// Whether a basin, stream or token of that name is visible in listings.
    pub fn sees_basin(&self, basin: &str) -> bool {
        matches(&self.scope.basins, basin)
    }

    pub fn sees_stream(&self, stream: &StreamName) -> bool {
        matches(&self.scope.streams, stream.as_str()) && self.visible(stream).is_some()
    }

    pub fn sees_access_token(&self, id: &str) -> bool {
        matches(&self.scope.access_tokens, id)
    }

    /// The stored name of a stream the caller names `name`.
    pub fn stored(&self, name: &StreamName) -> Result<StreamName> {
        match &self.auto_prefix {
            None => Ok(name.clone()),
            Some(prefix) => StreamName::new(format!("{prefix}{}", name.as_str())),
        }
    }

    /// The name the caller knows a stored stream by; `None` for the one stream named
    /// exactly the prefix, which the caller cannot name.
    pub fn visible(&self, stored: &StreamName) -> Option<String> {
        match &self.auto_prefix {
            None => Some(stored.as_str().to_owned()),
            Some(prefix) => stored
                .as_str()
                .strip_prefix(prefix.as_str())
                .filter(|rest| !rest.is_empty())
                .map(str::to_owned),
        }
    }

    /// The listing prefix, in stored names, for a caller's requested prefix.
    pub fn stored_prefix(&self, requested: &str) -> String {
        format!("{}{requested}", self.auto_prefix.as_deref().unwrap_or(""))
    }
}

fn matches(set: &Option<ResourceSet>, name: &str) -> bool {
    set.as_ref().is_some_and(|set| set.matches(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::scope::{OpGroups, ReadWrite};

    fn token(scope: Scope, auto_prefix_streams: bool) -> Principal {
        Principal::new(&AccessTokenInfo {
            id: "t".into(),
            expires_at: None,
            auto_prefix_streams,
            scope,
        })
    }

    fn stream_rw() -> Option<OpGroups> {
        Some(OpGroups {
            stream: Some(ReadWrite {
                read: true,
                write: true,
            }),
            ..Default::default()
        })
    }

    #[test]
    fn checks_the_operation_then_each_resource() {
        let basin = BasinName::new("tenant-one").unwrap();
        let other = BasinName::new("tenant-two").unwrap();
        let p = token(
            Scope {
                basins: Some(ResourceSet::Exact("tenant-one".into())),
                streams: Some(ResourceSet::Prefix("logs/".into())),
                op_groups: stream_rw(),
                ..Default::default()
            },
            false,
        );
        let logs = StreamName::new("logs/a").unwrap();
        let metrics = StreamName::new("metrics/a").unwrap();
        assert!(p
            .check(Operation::Append, Target::Stream(&basin, &logs))
            .is_ok());
        let denied = |r: Result<()>| matches!(r, Err(Error::PermissionDenied(_)));
        assert!(denied(
            p.check(Operation::Append, Target::Stream(&basin, &metrics))
        ));
        assert!(denied(
            p.check(Operation::Append, Target::Stream(&other, &logs))
        ));
        assert!(denied(
            p.check(Operation::CreateStream, Target::Stream(&basin, &logs))
        ));
        assert!(denied(p.check(Operation::ListBasins, Target::Account)));
        assert!(denied(
            p.check(Operation::ListAccessTokens, Target::AccessToken("x"))
        ));
    }

    #[test]
    fn an_expired_token_is_unauthenticated() {
        let mut info = AccessTokenInfo {
            id: "t".into(),
            expires_at: Some(OffsetDateTime::now_utc() - time::Duration::seconds(1)),
            auto_prefix_streams: false,
            scope: Scope::everything(),
        };
        let p = Principal::new(&info);
        assert!(matches!(
            p.check(Operation::ListBasins, Target::Account),
            Err(Error::Unauthenticated(_))
        ));
        info.expires_at = Some(OffsetDateTime::now_utc() + time::Duration::hours(1));
        assert!(Principal::new(&info)
            .check(Operation::ListBasins, Target::Account)
            .is_ok());
    }

    #[test]
    fn auto_prefixing_maps_names_both_ways() {
        let p = token(
            Scope {
                basins: Some(ResourceSet::Prefix(String::new())),
                streams: Some(ResourceSet::Prefix("user1/".into())),
                op_groups: stream_rw(),
                ..Default::default()
            },
            true,
        );
        let stored = p.stored(&StreamName::new("logs").unwrap()).unwrap();
        assert_eq!(stored.as_str(), "user1/logs");
        assert_eq!(p.visible(&stored).as_deref(), Some("logs"));
        assert_eq!(p.stored_prefix("lo"), "user1/lo");
        assert_eq!(p.visible(&StreamName::new("user1/").unwrap()), None);
        assert!(p.sees_stream(&stored));
        assert!(!p.sees_stream(&StreamName::new("user2/logs").unwrap()));
        // A prefixed name may not exceed the 512-byte limit.
        assert!(p
            .stored(&StreamName::new("x".repeat(510)).unwrap())
            .is_err());
        // Without auto-prefixing, names pass through.
        let plain = token(Scope::everything(), false);
        assert_eq!(plain.stored(&stored).unwrap(), stored);
    }
}
