//! The S2 Redis Streams page's command permission table: the operations each command
//! needs on every key it names, checked before it runs (`NOPERM` if any is outside the
//! token's scope). Commands need more than the engine calls they make check (an XADD
//! with a trim also reads the tail), so this is checked up front.

use bytes::Bytes;
use streamgate_core::access::Operation::{self, *};

use crate::cmd::{Command, XGroup, XInfo};
use crate::reply::Reply;
use crate::session::{error_reply, stream_name};
use crate::streams::Streams;

/// The keys a command names and the operations it needs on each.
fn needed(command: &Command) -> Option<(Vec<&Bytes>, Vec<Operation>)> {
    Some(match command {
        Command::XAdd {
            key,
            nomkstream,
            trim,
            ..
        } => {
            let mut ops = vec![Append];
            if *nomkstream {
                ops.push(CheckTail);
            }
            if trim.is_some() {
                ops.extend([Read, CheckTail, Trim]);
            }
            (vec![key], ops)
        }
        Command::XTrim { key, .. } => (vec![key], vec![Read, CheckTail, Append, Trim]),
        Command::XRange { key, .. } | Command::XLen(key) => (vec![key], vec![Read, CheckTail]),
        Command::XRead { block, keys, .. } => {
            let ops = if block.is_some() && keys.len() == 1 {
                vec![Read]
            } else {
                vec![Read, CheckTail]
            };
            (keys.iter().collect(), ops)
        }
        Command::XRevRange { key, .. } => (vec![key], vec![Read, CheckTail]),
        // Group state is written state of its stream: changing it takes read and
        // append; MKSTREAM creates the stream too.
        Command::XGroup(XGroup::Create { key, mkstream, .. }) => {
            let mut ops = vec![Read, Append];
            if *mkstream {
                ops.push(CreateStream);
            }
            (vec![key], ops)
        }
        Command::XGroup(group) => (group.key().into_iter().collect(), vec![Read, Append]),
        Command::XReadGroup(read) => (read.keys.iter().collect(), vec![Read, Append]),
        Command::XAck { key, .. } => (vec![key], vec![Read, Append]),
        Command::XClaim(claim) => (vec![&claim.key], vec![Read, Append]),
        Command::XAutoClaim(claim) => (vec![&claim.key], vec![Read, Append]),
        Command::XPending { key, .. } => (vec![key], vec![Read]),
        Command::XInfo(XInfo::Stream { key, .. } | XInfo::Groups { key }) => {
            (vec![key], vec![Read, CheckTail])
        }
        Command::XInfo(XInfo::Consumers { key, .. }) => (vec![key], vec![Read]),
        Command::Exists(keys) => (keys.iter().collect(), vec![GetStreamConfig]),
        Command::Type(key) => (vec![key], vec![GetStreamConfig]),
        _ => return None,
    })
}

pub(crate) fn authorize(streams: &Streams<'_>, command: &Command) -> Result<(), Reply> {
    let Some((keys, ops)) = needed(command) else {
        return Ok(());
    };
    for key in keys {
        // A key that is no stream name gets the command's own error.
        let Ok(name) = stream_name(key) else {
            continue;
        };
        for op in &ops {
            streams
                .caller
                .authorize_stream(*op, streams.basin, &name)
                .map_err(|e| error_reply(&e))?;
        }
    }
    Ok(())
}
