//! `XREAD [COUNT n] [BLOCK ms] STREAMS key [key ...] id [id ...]`: entries after an ID
//! (or from now on, `$`) in up to `MAX_XREAD_STREAMS` streams, waiting for new ones with
//! BLOCK.

use std::time::Duration;

use bytes::Bytes;
use streamgate_core::read::ReadStart;
use streamgate_core::Error;

use super::parse::{id, integer, syntax, upper};
use super::{Command, MAX_READ_ENTRIES};
use crate::entry::IdArg;
use crate::reply::Reply;
use crate::session::{error_reply, stream_name, Session};

/// Most streams one XREAD may name.
pub const MAX_XREAD_STREAMS: usize = 100;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFrom {
    /// `$`: entries added after the command arrives.
    Tail,
    /// Entries after this ID.
    After(IdArg),
}

pub(crate) fn parse(args: &[Bytes]) -> Result<Command, String> {
    let n = args.len();
    let (mut count, mut block) = (None, None);
    let mut i = 1;
    while i < n {
        match upper(&args[i]).as_str() {
            "COUNT" if i + 1 < n => {
                count = Some(integer(&args[i + 1])?);
                i += 2;
            }
            "BLOCK" if i + 1 < n => {
                block = Some(integer(&args[i + 1])?);
                i += 2;
            }
            "STREAMS" => {
                i += 1;
                break;
            }
            _ => return Err(syntax()),
        }
    }
    let rest = &args[i.min(n)..];
    if rest.is_empty() || !rest.len().is_multiple_of(2) {
        return Err("ERR Unbalanced 'xread' list of streams: for each stream key an ID or '$' must be specified.".into());
    }
    let streams = rest.len() / 2;
    if streams > MAX_XREAD_STREAMS {
        return Err(format!(
            "ERR XREAD may name at most {MAX_XREAD_STREAMS} streams"
        ));
    }
    let keys = rest[..streams].to_vec();
    let from = rest[streams..]
        .iter()
        .map(|a| match a.as_ref() {
            b"$" => Ok(ReadFrom::Tail),
            b"+" => Err("ERR the + ID is not supported by XREAD here".to_string()),
            other => Ok(ReadFrom::After(id(other)?)),
        })
        .collect::<Result<_, _>>()?;
    Ok(Command::XRead {
        count,
        block,
        keys,
        from,
    })
}

pub(crate) async fn apply(
    session: &Session,
    count: Option<u64>,
    block: Option<u64>,
    keys: &[Bytes],
    from: &[ReadFrom],
) -> Result<Reply, Reply> {
    let streams = session.streams()?;
    // Entries are shared out evenly across the streams.
    let per_stream = count
        .unwrap_or(MAX_READ_ENTRIES)
        .min(MAX_READ_ENTRIES / keys.len() as u64)
        .max(1);
    let mut readers = Vec::with_capacity(keys.len());
    for (key, from) in keys.iter().zip(from) {
        let name = stream_name(key)?;
        let start = match from {
            ReadFrom::Tail => ReadStart::TailOffset(0),
            ReadFrom::After(id) => ReadStart::SeqNum(streams.seq_from_id(&name, *id, false).await?),
        };
        let reader = streams.reader(&name, start).await?;
        readers.push((key.clone(), name, reader));
    }
    let deadline = match block {
        None => None,
        Some(0) => Some(None),
        Some(ms) => Some(Some(
            tokio::time::Instant::now() + Duration::from_millis(ms),
        )),
    };
    loop {
        let mut results = Vec::new();
        for (key, _, reader) in readers.iter_mut() {
            if let Some(reader) = reader {
                let entries = streams.read_entries(reader, per_stream, u64::MAX).await?;
                if !entries.is_empty() {
                    results.push((Reply::Bulk(key.clone()), Reply::Array(entries)));
                }
            }
        }
        if !results.is_empty() {
            return Ok(if session.resp3 {
                Reply::Map(results)
            } else {
                Reply::Array(
                    results
                        .into_iter()
                        .map(|(k, v)| Reply::Array(vec![k, v]))
                        .collect(),
                )
            });
        }
        let Some(deadline) = deadline else {
            return Ok(Reply::NullArray);
        };
        // Wait on every stream's tail notifications until one has new entries.
        let waits: Vec<_> = readers
            .iter_mut()
            .filter_map(|(_, _, reader)| reader.as_mut())
            .map(|reader| Box::pin(reader.wait_for_records(deadline)))
            .collect();
        if waits.is_empty() {
            match deadline {
                Some(deadline) => tokio::time::sleep_until(deadline).await,
                None => std::future::pending::<()>().await,
            }
            return Ok(Reply::NullArray);
        }
        let (outcome, _, _) = futures::future::select_all(waits).await;
        match outcome {
            Ok(true) => continue,
            Ok(false) => return Ok(Reply::NullArray),
            // Handed to another node while waiting: the wait goes on there.
            Err(Error::StreamMoved) => {
                let moved = readers
                    .iter_mut()
                    .filter_map(|(_, name, reader)| Some((&*name, reader.as_mut()?)));
                streams.follow_moves(moved).await?;
            }
            Err(err) => return Err(error_reply(&err)),
        }
    }
}
