//! The streams of a session's basin as its token sees them, and the translation between
//! Redis entry IDs (`<timestamp>-<seq_num>`) and stream positions that the commands
//! share: where an ID falls in a stream, where a trim puts the trim point, and reading
//! entries between two positions.

use bytes::Bytes;
use streamgate_core::names::{BasinName, StreamName};
use streamgate_core::read::{ReadLimits, ReadStart, StreamReader};
use streamgate_core::record::{SequencedRecord, StreamPosition};
use streamgate_core::{Caller, Error, Resource};

use crate::cmd::xtrim::Trim;
use crate::entry::{self, EntryId, IdArg};
use crate::reply::Reply;
use crate::session::error_reply;

pub(crate) struct Streams<'a> {
    pub caller: &'a Caller,
    pub basin: &'a BasinName,
}

/// An entry as XRANGE and XREAD reply with it: its ID and its field-value pairs.
fn entry_reply(record: &SequencedRecord) -> Result<Reply, Reply> {
    let fields = entry::decode_fields(record).map_err(Reply::Error)?;
    Ok(Reply::Array(vec![
        Reply::Bulk(EntryId::of(record).to_bytes()),
        Reply::Array(
            fields
                .into_iter()
                .flat_map(|(f, v)| [Reply::Bulk(f), Reply::Bulk(v)])
                .collect(),
        ),
    ]))
}

impl<'a> Streams<'a> {
    pub fn new(caller: &'a Caller, basin: &'a BasinName) -> Self {
        Self { caller, basin }
    }

    /// Whether the key names a stream the token may see.
    pub async fn exists(&self, key: &Bytes) -> bool {
        match crate::session::stream_name(key) {
            Ok(name) => self.caller.stream_config(self.basin, &name).await.is_ok(),
            Err(_) => false,
        }
    }

    /// A reader at `start` (clamped to the tail, and up to the first retained entry),
    /// creating the stream if the basin creates streams on read. `Ok(None)` if the
    /// stream does not exist.
    pub async fn reader(
        &self,
        name: &StreamName,
        start: ReadStart,
    ) -> Result<Option<StreamReader>, Reply> {
        match self
            .caller
            .open_reader(self.basin, name, start, true, None)
            .await
        {
            Ok(reader) => Ok(Some(reader)),
            Err(Error::NotFound(Resource::Stream(_))) => Ok(None),
            Err(err) => Err(error_reply(&err)),
        }
    }

    /// The stream's tail (the default position if it does not exist).
    pub async fn tail(&self, name: &StreamName) -> Result<StreamPosition, Reply> {
        Ok(self
            .reader(name, ReadStart::TailOffset(0))
            .await?
            .map_or_else(StreamPosition::default, |reader| reader.tail()))
    }

    /// The first sequence number at or after timestamp `ts` (the tail if none).
    async fn seq_at_timestamp(&self, name: &StreamName, ts: u64) -> Result<u64, Reply> {
        Ok(self
            .reader(name, ReadStart::Timestamp(ts))
            .await?
            .map_or(0, |r| r.position()))
    }

    /// The first sequence number whose entry ID is at least (`inclusive`) or greater
    /// than `id`. IDs order by (timestamp, seq_num), which for one stream is the order
    /// of sequence numbers; an ID that names no entry falls between entries.
    pub async fn seq_from_id(
        &self,
        name: &StreamName,
        id: IdArg,
        inclusive: bool,
    ) -> Result<u64, Reply> {
        let (ts, seq) = match id {
            IdArg::TimestampOnly(ts) => (ts, if inclusive { 0 } else { u64::MAX }),
            IdArg::Full(id) => (id.timestamp, id.seq_num),
        };
        let first_at = self.seq_at_timestamp(name, ts).await?;
        let first_after = self.seq_at_timestamp(name, ts.saturating_add(1)).await?;
        let threshold = if inclusive {
            seq
        } else {
            seq.saturating_add(1)
        };
        Ok(first_at.max(threshold).min(first_after))
    }

    /// Where a trim should put the trim point, given the stream's tail and how many
    /// records the trim's own append adds.
    pub async fn trim_point(
        &self,
        name: &StreamName,
        trim: Trim,
        tail: StreamPosition,
        appended: u64,
    ) -> Result<u64, Reply> {
        Ok(match trim {
            Trim::MaxLen(keep) => (tail.seq_num + appended).saturating_sub(keep),
            Trim::MinId(id) => self.seq_from_id(name, id, true).await?,
        })
    }

    /// Reads entries from `reader` up to `count` and below `end_seq`, without waiting.
    pub async fn read_entries(
        &self,
        reader: &mut StreamReader,
        count: u64,
        end_seq: u64,
    ) -> Result<Vec<Reply>, Reply> {
        let mut entries = Vec::new();
        while (entries.len() as u64) < count && reader.position() < end_seq && !reader.at_tail() {
            let limits = ReadLimits {
                count: Some(count - entries.len() as u64),
                ..Default::default()
            }
            .for_one_batch();
            let (batch, _) = self
                .caller
                .next_batch(reader, limits)
                .await
                .map_err(|e| error_reply(&e))?;
            if batch.records.is_empty() {
                break;
            }
            for record in batch.records.iter().take_while(|r| r.seq_num < end_seq) {
                entries.push(entry_reply(record)?);
            }
        }
        Ok(entries)
    }
}
