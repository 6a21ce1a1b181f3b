//! The chunks of this node's log that the writer has released (durable, in order),
//! as compaction sees them: how many, and which streams each one holds.
//!
//! Knowing a chunk's streams lets compaction take a chunk whose streams are all gone
//! from this node (deleted, or handed to another node) without reading it. A stream
//! written at full speed and then deleted (`s2 bench` makes a temporary one per run)
//! would otherwise have gigabytes of chunks read back and decoded only to be thrown
//! away, with the appends of every other stream waiting behind those reads for the disk.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::watch;

/// At most this many chunks' streams are kept (a few MiB): should compaction fall this
/// far behind, the chunks released meanwhile are read as any chunk is.
const MAX_CHUNKS_KNOWN: usize = 1 << 16;

type StreamsByChunk = Arc<Mutex<BTreeMap<u64, Box<[u64]>>>>;

/// The writer's side.
pub(crate) struct ChunkRelease {
    count: watch::Sender<u64>,
    streams: StreamsByChunk,
}

/// Compaction's side.
pub(crate) struct ReleasedChunks {
    count: watch::Receiver<u64>,
    streams: StreamsByChunk,
}

pub(crate) fn channel() -> (ChunkRelease, ReleasedChunks) {
    let (count, count_rx) = watch::channel(0);
    let streams = StreamsByChunk::default();
    (
        ChunkRelease {
            count,
            streams: streams.clone(),
        },
        ReleasedChunks {
            count: count_rx,
            streams,
        },
    )
}

impl ChunkRelease {
    /// Releases the next chunk (chunks are released in the order of their numbers,
    /// from 0), which holds entries of `streams`.
    pub fn release(&self, mut streams: Vec<u64>) {
        streams.sort_unstable();
        streams.dedup();
        let number = *self.count.borrow();
        {
            let mut known = self.streams.lock();
            if known.len() < MAX_CHUNKS_KNOWN {
                known.insert(number, streams.into_boxed_slice());
            }
        }
        self.count.send_modify(|count| *count += 1);
    }
}

impl ReleasedChunks {
    /// How many chunks are released: those numbered below.
    pub fn count(&self) -> u64 {
        *self.count.borrow()
    }

    /// The streams chunk `number` holds entries of, if known.
    pub fn streams_of(&self, number: u64) -> Option<Box<[u64]>> {
        self.streams.lock().get(&number).cloned()
    }

    /// Compaction is done with the chunks numbered below `number`.
    pub fn forget_below(&self, number: u64) {
        let mut known = self.streams.lock();
        *known = known.split_off(&number);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_chunk_is_known_by_its_number_until_forgotten() {
        let (release, released) = channel();
        release.release(vec![7, 3, 7]);
        release.release(vec![]);
        release.release(vec![5]);
        assert_eq!(released.count(), 3);
        assert_eq!(released.streams_of(0).as_deref(), Some(&[3, 7][..]));
        assert_eq!(released.streams_of(1).as_deref(), Some(&[][..]));
        assert_eq!(released.streams_of(3), None, "not released yet");
        released.forget_below(2);
        assert_eq!(released.streams_of(1), None);
        assert_eq!(released.streams_of(2).as_deref(), Some(&[5][..]));
    }

    #[test]
    fn past_the_bound_chunks_are_counted_but_not_known() {
        let (release, released) = channel();
        for _ in 0..MAX_CHUNKS_KNOWN + 1 {
            release.release(vec![1]);
        }
        let last = MAX_CHUNKS_KNOWN as u64;
        assert_eq!(released.count(), last + 1);
        assert!(released.streams_of(last - 1).is_some());
        assert_eq!(released.streams_of(last), None);
        // Room again once compaction is past the first ones.
        released.forget_below(1);
        release.release(vec![2]);
        assert_eq!(released.streams_of(last + 1).as_deref(), Some(&[2][..]));
    }
}
