//! Recovery: rebuilds every live stream at start-up from its checkpoint (where its
//! segments end) and the write-ahead log chunks after the compacted ones.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::compaction::{CompactionState, EpochLog};
use crate::error::{Error, Result};
use crate::record::StreamPosition;
use crate::registry::StreamKey;
use crate::storage::{MetadataStore, ObjectStore};
use crate::stream::{BatchLocation, SequencerState, Stored, StreamState};
use crate::wal::{chunk_key, decode_chunk, parse_chunk_key};

/// A crash can lose or tear only the chunks that were being written: at most this many
/// (the largest `--flush-in-flight` accepted) end an epoch. A missing or unreadable
/// chunk with more after it is corruption, not a crash.
pub const MAX_TORN_TAIL: usize = 64;

/// Rebuilds every live stream from its checkpoint (where its segments end) and the WAL
/// chunks after the compacted ones: its tail, last timestamp, fencing token, trim point,
/// and where each batch still in the WAL lies. Within each epoch, chunks are replayed in
/// order from the watermark up to the first missing one; chunks after a gap were never
/// acknowledged (see the writer).
pub(crate) async fn recover(
    metadata: &dyn MetadataStore,
    objects: &dyn ObjectStore,
) -> Result<(HashMap<StreamKey, Arc<StreamState>>, CompactionState)> {
    let live = metadata.live_streams().await?;
    let checkpoints = metadata.stream_checkpoints().await?;
    let watermarks = metadata.wal_watermarks().await?;
    let mut replay: HashMap<u64, (SequencerState, Vec<BatchLocation>)> = live
        .iter()
        .map(|s| {
            let state = checkpoints.get(&s.id).map(SequencerState::from);
            (s.id, (state.unwrap_or_default(), Vec::new()))
        })
        .collect();

    let mut epochs: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for key in objects.list("wal/").await? {
        if let Some((epoch, number)) = parse_chunk_key(&key) {
            epochs.entry(epoch).or_default().push(number);
        }
    }
    let mut logs = BTreeMap::new();
    let mut chunks_replayed = 0usize;
    for (epoch, mut numbers) in epochs {
        numbers.sort_unstable();
        let watermark = watermarks.get(&epoch).copied().unwrap_or(0);
        // Chunks below the watermark are compacted, waiting to be deleted.
        numbers.retain(|n| *n >= watermark);
        let mut end = watermark;
        for (expected, number) in (watermark..).zip(numbers.iter()) {
            let key: Arc<str> = chunk_key(epoch, expected).into();
            // A chunk that is missing, or reads as absent (torn), was being written when
            // the process died, so neither it nor any chunk after it was acknowledged: it
            // ends this epoch's log. Only a few chunks are ever written at once, so many
            // complete ones after it mean a damaged log, not a crash.
            let chunk = if *number == expected {
                objects.get(&key).await?
            } else {
                None
            };
            let Some(chunk) = chunk else {
                let from_here = numbers.len() - (expected - watermark) as usize;
                let after = from_here - usize::from(*number == expected);
                if after > MAX_TORN_TAIL {
                    return Err(Error::storage(format!(
                        "WAL chunk `{key}` is missing or unreadable but {after} chunks follow it, \
                         so it was not lost to a crash: the log is corrupt; restore the data \
                         directory from a backup"
                    )));
                }
                tracing::warn!(
                    epoch,
                    ignored = after,
                    "a WAL chunk lost to a crash ends this epoch; ignoring the chunks after it"
                );
                break;
            };
            for entry in decode_chunk(&key, &chunk)? {
                let Some((sequencer, batches)) = replay.get_mut(&entry.stream_id) else {
                    continue; // a deleted stream
                };
                let first_seq = entry.records[0].seq_num;
                if first_seq != sequencer.next_seq {
                    return Err(Error::storage(format!(
                        "WAL chunk `{key}` continues stream {} at {first_seq}, but recovery \
                         expected {}; refusing to serve from an inconsistent log",
                        entry.stream_id, sequencer.next_seq
                    )));
                }
                sequencer.replay(&entry.records);
                batches.push(BatchLocation {
                    start_seq: first_seq,
                    end_seq: sequencer.next_seq,
                    last_timestamp: sequencer.last_timestamp,
                    object: key.clone(),
                    stored: Stored::WalChunk,
                    span: entry.span,
                });
            }
            chunks_replayed += 1;
            end = number + 1;
        }
        let leftovers = numbers
            .iter()
            .filter(|n| **n >= end)
            .map(|n| chunk_key(epoch, *n))
            .collect();
        logs.insert(
            epoch,
            EpochLog {
                next: watermark,
                end: Some((end, leftovers)),
            },
        );
    }
    tracing::info!(
        streams = live.len(),
        checkpoints = checkpoints.len(),
        chunks = chunks_replayed,
        "recovered streams from their checkpoints and the write-ahead log"
    );
    let streams = live
        .into_iter()
        .map(|record| {
            let (sequencer, batches) = replay.remove(&record.id).unwrap_or_default();
            let compacted = checkpoints
                .get(&record.id)
                .map(|c| StreamPosition {
                    seq_num: c.next_seq,
                    timestamp: c.last_timestamp,
                })
                .unwrap_or_default();
            let state = StreamState::new(
                record.id,
                record.name.clone(),
                record.config,
                sequencer,
                compacted,
                batches,
            );
            ((record.basin, record.name), state)
        })
        .collect();
    let compaction = CompactionState {
        checkpoints: checkpoints
            .iter()
            .map(|(id, c)| (*id, SequencerState::from(c)))
            .collect(),
        logs,
    };
    Ok((streams, compaction))
}
