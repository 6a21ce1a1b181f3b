//! The key commands for streams: `EXISTS key [key ...]`, `TYPE key` and `XLEN key`.

use bytes::Bytes;
use streamgate_core::read::ReadStart;

use crate::reply::Reply;
use crate::session::{stream_name, Session};

pub(crate) async fn exists(session: &Session, keys: &[Bytes]) -> Result<Reply, Reply> {
    let streams = session.streams()?;
    let mut count = 0;
    for key in keys {
        if streams.exists(key).await {
            count += 1;
        }
    }
    Ok(Reply::Integer(count))
}

pub(crate) async fn type_of(session: &Session, key: &Bytes) -> Result<Reply, Reply> {
    let streams = session.streams()?;
    Ok(Reply::Simple(if streams.exists(key).await {
        "stream"
    } else {
        "none"
    }))
}

/// The number of retained entries: from the first one still readable to the tail.
pub(crate) async fn xlen(session: &Session, key: &Bytes) -> Result<Reply, Reply> {
    let streams = session.streams()?;
    let name = stream_name(key)?;
    let len = match streams.reader(&name, ReadStart::SeqNum(0)).await? {
        Some(reader) => reader.tail().seq_num - reader.position(),
        None => 0,
    };
    Ok(Reply::Integer(len as i64))
}
