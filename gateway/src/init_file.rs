//! The init file (`--init-file`): basins and streams to provision at start-up, in the
//! format of `s2 apply` (the "Declarative Spec" page), so the same file serves both:
//!
//! ```json
//! {"basins": [{"name": "events", "config": {"create_stream_on_append": true,
//!   "default_stream_config": {"retention_policy": "7days"}},
//!   "streams": [{"name": "audit", "config": {"retention_policy": "infinite"}}]}]}
//! ```
//!
//! It is applied before the server takes requests: what is missing is created, and what
//! exists is reconfigured to match — only in the fields the file gives, as the docs say
//! of `s2 apply` — so applying it on every restart changes nothing the second time. A
//! file that cannot be read, parsed or validated stops start-up with a message naming
//! the field (`basins[0].streams[2].config.retention_policy: …`).

use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Deserializer};
use streamgate_core::config::{
    BasinConfig, BasinReconfiguration, DeleteOnEmptyConfig, DeleteOnEmptyReconfiguration,
    InfiniteRetention, Patch, RetentionPolicy, StorageClass, StreamConfig, StreamReconfiguration,
    TimestampingConfig, TimestampingMode, TimestampingReconfiguration,
};
use streamgate_core::encryption::Cipher;
use streamgate_core::names::{BasinName, StreamName};
use streamgate_core::{Caller, Error};

/// The whole file. Unknown top-level keys (such as `$schema`) are ignored; everywhere
/// else an unknown field is an error, so a typo is never silently dropped.
#[derive(Debug, Deserialize)]
pub struct Spec {
    #[serde(default)]
    basins: Vec<BasinSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BasinSpec {
    name: String,
    #[serde(default)]
    config: Option<BasinConfigSpec>,
    #[serde(default)]
    streams: Vec<StreamSpec>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct BasinConfigSpec {
    #[serde(default)]
    default_stream_config: Option<StreamConfigSpec>,
    #[serde(default)]
    stream_cipher: Option<Cipher>,
    #[serde(default)]
    create_stream_on_append: Option<bool>,
    #[serde(default)]
    create_stream_on_read: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamSpec {
    name: String,
    #[serde(default)]
    config: Option<StreamConfigSpec>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamConfigSpec {
    #[serde(default)]
    storage_class: Option<StorageClass>,
    /// `"infinite"`, or how long records are kept (`"7days"`, `"12h"`).
    #[serde(default, deserialize_with = "retention")]
    retention_policy: Option<RetentionPolicy>,
    #[serde(default)]
    timestamping: Option<TimestampingSpec>,
    #[serde(default)]
    delete_on_empty: Option<DeleteOnEmptySpec>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TimestampingSpec {
    #[serde(default)]
    mode: Option<TimestampingMode>,
    #[serde(default)]
    uncapped: Option<bool>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteOnEmptySpec {
    /// How old an empty stream must be before it is deleted (`"1day"`); `"0s"` disables.
    #[serde(default, deserialize_with = "duration_secs")]
    min_age: Option<u64>,
}

fn retention<'de, D: Deserializer<'de>>(d: D) -> Result<Option<RetentionPolicy>, D::Error> {
    let text = String::deserialize(d)?;
    if text.trim().eq_ignore_ascii_case("infinite") {
        return Ok(Some(RetentionPolicy::Infinite(InfiniteRetention {})));
    }
    let secs = parse_duration(&text).map_err(serde::de::Error::custom)?;
    if secs == 0 {
        return Err(serde::de::Error::custom(
            "a retention must be longer than 0 seconds (or \"infinite\")",
        ));
    }
    Ok(Some(RetentionPolicy::Age(secs)))
}

fn duration_secs<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let text = String::deserialize(d)?;
    parse_duration(&text)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

/// Whole seconds of a humantime duration (`"7days"`, `"2h 30m"`).
fn parse_duration(text: &str) -> Result<u64, String> {
    humantime::parse_duration(text.trim())
        .map(|d| d.as_secs())
        .map_err(|e| format!("`{text}` is not a duration such as \"7days\" or \"2h 30m\" ({e})"))
}

impl StreamConfigSpec {
    /// The config of a stream (or basin default) created from the file.
    fn config(&self) -> StreamConfig {
        StreamConfig {
            storage_class: self.storage_class,
            retention_policy: self.retention_policy,
            timestamping: self.timestamping.map(|t| TimestampingConfig {
                mode: t.mode,
                uncapped: t.uncapped,
            }),
            delete_on_empty: self
                .delete_on_empty
                .and_then(|d| d.min_age)
                .map(|min_age_secs| DeleteOnEmptyConfig { min_age_secs }),
        }
    }

    /// The change that brings an existing config to the file's, in the fields it gives.
    fn reconfiguration(&self) -> StreamReconfiguration {
        StreamReconfiguration {
            storage_class: set(self.storage_class),
            retention_policy: set(self.retention_policy),
            timestamping: set(self.timestamping.map(|t| TimestampingReconfiguration {
                mode: set(t.mode),
                uncapped: set(t.uncapped),
            })),
            delete_on_empty: set(self.delete_on_empty.map(|d| DeleteOnEmptyReconfiguration {
                min_age_secs: set(d.min_age),
            })),
        }
    }
}

impl BasinConfigSpec {
    fn config(&self) -> BasinConfig {
        BasinConfig {
            default_stream_config: self.default_stream_config.map(|c| c.config()),
            create_stream_on_append: self.create_stream_on_append.unwrap_or(false),
            create_stream_on_read: self.create_stream_on_read.unwrap_or(false),
            stream_cipher: self.stream_cipher,
        }
    }

    fn reconfiguration(&self) -> BasinReconfiguration {
        BasinReconfiguration {
            default_stream_config: set(self.default_stream_config.map(|c| c.reconfiguration())),
            create_stream_on_append: set(self.create_stream_on_append),
            create_stream_on_read: set(self.create_stream_on_read),
            stream_cipher: set(self.stream_cipher),
        }
    }
}

/// A field the file gives is set; one it leaves out is kept as it is.
fn set<T>(value: Option<T>) -> Patch<T> {
    value.map_or(Patch::Keep, Patch::Set)
}

/// Reads, parses and checks the file: names valid, none twice.
pub fn load(path: &Path) -> anyhow::Result<Spec> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--init-file: cannot read {}", path.display()))?;
    parse(&text).with_context(|| format!("--init-file {}", path.display()))
}

fn parse(text: &str) -> anyhow::Result<Spec> {
    let mut json = serde_json::Deserializer::from_str(text);
    let spec: Spec = serde_path_to_error::deserialize(&mut json).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match path.as_str() {
            "." => anyhow::anyhow!("{inner}"),
            _ => anyhow::anyhow!("{path}: {inner}"),
        }
    })?;
    let mut basins = std::collections::HashSet::new();
    for (i, basin) in spec.basins.iter().enumerate() {
        BasinName::new(basin.name.as_str())
            .map_err(|e| anyhow::anyhow!("basins[{i}].name: {e}"))?;
        if !basins.insert(basin.name.as_str()) {
            anyhow::bail!("basins[{i}].name: basin `{}` is listed twice", basin.name);
        }
        let mut streams = std::collections::HashSet::new();
        for (j, stream) in basin.streams.iter().enumerate() {
            StreamName::new(stream.name.as_str())
                .map_err(|e| anyhow::anyhow!("basins[{i}].streams[{j}].name: {e}"))?;
            if !streams.insert(stream.name.as_str()) {
                anyhow::bail!(
                    "basins[{i}].streams[{j}].name: stream `{}` is listed twice in basin `{}`",
                    stream.name,
                    basin.name
                );
            }
        }
    }
    Ok(spec)
}

/// What applying the file did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Applied {
    pub created: usize,
    pub reconfigured: usize,
    pub unchanged: usize,
}

impl std::fmt::Display for Applied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} created, {} reconfigured, {} unchanged",
            self.created, self.reconfigured, self.unchanged
        )
    }
}

/// Creates what is missing and reconfigures what differs, basin by basin in file order.
pub async fn apply(caller: &Caller, spec: &Spec) -> anyhow::Result<Applied> {
    let mut applied = Applied::default();
    for basin in &spec.basins {
        let name = BasinName::new(basin.name.as_str())?;
        let config = basin.config.as_ref();
        let outcome = apply_basin(caller, &name, config)
            .await
            .with_context(|| format!("applying basin `{name}`"))?;
        tracing::info!(basin = %name, outcome, "init file");
        applied.count(outcome);
        for stream in &basin.streams {
            let stream_name = StreamName::new(stream.name.as_str())?;
            let outcome = apply_stream(caller, &name, &stream_name, stream.config.as_ref())
                .await
                .with_context(|| format!("applying stream `{stream_name}` of basin `{name}`"))?;
            tracing::info!(basin = %name, stream = %stream_name, outcome, "init file");
            applied.count(outcome);
        }
    }
    Ok(applied)
}

impl Applied {
    fn count(&mut self, outcome: &str) {
        match outcome {
            CREATED => self.created += 1,
            RECONFIGURED => self.reconfigured += 1,
            _ => self.unchanged += 1,
        }
    }
}

const CREATED: &str = "created";
const RECONFIGURED: &str = "reconfigured";
const UNCHANGED: &str = "unchanged";

async fn apply_basin(
    caller: &Caller,
    name: &BasinName,
    spec: Option<&BasinConfigSpec>,
) -> Result<&'static str, Error> {
    // No config: a basin with the defaults, or no change to an existing one.
    let spec = spec.copied().unwrap_or_default();
    let current = match caller.basin(name).await {
        Ok(basin) => basin.config,
        Err(Error::NotFound(_)) => {
            match caller.create_basin(name.clone(), spec.config(), None).await {
                Ok(_) => return Ok(CREATED),
                // Another node applying the same file got there first.
                Err(Error::AlreadyExists(_)) => caller.basin(name).await?.config,
                Err(err) => return Err(err),
            }
        }
        Err(err) => return Err(err),
    };
    let change = spec.reconfiguration();
    if change.apply(&current)? == current {
        return Ok(UNCHANGED);
    }
    caller.reconfigure_basin(name, &change).await?;
    Ok(RECONFIGURED)
}

async fn apply_stream(
    caller: &Caller,
    basin: &BasinName,
    name: &StreamName,
    spec: Option<&StreamConfigSpec>,
) -> Result<&'static str, Error> {
    let spec = spec.copied().unwrap_or_default();
    let current = match caller.stream_config(basin, name).await {
        Ok(config) => config,
        Err(Error::NotFound(_)) => {
            match caller
                .create_stream(basin, name.clone(), spec.config(), None)
                .await
            {
                Ok(_) => return Ok(CREATED),
                Err(Error::AlreadyExists(_)) => caller.stream_config(basin, name).await?,
                Err(err) => return Err(err),
            }
        }
        Err(err) => return Err(err),
    };
    let change = spec.reconfiguration();
    if change.apply(&current)? == current {
        return Ok(UNCHANGED);
    }
    caller.reconfigure_stream(basin, name, &change).await?;
    Ok(RECONFIGURED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_parses_into_configs() {
        let spec = parse(
            r#"{
              "$schema": "https://raw.githubusercontent.com/s2-streamstore/s2/main/cli/schema.json",
              "basins": [{
                "name": "my-basin",
                "config": {
                  "stream_cipher": "aegis-256",
                  "create_stream_on_append": true,
                  "default_stream_config": {"storage_class": "express", "retention_policy": "7days"}
                },
                "streams": [{
                  "name": "events",
                  "config": {"storage_class": "standard", "retention_policy": "infinite",
                             "timestamping": {"mode": "client-prefer", "uncapped": false},
                             "delete_on_empty": {"min_age": "1day"}}
                }]
              }]
            }"#,
        )
        .unwrap();
        let basin = &spec.basins[0];
        let config = basin.config.as_ref().unwrap().config();
        assert_eq!(config.stream_cipher, Some(Cipher::Aegis256));
        assert!(config.create_stream_on_append && !config.create_stream_on_read);
        let defaults = config.default_stream_config.unwrap();
        assert_eq!(
            defaults.retention_policy,
            Some(RetentionPolicy::Age(7 * 86_400))
        );
        assert_eq!(defaults.storage_class, Some(StorageClass::Express));
        let stream = basin.streams[0].config.unwrap().config();
        assert_eq!(
            stream.retention_policy,
            Some(RetentionPolicy::Infinite(InfiniteRetention {}))
        );
        assert_eq!(stream.delete_on_empty.unwrap().min_age_secs, 86_400);
        assert_eq!(stream.timestamping.unwrap().uncapped, Some(false));
    }

    #[test]
    fn only_the_fields_given_change_an_existing_config() {
        let spec: StreamConfigSpec = serde_json::from_str(r#"{"retention_policy": "1h"}"#).unwrap();
        let current = StreamConfig {
            storage_class: Some(StorageClass::Standard),
            retention_policy: Some(RetentionPolicy::Age(60)),
            ..Default::default()
        };
        let updated = spec.reconfiguration().apply(&current).unwrap();
        assert_eq!(updated.storage_class, Some(StorageClass::Standard));
        assert_eq!(updated.retention_policy, Some(RetentionPolicy::Age(3600)));
        assert_eq!(spec.reconfiguration().apply(&updated).unwrap(), updated);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (
                r#"{"basins": [{"name": "b", "config": {"retention": "1d"}}]}"#,
                "basins[0].config.retention: unknown field `retention`",
            ),
            (
                r#"{"basins": [{"name": "b", "streams": [{"name": "s", "config": {"retention_policy": "soon"}}]}]}"#,
                "basins[0].streams[0].config.retention_policy: `soon` is not a duration",
            ),
            (
                r#"{"basins": [{"name": "b", "streams": [{"name": "s", "config": {"retention_policy": "0s"}}]}]}"#,
                "longer than 0 seconds",
            ),
            (
                r#"{"basins": [{"name": "b", "config": {"stream_cipher": "rot13"}}]}"#,
                "basins[0].config.stream_cipher: unknown variant `rot13`",
            ),
            (
                r#"{"basins": [{"name": "b"}]}"#,
                "basins[0].name: basin name `b` must be between 8 and 48",
            ),
            (
                r#"{"basins": [{"name": "basin-one", "streams": [{"name": "s"}, {"name": "s"}]}]}"#,
                "basins[0].streams[1].name: stream `s` is listed twice",
            ),
            (
                r#"{"basins": [{"name": "basin-two"}, {"name": "basin-two"}]}"#,
                "basins[1].name: basin `basin-two` is listed twice",
            ),
            (r#"{"basins": "#, "EOF"),
        ];
        for (text, expected) in cases {
            let err = format!("{:#}", parse(text).unwrap_err());
            assert!(err.contains(expected), "{text}: {err}");
        }
    }
}
