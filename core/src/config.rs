//! Basin and stream configuration, with the documented defaults, validation and
//! reconfiguration rules. The serde shapes are the ones the S2 docs define, so the same
//! types serve the REST front end and the metadata store.

use serde::{Deserialize, Deserializer, Serialize};

use crate::encryption::Cipher;
use crate::error::{Error, Result};

/// Default retention: 7 days.
pub const DEFAULT_RETENTION_SECS: u64 = 7 * 24 * 60 * 60;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StorageClass {
    Standard,
    Express,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RetentionPolicy {
    /// Records older than this many seconds are trimmed automatically.
    Age(u64),
    /// Records are kept until explicitly trimmed.
    Infinite(InfiniteRetention),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct InfiniteRetention {}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TimestampingMode {
    #[default]
    ClientPrefer,
    ClientRequire,
    Arrival,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TimestampingConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<TimestampingMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uncapped: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DeleteOnEmptyConfig {
    /// 0 disables delete-on-empty.
    #[serde(default)]
    pub min_age_secs: u64,
}

/// A stream configuration. Every field is optional on input; a stream's stored
/// configuration has every field resolved (see [`StreamConfig::resolve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StreamConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class: Option<StorageClass>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_policy: Option<RetentionPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamping: Option<TimestampingConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_on_empty: Option<DeleteOnEmptyConfig>,
}

impl StreamConfig {
    pub fn validate(&self) -> Result<()> {
        if let Some(RetentionPolicy::Age(0)) = self.retention_policy {
            return Err(Error::invalid(
                "retention_policy.age must be greater than 0 seconds",
            ));
        }
        Ok(())
    }

    /// Fills every unset field, first from `fallback` (the basin's default stream config),
    /// then from the documented defaults.
    pub fn resolve(&self, fallback: &StreamConfig, default_class: StorageClass) -> StreamConfig {
        let timestamping = {
            let own = self.timestamping.unwrap_or_default();
            let inherited = fallback.timestamping.unwrap_or_default();
            TimestampingConfig {
                mode: Some(own.mode.or(inherited.mode).unwrap_or_default()),
                uncapped: Some(own.uncapped.or(inherited.uncapped).unwrap_or(false)),
            }
        };
        StreamConfig {
            storage_class: Some(
                self.storage_class
                    .or(fallback.storage_class)
                    .unwrap_or(default_class),
            ),
            retention_policy: Some(
                self.retention_policy
                    .or(fallback.retention_policy)
                    .unwrap_or(RetentionPolicy::Age(DEFAULT_RETENTION_SECS)),
            ),
            timestamping: Some(timestamping),
            delete_on_empty: Some(
                self.delete_on_empty
                    .or(fallback.delete_on_empty)
                    .unwrap_or_default(),
            ),
        }
    }

    pub fn timestamping_mode(&self) -> TimestampingMode {
        self.timestamping.and_then(|t| t.mode).unwrap_or_default()
    }

    pub fn timestamping_uncapped(&self) -> bool {
        self.timestamping.and_then(|t| t.uncapped).unwrap_or(false)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct BasinConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_stream_config: Option<StreamConfig>,
    #[serde(default)]
    pub create_stream_on_append: bool,
    #[serde(default)]
    pub create_stream_on_read: bool,
    /// The cipher streams created from now on encrypt their records with (each stream
    /// keeps the one it was created with); `None`: new streams are plaintext.
    #[serde(default)]
    pub stream_cipher: Option<Cipher>,
}

impl BasinConfig {
    pub fn validate(&self) -> Result<()> {
        match &self.default_stream_config {
            Some(config) => config.validate(),
            None => Ok(()),
        }
    }
}

/// One field of a reconfiguration: absent leaves it unchanged, `null` resets it to its
/// default, a value sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Patch<T> {
    #[default]
    Keep,
    Reset,
    Set(T),
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Patch<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Only called when the field is present; absent fields take `Default` (Keep).
        Ok(match Option::<T>::deserialize(deserializer)? {
            Some(value) => Patch::Set(value),
            None => Patch::Reset,
        })
    }
}

impl<T: Copy> Patch<T> {
    fn apply(self, current: Option<T>) -> Option<T> {
        match self {
            Patch::Keep => current,
            Patch::Reset => None,
            Patch::Set(value) => Some(value),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub struct TimestampingReconfiguration {
    #[serde(default)]
    pub mode: Patch<TimestampingMode>,
    #[serde(default)]
    pub uncapped: Patch<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub struct DeleteOnEmptyReconfiguration {
    #[serde(default)]
    pub min_age_secs: Patch<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub struct StreamReconfiguration {
    #[serde(default)]
    pub storage_class: Patch<StorageClass>,
    #[serde(default)]
    pub retention_policy: Patch<RetentionPolicy>,
    #[serde(default)]
    pub timestamping: Patch<TimestampingReconfiguration>,
    #[serde(default)]
    pub delete_on_empty: Patch<DeleteOnEmptyReconfiguration>,
}

impl StreamReconfiguration {
    /// Applies the changes to a (possibly partial) config; fields reset to `null` become
    /// unset, so that [`StreamConfig::resolve`] gives them their defaults again.
    pub fn apply(&self, config: &StreamConfig) -> Result<StreamConfig> {
        let timestamping = match self.timestamping {
            Patch::Keep => config.timestamping,
            Patch::Reset => None,
            Patch::Set(change) => {
                let current = config.timestamping.unwrap_or_default();
                Some(TimestampingConfig {
                    mode: change.mode.apply(current.mode),
                    uncapped: change.uncapped.apply(current.uncapped),
                })
            }
        };
        let delete_on_empty = match self.delete_on_empty {
            Patch::Keep => config.delete_on_empty,
            Patch::Reset => None,
            Patch::Set(change) => {
                let current = config.delete_on_empty.map(|d| d.min_age_secs);
                change
                    .min_age_secs
                    .apply(current)
                    .map(|min_age_secs| DeleteOnEmptyConfig { min_age_secs })
            }
        };
        let updated = StreamConfig {
            storage_class: self.storage_class.apply(config.storage_class),
            retention_policy: self.retention_policy.apply(config.retention_policy),
            timestamping,
            delete_on_empty,
        };
        updated.validate()?;
        Ok(updated)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub struct BasinReconfiguration {
    #[serde(default)]
    pub default_stream_config: Patch<StreamReconfiguration>,
    #[serde(default)]
    pub create_stream_on_append: Patch<bool>,
    #[serde(default)]
    pub create_stream_on_read: Patch<bool>,
    #[serde(default)]
    pub stream_cipher: Patch<Cipher>,
}

impl BasinReconfiguration {
    pub fn apply(&self, config: &BasinConfig) -> Result<BasinConfig> {
        let default_stream_config = match self.default_stream_config {
            Patch::Keep => config.default_stream_config,
            Patch::Reset => None,
            Patch::Set(change) => {
                Some(change.apply(&config.default_stream_config.unwrap_or_default())?)
            }
        };
        Ok(BasinConfig {
            default_stream_config,
            create_stream_on_append: self
                .create_stream_on_append
                .apply(Some(config.create_stream_on_append))
                .unwrap_or(false),
            create_stream_on_read: self
                .create_stream_on_read
                .apply(Some(config.create_stream_on_read))
                .unwrap_or(false),
            stream_cipher: self.stream_cipher.apply(config.stream_cipher),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_policy_has_the_documented_json_shapes() {
        let age: RetentionPolicy = serde_json::from_str(r#"{"age":3600}"#).unwrap();
        assert_eq!(age, RetentionPolicy::Age(3600));
        let infinite: RetentionPolicy = serde_json::from_str(r#"{"infinite":{}}"#).unwrap();
        assert_eq!(infinite, RetentionPolicy::Infinite(InfiniteRetention {}));
        assert_eq!(
            serde_json::to_string(&infinite).unwrap(),
            r#"{"infinite":{}}"#
        );
        let mode: TimestampingMode = serde_json::from_str(r#""client-require""#).unwrap();
        assert_eq!(mode, TimestampingMode::ClientRequire);
    }

    #[test]
    fn resolve_prefers_own_then_basin_default_then_documented_defaults() {
        let own = StreamConfig {
            timestamping: Some(TimestampingConfig {
                mode: Some(TimestampingMode::Arrival),
                uncapped: None,
            }),
            ..Default::default()
        };
        let basin = StreamConfig {
            retention_policy: Some(RetentionPolicy::Age(60)),
            timestamping: Some(TimestampingConfig {
                mode: Some(TimestampingMode::ClientRequire),
                uncapped: Some(true),
            }),
            ..Default::default()
        };
        let resolved = own.resolve(&basin, StorageClass::Express);
        assert_eq!(resolved.storage_class, Some(StorageClass::Express));
        assert_eq!(resolved.retention_policy, Some(RetentionPolicy::Age(60)));
        assert_eq!(resolved.timestamping_mode(), TimestampingMode::Arrival);
        assert!(resolved.timestamping_uncapped());
        assert_eq!(
            resolved.delete_on_empty,
            Some(DeleteOnEmptyConfig::default())
        );

        let defaults =
            StreamConfig::default().resolve(&StreamConfig::default(), StorageClass::Standard);
        assert_eq!(
            defaults.retention_policy,
            Some(RetentionPolicy::Age(DEFAULT_RETENTION_SECS))
        );
        assert_eq!(defaults.timestamping_mode(), TimestampingMode::ClientPrefer);
        assert!(!defaults.timestamping_uncapped());
    }

    #[test]
    fn reconfiguration_changes_only_given_fields_and_null_resets() {
        let current = StreamConfig {
            storage_class: Some(StorageClass::Standard),
            retention_policy: Some(RetentionPolicy::Age(60)),
            timestamping: Some(TimestampingConfig {
                mode: Some(TimestampingMode::Arrival),
                uncapped: Some(true),
            }),
            delete_on_empty: Some(DeleteOnEmptyConfig { min_age_secs: 10 }),
        };
        let change: StreamReconfiguration = serde_json::from_str(
            r#"{"retention_policy":{"infinite":{}},"timestamping":{"uncapped":false},"delete_on_empty":null}"#,
        )
        .unwrap();
        let updated = change.apply(&current).unwrap();
        assert_eq!(updated.storage_class, Some(StorageClass::Standard));
        assert_eq!(
            updated.retention_policy,
            Some(RetentionPolicy::Infinite(InfiniteRetention {}))
        );
        assert_eq!(updated.timestamping_mode(), TimestampingMode::Arrival);
        assert_eq!(updated.timestamping.unwrap().uncapped, Some(false));
        assert_eq!(updated.delete_on_empty, None);

        let zero_age: StreamReconfiguration =
            serde_json::from_str(r#"{"retention_policy":{"age":0}}"#).unwrap();
        assert_eq!(zero_age.apply(&current).unwrap_err().code(), "invalid");
    }

    #[test]
    fn basin_reconfiguration_merges_into_default_stream_config() {
        let current = BasinConfig {
            default_stream_config: Some(StreamConfig {
                storage_class: Some(StorageClass::Express),
                ..Default::default()
            }),
            create_stream_on_append: true,
            create_stream_on_read: false,
            stream_cipher: Some(Cipher::Aegis256),
        };
        let change: BasinReconfiguration = serde_json::from_str(
            r#"{"create_stream_on_read":true,"default_stream_config":{"retention_policy":{"age":5}}}"#,
        )
        .unwrap();
        let updated = change.apply(&current).unwrap();
        assert_eq!(updated.stream_cipher, Some(Cipher::Aegis256));
        assert!(updated.create_stream_on_append);
        assert!(updated.create_stream_on_read);
        let defaults = updated.default_stream_config.unwrap();
        assert_eq!(defaults.storage_class, Some(StorageClass::Express));
        assert_eq!(defaults.retention_policy, Some(RetentionPolicy::Age(5)));

        let cipher: BasinReconfiguration =
            serde_json::from_str(r#"{"stream_cipher":"aes-256-gcm"}"#).unwrap();
        let updated = cipher.apply(&current).unwrap();
        assert_eq!(updated.stream_cipher, Some(Cipher::Aes256Gcm));
        let cleared: BasinReconfiguration =
            serde_json::from_str(r#"{"stream_cipher":null}"#).unwrap();
        assert_eq!(cleared.apply(&current).unwrap().stream_cipher, None);
        assert!(serde_json::from_str::<BasinConfig>(r#"{"stream_cipher":"rot13"}"#).is_err());
    }
}
