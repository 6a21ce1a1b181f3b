//! Access tokens: what a token is, what it may do, how a token may issue another, and
//! how secrets are kept.

mod principal;
mod registry;
mod scope;
pub mod secret;
mod throttle;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

pub use principal::{Principal, Target};
pub use registry::{TokenRegistry, CACHE_TTL};
pub use scope::{Level, OpGroups, Operation, ReadWrite, ResourceSet, Scope};

use crate::error::{Error, Result};

/// The id of the token the server creates on first start.
pub const ROOT_TOKEN_ID: &str = "root";

/// A token as issued and listed (`AccessTokenInfo` on the wire). The secret is not part
/// of it: it is shown once, at issue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessTokenInfo {
    pub id: String,
    #[serde(default, with = "expiry")]
    pub expires_at: Option<OffsetDateTime>,
    #[serde(default, deserialize_with = "scope::null_as_default")]
    pub auto_prefix_streams: bool,
    pub scope: Scope,
}

pub const MAX_TOKEN_ID_BYTES: usize = 96;

/// RFC 3339 timestamps; one without an offset (as Python sends a naive datetime) is
/// taken as UTC.
mod expiry {
    use serde::{Deserialize, Deserializer, Serializer};
    use time::format_description::well_known::Rfc3339;
    use time::{OffsetDateTime, PrimitiveDateTime};

    pub fn serialize<S: Serializer>(at: &Option<OffsetDateTime>, s: S) -> Result<S::Ok, S::Error> {
        time::serde::rfc3339::option::serialize(at, s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<OffsetDateTime>, D::Error> {
        let Some(text) = Option::<String>::deserialize(d)? else {
            return Ok(None);
        };
        OffsetDateTime::parse(&text, &Rfc3339)
            .or_else(|_| {
                let naive = time::macros::format_description!(
                    "[year]-[month]-[day]T[hour]:[minute]:[second][optional [.[subsecond]]]"
                );
                PrimitiveDateTime::parse(&text, naive).map(PrimitiveDateTime::assume_utc)
            })
            .map(Some)
            .map_err(|_| serde::de::Error::custom(format!("`{text}` is not an RFC 3339 timestamp")))
    }
}

impl AccessTokenInfo {
    /// The token as listings show it (see `Scope::normalized`).
    pub fn normalized(&self) -> AccessTokenInfo {
        AccessTokenInfo {
            scope: self.scope.normalized(),
            ..self.clone()
        }
    }
}

/// Checks a request to issue `new` on behalf of `issuer`, and gives `new` the issuer's
/// expiry when it names none. Broader access than the issuer's is `permission_denied`;
/// a malformed request is `invalid`.
pub fn check_issue(issuer: &Principal, new: &mut AccessTokenInfo) -> Result<()> {
    if new.id.is_empty() || new.id.len() > MAX_TOKEN_ID_BYTES {
        return Err(Error::invalid(format!(
            "an access token id must be between 1 and {MAX_TOKEN_ID_BYTES} bytes long"
        )));
    }
    // Ids travel in URL paths (revoke): ones a client would normalise away are refused.
    if new.id == "." || new.id == ".." || new.id.contains('\0') {
        return Err(Error::invalid(
            "an access token id cannot be `.` or `..` or contain NUL",
        ));
    }
    issuer.check(Operation::IssueAccessToken, Target::AccessToken(&new.id))?;
    if new.auto_prefix_streams && !matches!(new.scope.streams, Some(ResourceSet::Prefix(_))) {
        return Err(Error::invalid(
            "`auto_prefix_streams` needs a prefix matcher for `streams`",
        ));
    }
    if new.scope.operations().is_empty() {
        return Err(Error::invalid(
            "the token would grant no operation: give it `op_groups` or `ops`",
        ));
    }
    if let Some(why) = new.scope.exceeds(issuer.scope()) {
        return Err(Error::PermissionDenied(format!(
            "an access token can only issue tokens equal to or narrower than itself: {why}"
        )));
    }
    match (new.expires_at, issuer.expires_at()) {
        (None, inherited) => new.expires_at = inherited,
        (Some(wanted), Some(limit)) if wanted > limit => {
            return Err(Error::PermissionDenied(
                "the new token cannot outlive the issuing token".into(),
            ))
        }
        (Some(wanted), _) if wanted <= OffsetDateTime::now_utc() => {
            return Err(Error::invalid("`expires_at` is in the past"))
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: &str, scope: Scope) -> AccessTokenInfo {
        AccessTokenInfo {
            id: id.into(),
            expires_at: None,
            auto_prefix_streams: false,
            scope,
        }
    }

    fn read_only() -> Scope {
        Scope {
            basins: Some(ResourceSet::Prefix(String::new())),
            streams: Some(ResourceSet::Prefix("s/".into())),
            ops: Some(vec![Operation::Read]),
            ..Default::default()
        }
    }

    #[test]
    fn issuing_checks_id_scope_and_expiry() {
        let in_an_hour = OffsetDateTime::now_utc() + time::Duration::hours(1);
        let mut issuer_info = info("service/a", Scope::everything());
        issuer_info.scope.access_tokens = Some(ResourceSet::Prefix("service/".into()));
        issuer_info.expires_at = Some(in_an_hour);
        let issuer = Principal::new(&issuer_info);

        let mut ok = info("service/b", read_only());
        check_issue(&issuer, &mut ok).unwrap();
        assert_eq!(ok.expires_at, Some(in_an_hour), "expiry is inherited");

        let denied = |r: Result<()>| matches!(r, Err(Error::PermissionDenied(_)));
        let invalid = |r: Result<()>| matches!(r, Err(Error::Invalid(_)));
        // The id must match the issuer's access-token matcher.
        assert!(denied(check_issue(
            &issuer,
            &mut info("user/x", read_only())
        )));
        // No outliving the issuer.
        let mut later = info("service/c", read_only());
        later.expires_at = Some(in_an_hour + time::Duration::hours(1));
        assert!(denied(check_issue(&issuer, &mut later)));
        // Malformed requests.
        assert!(invalid(check_issue(&issuer, &mut info("", read_only()))));
        for bad in ["..", ".", "svc\0x"] {
            assert!(
                invalid(check_issue(&issuer, &mut info(bad, read_only()))),
                "{bad:?}"
            );
        }
        assert!(invalid(check_issue(
            &issuer,
            &mut info(&"x".repeat(97), read_only())
        )));
        assert!(invalid(check_issue(
            &issuer,
            &mut info("service/d", Scope::default())
        )));
        let mut exact_auto = info("service/e", read_only());
        exact_auto.scope.streams = Some(ResourceSet::Exact("s/1".into()));
        exact_auto.auto_prefix_streams = true;
        assert!(invalid(check_issue(&issuer, &mut exact_auto)));
        let mut past = info("service/f", read_only());
        past.expires_at = Some(OffsetDateTime::now_utc() - time::Duration::seconds(5));
        assert!(invalid(check_issue(&issuer, &mut past)));

        // A read-only token cannot issue at all.
        let reader = Principal::new(&ok);
        assert!(denied(check_issue(
            &reader,
            &mut info("service/g", read_only())
        )));
    }

    #[test]
    fn token_info_json_uses_the_wire_shape() {
        let json = r#"{"id":"t1","expires_at":"2030-01-01T00:00:00Z","scope":{"streams":{"prefix":"a/"},"ops":["read"]},"auto_prefix_streams":true}"#;
        let parsed: AccessTokenInfo = serde_json::from_str(json).unwrap();
        assert_eq!(parsed.id, "t1");
        assert!(parsed.auto_prefix_streams);
        assert_eq!(parsed.expires_at.unwrap().year(), 2030);
        let back: AccessTokenInfo =
            serde_json::from_str(&serde_json::to_string(&parsed).unwrap()).unwrap();
        assert_eq!(back, parsed);
        assert!(serde_json::from_str::<AccessTokenInfo>(
            r#"{"id":"x","scope":{},"expires_at":"tomorrow"}"#
        )
        .is_err());
    }
}
