//! The commands: exactly the forms the Redis Streams integration page supports, one
//! file per command or family with its parsing and its execution. Anything else is an
//! error reply; nothing here can fail the connection.

mod connection;
mod groups;
mod keys;
mod parse;
pub(crate) mod xadd;
mod xinfo;
mod xrange;
mod xread;
pub(crate) mod xtrim;

use bytes::Bytes;
use streamgate_core::groups::Durable;
use tokio::sync::watch;

use crate::reply::Reply;
use crate::session::Session;
use parse::{arity, upper};

pub use groups::{PendingRange, XAutoClaim, XClaim, XGroup, XReadGroup};
pub use xinfo::XInfo;
pub use xrange::Bound;
pub use xread::ReadFrom;
pub use xtrim::Trim;

/// Most arguments one command may carry.
pub const MAX_ARGS: usize = 16_384;
/// Most entries one XRANGE or XREAD returns.
pub const MAX_READ_ENTRIES: u64 = 10_000;

#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    Ping(Option<Bytes>),
    Echo(Bytes),
    Quit,
    Auth {
        username: Option<Bytes>,
        password: Bytes,
    },
    Hello {
        protocol: Option<u8>,
        auth: Option<(Bytes, Bytes)>,
        setname: Option<Bytes>,
    },
    ClientSetName(Bytes),
    ClientGetName,
    ClientSetInfo,
    Select(Bytes),
    DescribeCommands,
    Info(Vec<Bytes>),
    Exists(Vec<Bytes>),
    Type(Bytes),
    XLen(Bytes),
    XAdd {
        key: Bytes,
        nomkstream: bool,
        trim: Option<Trim>,
        fields: Vec<(Bytes, Bytes)>,
    },
    XTrim {
        key: Bytes,
        trim: Trim,
    },
    XRange {
        key: Bytes,
        start: Bound,
        end: Bound,
        count: Option<u64>,
    },
    /// XREVRANGE: the same bounds, newest first.
    XRevRange {
        key: Bytes,
        start: Bound,
        end: Bound,
        count: Option<u64>,
    },
    XRead {
        count: Option<u64>,
        block: Option<u64>,
        keys: Vec<Bytes>,
        from: Vec<ReadFrom>,
    },
    XGroup(XGroup),
    XReadGroup(XReadGroup),
    XAck {
        key: Bytes,
        group: String,
        ids: Vec<Bytes>,
    },
    XPending {
        key: Bytes,
        group: String,
        range: Option<PendingRange>,
    },
    XClaim(XClaim),
    XAutoClaim(XAutoClaim),
    XInfo(XInfo),
}

impl Command {
    /// The command's name, as operator metrics label it.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Ping(_) => "ping",
            Command::Echo(_) => "echo",
            Command::Quit => "quit",
            Command::Auth { .. } => "auth",
            Command::Hello { .. } => "hello",
            Command::ClientSetName(_) | Command::ClientGetName | Command::ClientSetInfo => "client",
            Command::Select(_) => "select",
            Command::DescribeCommands => "command",
            Command::Info(_) => "info",
            Command::Exists(_) => "exists",
            Command::Type(_) => "type",
            Command::XLen(_) => "xlen",
            Command::XAdd { .. } => "xadd",
            Command::XTrim { .. } => "xtrim",
            Command::XRange { .. } => "xrange",
            Command::XRead { .. } => "xread",
            Command::XRevRange { .. } => "xrevrange",
            Command::XGroup(_) => "xgroup",
            Command::XReadGroup(_) => "xreadgroup",
            Command::XAck { .. } => "xack",
            Command::XPending { .. } => "xpending",
            Command::XClaim(_) => "xclaim",
            Command::XAutoClaim(_) => "xautoclaim",
            Command::XInfo(_) => "xinfo",
        }
    }

    /// Whether the command changes or reads consumer groups, answering once what it saw
    /// is durable: commands pipelined after it may run meanwhile.
    pub fn defers_reply(&self) -> bool {
        matches!(
            self,
            Command::XGroup(_)
                | Command::XReadGroup(_)
                | Command::XAck { .. }
                | Command::XPending { .. }
                | Command::XClaim(_)
                | Command::XAutoClaim(_)
        )
    }

    /// The streams whose consumer groups the command works on, which it must run at
    /// the node that sequences them; `None` for a command that is not about groups.
    pub fn group_keys(&self) -> Option<Vec<&Bytes>> {
        Some(match self {
            Command::XGroup(group) => group.key().into_iter().collect(),
            Command::XReadGroup(read) => read.keys.iter().collect(),
            Command::XAck { key, .. } | Command::XPending { key, .. } => vec![key],
            Command::XClaim(claim) => vec![&claim.key],
            Command::XAutoClaim(claim) => vec![&claim.key],
            Command::XInfo(info) => info.key().into_iter().collect(),
            _ => return None,
        })
    }

    /// Whether the command needs an authenticated connection.
    pub fn needs_auth(&self) -> bool {
        !matches!(
            self,
            Command::Auth { .. } | Command::Hello { .. } | Command::Quit
        )
    }
}

/// Parses one command from its arguments (the first is the command name).
pub fn parse(args: &[Bytes]) -> Result<Command, String> {
    let Some(name) = args.first() else {
        return Err("ERR empty command".into());
    };
    if args.len() > MAX_ARGS {
        return Err(format!(
            "ERR a command may have at most {MAX_ARGS} arguments"
        ));
    }
    let name = upper(name);
    let n = args.len();
    Ok(match name.as_str() {
        "PING" => match n {
            1 => Command::Ping(None),
            2 => Command::Ping(Some(args[1].clone())),
            _ => return Err(arity(&name)),
        },
        "ECHO" if n == 2 => Command::Echo(args[1].clone()),
        "QUIT" => Command::Quit,
        "AUTH" => return connection::parse_auth(args),
        "HELLO" => return connection::parse_hello(args),
        "CLIENT" if n >= 2 => return connection::parse_client(args),
        "SELECT" if n == 2 => Command::Select(args[1].clone()),
        "COMMAND" => Command::DescribeCommands,
        "INFO" => Command::Info(args[1..].to_vec()),
        "EXISTS" if n >= 2 => Command::Exists(args[1..].to_vec()),
        "TYPE" if n == 2 => Command::Type(args[1].clone()),
        "XLEN" if n == 2 => Command::XLen(args[1].clone()),
        "XADD" => return xadd::parse(args),
        "XTRIM" => return xtrim::parse(args),
        "XRANGE" | "XREVRANGE" => return xrange::parse(args),
        "XREAD" => return xread::parse(args),
        "XGROUP" if n >= 2 => return groups::parse_xgroup(args),
        "XREADGROUP" => return groups::parse_xreadgroup(args),
        "XACK" => return groups::parse_xack(args),
        "XPENDING" => return groups::parse_xpending(args),
        "XCLAIM" => return groups::parse_xclaim(args),
        "XAUTOCLAIM" => return groups::parse_xautoclaim(args),
        "XINFO" if n >= 2 => return xinfo::parse(args),
        // Redis stream commands an immutable log cannot honour: say why, not "unknown".
        "XDEL" => {
            return Err(
                "ERR XDEL is not supported: an S2 stream is an immutable log, whose \
                        entries leave only by trimming from the front (XTRIM)"
                    .into(),
            )
        }
        "XSETID" => return Err("ERR XSETID is not supported: the server assigns entry IDs".into()),
        "ECHO" | "CLIENT" | "SELECT" | "EXISTS" | "TYPE" | "XLEN" | "XGROUP" | "XINFO" => {
            return Err(arity(&name))
        }
        _ => {
            let preview: Vec<String> = args[1..]
                .iter()
                .take(3)
                .map(|a| format!("'{}'", String::from_utf8_lossy(a)))
                .collect();
            return Err(format!(
                "ERR unknown command '{}', with args beginning with: {}",
                String::from_utf8_lossy(&args[0]),
                preview.join(" ")
            ));
        }
    })
}

/// Runs one command: its reply, whether the connection closes after it, and the group
/// changes that must be durable before the reply is given.
///
/// `sent` is the command as the client sent it, for a group command: where another
/// node sequences its stream, it runs there (see `crate::forwarded`).
pub(crate) async fn execute(
    session: &mut Session,
    command: Command,
    shutdown: &mut watch::Receiver<bool>,
    sent: Option<Bytes>,
) -> (Reply, bool, Vec<Durable>) {
    if command.needs_auth() {
        if let Err(reply) = session.still_authenticated().await {
            return (reply, false, Vec::new());
        }
        let authorized = session
            .streams()
            .and_then(|streams| crate::permissions::authorize(&streams, &command));
        if let Err(reply) = authorized {
            return (reply, false, Vec::new());
        }
    }
    if let Some(sent) = &sent {
        if let Some(reply) = crate::forwarded::at_owner(session, &command, sent).await {
            return (reply, false, Vec::new());
        }
    }
    let reply = match command {
        Command::Quit => return (Reply::ok(), true, Vec::new()),
        Command::Ping(None) => Reply::Simple("PONG"),
        Command::Ping(Some(message)) | Command::Echo(message) => Reply::Bulk(message),
        Command::Auth { username, password } => {
            connection::auth(session, username.as_ref(), &password).await
        }
        Command::Hello {
            protocol,
            auth,
            setname,
        } => connection::hello(session, protocol, auth, setname).await,
        Command::ClientSetName(name) => connection::client_setname(session, name),
        Command::ClientGetName => session.name.clone().map_or(Reply::Null, Reply::Bulk),
        Command::ClientSetInfo => Reply::ok(),
        Command::Select(db) if db.as_ref() == b"0" => Reply::ok(),
        Command::Select(_) => Reply::error("ERR only database 0 exists"),
        Command::DescribeCommands => Reply::Array(vec![]),
        Command::Info(sections) => connection::info(&sections),
        Command::XAdd {
            key,
            nomkstream,
            trim,
            fields,
        } => {
            let (reply, close) = xadd::apply(session, key, nomkstream, trim, &fields).await;
            return (reply, close, Vec::new());
        }
        Command::Exists(keys) => keys::exists(session, &keys).await.unwrap_or_else(|r| r),
        Command::Type(key) => keys::type_of(session, &key).await.unwrap_or_else(|r| r),
        Command::XLen(key) => keys::xlen(session, &key).await.unwrap_or_else(|r| r),
        Command::XTrim { key, trim } => xtrim::apply(session, &key, trim)
            .await
            .unwrap_or_else(|r| r),
        Command::XRange {
            key,
            start,
            end,
            count,
        } => xrange::apply(session, &key, (start, end), count, false)
            .await
            .unwrap_or_else(|r| r),
        Command::XRevRange {
            key,
            start,
            end,
            count,
        } => xrange::apply(session, &key, (start, end), count, true)
            .await
            .unwrap_or_else(|r| r),
        Command::XRead {
            count,
            block,
            keys,
            from,
        } => {
            tokio::select! {
                reply = xread::apply(session, count, block, &keys, &from) => reply.unwrap_or_else(|r| r),
                _ = crate::stopped(shutdown) => return (Reply::error("ERR session closing; blocking read interrupted"), true, Vec::new()),
            }
        }
        Command::XInfo(info) => xinfo::apply(session, &info).await.unwrap_or_else(|r| r),
        Command::XGroup(command) => return answered(groups::xgroup(session, command).await),
        Command::XAck { key, group, ids } => {
            return answered(groups::xack(session, &key, &group, &ids).await)
        }
        Command::XPending { key, group, range } => {
            return answered(groups::xpending(session, &key, &group, &range).await)
        }
        Command::XClaim(claim) => return answered(groups::xclaim(session, &claim).await),
        Command::XAutoClaim(claim) => return answered(groups::xautoclaim(session, &claim).await),
        Command::XReadGroup(read) => {
            tokio::select! {
                answer = groups::xreadgroup(session, &read) => return answered(answer),
                _ = crate::stopped(shutdown) => return (Reply::error("ERR session closing; blocking read interrupted"), true, Vec::new()),
            }
        }
    };
    (reply, false, Vec::new())
}

fn answered(answer: Result<groups::Answer, Reply>) -> (Reply, bool, Vec<Durable>) {
    match answer {
        Ok(answer) => (answer.reply, false, answer.durable),
        Err(reply) => (reply, false, Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::parse::args;
    use super::*;
    use crate::entry::{EntryId, IdArg};

    #[test]
    fn xadd_forms() {
        assert_eq!(
            parse(&args("XADD events * kind example n 1")).unwrap(),
            Command::XAdd {
                key: "events".into(),
                nomkstream: false,
                trim: None,
                fields: vec![("kind".into(), "example".into()), ("n".into(), "1".into())],
            }
        );
        let Command::XAdd {
            nomkstream, trim, ..
        } = parse(&args("xadd s NOMKSTREAM MAXLEN ~ 5 * a b")).unwrap()
        else {
            panic!()
        };
        assert!(nomkstream);
        assert_eq!(trim, Some(Trim::MaxLen(5)));
        assert!(parse(&args("XADD s 1-1 a b"))
            .unwrap_err()
            .contains("explicit IDs"));
        assert!(parse(&args("XDEL s 1-1"))
            .unwrap_err()
            .contains("immutable log"));
        assert!(parse(&args("XSETID s 1-1"))
            .unwrap_err()
            .contains("assigns entry IDs"));
        assert!(parse(&args("XADD s MAXLEN 5 * a b"))
            .unwrap_err()
            .contains("approximate"));
        assert!(parse(&args("XADD s MAXLEN ~ 5 LIMIT 10 * a b"))
            .unwrap_err()
            .contains("LIMIT"));
        assert!(parse(&args("XADD s * a"))
            .unwrap_err()
            .contains("wrong number"));
        assert!(parse(&args("XADD s")).unwrap_err().contains("wrong number"));
    }

    #[test]
    fn range_and_read_forms() {
        assert_eq!(
            parse(&args("XRANGE s - + COUNT 10")).unwrap(),
            Command::XRange {
                key: "s".into(),
                start: Bound::Min,
                end: Bound::Max,
                count: Some(10)
            }
        );
        let Command::XRange { start, end, .. } = parse(&args("XRANGE s (5-3 99")).unwrap() else {
            panic!()
        };
        assert_eq!(
            start,
            Bound::Exclusive(IdArg::Full(EntryId {
                timestamp: 5,
                seq_num: 3
            }))
        );
        assert_eq!(end, Bound::Inclusive(IdArg::TimestampOnly(99)));
        assert!(parse(&args("XRANGE s - + LIMIT 1")).is_err());
        let Command::XRead {
            count,
            block,
            keys,
            from,
        } = parse(&args("XREAD COUNT 5 BLOCK 0 STREAMS a b $ 1-2")).unwrap()
        else {
            panic!()
        };
        assert_eq!((count, block), (Some(5), Some(0)));
        assert_eq!(keys, vec![Bytes::from("a"), Bytes::from("b")]);
        assert_eq!(from[0], ReadFrom::Tail);
        assert!(parse(&args("XREAD STREAMS a"))
            .unwrap_err()
            .contains("Unbalanced"));
        assert!(parse(&args("XTRIM s MAXLEN ~ 2")).is_ok());
        assert!(parse(&args("XTRIM s MINID ~ 7-0")).is_ok());
        assert!(parse(&args("XTRIM s MAXLEN 2")).is_err());
    }

    #[test]
    fn connection_commands_and_unknowns() {
        assert_eq!(
            parse(&args("HELLO 3 AUTH default tok SETNAME me")).unwrap(),
            Command::Hello {
                protocol: Some(3),
                auth: Some(("default".into(), "tok".into())),
                setname: Some("me".into())
            }
        );
        assert!(parse(&args("HELLO 4")).unwrap_err().starts_with("NOPROTO"));
        assert!(parse(&args("SET k v"))
            .unwrap_err()
            .starts_with("ERR unknown command 'SET'"));
        assert!(parse(&[]).is_err());
        assert!(parse(&vec![Bytes::from("PING"); MAX_ARGS + 1]).is_err());
        assert_eq!(
            parse(&args("client setinfo LIB-NAME x")).unwrap(),
            Command::ClientSetInfo
        );
    }
}
