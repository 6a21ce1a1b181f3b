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

/// The most entries one read command replies with, in metered bytes: `COUNT` allows
/// 10,000 entries, and of 1 MiB each they would be 10 GiB held at once.
const MAX_REPLY_BYTES: u64 = 16 * 1024 * 1024;

pub(crate) struct Streams<'a> {
    pub caller: &'a Caller,
    pub basin: &'a BasinName,
}

/// An entry as XRANGE and XREAD reply with it: its ID and its field-value pairs.
pub(crate) fn entry_reply(record: &SequencedRecord) -> Result<Reply, Reply> {
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

    /// After `StreamMoved` from a wait: every reader whose stream was handed to another
    /// node goes on from where it was, at the new owner.
    pub async fn follow_moves<'r>(
        &self,
        readers: impl Iterator<Item = (&'r StreamName, &'r mut StreamReader)>,
    ) -> Result<(), Reply> {
        for (name, reader) in readers.filter(|(_, reader)| reader.has_moved()) {
            self.caller
                .follow_move(reader, self.basin, name)
                .await
                .map_err(|err| error_reply(&err))?;
        }
        Ok(())
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
        self.read_records(reader, count, end_seq)
            .await?
            .iter()
            .map(entry_reply)
            .collect()
    }

    /// The records `read_entries` replies with: at most `count`, and no more than
    /// `MAX_REPLY_BYTES` of them (at least one), however large a client asks for.
    pub async fn read_records(
        &self,
        reader: &mut StreamReader,
        count: u64,
        end_seq: u64,
    ) -> Result<Vec<SequencedRecord>, Reply> {
        let mut records = Vec::new();
        let mut bytes = 0u64;
        while (records.len() as u64) < count
            && bytes < MAX_REPLY_BYTES
            && reader.position() < end_seq
            && !reader.at_tail()
        {
            let limits = ReadLimits {
                count: Some(count - records.len() as u64),
                bytes: Some(MAX_REPLY_BYTES - bytes),
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
            for record in batch
                .records
                .into_iter()
                .take_while(|r| r.seq_num < end_seq)
            {
                bytes += record.metered_size();
                records.push(record);
            }
        }
        Ok(records)
    }

    /// The records at these positions that the stream still holds (ascending positions
    /// in, by position out), read in as few runs as they allow.
    pub async fn records_at(
        &self,
        name: &StreamName,
        positions: &[u64],
    ) -> Result<std::collections::BTreeMap<u64, SequencedRecord>, Reply> {
        let mut found = std::collections::BTreeMap::new();
        let mut rest = positions;
        while let Some(&first) = rest.first() {
            let Some(mut reader) = self.reader(name, ReadStart::SeqNum(first)).await? else {
                break;
            };
            if reader.position() > first {
                // Trimmed away: those positions are gone.
                let gone = rest.partition_point(|p| *p < reader.position());
                rest = &rest[gone..];
                continue;
            }
            // One run: up to the last wanted position within a batch's reach.
            let reach = rest.partition_point(|p| *p < first + 1000);
            let last = rest[reach - 1];
            for record in self
                .read_records(&mut reader, last - first + 1, last + 1)
                .await?
            {
                if rest[..reach].binary_search(&record.seq_num).is_ok() {
                    found.insert(record.seq_num, record);
                }
            }
            rest = &rest[reach..];
        }
        Ok(found)
    }
}
