//! `XRANGE key start end [COUNT n]`: entries between two IDs, oldest first.

use bytes::Bytes;
use streamgate_core::read::ReadStart;

use super::parse::{arity, id, integer, syntax, upper};
use super::{Command, MAX_READ_ENTRIES};
use crate::entry::IdArg;
use crate::reply::Reply;
use crate::session::{stream_name, Session};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    Min,
    Max,
    Inclusive(IdArg),
    Exclusive(IdArg),
}

fn bound(arg: &[u8]) -> Result<Bound, String> {
    match arg {
        b"-" => Ok(Bound::Min),
        b"+" => Ok(Bound::Max),
        [b'(', rest @ ..] => Ok(Bound::Exclusive(id(rest)?)),
        other => Ok(Bound::Inclusive(id(other)?)),
    }
}

pub(crate) fn parse(args: &[Bytes]) -> Result<Command, String> {
    let n = args.len();
    if n != 4 && n != 6 {
        return Err(arity("XRANGE"));
    }
    let count = if n == 6 {
        if upper(&args[4]) != "COUNT" {
            return Err(syntax());
        }
        Some(integer(&args[5])?)
    } else {
        None
    };
    Ok(Command::XRange {
        key: args[1].clone(),
        start: bound(&args[2])?,
        end: bound(&args[3])?,
        count,
    })
}

pub(crate) async fn apply(
    session: &Session,
    key: &Bytes,
    start: Bound,
    end: Bound,
    count: Option<u64>,
) -> Result<Reply, Reply> {
    let streams = session.streams()?;
    let name = stream_name(key)?;
    let count = count.unwrap_or(MAX_READ_ENTRIES).min(MAX_READ_ENTRIES);
    let start_seq = match start {
        Bound::Min => 0,
        Bound::Max => u64::MAX,
        Bound::Inclusive(id) => streams.seq_from_id(&name, id, true).await?,
        Bound::Exclusive(id) => streams.seq_from_id(&name, id, false).await?,
    };
    let end_seq = match end {
        Bound::Max => u64::MAX,
        Bound::Min => 0,
        Bound::Inclusive(id) => streams.seq_from_id(&name, id, false).await?,
        Bound::Exclusive(id) => streams.seq_from_id(&name, id, true).await?,
    };
    let Some(mut reader) = streams.reader(&name, ReadStart::SeqNum(start_seq)).await? else {
        return Ok(Reply::Array(vec![]));
    };
    Ok(Reply::Array(
        streams.read_entries(&mut reader, count, end_seq).await?,
    ))
}
