//! `XRANGE key start end [COUNT n]`: entries between two IDs, oldest first, and
//! `XREVRANGE key end start [COUNT n]`: the same, newest first.

use bytes::Bytes;
use streamgate_core::read::ReadStart;

use super::parse::{arity, id, syntax, upper};
use super::{Command, MAX_READ_ENTRIES};
use crate::entry::IdArg;
use crate::reply::Reply;
use crate::session::{stream_name, Session};
use crate::streams::Streams;
use streamgate_core::names::StreamName;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    Min,
    Max,
    Inclusive(IdArg),
    Exclusive(IdArg),
}

pub(crate) fn bound(arg: &[u8]) -> Result<Bound, String> {
    match arg {
        b"-" => Ok(Bound::Min),
        b"+" => Ok(Bound::Max),
        [b'(', rest @ ..] => Ok(Bound::Exclusive(id(rest)?)),
        other => Ok(Bound::Inclusive(id(other)?)),
    }
}

/// Parses XRANGE and XREVRANGE (whose bounds come end first).
pub(crate) fn parse(args: &[Bytes]) -> Result<Command, String> {
    let n = args.len();
    let reversed = upper(&args[0]) == "XREVRANGE";
    if n < 4 {
        return Err(arity(if reversed { "XREVRANGE" } else { "XRANGE" }));
    }
    let mut count = None;
    let mut i = 4;
    while i < n {
        if upper(&args[i]) != "COUNT" || i + 1 == n {
            return Err(syntax());
        }
        count = Some(super::parse::count(&args[i + 1])?);
        i += 2;
    }
    let key = args[1].clone();
    Ok(if reversed {
        Command::XRevRange {
            key,
            end: bound(&args[2])?,
            start: bound(&args[3])?,
            count,
        }
    } else {
        Command::XRange {
            key,
            start: bound(&args[2])?,
            end: bound(&args[3])?,
            count,
        }
    })
}

/// The positions `[start, end)` a pair of bounds covers in the stream.
async fn positions(
    streams: &Streams<'_>,
    name: &StreamName,
    start: Bound,
    end: Bound,
) -> Result<(u64, u64), Reply> {
    let start_seq = match start {
        Bound::Min => 0,
        Bound::Max => u64::MAX,
        Bound::Inclusive(id) => streams.seq_from_id(name, id, true).await?,
        Bound::Exclusive(id) => streams.seq_from_id(name, id, false).await?,
    };
    let end_seq = match end {
        Bound::Max => u64::MAX,
        Bound::Min => 0,
        Bound::Inclusive(id) => streams.seq_from_id(name, id, false).await?,
        Bound::Exclusive(id) => streams.seq_from_id(name, id, true).await?,
    };
    Ok((start_seq, end_seq))
}

/// Reads the entries between the bounds: the first `count` of them, or with `newest`
/// the last `count`, newest first. `COUNT 0` is a null reply, as in Redis.
pub(crate) async fn apply(
    session: &Session,
    key: &Bytes,
    (start, end): (Bound, Bound),
    count: Option<u64>,
    newest: bool,
) -> Result<Reply, Reply> {
    let streams = session.streams()?;
    let name = stream_name(key)?;
    if count == Some(0) {
        return Ok(match streams.exists(key).await {
            true => Reply::NullArray,
            false => Reply::Array(vec![]),
        });
    }
    let count = count.unwrap_or(MAX_READ_ENTRIES).min(MAX_READ_ENTRIES);
    let (mut start_seq, mut end_seq) = positions(&streams, &name, start, end).await?;
    if newest {
        end_seq = end_seq.min(streams.tail(&name).await?.seq_num);
        start_seq = start_seq.max(end_seq.saturating_sub(count));
    }
    let mut entries = read_window(&streams, &name, start_seq, count, end_seq).await?;
    if newest {
        // A reply cut short by its byte bound must keep the newest entries: read again
        // nearer the end until what is read reaches it (each pass reads fewer).
        while !entries.is_empty() && (entries.len() as u64) < end_seq.saturating_sub(start_seq) {
            start_seq = end_seq - entries.len() as u64;
            entries = read_window(&streams, &name, start_seq, count, end_seq).await?;
        }
        entries.reverse();
    }
    Ok(Reply::Array(entries))
}

/// Up to `count` entries from `start_seq` to before `end_seq`.
async fn read_window(
    streams: &crate::streams::Streams<'_>,
    name: &streamgate_core::names::StreamName,
    start_seq: u64,
    count: u64,
    end_seq: u64,
) -> Result<Vec<Reply>, Reply> {
    let Some(mut reader) = streams.reader(name, ReadStart::SeqNum(start_seq)).await? else {
        return Ok(Vec::new());
    };
    streams.read_entries(&mut reader, count, end_seq).await
}
