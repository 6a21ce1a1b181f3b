//! `XADD key [NOMKSTREAM] [MAXLEN|MINID ~ threshold] * field value [field value ...]`.
//!
//! Every XADD is appended through one path: an [`XaddBatch`] submitted by [`submit`].
//! The connection gathers pipelined plain XADDs to one stream into one batch (one
//! append, acknowledged together once durable); an XADD with options is a batch of its
//! own, carrying its trim record after the entry.

use bytes::Bytes;
use futures::future::BoxFuture;
use streamgate_core::record::{AppendInput, AppendRecord, BatchPacker, MAX_BATCH_METERED_BYTES};
use streamgate_core::{Error, Resource};

use super::parse::{arity, upper};
use super::xtrim::{parse_trim, trim_record, Trim};
use super::Command;
use crate::entry::{self, EntryId};
use crate::reply::Reply;
use crate::session::{error_reply, stream_name, Session};

pub(crate) fn parse(args: &[Bytes]) -> Result<Command, String> {
    let n = args.len();
    if n < 5 {
        return Err(arity("XADD"));
    }
    let key = args[1].clone();
    let mut i = 2;
    let mut nomkstream = false;
    let mut trim = None;
    loop {
        match upper(&args[i]).as_str() {
            "NOMKSTREAM" => {
                nomkstream = true;
                i += 1;
            }
            "MAXLEN" | "MINID" => {
                let (t, used) = parse_trim(args, i)?;
                trim = Some(t);
                i += used;
            }
            _ => break,
        }
        if i >= n {
            return Err(arity("XADD"));
        }
    }
    if args[i].as_ref() != b"*" {
        return Err("ERR explicit IDs are not supported: IDs are always generated, use *".into());
    }
    let pairs = &args[i + 1..];
    if pairs.is_empty() || !pairs.len().is_multiple_of(2) {
        return Err(arity("XADD"));
    }
    let fields = pairs
        .chunks(2)
        .map(|p| (p[0].clone(), p[1].clone()))
        .collect();
    Ok(Command::XAdd {
        key,
        nomkstream,
        trim,
        fields,
    })
}

fn entry_record(fields: &[(Bytes, Bytes)]) -> AppendRecord {
    AppendRecord {
        timestamp: None,
        headers: entry::encode_fields(fields),
        body: Bytes::new(),
    }
}

/// XADDs to one stream, appended together.
pub struct XaddBatch {
    key: Bytes,
    records: BatchPacker,
    /// How many records are entries (the others are a trim record), each with a reply.
    entries: usize,
}

impl XaddBatch {
    pub fn start(key: Bytes, fields: &[(Bytes, Bytes)]) -> Result<XaddBatch, Reply> {
        let record = entry_record(fields);
        let metered = record.metered_size();
        if metered > MAX_BATCH_METERED_BYTES {
            return Err(Reply::error(format!(
                "ERR entry of {metered} metered bytes exceeds the 1 MiB record limit"
            )));
        }
        let mut records = BatchPacker::default();
        records.push(record);
        Ok(XaddBatch {
            key,
            records,
            entries: 1,
        })
    }

    /// Whether an XADD of `fields` to `key` can join this batch.
    pub fn accepts(&self, key: &Bytes, fields: &[(Bytes, Bytes)]) -> bool {
        *key == self.key && self.records.fits(entry::metered_size(fields))
    }

    pub fn push(&mut self, fields: &[(Bytes, Bytes)]) {
        self.records.push(entry_record(fields));
        self.entries += 1;
    }
}

/// Submits a batch as one append; the future yields one ID per entry, and whether the
/// connection must close (the append's outcome is unknown).
pub(crate) async fn submit(
    session: &mut Session,
    batch: XaddBatch,
) -> BoxFuture<'static, (Vec<Reply>, bool)> {
    let count = batch.entries;
    let refuse = |reply: Reply| -> BoxFuture<'static, (Vec<Reply>, bool)> {
        Box::pin(async move { (vec![reply; count], false) })
    };
    let name = match stream_name(&batch.key) {
        Ok(name) => name,
        Err(reply) => return refuse(reply),
    };
    let input = AppendInput {
        records: batch.records.into_records(),
        ..Default::default()
    };
    // The engine re-checks the token: one revoked or expired since the batch began is
    // refused here, and ends the session's authentication.
    let submitted = match session.streams() {
        Ok(streams) => {
            streams
                .caller
                .submit_append(streams.basin, &name, input, None)
                .await
        }
        Err(reply) => return refuse(reply),
    };
    match submitted {
        Ok(ack) => Box::pin(async move {
            match ack.await {
                // Every record of one append carries the batch's timestamp.
                Ok(ack) => (
                    (0..count as u64)
                        .map(|i| {
                            Reply::Bulk(
                                EntryId {
                                    timestamp: ack.start.timestamp,
                                    seq_num: ack.start.seq_num + i,
                                }
                                .to_bytes(),
                            )
                        })
                        .collect(),
                    false,
                ),
                Err(err) => (
                    vec![
                        Reply::error(format!(
                            "ERR S2 append outcome is ambiguous; closing connection: {err}"
                        ));
                        count
                    ],
                    true,
                ),
            }
        }),
        Err(err) => refuse(session.failed(&err)),
    }
}

/// An XADD run on its own (with NOMKSTREAM or a trim, or not pipelined behind others).
pub(crate) async fn apply(
    session: &mut Session,
    key: Bytes,
    nomkstream: bool,
    trim: Option<Trim>,
    fields: &[(Bytes, Bytes)],
) -> (Reply, bool) {
    let mut batch = match XaddBatch::start(key.clone(), fields) {
        Ok(batch) => batch,
        Err(reply) => return (reply, false),
    };
    if let Err(reply) = with_options(session, &key, nomkstream, trim, &mut batch).await {
        return (reply, false);
    }
    let (mut replies, close) = submit(session, batch).await.await;
    (replies.swap_remove(0), close)
}

/// NOMKSTREAM: `Null` unless the stream exists. A trim: its record after the entry.
async fn with_options(
    session: &Session,
    key: &Bytes,
    nomkstream: bool,
    trim: Option<Trim>,
    batch: &mut XaddBatch,
) -> Result<(), Reply> {
    if !nomkstream && trim.is_none() {
        return Ok(());
    }
    let name = stream_name(key)?;
    let streams = session.streams()?;
    if nomkstream {
        // The check creates the stream if the basin creates streams on read.
        match streams.caller.check_tail(streams.basin, &name, None).await {
            Ok(_) => {}
            Err(Error::NotFound(Resource::Stream(_))) => return Err(Reply::Null),
            Err(err) => return Err(error_reply(&err)),
        }
    }
    if let Some(trim) = trim {
        let tail = streams.tail(&name).await?;
        let point = streams.trim_point(&name, trim, tail, 2).await?;
        batch.records.push(trim_record(point));
    }
    Ok(())
}
