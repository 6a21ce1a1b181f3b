//! What every command's parser shares: argument words, numbers, IDs and the standard
//! error replies for malformed commands.

use crate::entry::IdArg;

pub(crate) fn upper(arg: &[u8]) -> String {
    String::from_utf8_lossy(arg).to_ascii_uppercase()
}

pub(crate) fn arity(name: &str) -> String {
    format!(
        "ERR wrong number of arguments for '{}' command",
        name.to_ascii_lowercase()
    )
}

pub(crate) fn syntax() -> String {
    "ERR syntax error".into()
}

pub(crate) fn integer(arg: &[u8]) -> Result<u64, String> {
    std::str::from_utf8(arg)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| "ERR value is not an integer or out of range".to_string())
}

pub(crate) fn id(arg: &[u8]) -> Result<IdArg, String> {
    IdArg::parse(arg)
        .ok_or_else(|| "ERR Invalid stream ID specified as stream command argument".to_string())
}

/// A signed integer argument (Redis takes `-5` where a count is expected, then decides).
pub(crate) fn signed(arg: &[u8], error: &str) -> Result<i64, String> {
    std::str::from_utf8(arg)
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| error.to_string())
}

/// A `COUNT` argument: as in Redis, a negative one counts as 0.
pub(crate) fn count(arg: &[u8]) -> Result<u64, String> {
    Ok(signed(arg, "ERR value is not an integer or out of range")?.max(0) as u64)
}

/// A command line as its arguments, split at spaces (for the parsers' tests).
#[cfg(test)]
pub(crate) fn args(line: &str) -> Vec<bytes::Bytes> {
    line.split(' ')
        .map(|s| bytes::Bytes::copy_from_slice(s.as_bytes()))
        .collect()
}
