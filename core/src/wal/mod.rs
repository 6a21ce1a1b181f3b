//! Write-ahead-log chunks: the unit of group commit. A chunk holds sequenced batches of
//! many streams; each batch is an entry with its own CRC, so a read can fetch and verify
//! one entry by byte range without the rest of the chunk.
//!
//! Chunk:  magic "SGWAL\0\0\x01" | entry*
//! Entry:  u32 len (of what follows) | u32 crc32 (of what follows the crc) | u64 stream id |
//!         u64 first seq_num | u32 record count | record*
//! Record: u64 timestamp | u32 header count | (u32 len, name, u32 len, value)* | u32 len, body
//! Integers are big-endian.
//!
//! An entry whose stream id has its top bit set ([`GROUP_OPS`]) holds changes to the
//! stream's consumer groups instead of records: each "record" body is one op, and the
//! "sequence numbers" count the stream's group ops, not its positions. Readers never
//! look at them (no batch location points there).

pub(crate) mod recovery;
pub(crate) mod released;
pub(crate) mod writer;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::error::{Error, Result};
use crate::record::{Header, SequencedRecord};

const MAGIC: &[u8; 8] = b"SGWAL\0\0\x01";
/// Bytes of a chunk (or segment) before its first entry.
pub(crate) const CHUNK_HEADER_BYTES: usize = MAGIC.len();
/// Size of an entry's fixed part after its length and CRC.
const ENTRY_FIXED: usize = 8 + 8 + 4;

/// The stream-id bit of an entry of consumer-group ops (stream ids stay far below it).
pub(crate) const GROUP_OPS: u64 = 1 << 63;

/// What an entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum EntryKind {
    /// Records of the stream, at their positions.
    #[default]
    Records,
    /// Changes to the stream's consumer groups, numbered by group op.
    GroupOps,
}

/// Object-store key of a chunk: sorting keys sorts chunks by epoch, then by number.
pub fn chunk_key(epoch: u64, number: u64) -> String {
    format!("wal/{epoch:020}/{number:020}")
}

/// The inverse of [`chunk_key`]; `None` for keys that are not chunks.
pub(crate) fn parse_chunk_key(key: &str) -> Option<(u64, u64)> {
    let rest = key.strip_prefix("wal/")?;
    let (epoch, number) = rest.split_once('/')?;
    Some((epoch.parse().ok()?, number.parse().ok()?))
}

/// A record's stored form: what the sequencer decided, before it has a sequence number
/// in hand (the entry carries the first one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredRecord {
    pub timestamp: u64,
    pub headers: Vec<Header>,
    pub body: Bytes,
}

/// Where an entry lies inside its chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntrySpan {
    pub offset: u64,
    pub len: u64,
}

impl EntrySpan {
    pub fn range(&self) -> std::ops::Range<u64> {
        self.offset..self.offset + self.len
    }

    /// The entry's bytes, cut out of the whole object `key` that holds it; an error if
    /// the object is too short for it (damaged, or not the object the span is for).
    pub fn cut(&self, key: &str, object: &Bytes) -> Result<Bytes> {
        let end = self
            .offset
            .checked_add(self.len)
            .filter(|end| *end <= object.len() as u64);
        match end {
            Some(end) => Ok(object.slice(self.offset as usize..end as usize)),
            None => Err(corrupt(key, "an entry runs past the end of its object")),
        }
    }
}

/// Builds a chunk out of entries, remembering each entry's span.
pub(crate) struct ChunkBuilder {
    buf: BytesMut,
    spans: Vec<EntrySpan>,
}

impl ChunkBuilder {
    pub fn with_capacity(bytes: usize) -> Self {
        let mut buf = BytesMut::with_capacity(bytes + MAGIC.len());
        buf.put_slice(MAGIC);
        Self {
            buf,
            spans: Vec::new(),
        }
    }

    pub fn push(&mut self, stream_id: u64, first_seq: u64, records: &[StoredRecord]) {
        let start = self.buf.len();
        self.buf.put_u32(0); // length, patched below
        self.buf.put_u32(0); // crc, patched below
        self.buf.put_u64(stream_id);
        self.buf.put_u64(first_seq);
        self.buf.put_u32(records.len() as u32);
        for record in records {
            self.buf.put_u64(record.timestamp);
            self.buf.put_u32(record.headers.len() as u32);
            for header in &record.headers {
                self.buf.put_u32(header.name.len() as u32);
                self.buf.put_slice(&header.name);
                self.buf.put_u32(header.value.len() as u32);
                self.buf.put_slice(&header.value);
            }
            self.buf.put_u32(record.body.len() as u32);
            self.buf.put_slice(&record.body);
        }
        let len = (self.buf.len() - start - 4) as u32;
        let crc = crc32fast::hash(&self.buf[start + 8..]);
        self.buf[start..start + 4].copy_from_slice(&len.to_be_bytes());
        self.buf[start + 4..start + 8].copy_from_slice(&crc.to_be_bytes());
        self.spans.push(EntrySpan {
            offset: start as u64,
            len: (self.buf.len() - start) as u64,
        });
    }

    /// Appends an entry already encoded (as cut out of another chunk by its span).
    pub fn push_encoded(&mut self, entry: &[u8]) -> EntrySpan {
        let span = EntrySpan {
            offset: self.buf.len() as u64,
            len: entry.len() as u64,
        };
        self.buf.put_slice(entry);
        self.spans.push(span);
        span
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    pub fn finish(self) -> (Bytes, Vec<EntrySpan>) {
        (self.buf.freeze(), self.spans)
    }
}

/// One decoded entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub stream_id: u64,
    pub kind: EntryKind,
    pub records: Vec<SequencedRecord>,
    pub span: EntrySpan,
}

/// Decodes every entry of a whole chunk, verifying each CRC.
pub(crate) fn decode_chunk(key: &str, chunk: &Bytes) -> Result<Vec<Entry>> {
    if chunk.len() < MAGIC.len() || &chunk[..MAGIC.len()] != MAGIC {
        return Err(corrupt(key, "not a streamgate WAL chunk"));
    }
    let mut entries = Vec::new();
    let mut offset = MAGIC.len();
    while offset < chunk.len() {
        if chunk.len() - offset < 4 {
            return Err(corrupt(key, "truncated entry header"));
        }
        let len = u32::from_be_bytes(chunk[offset..offset + 4].try_into().unwrap()) as usize;
        let end = offset + 4 + len;
        if end > chunk.len() {
            return Err(corrupt(key, "entry runs past the end of the chunk"));
        }
        let span = EntrySpan {
            offset: offset as u64,
            len: (end - offset) as u64,
        };
        let (stream_id, records) = decode_entry(key, chunk.slice(offset..end))?;
        let kind = match stream_id & GROUP_OPS {
            0 => EntryKind::Records,
            _ => EntryKind::GroupOps,
        };
        entries.push(Entry {
            stream_id: stream_id & !GROUP_OPS,
            kind,
            records,
            span,
        });
        offset = end;
    }
    Ok(entries)
}

/// Decodes one entry given exactly its bytes (as cut by its [`EntrySpan`]); the stream
/// id as written (with [`GROUP_OPS`] for an entry of group ops).
pub(crate) fn decode_entry(key: &str, mut entry: Bytes) -> Result<(u64, Vec<SequencedRecord>)> {
    if entry.len() < 8 + ENTRY_FIXED {
        return Err(corrupt(key, "entry too short"));
    }
    let len = entry.get_u32() as usize;
    if len != entry.len() {
        return Err(corrupt(key, "entry length mismatch"));
    }
    let crc = entry.get_u32();
    if crc32fast::hash(&entry) != crc {
        return Err(corrupt(key, "entry checksum mismatch"));
    }
    let stream_id = entry.get_u64();
    let first_seq = entry.get_u64();
    let count = entry.get_u32() as usize;
    let mut records = Vec::with_capacity(count.min(1000));
    for i in 0..count {
        let timestamp = take_u64(key, &mut entry)?;
        let header_count = take_u32(key, &mut entry)? as usize;
        let mut headers = Vec::with_capacity(header_count.min(64));
        for _ in 0..header_count {
            let name = take_bytes(key, &mut entry)?;
            let value = take_bytes(key, &mut entry)?;
            headers.push(Header { name, value });
        }
        let body = take_bytes(key, &mut entry)?;
        records.push(SequencedRecord {
            seq_num: first_seq + i as u64,
            timestamp,
            headers,
            body,
        });
    }
    if entry.has_remaining() {
        return Err(corrupt(key, "trailing bytes in entry"));
    }
    Ok((stream_id, records))
}

fn take_u64(key: &str, buf: &mut Bytes) -> Result<u64> {
    if buf.remaining() < 8 {
        return Err(corrupt(key, "truncated record"));
    }
    Ok(buf.get_u64())
}

fn take_u32(key: &str, buf: &mut Bytes) -> Result<u32> {
    if buf.remaining() < 4 {
        return Err(corrupt(key, "truncated record"));
    }
    Ok(buf.get_u32())
}

fn take_bytes(key: &str, buf: &mut Bytes) -> Result<Bytes> {
    let len = take_u32(key, buf)? as usize;
    if buf.remaining() < len {
        return Err(corrupt(key, "truncated record"));
    }
    Ok(buf.split_to(len))
}

fn corrupt(key: &str, what: &str) -> Error {
    Error::storage(format!("WAL chunk `{key}` is corrupt: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(ts: u64, headers: &[(&str, &str)], body: &str) -> StoredRecord {
        StoredRecord {
            timestamp: ts,
            headers: headers
                .iter()
                .map(|(n, v)| Header {
                    name: Bytes::copy_from_slice(n.as_bytes()),
                    value: Bytes::copy_from_slice(v.as_bytes()),
                })
                .collect(),
            body: Bytes::copy_from_slice(body.as_bytes()),
        }
    }

    #[test]
    fn chunks_round_trip_and_entries_decode_by_span() {
        let mut builder = ChunkBuilder::with_capacity(128);
        builder.push(7, 0, &[stored(10, &[("k", "v")], "a"), stored(11, &[], "")]);
        builder.push(9, 42, &[stored(12, &[("", "fence"), ("x", "")], "tok")]);
        let (chunk, spans) = builder.finish();

        let entries = decode_chunk("c", &chunk).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].stream_id, 7);
        assert_eq!(entries[0].records[1].seq_num, 1);
        assert_eq!(
            entries[0].records[0].headers[0].value,
            Bytes::from_static(b"v")
        );
        assert_eq!(entries[1].records[0].seq_num, 42);
        assert_eq!(entries[1].records[0].body, Bytes::from_static(b"tok"));
        assert_eq!(entries.iter().map(|e| e.span).collect::<Vec<_>>(), spans);

        let span = spans[1];
        let (id, records) = decode_entry("c", span.cut("c", &chunk).unwrap()).unwrap();
        assert_eq!(id, 9);
        assert_eq!(records, entries[1].records);
    }

    #[test]
    fn corruption_is_detected() {
        let mut builder = ChunkBuilder::with_capacity(64);
        builder.push(1, 0, &[stored(1, &[], "hello")]);
        let (chunk, _) = builder.finish();
        for i in MAGIC.len()..chunk.len() {
            let mut bad = chunk.to_vec();
            bad[i] ^= 0x40;
            assert!(decode_chunk("c", &Bytes::from(bad)).is_err(), "flip at {i}");
        }
        assert!(decode_chunk("c", &chunk.slice(..chunk.len() - 1)).is_err());
        assert!(decode_chunk("c", &Bytes::from_static(b"garbage!")).is_err());
    }

    #[test]
    fn keys_sort_by_epoch_then_number() {
        assert!(chunk_key(2, 0) > chunk_key(1, 99));
        assert!(chunk_key(1, 10) > chunk_key(1, 9));
        assert_eq!(parse_chunk_key(&chunk_key(3, 17)), Some((3, 17)));
        assert_eq!(parse_chunk_key("wal/x/1"), None);
        assert_eq!(parse_chunk_key("segments/1"), None);
    }
}
