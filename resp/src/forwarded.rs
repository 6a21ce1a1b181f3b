//! Consumer-group commands in a cluster. A stream's groups live with the stream, at the
//! node that sequences it, so a group command that reaches another node runs whole at
//! the owner: this node passes the command on as the client sent it (with the client's
//! token, so the owner checks it as if the client had come to it), and writes back the
//! owner's reply, encoded already for the client's protocol.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use streamgate_core::names::BasinName;
use streamgate_core::{Caller, Engine};
use tokio::sync::watch;

use crate::cmd::{self, Command};
use crate::reply::Reply;
use crate::session::{error_reply, stream_name, Session};

/// How long a command at the owner may take, beyond a blocking read's own wait.
const OWNER_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest wait of a blocking read passed on (`BLOCK 0` waits without end here).
const LONGEST_BLOCK: Duration = Duration::from_secs(24 * 3600);

/// A command as a client sends it: an array of bulk strings.
pub(crate) fn encode_command(args: &[Bytes]) -> Bytes {
    let mut out = BytesMut::new();
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out.freeze()
}

/// The reply of the owner of the first of the command's streams that another node
/// sequences, when there is one; `None` when the command runs here. (A command on
/// streams of several owners goes to one of them, which answers `TRYAGAIN` for the
/// others: it does not pass a command on again.)
pub(crate) async fn at_owner(session: &Session, command: &Command, sent: &Bytes) -> Option<Reply> {
    let keys = command.group_keys()?;
    let streams = session.streams().ok()?;
    let timeout = match command {
        Command::XReadGroup(read) => match read.block {
            Some(0) => LONGEST_BLOCK,
            Some(ms) => Duration::from_millis(ms) + OWNER_TIMEOUT,
            None => OWNER_TIMEOUT,
        },
        _ => OWNER_TIMEOUT,
    };
    for key in keys {
        let Ok(name) = stream_name(key) else { continue };
        let elsewhere = streams
            .caller
            .resp_command_at_owner(streams.basin, &name, sent.clone(), session.resp3, timeout)
            .await;
        match elsewhere {
            Ok(None) => continue,
            Ok(Some(encoded)) => return Some(Reply::Encoded(encoded)),
            Err(err) => return Some(error_reply(&err)),
        }
    }
    None
}

/// Runs a group command another node passed on (see `at_owner`) as that node's client
/// `caller`, in `basin`; the reply, encoded for the client's protocol, once the group
/// changes it shows are durable.
pub async fn run_forwarded(
    engine: Engine,
    caller: Caller,
    basin: BasinName,
    command: Bytes,
    resp3: bool,
) -> Bytes {
    let reply = forwarded_reply(engine, caller, basin, command, resp3).await;
    let mut out = BytesMut::new();
    reply.encode(resp3, &mut out);
    out.freeze()
}

async fn forwarded_reply(
    engine: Engine,
    caller: Caller,
    basin: BasinName,
    command: Bytes,
    resp3: bool,
) -> Reply {
    let mut input = BytesMut::from(&command[..]);
    let args = match crate::request::RequestDecoder::default().next_request(&mut input) {
        Ok(Some(args)) if input.is_empty() => args,
        _ => {
            return Reply::error(
                "ERR Protocol error: the command passed on is not one RESP command",
            )
        }
    };
    let command = match cmd::parse(&args) {
        Ok(command) if command.group_keys().is_some() => command,
        Ok(_) => return Reply::error("ERR only consumer-group commands are passed between nodes"),
        Err(message) => return Reply::error(message),
    };
    let mut session = Session::forwarded(engine, basin, caller, resp3);
    // Nothing stops it but the caller hanging up, which drops this future.
    let (_running, mut shutdown) = watch::channel(false);
    let (reply, _, durable) = cmd::execute(&mut session, command, &mut shutdown, None).await;
    for change in durable {
        if let Err(err) = change.await {
            return error_reply(&err);
        }
    }
    reply
}
