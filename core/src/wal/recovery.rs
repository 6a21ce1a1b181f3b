//! Replaying write-ahead logs: how a node taking streams over rebuilds each stream's
//! tail from its checkpoint (where its segments end) and the batches after it in the
//! log of the node that sequenced it before.

use std::collections::HashMap;

use futures::StreamExt;

use crate::error::{Error, Result};
use crate::record::SequencedRecord;
use crate::storage::{MetadataStore, ObjectStore};
use crate::stream::SequencerState;
use crate::wal::{chunk_key, decode_chunk, parse_chunk_key, EntryKind};

/// A crash can lose or tear only the chunks that were being written: at most this many
/// (the largest `--flush-in-flight` accepted) end an epoch. A missing or unreadable
/// chunk with more after it is corruption, not a crash.
pub const MAX_TORN_TAIL: usize = 64;

/// Chunks read ahead while a log is replayed: what a replay holds in memory besides the
/// batches it keeps is this many chunks of the node that wrote them (each cut at its
/// `--flush-max-bytes`, 8 MiB by default, plus the batch that crossed it).
const REPLAY_READ_AHEAD: usize = 8;

/// One stream being rebuilt: its state at its checkpoint, then after each batch the
/// logs hold past it (records, and consumer-group ops), in log order.
#[derive(Debug, Default)]
pub(crate) struct StreamReplay {
    pub state: SequencerState,
    pub batches: Vec<(EntryKind, Vec<SequencedRecord>)>,
}

/// The epochs (in order) whose logs hold records of streams written before clusters:
/// those with chunks but no node.
pub(crate) async fn legacy_epochs(
    metadata: &dyn MetadataStore,
    objects: &dyn ObjectStore,
) -> Result<Vec<u64>> {
    let nodes: std::collections::HashSet<u64> = metadata
        .cluster_nodes()
        .await?
        .into_iter()
        .map(|n| n.epoch)
        .collect();
    let mut epochs: Vec<u64> = objects
        .list("wal/")
        .await?
        .iter()
        .filter_map(|key| parse_chunk_key(key).map(|(epoch, _)| epoch))
        .filter(|epoch| !nodes.contains(epoch))
        .collect();
    epochs.sort_unstable();
    epochs.dedup();
    Ok(epochs)
}

/// The folder of one epoch's chunks.
pub(crate) fn epoch_prefix(epoch: u64) -> String {
    let key = chunk_key(epoch, 0);
    key[..key.rfind('/').map_or(key.len(), |i| i + 1)].to_owned()
}

/// Replays the logs of `epochs`, in order, for the streams in `replays`. Within each
/// epoch, chunks are replayed from its watermark up to the first missing one: chunks
/// after a gap were never acknowledged (see the writer). Entries of other streams are
/// skipped, as are entries already below a stream's checkpoint.
pub(crate) async fn replay_logs(
    metadata: &dyn MetadataStore,
    objects: &dyn ObjectStore,
    epochs: &[u64],
    replays: &mut HashMap<u64, StreamReplay>,
) -> Result<usize> {
    let watermarks = metadata.wal_watermarks().await?;
    let mut chunks_replayed = 0;
    for epoch in epochs {
        let mut numbers: Vec<u64> = objects
            .list(&epoch_prefix(*epoch))
            .await?
            .iter()
            .filter_map(|key| parse_chunk_key(key))
            .filter(|(e, _)| e == epoch)
            .map(|(_, number)| number)
            .collect();
        numbers.sort_unstable();
        let watermark = watermarks.get(epoch).copied().unwrap_or(0);
        // Chunks below the watermark are compacted, waiting to be deleted.
        numbers.retain(|n| *n >= watermark);
        chunks_replayed += replay_epoch(objects, *epoch, watermark, &numbers, replays).await?;
    }
    Ok(chunks_replayed)
}

async fn replay_epoch(
    objects: &dyn ObjectStore,
    epoch: u64,
    watermark: u64,
    numbers: &[u64],
    replays: &mut HashMap<u64, StreamReplay>,
) -> Result<usize> {
    // The chunks present from the watermark on without a gap are read a few at a time
    // ahead of the one being replayed: from S3 a log of many small chunks would
    // otherwise cost a round trip per chunk, one after another, while requests for
    // the streams being taken over wait.
    let unbroken = (watermark..)
        .zip(numbers.iter())
        .take_while(|(expected, number)| *number == expected)
        .count() as u64;
    let mut reads = futures::stream::iter(watermark..watermark + unbroken)
        .map(|number| async move { objects.get(&chunk_key(epoch, number)).await })
        .buffered(REPLAY_READ_AHEAD);
    let mut replayed = 0;
    for (expected, number) in (watermark..).zip(numbers.iter()) {
        let key = chunk_key(epoch, expected);
        // A chunk that is missing, or reads as absent (torn), was being written when its
        // node died, so neither it nor any chunk after it was acknowledged: it ends this
        // epoch's log. Only a few chunks are ever written at once, so many complete ones
        // after it mean a damaged log, not a crash.
        let chunk = if *number == expected {
            reads.next().await.transpose()?.flatten()
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
                     from a backup"
                )));
            }
            if after > 0 {
                tracing::warn!(
                    epoch,
                    ignored = after,
                    "a WAL chunk lost to a crash ends this epoch; ignoring the chunks after it"
                );
            }
            break;
        };
        for entry in decode_chunk(&key, &chunk)? {
            let Some(replay) = replays.get_mut(&entry.stream_id) else {
                continue; // another stream, or a deleted one
            };
            let first = entry.records[0].seq_num;
            let end = first + entry.records.len() as u64;
            let (next, what) = match entry.kind {
                EntryKind::Records => (replay.state.next_seq, "records"),
                EntryKind::GroupOps => (replay.state.next_group_op, "consumer group ops"),
            };
            if end <= next {
                continue; // already in the checkpoint
            }
            if first != next {
                return Err(Error::storage(format!(
                    "WAL chunk `{key}` continues the {what} of stream {} at {first}, but \
                     they end at {next}; refusing to serve from an inconsistent log",
                    entry.stream_id
                )));
            }
            match entry.kind {
                EntryKind::Records => replay.state.replay(&entry.records),
                EntryKind::GroupOps => replay.state.replay_group_ops(&entry.records)?,
            }
            replay.batches.push((entry.kind, entry.records));
        }
        replayed += 1;
    }
    Ok(replayed)
}

/// Keys of the chunks of `epochs` (for deleting a log no stream needs any more).
pub(crate) async fn chunks_of(objects: &dyn ObjectStore, epochs: &[u64]) -> Result<Vec<String>> {
    let mut keys = Vec::new();
    let wanted: std::collections::BTreeSet<u64> = epochs.iter().copied().collect();
    for epoch in epochs {
        keys.extend(
            objects
                .list(&epoch_prefix(*epoch))
                .await?
                .into_iter()
                .filter(|key| parse_chunk_key(key).is_some_and(|(e, _)| wanted.contains(&e))),
        );
    }
    Ok(keys)
}
