//! Records, batches and command records, with the documented limits and metering.

use bytes::Bytes;

use crate::error::{Error, Result};

/// Most records one append may carry.
pub const MAX_BATCH_RECORDS: usize = 1000;
/// Most metered bytes one append (or one read batch) may carry: 1 MiB.
pub const MAX_BATCH_METERED_BYTES: u64 = 1024 * 1024;
/// Longest fencing token, in bytes.
pub const MAX_FENCING_TOKEN_BYTES: usize = 36;

/// A position in a stream: a sequence number and the timestamp that goes with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamPosition {
    pub seq_num: u64,
    pub timestamp: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub name: Bytes,
    pub value: Bytes,
}

/// A record as a client submits it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AppendRecord {
    pub timestamp: Option<u64>,
    pub headers: Vec<Header>,
    pub body: Bytes,
}

/// A record as it is stored and read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequencedRecord {
    pub seq_num: u64,
    pub timestamp: u64,
    pub headers: Vec<Header>,
    pub body: Bytes,
}

/// The metered size of a record: 8 + 2 per header + header name and value bytes + body.
pub fn metered_size(headers: &[Header], body: &[u8]) -> u64 {
    let header_bytes: usize = headers.iter().map(|h| h.name.len() + h.value.len()).sum();
    (8 + 2 * headers.len() + header_bytes + body.len()) as u64
}

impl AppendRecord {
    pub fn metered_size(&self) -> u64 {
        metered_size(&self.headers, &self.body)
    }
}

/// A batch being filled, one record at a time, within the limits of one append: how
/// front ends that receive records one by one (OTLP items, pipelined XADDs) pack them
/// into as few appends as they can.
#[derive(Debug, Default)]
pub struct BatchPacker {
    records: Vec<AppendRecord>,
    metered: u64,
}

impl BatchPacker {
    /// Whether one more record of `metered` bytes fits this batch.
    pub fn fits(&self, metered: u64) -> bool {
        self.records.len() < MAX_BATCH_RECORDS && self.metered + metered <= MAX_BATCH_METERED_BYTES
    }

    /// Adds a record (that `fits`).
    pub fn push(&mut self, record: AppendRecord) {
        self.metered += record.metered_size();
        self.records.push(record);
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    pub fn into_records(self) -> Vec<AppendRecord> {
        self.records
    }

    /// Packs `records` in order into as few batches as the limits allow (a record too
    /// large for any batch gets one of its own, which its append then refuses).
    pub fn pack(records: impl IntoIterator<Item = AppendRecord>) -> Vec<Vec<AppendRecord>> {
        let mut batches = Vec::new();
        let mut current = BatchPacker::default();
        for record in records {
            if !current.is_empty() && !current.fits(record.metered_size()) {
                batches.push(std::mem::take(&mut current).into_records());
            }
            current.push(record);
        }
        if !current.is_empty() {
            batches.push(current.into_records());
        }
        batches
    }
}

impl SequencedRecord {
    pub fn metered_size(&self) -> u64 {
        metered_size(&self.headers, &self.body)
    }

    pub fn position(&self) -> StreamPosition {
        StreamPosition {
            seq_num: self.seq_num,
            timestamp: self.timestamp,
        }
    }
}

/// A service-side directive carried by a record whose only header has an empty name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Sets the stream's fencing token; an empty token clears it.
    Fence(String),
    /// Asks for records before this sequence number to be trimmed.
    Trim(u64),
}

impl Command {
    /// Interprets a record: `Ok(None)` for an ordinary record, `Err` for a malformed command
    /// or an empty header name outside a command record.
    pub fn parse(headers: &[Header], body: &[u8]) -> Result<Option<Command>> {
        let empty_names = headers.iter().filter(|h| h.name.is_empty()).count();
        if empty_names == 0 {
            return Ok(None);
        }
        if headers.len() != 1 {
            return Err(Error::invalid(
                "a header name can only be empty in a command record, which has exactly one header",
            ));
        }
        match headers[0].value.as_ref() {
            b"fence" => {
                let token = std::str::from_utf8(body)
                    .map_err(|_| Error::invalid("a fencing token must be valid UTF-8"))?;
                check_fencing_token(token)?;
                Ok(Some(Command::Fence(token.to_owned())))
            }
            b"trim" => {
                let bytes: [u8; 8] = body.try_into().map_err(|_| {
                    Error::invalid("a trim command body must be exactly 8 big-endian bytes")
                })?;
                Ok(Some(Command::Trim(u64::from_be_bytes(bytes))))
            }
            other => Err(Error::invalid(format!(
                "unknown command record operation `{}`; supported: fence, trim",
                String::from_utf8_lossy(other)
            ))),
        }
    }
}

pub fn check_fencing_token(token: &str) -> Result<()> {
    if token.len() > MAX_FENCING_TOKEN_BYTES {
        return Err(Error::invalid(format!(
            "a fencing token may be at most {MAX_FENCING_TOKEN_BYTES} bytes (got {})",
            token.len()
        )));
    }
    Ok(())
}

/// Checks that a batch holds between 1 and `MAX_BATCH_RECORDS` records; decoders call it
/// with what they counted on the wire, before they allocate for the records.
pub fn check_record_count(records: usize) -> Result<()> {
    if records == 0 || records > MAX_BATCH_RECORDS {
        return Err(Error::invalid(format!(
            "a batch must contain between 1 and {MAX_BATCH_RECORDS} records (got {records})"
        )));
    }
    Ok(())
}

/// The most headers a batch can hold: each counts at least 2 metered bytes.
pub const MAX_BATCH_HEADERS: usize = (MAX_BATCH_METERED_BYTES / 2) as usize;

/// Checks a batch's header count against `MAX_BATCH_HEADERS`, before decoding them.
pub fn check_header_count(headers: usize) -> Result<()> {
    if headers > MAX_BATCH_HEADERS {
        return Err(Error::invalid(format!(
            "a batch may be at most {MAX_BATCH_METERED_BYTES} metered bytes, and each of \
             its {headers} headers counts at least 2"
        )));
    }
    Ok(())
}

/// An append request: a batch of records and its optional conditions.
#[derive(Debug, Clone, Default)]
pub struct AppendInput {
    pub records: Vec<AppendRecord>,
    pub match_seq_num: Option<u64>,
    pub fencing_token: Option<String>,
}

impl AppendInput {
    /// Checks every documented rule; returns the commands the batch carries (by index)
    /// and its metered size.
    pub fn validate(&self) -> Result<ValidBatch> {
        check_record_count(self.records.len())?;
        let metered: u64 = self.records.iter().map(AppendRecord::metered_size).sum();
        if metered > MAX_BATCH_METERED_BYTES {
            return Err(Error::invalid(format!(
                "a batch may be at most {MAX_BATCH_METERED_BYTES} metered bytes (got {metered})"
            )));
        }
        if let Some(token) = &self.fencing_token {
            check_fencing_token(token)?;
        }
        let mut commands = Vec::new();
        for (index, record) in self.records.iter().enumerate() {
            if let Some(command) = Command::parse(&record.headers, &record.body)? {
                commands.push((index, command));
            }
        }
        Ok(ValidBatch { commands, metered })
    }
}

/// What validating a batch found out about it.
#[derive(Debug)]
pub struct ValidBatch {
    pub commands: Vec<(usize, Command)>,
    pub metered: u64,
}

/// What an acknowledged append tells the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendAck {
    /// Position of the first record appended.
    pub start: StreamPosition,
    /// Sequence number after the last record appended, with that record's timestamp.
    pub end: StreamPosition,
    /// The stream's tail when the ack was sent.
    pub tail: StreamPosition,
}

/// The wall clock in milliseconds since the epoch: what records are timestamped with.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(name: &str, value: &str) -> Header {
        Header {
            name: Bytes::copy_from_slice(name.as_bytes()),
            value: Bytes::copy_from_slice(value.as_bytes()),
        }
    }

    fn record(headers: Vec<Header>, body: &[u8]) -> AppendRecord {
        AppendRecord {
            timestamp: None,
            headers,
            body: Bytes::copy_from_slice(body),
        }
    }

    #[test]
    fn metered_size_follows_the_formula() {
        assert_eq!(metered_size(&[], b""), 8);
        assert_eq!(metered_size(&[], b"hello"), 13);
        // 8 + 2*2 + (1+2) + (3+4) + 5
        let headers = [header("a", "bb"), header("ccc", "dddd")];
        assert_eq!(metered_size(&headers, b"12345"), 8 + 4 + 3 + 7 + 5);
    }

    #[test]
    fn batch_limits_are_enforced() {
        assert!(AppendInput::default().validate().is_err());
        let thousand = AppendInput {
            records: vec![record(vec![], b"x"); 1000],
            ..Default::default()
        };
        assert!(thousand.validate().is_ok());
        let too_many = AppendInput {
            records: vec![record(vec![], b"x"); 1001],
            ..Default::default()
        };
        assert_eq!(too_many.validate().unwrap_err().code(), "invalid");
        // Exactly 1 MiB metered passes; one byte more fails.
        let exact = AppendInput {
            records: vec![record(vec![], &vec![0u8; 1024 * 1024 - 8])],
            ..Default::default()
        };
        assert!(exact.validate().is_ok());
        let over = AppendInput {
            records: vec![record(vec![], &vec![0u8; 1024 * 1024 - 7])],
            ..Default::default()
        };
        assert!(over.validate().is_err());
        let long_token = AppendInput {
            records: vec![record(vec![], b"x")],
            fencing_token: Some("t".repeat(37)),
            ..Default::default()
        };
        assert!(long_token.validate().is_err());
    }

    #[test]
    fn command_records_are_recognised_and_checked() {
        let fence = Command::parse(&[header("", "fence")], b"writer-1").unwrap();
        assert_eq!(fence, Some(Command::Fence("writer-1".into())));
        let clear = Command::parse(&[header("", "fence")], b"").unwrap();
        assert_eq!(clear, Some(Command::Fence(String::new())));
        let trim = Command::parse(&[header("", "trim")], &100u64.to_be_bytes()).unwrap();
        assert_eq!(trim, Some(Command::Trim(100)));
        assert_eq!(Command::parse(&[header("k", "v")], b"").unwrap(), None);

        for (headers, body) in [
            (vec![header("", "fence")], "t".repeat(37).into_bytes()),
            (vec![header("", "trim")], vec![0u8; 7]),
            (vec![header("", "explode")], vec![]),
            (vec![header("", "fence"), header("k", "v")], vec![]),
            (vec![header("k", "v"), header("", "x")], vec![]),
        ] {
            assert_eq!(
                Command::parse(&headers, &body).unwrap_err().code(),
                "invalid"
            );
        }
    }
}
