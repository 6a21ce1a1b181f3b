//! Segments: one stream's records, moved out of the write-ahead log by compaction into
//! objects of their own. A segment object has the WAL chunk format (magic, then entries
//! with their own CRCs), so the bytes of each entry are copied verbatim from the chunk
//! and read back the same way. Its index row in the metadata store maps the sequence and
//! timestamp range to the object and each entry's byte range.

use bytes::{Buf, BufMut};

use crate::error::{Error, Result};
use crate::stream::SequencerState;
use crate::wal::EntrySpan;

/// A stream's segment is cut once it holds this many bytes; reads of history fetch and
/// cache whole segments, so this is also the unit of a cold read.
pub const MAX_SEGMENT_BYTES: usize = 8 * 1024 * 1024;

/// A segment is also cut at this many entries (appended batches), so its index row's
/// entry table, which every lookup of it reads, stays small (160 KiB) even for streams
/// of tiny batches.
pub const MAX_SEGMENT_ENTRIES: usize = 4096;

/// Object-store key of the segment of `stream_id` that starts at `start_seq`, written by
/// the node of `epoch`. The writer is part of the key so that no node can overwrite a
/// segment another node wrote (a node that lost the stream, compacting late); a round
/// redone by the same node after an uncertain commit rewrites the same object.
pub fn segment_key(stream_id: u64, start_seq: u64, epoch: u64) -> String {
    format!("{}{start_seq:020}-{epoch:020}", segment_prefix(stream_id))
}

/// The stream and first sequence number of a segment key (of [`segment_key`], or of
/// the form without a writer that streamgate used before clusters).
pub fn parse_segment_key(key: &str) -> Option<(u64, u64)> {
    let (stream_id, rest) = key.strip_prefix("segments/")?.split_once('/')?;
    let start_seq = rest.split_once('-').map_or(rest, |(start, _)| start);
    Some((stream_id.parse().ok()?, start_seq.parse().ok()?))
}

/// The folder of a stream's segments.
pub fn segment_prefix(stream_id: u64) -> String {
    format!("segments/{stream_id:020}/")
}

/// Object-store key of a segment that merges a stream's segments from `start_seq` up to
/// `end_seq` (see `segment_merge`), written by the node of `epoch`. The end makes each
/// merge's object new, so no reader or cache ever sees one key with two contents.
pub fn merged_segment_key(stream_id: u64, start_seq: u64, end_seq: u64, epoch: u64) -> String {
    format!("{}-{end_seq:020}", segment_key(stream_id, start_seq, epoch))
}

/// Whether `key` is a [`merged_segment_key`] (its records were compacted at several
/// times), not one compaction round's segment.
pub fn is_merged_segment_key(key: &str) -> bool {
    key.rsplit('/')
        .next()
        .is_some_and(|name| name.matches('-').count() == 2)
}

/// One WAL entry (one appended batch) inside a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentEntry {
    pub start_seq: u64,
    pub end_seq: u64,
    pub last_timestamp: u64,
    pub span: EntrySpan,
}

/// A segment's index row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentRecord {
    pub stream_id: u64,
    pub key: String,
    /// When compaction wrote it (ms since the epoch): no later than one compaction
    /// interval (plus any backlog) after its records arrived. Retention ages records by
    /// this, not by their timestamps, which clients may set to anything.
    pub written_at_ms: u64,
    /// In sequence order, contiguous: the segment covers `entries[0].start_seq` up to
    /// the last entry's `end_seq`.
    pub entries: Vec<SegmentEntry>,
}

const ENTRY_BYTES: usize = 8 * 5;

impl SegmentRecord {
    pub fn start_seq(&self) -> u64 {
        self.entries[0].start_seq
    }

    pub fn end_seq(&self) -> u64 {
        self.entries[self.entries.len() - 1].end_seq
    }

    pub fn last_timestamp(&self) -> u64 {
        self.entries[self.entries.len() - 1].last_timestamp
    }

    /// The bytes of the segment's entries: what it stores (for the storage gauges).
    pub fn stored_bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.span.len).sum()
    }

    /// The entry table as stored in the index row.
    pub fn encode_entries(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.entries.len() * ENTRY_BYTES);
        for entry in &self.entries {
            out.put_u64(entry.start_seq);
            out.put_u64(entry.end_seq);
            out.put_u64(entry.last_timestamp);
            out.put_u64(entry.span.offset);
            out.put_u64(entry.span.len);
        }
        out
    }

    pub fn decode_entries(key: &str, mut bytes: &[u8]) -> Result<Vec<SegmentEntry>> {
        if bytes.is_empty() || !bytes.len().is_multiple_of(ENTRY_BYTES) {
            return Err(Error::storage(format!(
                "the index of segment `{key}` is corrupt ({} bytes)",
                bytes.len()
            )));
        }
        let mut entries = Vec::with_capacity(bytes.len() / ENTRY_BYTES);
        while bytes.has_remaining() {
            entries.push(SegmentEntry {
                start_seq: bytes.get_u64(),
                end_seq: bytes.get_u64(),
                last_timestamp: bytes.get_u64(),
                span: EntrySpan {
                    offset: bytes.get_u64(),
                    len: bytes.get_u64(),
                },
            });
        }
        Ok(entries)
    }
}

/// What a stream looked like right after the last record that is in a segment: recovery
/// starts from here and replays only the WAL chunks after the compacted ones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamCheckpoint {
    pub next_seq: u64,
    pub last_timestamp: u64,
    pub fencing_token: String,
    pub trim_point: u64,
    /// The stream's consumer groups after the group ops before `next_group_op`.
    pub groups: std::sync::Arc<crate::groups::Groups>,
    pub next_group_op: u64,
}

impl From<&StreamCheckpoint> for SequencerState {
    fn from(checkpoint: &StreamCheckpoint) -> Self {
        SequencerState {
            next_seq: checkpoint.next_seq,
            last_timestamp: checkpoint.last_timestamp,
            fencing_token: checkpoint.fencing_token.clone(),
            trim_point: checkpoint.trim_point,
            groups: checkpoint.groups.clone(),
            next_group_op: checkpoint.next_group_op,
        }
    }
}

impl From<&SequencerState> for StreamCheckpoint {
    fn from(state: &SequencerState) -> Self {
        StreamCheckpoint {
            next_seq: state.next_seq,
            last_timestamp: state.last_timestamp,
            fencing_token: state.fencing_token.clone(),
            trim_point: state.trim_point,
            groups: state.groups.clone(),
            next_group_op: state.next_group_op,
        }
    }
}

/// The outcome of one compaction round, committed in one metadata transaction: the new
/// segments, each touched stream's checkpoint, how far each epoch's log is now covered
/// (recovery starts there), and the WAL chunks that became obsolete.
#[derive(Debug, Clone, Default)]
pub struct CompactionCommit {
    pub segments: Vec<SegmentRecord>,
    pub checkpoints: Vec<(u64, StreamCheckpoint)>,
    /// `(epoch, n)`: chunks numbered below `n` in `epoch` are compacted.
    pub wal_watermarks: Vec<(u64, u64)>,
    pub obsolete_objects: Vec<String>,
    /// The node committing, if it commits for streams it holds: the commit is refused
    /// (and changes nothing) once any of that node's leases were taken.
    pub committed_by: Option<u64>,
    /// Live streams with records in the compacted chunks that the committing node does
    /// not serve: the commit is refused if any of them still has its records in that
    /// node's log (they would be lost with the chunks).
    pub skipped_streams: Vec<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_tables_round_trip_and_corruption_is_caught() {
        let record = SegmentRecord {
            stream_id: 7,
            key: segment_key(7, 10, 3),
            written_at_ms: 1,
            entries: vec![
                SegmentEntry {
                    start_seq: 10,
                    end_seq: 12,
                    last_timestamp: 5,
                    span: EntrySpan { offset: 8, len: 40 },
                },
                SegmentEntry {
                    start_seq: 12,
                    end_seq: 20,
                    last_timestamp: u64::MAX,
                    span: EntrySpan {
                        offset: 48,
                        len: 90,
                    },
                },
            ],
        };
        let table = record.encode_entries();
        assert_eq!(
            SegmentRecord::decode_entries(&record.key, &table).unwrap(),
            record.entries
        );
        assert_eq!((record.start_seq(), record.end_seq()), (10, 20));
        assert_eq!(record.last_timestamp(), u64::MAX);
        assert!(SegmentRecord::decode_entries("k", &table[..table.len() - 1]).is_err());
        assert!(SegmentRecord::decode_entries("k", &[]).is_err());
        assert_eq!(
            segment_key(7, 10, 3),
            "segments/00000000000000000007/00000000000000000010-00000000000000000003"
        );
        assert_eq!(parse_segment_key(&segment_key(7, 10, 3)), Some((7, 10)));
        // Keys from before clusters name no writer.
        assert_eq!(
            parse_segment_key("segments/00000000000000000007/00000000000000000010"),
            Some((7, 10))
        );
        assert_eq!(parse_segment_key("wal/1/2"), None);
        let merged = merged_segment_key(7, 10, 30, 3);
        assert_eq!(parse_segment_key(&merged), Some((7, 10)));
        assert!(is_merged_segment_key(&merged));
        assert!(!is_merged_segment_key(&segment_key(7, 10, 3)));
    }
}
