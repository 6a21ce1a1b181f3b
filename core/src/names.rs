//! Validated basin and stream names.

use std::fmt;

use crate::error::{Error, Result};

/// A basin name: 8 to 48 lowercase letters, digits and hyphens, not starting or ending
/// with a hyphen.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BasinName(String);

impl BasinName {
    pub const MIN_LEN: usize = 8;
    pub const MAX_LEN: usize = 48;

    pub fn new(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        if name.len() < Self::MIN_LEN || name.len() > Self::MAX_LEN {
            return Err(Error::invalid(format!(
                "basin name `{name}` must be between {} and {} characters long",
                Self::MIN_LEN,
                Self::MAX_LEN
            )));
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(Error::invalid(format!(
                "basin name `{name}` may only contain lowercase letters, digits and hyphens"
            )));
        }
        if name.starts_with('-') || name.ends_with('-') {
            return Err(Error::invalid(format!(
                "basin name `{name}` must not begin or end with a hyphen"
            )));
        }
        Ok(Self(name))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for BasinName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A stream name: 1 to 512 bytes of UTF-8, unique within its basin.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamName(String);

impl StreamName {
    pub const MAX_LEN: usize = 512;

    pub fn new(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        if name.is_empty() || name.len() > Self::MAX_LEN {
            return Err(Error::invalid(format!(
                "stream name must be between 1 and {} bytes long (got {} bytes)",
                Self::MAX_LEN,
                name.len()
            )));
        }
        Ok(Self(name))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for StreamName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Validates a listing prefix or `start_after` value against the name rules' length bound,
/// without requiring it to be a complete name.
pub fn check_list_bound(what: &str, value: &str, max_len: usize) -> Result<()> {
    if value.len() > max_len {
        return Err(Error::invalid(format!(
            "{what} must be at most {max_len} bytes long"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basin_names_follow_the_documented_rules() {
        for ok in ["my-basin", "abcdefgh", "a1b2c3d4-x", &"a".repeat(48)] {
            assert!(BasinName::new(ok).is_ok(), "{ok} should be valid");
        }
        for bad in [
            "short",
            "abcdefg",
            &"a".repeat(49),
            "-leading1",
            "trailing-",
            "Upper-case",
            "under_score",
            "dots.in.name",
            "späce-basin",
        ] {
            let err = BasinName::new(bad).unwrap_err();
            assert_eq!(err.code(), "invalid", "{bad} should be invalid");
        }
    }

    #[test]
    fn stream_names_are_1_to_512_bytes() {
        assert!(StreamName::new("a").is_ok());
        assert!(StreamName::new("logs/2024/app name é").is_ok());
        assert!(StreamName::new("x".repeat(512)).is_ok());
        assert!(StreamName::new("").is_err());
        assert!(StreamName::new("x".repeat(513)).is_err());
        // 171 three-byte characters = 513 bytes: the limit is in bytes, not characters.
        assert!(StreamName::new("€".repeat(171)).is_err());
    }
}
