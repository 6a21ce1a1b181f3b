//! `XTRIM key MAXLEN|MINID ~ threshold`, and the trim clause XADD shares. A trim is a
//! trim command record appended to the stream: entries below the new trim point stop
//! being readable at once and are removed in the background.

use bytes::Bytes;
use streamgate_core::read::ReadStart;
use streamgate_core::record::{AppendInput, AppendRecord, Header};

use super::parse::{arity, id, integer, syntax, upper};
use super::Command;
use crate::entry::IdArg;
use crate::reply::Reply;
use crate::session::{error_reply, stream_name, Session};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trim {
    /// `MAXLEN ~ n`: keep about the last n entries.
    MaxLen(u64),
    /// `MINID ~ id`: drop entries before id.
    MinId(IdArg),
}

/// Parses `MAXLEN|MINID [~|=] threshold [LIMIT n]` at `args[i..]`; returns the trim and
/// how many arguments it took.
pub(crate) fn parse_trim(args: &[Bytes], i: usize) -> Result<(Trim, usize), String> {
    let kind = upper(&args[i]);
    let mut j = i + 1;
    let approximate = match args.get(j).map(|a| a.as_ref()) {
        Some(b"~") => {
            j += 1;
            true
        }
        Some(b"=") => {
            j += 1;
            false
        }
        _ => false,
    };
    let threshold = args.get(j).ok_or_else(syntax)?;
    j += 1;
    if args.get(j).is_some_and(|a| upper(a) == "LIMIT") {
        return Err("ERR LIMIT is not supported; only approximate trimming (~) is".into());
    }
    if !approximate {
        return Err("ERR only approximate trimming is supported: use MAXLEN ~ or MINID ~".into());
    }
    let trim = match kind.as_str() {
        "MAXLEN" => Trim::MaxLen(integer(threshold)?),
        "MINID" => Trim::MinId(id(threshold)?),
        _ => return Err(syntax()),
    };
    Ok((trim, j - i))
}

/// The trim command record that moves the trim point to `point`.
pub(crate) fn trim_record(point: u64) -> AppendRecord {
    AppendRecord {
        timestamp: None,
        headers: vec![Header {
            name: Bytes::new(),
            value: Bytes::from_static(b"trim"),
        }],
        body: Bytes::copy_from_slice(&point.to_be_bytes()),
    }
}

pub(crate) fn parse(args: &[Bytes]) -> Result<Command, String> {
    if args.len() < 4 {
        return Err(arity("XTRIM"));
    }
    let (trim, used) = parse_trim(args, 2)?;
    if 2 + used != args.len() {
        return Err(syntax());
    }
    Ok(Command::XTrim {
        key: args[1].clone(),
        trim,
    })
}

/// Replies with an estimate of the entries trimmed away.
pub(crate) async fn apply(session: &Session, key: &Bytes, trim: Trim) -> Result<Reply, Reply> {
    let streams = session.streams()?;
    let name = stream_name(key)?;
    let Some(reader) = streams.reader(&name, ReadStart::SeqNum(0)).await? else {
        return Ok(Reply::Integer(0));
    };
    let (first, tail) = (reader.position(), reader.tail());
    let point = streams.trim_point(&name, trim, tail, 1).await?;
    if point <= first {
        return Ok(Reply::Integer(0));
    }
    let input = AppendInput {
        records: vec![trim_record(point)],
        ..Default::default()
    };
    streams
        .caller
        .append(streams.basin, &name, input, None)
        .await
        .map_err(|e| error_reply(&e))?;
    // The estimate counts entries that existed before the trim record.
    Ok(Reply::Integer((point.min(tail.seq_num) - first) as i64))
}
