//! What an access token may do: resource matchers, operations and operation groups, and
//! the narrowing rules for a token issuing another. Serde shapes are the wire shapes of
//! the v1 API (`AccessTokenScope`), so they serve REST and the metadata store alike.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// Every operation a token can be granted, by its documented name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Operation {
    ListBasins,
    CreateBasin,
    DeleteBasin,
    ReconfigureBasin,
    GetBasinConfig,
    IssueAccessToken,
    RevokeAccessToken,
    ListAccessTokens,
    ListStreams,
    CreateStream,
    DeleteStream,
    GetStreamConfig,
    ReconfigureStream,
    CheckTail,
    Append,
    Read,
    Trim,
    Fence,
    AccountMetrics,
    BasinMetrics,
    StreamMetrics,
}

/// The level an operation acts at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Account,
    Basin,
    Stream,
}

impl Operation {
    pub const ALL: [Operation; 21] = [
        Operation::ListBasins,
        Operation::CreateBasin,
        Operation::DeleteBasin,
        Operation::ReconfigureBasin,
        Operation::GetBasinConfig,
        Operation::IssueAccessToken,
        Operation::RevokeAccessToken,
        Operation::ListAccessTokens,
        Operation::ListStreams,
        Operation::CreateStream,
        Operation::DeleteStream,
        Operation::GetStreamConfig,
        Operation::ReconfigureStream,
        Operation::CheckTail,
        Operation::Append,
        Operation::Read,
        Operation::Trim,
        Operation::Fence,
        Operation::AccountMetrics,
        Operation::BasinMetrics,
        Operation::StreamMetrics,
    ];

    /// The operation group it belongs to: its level, and whether it writes.
    pub fn group(self) -> (Level, bool) {
        use Operation::*;
        match self {
            ListBasins | GetBasinConfig | ListAccessTokens | AccountMetrics => {
                (Level::Account, false)
            }
            CreateBasin | DeleteBasin | ReconfigureBasin | IssueAccessToken | RevokeAccessToken => {
                (Level::Account, true)
            }
            ListStreams | GetStreamConfig | BasinMetrics => (Level::Basin, false),
            CreateStream | DeleteStream | ReconfigureStream => (Level::Basin, true),
            CheckTail | Read | StreamMetrics => (Level::Stream, false),
            Append | Trim | Fence => (Level::Stream, true),
        }
    }

    /// The documented name, as in `ops`.
    pub fn name(self) -> &'static str {
        use Operation::*;
        match self {
            ListBasins => "list-basins",
            CreateBasin => "create-basin",
            DeleteBasin => "delete-basin",
            ReconfigureBasin => "reconfigure-basin",
            GetBasinConfig => "get-basin-config",
            IssueAccessToken => "issue-access-token",
            RevokeAccessToken => "revoke-access-token",
            ListAccessTokens => "list-access-tokens",
            ListStreams => "list-streams",
            CreateStream => "create-stream",
            DeleteStream => "delete-stream",
            GetStreamConfig => "get-stream-config",
            ReconfigureStream => "reconfigure-stream",
            CheckTail => "check-tail",
            Append => "append",
            Read => "read",
            Trim => "trim",
            Fence => "fence",
            AccountMetrics => "account-metrics",
            BasinMetrics => "basin-metrics",
            StreamMetrics => "stream-metrics",
        }
    }
}

/// A set of basin names, stream names or token ids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResourceSet {
    /// Just this name; an empty one matches nothing.
    Exact(String),
    /// Every name starting with this; an empty one matches everything.
    Prefix(String),
}

impl ResourceSet {
    pub fn matches(&self, name: &str) -> bool {
        match self {
            ResourceSet::Exact(exact) => !exact.is_empty() && exact == name,
            ResourceSet::Prefix(prefix) => name.starts_with(prefix.as_str()),
        }
    }

    /// Whether this set matches nothing at all.
    fn is_empty(&self) -> bool {
        matches!(self, ResourceSet::Exact(exact) if exact.is_empty())
    }
}

/// Whether `set` (absent: no access) is equal to or narrower than `issuer`'s.
pub fn within(set: Option<&ResourceSet>, issuer: Option<&ResourceSet>) -> bool {
    let Some(set) = set.filter(|s| !s.is_empty()) else {
        return true; // no access is within anything
    };
    match (set, issuer) {
        (_, None) => false,
        (set, Some(ResourceSet::Exact(exact))) => {
            !exact.is_empty() && *set == ResourceSet::Exact(exact.clone())
        }
        (ResourceSet::Prefix(p) | ResourceSet::Exact(p), Some(ResourceSet::Prefix(issuer))) => {
            p.starts_with(issuer.as_str())
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadWrite {
    #[serde(default, deserialize_with = "null_as_default")]
    pub read: bool,
    #[serde(default, deserialize_with = "null_as_default")]
    pub write: bool,
}

/// Clients send `null` for fields they leave unset (the CLI does): same as absent.
pub(crate) fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpGroups {
    #[serde(default)]
    pub account: Option<ReadWrite>,
    #[serde(default)]
    pub basin: Option<ReadWrite>,
    #[serde(default)]
    pub stream: Option<ReadWrite>,
}

impl OpGroups {
    fn level(&self, level: Level) -> ReadWrite {
        match level {
            Level::Account => self.account,
            Level::Basin => self.basin,
            Level::Stream => self.stream,
        }
        .unwrap_or_default()
    }

    /// Whether the group an operation belongs to is granted.
    fn grants(&self, op: Operation) -> bool {
        let (level, write) = op.group();
        let granted = self.level(level);
        if write {
            granted.write
        } else {
            granted.read
        }
    }
}

/// A token's scope. Absent fields are the least permissive: no resources, no operations.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scope {
    #[serde(default)]
    pub basins: Option<ResourceSet>,
    #[serde(default)]
    pub streams: Option<ResourceSet>,
    #[serde(default)]
    pub access_tokens: Option<ResourceSet>,
    #[serde(default)]
    pub op_groups: Option<OpGroups>,
    #[serde(default)]
    pub ops: Option<Vec<Operation>>,
}

impl Scope {
    /// The scope as listings show it: no-access matchers as `null`, every operation
    /// group spelled out, `ops` always a list (what the SDKs expect to parse).
    pub fn normalized(&self) -> Scope {
        let set = |s: &Option<ResourceSet>| s.clone().filter(|s| !s.is_empty());
        let groups = self.op_groups.unwrap_or_default();
        Scope {
            basins: set(&self.basins),
            streams: set(&self.streams),
            access_tokens: set(&self.access_tokens),
            op_groups: Some(OpGroups {
                account: Some(groups.level(Level::Account)),
                basin: Some(groups.level(Level::Basin)),
                stream: Some(groups.level(Level::Stream)),
            }),
            ops: Some(self.ops.clone().unwrap_or_default()),
        }
    }

    /// Everything: the root token's scope.
    pub fn everything() -> Scope {
        let all = Some(ReadWrite {
            read: true,
            write: true,
        });
        let every = || Some(ResourceSet::Prefix(String::new()));
        Scope {
            basins: every(),
            streams: every(),
            access_tokens: every(),
            op_groups: Some(OpGroups {
                account: all,
                basin: all,
                stream: all,
            }),
            ops: None,
        }
    }

    /// Whether `op` is granted, by an operation group or individually.
    pub fn allows(&self, op: Operation) -> bool {
        self.op_groups.unwrap_or_default().grants(op)
            || self.ops.as_deref().unwrap_or_default().contains(&op)
    }

    /// The effective operations: the union of groups and individual operations.
    pub fn operations(&self) -> BTreeSet<Operation> {
        Operation::ALL
            .into_iter()
            .filter(|op| self.allows(*op))
            .collect()
    }

    /// Why `self` is not equal to or narrower than `issuer`, if it is not. A group can
    /// only come from the same group (it covers operations added later); an individual
    /// operation from the operation or its group.
    pub fn exceeds(&self, issuer: &Scope) -> Option<String> {
        let sets = [
            ("basins", &self.basins, &issuer.basins),
            ("streams", &self.streams, &issuer.streams),
            ("access_tokens", &self.access_tokens, &issuer.access_tokens),
        ];
        for (what, set, issuer_set) in sets {
            if !within(set.as_ref(), issuer_set.as_ref()) {
                return Some(format!("`{what}` is broader than the issuing token's"));
            }
        }
        let groups = self.op_groups.unwrap_or_default();
        let issuer_groups = issuer.op_groups.unwrap_or_default();
        for (level, name) in [
            (Level::Account, "account"),
            (Level::Basin, "basin"),
            (Level::Stream, "stream"),
        ] {
            let (wanted, held) = (groups.level(level), issuer_groups.level(level));
            if (wanted.read && !held.read) || (wanted.write && !held.write) {
                return Some(format!(
                    "operation group `{name}` grants more than the issuing token's"
                ));
            }
        }
        for op in self.ops.as_deref().unwrap_or_default() {
            if !issuer.allows(*op) {
                return Some(format!(
                    "operation `{}` is not granted to the issuing token",
                    op.name()
                ));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix(p: &str) -> Option<ResourceSet> {
        Some(ResourceSet::Prefix(p.into()))
    }
    fn exact(e: &str) -> Option<ResourceSet> {
        Some(ResourceSet::Exact(e.into()))
    }

    #[test]
    fn matchers_follow_the_documented_rules() {
        assert!(ResourceSet::Prefix(String::new()).matches("anything"));
        assert!(ResourceSet::Prefix("logs/".into()).matches("logs/app"));
        assert!(!ResourceSet::Prefix("logs/".into()).matches("log"));
        assert!(ResourceSet::Exact("a".into()).matches("a"));
        assert!(!ResourceSet::Exact("a".into()).matches("ab"));
        assert!(!ResourceSet::Exact(String::new()).matches(""));
    }

    #[test]
    fn narrowing_table_for_resource_matchers() {
        // Issuing token { "prefix": "foo/" }.
        for ok in [
            prefix("foo/"),
            prefix("foo/bar/"),
            exact("foo/bar"),
            None,
            exact(""),
        ] {
            assert!(within(ok.as_ref(), prefix("foo/").as_ref()), "{ok:?}");
        }
        for bad in [prefix(""), prefix("bar/"), exact("bar")] {
            assert!(!within(bad.as_ref(), prefix("foo/").as_ref()), "{bad:?}");
        }
        // Issuing token { "exact": "foo/bar" }.
        for ok in [exact("foo/bar"), None] {
            assert!(within(ok.as_ref(), exact("foo/bar").as_ref()), "{ok:?}");
        }
        for bad in [prefix("foo/"), exact("foo/baz"), prefix("foo/bar")] {
            assert!(!within(bad.as_ref(), exact("foo/bar").as_ref()), "{bad:?}");
        }
        // Issuing token with no access.
        for issuer in [None, exact("")] {
            assert!(within(None, issuer.as_ref()));
            for bad in [prefix(""), prefix("a"), exact("a")] {
                assert!(
                    !within(bad.as_ref(), issuer.as_ref()),
                    "{bad:?} from {issuer:?}"
                );
            }
        }
    }

    #[test]
    fn op_groups_expand_to_their_operations() {
        let scope = Scope {
            op_groups: Some(OpGroups {
                stream: Some(ReadWrite {
                    read: true,
                    write: false,
                }),
                ..Default::default()
            }),
            ops: Some(vec![Operation::ListStreams]),
            ..Default::default()
        };
        let ops: Vec<_> = scope.operations().into_iter().collect();
        assert_eq!(
            ops,
            [
                Operation::ListStreams,
                Operation::CheckTail,
                Operation::Read,
                Operation::StreamMetrics
            ]
        );
        assert!(!scope.allows(Operation::Append));
        assert!(Scope::default().operations().is_empty());
        assert_eq!(Scope::everything().operations().len(), Operation::ALL.len());
    }

    #[test]
    fn every_operation_has_its_documented_name_and_one_group() {
        for op in Operation::ALL {
            let json = serde_json::to_string(&op).unwrap();
            assert_eq!(json, format!("\"{}\"", op.name()));
            let back: Operation = serde_json::from_str(&json).unwrap();
            assert_eq!(back, op);
        }
    }

    #[test]
    fn narrowing_of_operations() {
        let stream_rw = Scope {
            op_groups: Some(OpGroups {
                stream: Some(ReadWrite {
                    read: true,
                    write: true,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let only_ops = Scope {
            ops: Some(vec![
                Operation::Read,
                Operation::CheckTail,
                Operation::StreamMetrics,
            ]),
            ..Default::default()
        };
        let stream_read_group = Scope {
            op_groups: Some(OpGroups {
                stream: Some(ReadWrite {
                    read: true,
                    write: false,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        // A group authorizes its individual operations and itself...
        assert_eq!(only_ops.exceeds(&stream_rw), None);
        assert_eq!(stream_read_group.exceeds(&stream_rw), None);
        // ...but individual operations never authorize a group, even all of them.
        assert!(stream_read_group.exceeds(&only_ops).is_some());
        // And nothing outside what the issuer holds.
        let append = Scope {
            ops: Some(vec![Operation::Append]),
            ..Default::default()
        };
        assert!(append.exceeds(&only_ops).unwrap().contains("append"));
        let account = Scope {
            op_groups: Some(OpGroups {
                account: Some(ReadWrite {
                    read: true,
                    write: false,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(account.exceeds(&stream_rw).unwrap().contains("account"));
    }

    #[test]
    fn scope_json_uses_the_wire_shapes() {
        let scope: Scope = serde_json::from_str(
            r#"{"basins":{"prefix":""},"streams":{"exact":"s"},"op_groups":{"stream":{"read":true}},"ops":["append","check-tail"]}"#,
        )
        .unwrap();
        assert_eq!(scope.basins, prefix(""));
        assert_eq!(scope.streams, exact("s"));
        assert_eq!(scope.access_tokens, None);
        assert!(scope.allows(Operation::Read) && scope.allows(Operation::Append));
        assert!(!scope.allows(Operation::Trim));
        assert!(serde_json::from_str::<Scope>(r#"{"ops":["nope"]}"#).is_err());
        assert!(serde_json::from_str::<Scope>(r#"{"basins":{"glob":"*"}}"#).is_err());
    }
}
