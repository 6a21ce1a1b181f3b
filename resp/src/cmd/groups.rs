//! Consumer groups, with Redis 7.0's semantics and replies: `XGROUP`, `XREADGROUP`,
//! `XACK`, `XPENDING`, `XCLAIM` and `XAUTOCLAIM`. Each command decides its changes from
//! the groups as the engine has them (under the stream's sequencer lock, so two
//! consumers never get the same new entry) and answers once they are durable; entries
//! are read before, and a change whose ground moved meanwhile is decided again.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use streamgate_core::groups::{Durable, EntryId, Group, GroupOp, GroupTurn, GroupView, Groups};
use streamgate_core::names::StreamName;
use streamgate_core::read::ReadStart;
use streamgate_core::record::SequencedRecord;
use streamgate_core::{Error, Resource};

use super::parse::{signed, syntax, upper};
use super::xrange::Bound;
use super::{Command, MAX_READ_ENTRIES};
use crate::entry::IdArg;
use crate::reply::Reply;
use crate::session::{error_reply, stream_name, Session};
use crate::streams::{entry_reply, Streams};

/// Most streams one XREADGROUP may name.
pub const MAX_STREAMS: usize = 100;

const INVALID_ID: &str = "ERR Invalid stream ID specified as stream command argument";

/// `$` or an ID, where a group's last ID is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartId {
    LastEntry,
    Id(EntryId),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XGroup {
    Create {
        key: Bytes,
        group: String,
        id: StartId,
        mkstream: bool,
        entries_read: Option<u64>,
    },
    SetId {
        key: Bytes,
        group: String,
        id: StartId,
        entries_read: Option<u64>,
    },
    Destroy {
        key: Bytes,
        group: String,
    },
    CreateConsumer {
        key: Bytes,
        group: String,
        consumer: String,
    },
    DelConsumer {
        key: Bytes,
        group: String,
        consumer: String,
    },
    Help,
}

impl XGroup {
    pub fn key(&self) -> Option<&Bytes> {
        match self {
            XGroup::Create { key, .. }
            | XGroup::SetId { key, .. }
            | XGroup::Destroy { key, .. }
            | XGroup::CreateConsumer { key, .. }
            | XGroup::DelConsumer { key, .. } => Some(key),
            XGroup::Help => None,
        }
    }
}

/// Where XREADGROUP reads a stream from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupFrom {
    /// `>`: entries never delivered to the group.
    New,
    /// The consumer's own pending entries after this ID.
    After(EntryId),
    /// Not an ID XREADGROUP takes: the error, given when the key's turn comes (as
    /// Redis checks each key's group, then its ID, in order).
    Refused(&'static str),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XReadGroup {
    pub group: String,
    pub consumer: String,
    pub count: Option<u64>,
    pub block: Option<u64>,
    pub noack: bool,
    pub keys: Vec<Bytes>,
    pub from: Vec<GroupFrom>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingRange {
    pub idle: Option<u64>,
    pub start: Bound,
    pub end: Bound,
    pub count: u64,
    pub consumer: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XClaim {
    pub key: Bytes,
    pub group: String,
    pub consumer: String,
    pub min_idle: u64,
    pub ids: Vec<EntryId>,
    pub idle: Option<i64>,
    pub time: Option<i64>,
    pub retry_count: Option<u64>,
    pub force: bool,
    pub just_id: bool,
    pub last_id: Option<EntryId>,
    /// A malformed argument: the error, given after the group is found (as Redis
    /// checks the key and group first).
    pub refused: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XAutoClaim {
    pub key: Bytes,
    pub group: String,
    pub consumer: String,
    pub min_idle: u64,
    pub start: Bound,
    pub count: u64,
    pub just_id: bool,
}

// ---------- parsing ----------

fn name(arg: &Bytes) -> Result<String, String> {
    String::from_utf8(arg.to_vec())
        .map_err(|_| "ERR consumer group and consumer names must be UTF-8 here".to_string())
}

fn strict_id(arg: &[u8]) -> Result<EntryId, String> {
    if arg == b"-" || arg == b"+" {
        return Err(INVALID_ID.into());
    }
    IdArg::parse(arg)
        .map(IdArg::id)
        .ok_or_else(|| INVALID_ID.to_string())
}

/// `$`, `-`, `+` or an ID, as XGROUP CREATE (strict) and SETID (not strict) take it.
fn start_id(arg: &[u8], strict: bool) -> Result<StartId, String> {
    match arg {
        b"$" => Ok(StartId::LastEntry),
        b"-" if !strict => Ok(StartId::Id(EntryId::MIN)),
        b"+" if !strict => Ok(StartId::Id(EntryId::MAX)),
        other => strict_id(other).map(StartId::Id),
    }
}

fn subcommand_error(typed: &[u8]) -> String {
    format!(
        "ERR unknown subcommand or wrong number of arguments for '{}'. Try XGROUP HELP.",
        String::from_utf8_lossy(typed)
    )
}

fn entries_read(arg: &[u8]) -> Result<Option<u64>, String> {
    let text = std::str::from_utf8(arg).unwrap_or("");
    let n: i64 = text
        .parse()
        .map_err(|_| "ERR value is not an integer or out of range".to_string())?;
    match n {
        -1 => Ok(None),
        n if n < 0 => Err("ERR value for ENTRIESREAD must be positive or -1".into()),
        n => Ok(Some(n as u64)),
    }
}

pub(crate) fn parse_xgroup(args: &[Bytes]) -> Result<Command, String> {
    let sub = upper(&args[1]);
    let n = args.len();
    let arity = |min: usize, exact: bool| {
        let ok = if exact { n == min } else { n >= min };
        if ok {
            Ok(())
        } else {
            Err(format!(
                "ERR wrong number of arguments for 'xgroup|{}' command",
                sub.to_ascii_lowercase()
            ))
        }
    };
    let group = || name(&args[3]);
    Ok(Command::XGroup(match sub.as_str() {
        "HELP" => {
            arity(2, true)?;
            XGroup::Help
        }
        "CREATE" => {
            arity(5, false)?;
            let (mut mkstream, mut read) = (false, None);
            let mut i = 5;
            while i < n {
                match upper(&args[i]).as_str() {
                    "MKSTREAM" => {
                        mkstream = true;
                        i += 1;
                    }
                    "ENTRIESREAD" if i + 1 < n => {
                        read = entries_read(&args[i + 1])?;
                        i += 2;
                    }
                    _ => return Err(subcommand_error(&args[1])),
                }
            }
            XGroup::Create {
                key: args[2].clone(),
                group: group()?,
                id: start_id(&args[4], true)?,
                mkstream,
                entries_read: read,
            }
        }
        "SETID" => {
            arity(5, false)?;
            let read = match n {
                5 => None,
                7 if upper(&args[5]) == "ENTRIESREAD" => entries_read(&args[6])?,
                _ => return Err(subcommand_error(&args[1])),
            };
            XGroup::SetId {
                key: args[2].clone(),
                group: group()?,
                id: start_id(&args[4], false)?,
                entries_read: read,
            }
        }
        "DESTROY" => {
            arity(4, true)?;
            XGroup::Destroy {
                key: args[2].clone(),
                group: group()?,
            }
        }
        "CREATECONSUMER" | "DELCONSUMER" => {
            arity(5, true)?;
            let (key, group, consumer) = (args[2].clone(), group()?, name(&args[4])?);
            match sub.as_str() {
                "CREATECONSUMER" => XGroup::CreateConsumer {
                    key,
                    group,
                    consumer,
                },
                _ => XGroup::DelConsumer {
                    key,
                    group,
                    consumer,
                },
            }
        }
        _ => {
            return Err(format!(
                "ERR unknown subcommand '{}'. Try XGROUP HELP.",
                String::from_utf8_lossy(&args[1])
            ))
        }
    }))
}

const DOLLAR_IN_XREADGROUP: &str = "ERR The $ ID is meaningless in the context of XREADGROUP: you want to read the history of this consumer by specifying a proper ID, or use the > ID to get new messages. The $ ID would just return an empty result set.";

pub(crate) fn parse_xreadgroup(args: &[Bytes]) -> Result<Command, String> {
    let n = args.len();
    if n < 7 {
        return Err(super::parse::arity("XREADGROUP"));
    }
    let (mut group, mut count, mut block, mut noack) = (None, None, None, false);
    let mut i = 1;
    let mut streams_at = None;
    while i < n {
        match upper(&args[i]).as_str() {
            "GROUP" if i + 2 < n => {
                group = Some((name(&args[i + 1])?, name(&args[i + 2])?));
                i += 3;
            }
            "COUNT" if i + 1 < n => {
                count = Some(super::parse::count(&args[i + 1])?);
                i += 2;
            }
            "BLOCK" if i + 1 < n => {
                let value = signed(
                    &args[i + 1],
                    "ERR timeout is not an integer or out of range",
                )?;
                if value < 0 {
                    return Err("ERR timeout is negative".into());
                }
                block = Some(value as u64);
                i += 2;
            }
            "NOACK" => {
                noack = true;
                i += 1;
            }
            "STREAMS" if i + 1 < n => {
                streams_at = Some(i + 1);
                break;
            }
            _ => return Err(syntax()),
        }
    }
    let Some(first) = streams_at else {
        return Err(syntax());
    };
    let rest = &args[first..];
    if rest.is_empty() || !rest.len().is_multiple_of(2) {
        return Err("ERR Unbalanced XREAD list of streams: for each stream key an ID or '$' must be specified.".into());
    }
    let Some((group, consumer)) = group else {
        return Err("ERR Missing GROUP option for XREADGROUP".into());
    };
    let streams = rest.len() / 2;
    if streams > MAX_STREAMS {
        return Err(format!(
            "ERR XREADGROUP may name at most {MAX_STREAMS} streams"
        ));
    }
    let from = rest[streams..]
        .iter()
        .map(|arg| match arg.as_ref() {
            b">" => GroupFrom::New,
            b"$" => GroupFrom::Refused(DOLLAR_IN_XREADGROUP),
            other => strict_id(other).map_or(GroupFrom::Refused(INVALID_ID), GroupFrom::After),
        })
        .collect();
    Ok(Command::XReadGroup(XReadGroup {
        group,
        consumer,
        count,
        block,
        noack,
        keys: rest[..streams].to_vec(),
        from,
    }))
}

pub(crate) fn parse_xack(args: &[Bytes]) -> Result<Command, String> {
    if args.len() < 4 {
        return Err(super::parse::arity("XACK"));
    }
    Ok(Command::XAck {
        key: args[1].clone(),
        group: name(&args[2])?,
        ids: args[3..].to_vec(),
    })
}

pub(crate) fn parse_xpending(args: &[Bytes]) -> Result<Command, String> {
    let n = args.len();
    if n < 3 {
        return Err(super::parse::arity("XPENDING"));
    }
    let (key, group) = (args[1].clone(), name(&args[2])?);
    if n == 3 {
        return Ok(Command::XPending {
            key,
            group,
            range: None,
        });
    }
    if !(6..=9).contains(&n) {
        return Err(syntax());
    }
    // In Redis's order: IDLE's value, the form's length, the count, then the bounds.
    let not_integer = "ERR value is not an integer or out of range";
    let (idle, at) = match upper(&args[3]) == "IDLE" {
        true => {
            let idle = signed(&args[4], not_integer)?.max(0) as u64;
            if n < 8 {
                return Err(syntax());
            }
            (Some(idle), 5)
        }
        false => (None, 3),
    };
    let count = signed(&args[at + 2], not_integer)?.max(0) as u64;
    let start = super::xrange::bound(&args[at])?;
    let end = super::xrange::bound(&args[at + 1])?;
    // Anything after the consumer is ignored, as in Redis.
    let consumer = args.get(at + 3).map(name).transpose()?;
    Ok(Command::XPending {
        key,
        group,
        range: Some(PendingRange {
            idle,
            start,
            end,
            count,
            consumer,
        }),
    })
}

pub(crate) fn parse_xclaim(args: &[Bytes]) -> Result<Command, String> {
    let n = args.len();
    if n < 6 {
        return Err(super::parse::arity("XCLAIM"));
    }
    let mut claim = XClaim {
        key: args[1].clone(),
        group: name(&args[2])?,
        consumer: name(&args[3])?,
        min_idle: 0,
        ids: Vec::new(),
        idle: None,
        time: None,
        retry_count: None,
        force: false,
        just_id: false,
        last_id: None,
        refused: None,
    };
    if let Err(refused) = claim_options(&mut claim, args) {
        claim.refused = Some(refused);
    }
    Ok(Command::XClaim(claim))
}

/// The arguments of XCLAIM after its consumer: the minimum idle time, IDs until the
/// first argument that is not one, then options.
fn claim_options(claim: &mut XClaim, args: &[Bytes]) -> Result<(), String> {
    let n = args.len();
    claim.min_idle =
        signed(&args[4], "ERR Invalid min-idle-time argument for XCLAIM")?.max(0) as u64;
    let mut i = 5;
    while let Some(Ok(id)) = args.get(i).map(|arg| strict_id(arg)) {
        claim.ids.push(id);
        i += 1;
    }
    while i < n {
        let value = args.get(i + 1);
        match (upper(&args[i]).as_str(), value) {
            ("FORCE", _) => claim.force = true,
            ("JUSTID", _) => claim.just_id = true,
            ("IDLE", Some(v)) => {
                claim.idle = Some(signed(v, "ERR Invalid IDLE option argument for XCLAIM")?);
                i += 1;
            }
            ("TIME", Some(v)) => {
                claim.time = Some(signed(v, "ERR Invalid TIME option argument for XCLAIM")?);
                i += 1;
            }
            ("RETRYCOUNT", Some(v)) => {
                // A negative count is no count, as in Redis.
                let count = signed(v, "ERR Invalid RETRYCOUNT option argument for XCLAIM")?;
                claim.retry_count = u64::try_from(count).ok();
                i += 1;
            }
            ("LASTID", Some(v)) => {
                claim.last_id = Some(strict_id(v)?);
                i += 1;
            }
            _ => {
                return Err(format!(
                    "ERR Unrecognized XCLAIM option '{}'",
                    String::from_utf8_lossy(&args[i])
                ))
            }
        }
        i += 1;
    }
    Ok(())
}

pub(crate) fn parse_xautoclaim(args: &[Bytes]) -> Result<Command, String> {
    let n = args.len();
    if n < 6 {
        return Err(super::parse::arity("XAUTOCLAIM"));
    }
    let min_idle = signed(
        &args[4],
        "ERR Invalid min-idle-time argument for XAUTOCLAIM",
    )?
    .max(0) as u64;
    let start = super::xrange::bound(&args[5])?;
    let (mut count, mut just_id) = (100u64, false);
    let mut i = 6;
    while i < n {
        match upper(&args[i]).as_str() {
            "COUNT" if i + 1 < n => {
                let value = signed(&args[i + 1], "ERR COUNT must be > 0")?;
                if !(1..=i64::MAX / 16).contains(&value) {
                    return Err("ERR COUNT must be > 0".into());
                }
                count = value as u64;
                i += 2;
            }
            "JUSTID" => {
                just_id = true;
                i += 1;
            }
            _ => return Err(syntax()),
        }
    }
    Ok(Command::XAutoClaim(XAutoClaim {
        key: args[1].clone(),
        group: name(&args[2])?,
        consumer: name(&args[3])?,
        min_idle,
        start,
        count,
        just_id,
    }))
}

// ---------- running ----------

/// `ERR` replies of the engine, except a missing stream, which each command words its
/// own way.
fn missing_or(err: Error, missing: impl FnOnce() -> Reply) -> Reply {
    match err {
        Error::NotFound(Resource::Stream(_)) => missing(),
        other => error_reply(&other),
    }
}

fn no_group_for_key(group: &str, key: &Bytes) -> Reply {
    Reply::error(format!(
        "NOGROUP No such consumer group '{group}' for key name '{}'",
        String::from_utf8_lossy(key)
    ))
}

fn no_key_or_group(group: &str, key: &Bytes) -> Reply {
    Reply::error(format!(
        "NOGROUP No such key '{}' or consumer group '{group}'",
        String::from_utf8_lossy(key)
    ))
}

const KEY_REQUIRED: &str = "ERR The XGROUP subcommand requires the key to exist. Note that for CREATE you may want to use the MKSTREAM option to create an empty stream automatically.";

/// The ID `$` stands for, or the one given.
fn resolve(id: StartId, view: &GroupView) -> EntryId {
    match id {
        StartId::LastEntry => view.last_entry(),
        StartId::Id(id) => id,
    }
}

/// A reply, to be given once the group changes it reflects are durable: the connection
/// holds it back meanwhile and may run the commands pipelined after it.
pub(crate) struct Answer {
    pub reply: Reply,
    pub durable: Vec<Durable>,
}

impl From<(Reply, Durable)> for Answer {
    fn from((reply, durable): (Reply, Durable)) -> Answer {
        Answer {
            reply,
            durable: vec![durable],
        }
    }
}

/// Runs `plan` as a change of the groups of `name`; its `Err` is the command's reply.
async fn change<R>(
    streams: &Streams<'_>,
    name: &StreamName,
    missing: impl FnOnce() -> Reply,
    plan: impl FnOnce(&Groups, &GroupView) -> Result<(Vec<GroupOp>, R), Reply>,
) -> Result<(R, Durable), Reply> {
    let outcome = streams
        .caller
        .change_groups(streams.basin, name, |groups, view| {
            Ok(match plan(groups, view) {
                Ok((ops, answer)) => (ops, Ok(answer)),
                Err(reply) => (Vec::new(), Err(reply)),
            })
        })
        .await;
    match outcome {
        Ok((answer, durable)) => answer.map(|answer| (answer, durable)),
        Err(err) => Err(missing_or(err, missing)),
    }
}

/// Reads the groups of `name` as sequenced so far, durable once `Durable` resolves.
async fn read<R>(
    streams: &Streams<'_>,
    name: &StreamName,
    missing: impl FnOnce() -> Reply,
    read: impl FnOnce(&Groups, &GroupView) -> R,
) -> Result<(R, Durable), Reply> {
    streams
        .caller
        .read_groups(streams.basin, name, read)
        .await
        .map_err(|err| missing_or(err, missing))
}

/// Waits for the stream's turn at a group change decided from records read first (see
/// `GroupTurn`): consumers taking turns do not read the same entries in vain.
async fn turn(
    streams: &Streams<'_>,
    name: &StreamName,
    missing: impl FnOnce() -> Reply,
) -> Result<GroupTurn, Reply> {
    streams
        .caller
        .group_turn(streams.basin, name)
        .await
        .map_err(|err| missing_or(err, missing))
}

/// Reads the groups of `name` to prepare a change, which checks again what it relies
/// on: durability does not matter here.
async fn peek<R>(
    streams: &Streams<'_>,
    name: &StreamName,
    missing: impl FnOnce() -> Reply,
    look: impl FnOnce(&Groups, &GroupView) -> R,
) -> Result<R, Reply> {
    Ok(read(streams, name, missing, look).await?.0)
}

pub(crate) async fn xgroup(session: &Session, command: XGroup) -> Result<Answer, Reply> {
    let streams = session.streams()?;
    if command == XGroup::Help {
        return Ok(Answer {
            reply: help(),
            durable: Vec::new(),
        });
    }
    let key = command
        .key()
        .cloned()
        .expect("every other subcommand names a key");
    let name = stream_name(&key)?;
    let key_required = || Reply::error(KEY_REQUIRED);
    let changed = match command {
        XGroup::Create {
            group,
            id,
            mkstream,
            entries_read,
            ..
        } => {
            if mkstream && !streams.exists(&key).await {
                let created = streams
                    .caller
                    .create_stream(streams.basin, name.clone(), Default::default(), None)
                    .await;
                match created {
                    Ok(_) | Err(Error::AlreadyExists(_)) => {}
                    Err(err) => return Err(error_reply(&err)),
                }
            }
            change(&streams, &name, key_required, |groups, view| {
                if groups.get(&group).is_some() {
                    return Err(Reply::error("BUSYGROUP Consumer Group name already exists"));
                }
                let op = GroupOp::Create {
                    group,
                    last_id: resolve(id, view),
                    entries_read,
                };
                Ok((vec![op], Reply::ok()))
            })
            .await
        }
        XGroup::SetId {
            group,
            id,
            entries_read,
            ..
        } => {
            change(&streams, &name, key_required, |groups, view| {
                if groups.get(&group).is_none() {
                    return Err(no_group_for_key(&group, &key));
                }
                let op = GroupOp::SetId {
                    group,
                    last_id: resolve(id, view),
                    entries_read,
                };
                Ok((vec![op], Reply::ok()))
            })
            .await
        }
        XGroup::Destroy { group, .. } => {
            change(&streams, &name, key_required, |groups, _| {
                Ok(match groups.get(&group) {
                    None => (Vec::new(), Reply::Integer(0)),
                    Some(_) => (vec![GroupOp::Destroy { group }], Reply::Integer(1)),
                })
            })
            .await
        }
        XGroup::CreateConsumer {
            group, consumer, ..
        } => {
            change(&streams, &name, key_required, |groups, view| {
                let Some(g) = groups.get(&group) else {
                    return Err(no_group_for_key(&group, &key));
                };
                if g.consumers.contains_key(&consumer) {
                    return Ok((Vec::new(), Reply::Integer(0)));
                }
                let op = GroupOp::CreateConsumer {
                    group,
                    consumer,
                    now_ms: view.now_ms,
                };
                Ok((vec![op], Reply::Integer(1)))
            })
            .await
        }
        XGroup::DelConsumer {
            group, consumer, ..
        } => {
            change(&streams, &name, key_required, |groups, _| {
                let Some(g) = groups.get(&group) else {
                    return Err(no_group_for_key(&group, &key));
                };
                Ok(match g.consumers.get(&consumer) {
                    None => (Vec::new(), Reply::Integer(0)),
                    Some(c) => {
                        let pending = c.pending.len() as i64;
                        let op = GroupOp::DeleteConsumer { group, consumer };
                        (vec![op], Reply::Integer(pending))
                    }
                })
            })
            .await
        }
        XGroup::Help => unreachable!("answered above"),
    };
    changed.map(Answer::from)
}

fn help() -> Reply {
    let lines = [
        "XGROUP <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
        "CREATE <key> <groupname> <id|$> [option]",
        "    Create a new consumer group. Options are:",
        "    * MKSTREAM",
        "      Create the empty stream if it does not exist.",
        "    * ENTRIESREAD entries_read",
        "      Set the group's entries_read counter (internal use).",
        "CREATECONSUMER <key> <groupname> <consumer>",
        "    Create a new consumer in the specified group.",
        "DELCONSUMER <key> <groupname> <consumer>",
        "    Remove the specified consumer.",
        "DESTROY <key> <groupname>",
        "    Remove the specified group.",
        "SETID <key> <groupname> <id|$> [ENTRIESREAD entries_read]",
        "    Set the current group ID and entries_read counter.",
        "HELP",
        "    Prints this help.",
    ];
    Reply::Array(lines.iter().map(|l| Reply::Simple(l)).collect())
}

/// The entry reply of a record, or `[id, nil]` for one the stream no longer holds.
fn entry_or_gone(id: EntryId, record: Option<&SequencedRecord>) -> Result<Reply, Reply> {
    match record {
        Some(record) => entry_reply(record),
        None => Ok(Reply::Array(vec![
            Reply::Bulk(id.to_bytes()),
            Reply::NullArray,
        ])),
    }
}

/// Whether the stream holds the entry with this ID (its record has that timestamp).
fn holds(records: &BTreeMap<u64, SequencedRecord>, id: &EntryId) -> bool {
    records
        .get(&id.seq_num)
        .is_some_and(|r| r.timestamp == id.timestamp)
}

/// What XREADGROUP did for one key.
enum Served {
    /// Entries for the reply, once the change is durable.
    Entries(Vec<Reply>, Durable),
    /// Nothing new yet (a `>` key): wait for it, if blocking.
    Nothing,
    /// The group moved meanwhile: decide again.
    Again,
}

pub(crate) async fn xreadgroup(session: &Session, command: &XReadGroup) -> Result<Answer, Reply> {
    let streams = session.streams()?;
    let count = match command.count {
        None | Some(0) => MAX_READ_ENTRIES,
        Some(n) => n.min(MAX_READ_ENTRIES),
    };
    let names: Vec<StreamName> = command
        .keys
        .iter()
        .map(stream_name)
        .collect::<Result<_, _>>()?;
    let missing = |key: &Bytes| {
        Reply::error(format!(
            "NOGROUP No such key '{}' or consumer group '{}' in XREADGROUP with GROUP option",
            String::from_utf8_lossy(key),
            command.group
        ))
    };
    // As in Redis, every key and group must exist before any is served.
    for (key, name) in command.keys.iter().zip(&names) {
        let found = peek(
            &streams,
            name,
            || missing(key),
            |groups, _| groups.get(&command.group).is_some(),
        )
        .await?;
        if !found {
            return Err(missing(key));
        }
    }
    let deadline = command.block.map(|ms| match ms {
        0 => None,
        ms => Some(tokio::time::Instant::now() + Duration::from_millis(ms)),
    });
    loop {
        let (mut served, mut durable, mut waits) = (Vec::new(), Vec::new(), Vec::new());
        for ((key, name), from) in command.keys.iter().zip(&names).zip(&command.from) {
            let missing = || missing(key);
            // A key whose group moved while its entries were read is decided again.
            let outcome = loop {
                let outcome = match from {
                    GroupFrom::New => {
                        let (outcome, reader) =
                            deliver_new(&streams, name, command, count, missing).await?;
                        waits.extend(reader);
                        outcome
                    }
                    GroupFrom::After(after) => {
                        redeliver(&streams, name, command, *after, count, missing).await?
                    }
                    GroupFrom::Refused(message) => return Err(Reply::error(*message)),
                };
                if !matches!(outcome, Served::Again) {
                    break outcome;
                }
            };
            if let Served::Entries(entries, change) = outcome {
                served.push((Reply::Bulk(key.clone()), Reply::Array(entries)));
                durable.push(change);
            }
        }
        if !served.is_empty() {
            let reply = if session.resp3 {
                Reply::Map(served)
            } else {
                Reply::Array(
                    served
                        .into_iter()
                        .map(|(k, v)| Reply::Array(vec![k, v]))
                        .collect(),
                )
            };
            return Ok(Answer { reply, durable });
        }
        let Some(deadline) = deadline else {
            return Ok(Answer {
                reply: Reply::NullArray,
                durable,
            });
        };
        let pending: Vec<_> = waits
            .iter_mut()
            .map(|reader| Box::pin(reader.wait_for_records(deadline)))
            .collect();
        let (outcome, _, _) = futures::future::select_all(pending).await;
        match outcome {
            Ok(true) => continue,
            // Handed to another node while waiting (nothing was delivered): answered
            // like a wait that ran out; the client's next call runs at the new owner.
            Ok(false) | Err(streamgate_core::Error::StreamMoved) => {
                return Ok(Answer {
                    reply: Reply::NullArray,
                    durable,
                })
            }
            Err(err) => return Err(error_reply(&err)),
        }
    }
}

/// `>`: the entries after the group's last ID, delivered to the consumer. Also the
/// reader to wait on when there are none.
async fn deliver_new(
    streams: &Streams<'_>,
    name: &StreamName,
    command: &XReadGroup,
    count: u64,
    missing: impl Fn() -> Reply,
) -> Result<(Served, Option<streamgate_core::read::StreamReader>), Reply> {
    let group = &command.group;
    let mut turn = turn(streams, name, &missing).await?;
    let last = peek(streams, name, &missing, |groups, _| {
        groups.get(group).map(|g| g.last_id)
    })
    .await?
    .ok_or_else(&missing)?;
    let (records, reader) =
        entries_after(streams, name, &mut turn, group, last, count, &missing).await?;
    if records.is_empty() {
        return Ok((Served::Nothing, reader));
    }
    let entries: Vec<Reply> = records.iter().map(entry_reply).collect::<Result<_, _>>()?;
    let ids: Vec<EntryId> = records.iter().map(EntryId::of).collect();
    let last_read = records[records.len() - 1].seq_num;
    let (outcome, durable) = change(streams, name, &missing, |groups, view| {
        let Some(g) = groups.get(group) else {
            return Err(missing());
        };
        if g.last_id != last {
            return Ok((Vec::new(), false));
        }
        let op = GroupOp::Deliver {
            group: group.clone(),
            consumer: command.consumer.clone(),
            now_ms: view.now_ms,
            last_id: ids[ids.len() - 1],
            entries_read: Some(last_read + 1),
            ids,
            noack: command.noack,
        };
        Ok((vec![op], true))
    })
    .await?;
    let served = match outcome {
        true => Served::Entries(entries, durable),
        false => Served::Again,
    };
    Ok((served, None))
}

/// Records a delivery reads beyond what it needs, for the next ones (see `GroupTurn`):
/// at most this many, and kept only if they come to no more than `READ_AHEAD_BYTES`.
const READ_AHEAD: u64 = 64;
const READ_AHEAD_BYTES: u64 = 256 * 1024;

/// Up to `count` records after the entry `last`: from those the turn read ahead, or
/// from the log (keeping what was read beyond `count` in the turn). With none, also the
/// reader to wait on for new ones.
async fn entries_after(
    streams: &Streams<'_>,
    name: &StreamName,
    turn: &mut GroupTurn,
    group: &str,
    last: EntryId,
    count: u64,
    missing: impl Fn() -> Reply,
) -> Result<
    (
        Vec<SequencedRecord>,
        Option<streamgate_core::read::StreamReader>,
    ),
    Reply,
> {
    if let Some(records) = turn.take_after(group, last, count as usize) {
        return Ok((records, None));
    }
    let wanted = count.max(READ_AHEAD);
    // After a delivery the last ID is an entry's own, found at its position: read from
    // there and skip it. An ID set by XGROUP may be no entry's: it is looked up by time.
    let Some(mut reader) = streams
        .reader(name, ReadStart::SeqNum(last.seq_num))
        .await?
    else {
        return Err(missing());
    };
    let mut records = streams
        .read_records(&mut reader, wanted + 1, u64::MAX)
        .await?;
    if records.first().map(EntryId::of) == Some(last) {
        records.remove(0);
    } else {
        let start = streams.seq_from_id(name, IdArg::Full(last), false).await?;
        let Some(from_start) = streams.reader(name, ReadStart::SeqNum(start)).await? else {
            return Err(missing());
        };
        reader = from_start;
        records = streams.read_records(&mut reader, wanted, u64::MAX).await?;
    }
    if records.is_empty() {
        return Ok((records, Some(reader)));
    }
    if records.len() as u64 > count {
        let surplus = records.split_off(count as usize);
        let bytes: u64 = surplus.iter().map(SequencedRecord::metered_size).sum();
        if bytes <= READ_AHEAD_BYTES {
            turn.keep_after(group, EntryId::of(&records[records.len() - 1]), surplus);
        }
    }
    Ok((records, None))
}

/// An ID: the consumer's own pending entries after it, delivered again.
async fn redeliver(
    streams: &Streams<'_>,
    name: &StreamName,
    command: &XReadGroup,
    after: EntryId,
    count: u64,
    missing: impl Fn() -> Reply,
) -> Result<Served, Reply> {
    let (group, consumer) = (&command.group, &command.consumer);
    let mine = |groups: &Groups| -> Option<Vec<EntryId>> {
        let g = groups.get(group)?;
        Some(match g.consumers.get(consumer) {
            None => Vec::new(),
            Some(c) => c
                .pending
                .range((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded))
                .take(count as usize)
                .copied()
                .collect(),
        })
    };
    let ids = peek(streams, name, &missing, |groups, _| mine(groups))
        .await?
        .ok_or_else(&missing)?;
    let positions: Vec<u64> = ids.iter().map(|id| id.seq_num).collect();
    let records = streams.records_at(name, &positions).await?;
    let (entries, durable) = change(streams, name, &missing, |groups, view| {
        let Some(now_mine) = mine(groups) else {
            return Err(missing());
        };
        if now_mine != ids {
            return Ok((Vec::new(), None));
        }
        let held: Vec<EntryId> = ids
            .iter()
            .filter(|id| holds(&records, id))
            .copied()
            .collect();
        let mut ops = vec![GroupOp::Touch {
            group: group.clone(),
            consumer: consumer.clone(),
            now_ms: view.now_ms,
        }];
        if !held.is_empty() {
            ops.push(GroupOp::Redeliver {
                group: group.clone(),
                consumer: consumer.clone(),
                now_ms: view.now_ms,
                ids: held,
                delivered_ms: view.now_ms,
                deliveries: None,
                count_up: true,
                create: false,
            });
        }
        let entries = ids
            .iter()
            .map(|id| {
                entry_or_gone(
                    *id,
                    records.get(&id.seq_num).filter(|_| holds(&records, id)),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok((ops, Some(entries)))
    })
    .await?;
    Ok(match entries {
        Some(entries) => Served::Entries(entries, durable),
        None => Served::Again,
    })
}

pub(crate) async fn xack(
    session: &Session,
    key: &Bytes,
    group: &str,
    ids: &[Bytes],
) -> Result<Answer, Reply> {
    let streams = session.streams()?;
    let name = stream_name(key)?;
    change(
        &streams,
        &name,
        || Reply::Integer(0),
        |groups, _| {
            let Some(g) = groups.get(group) else {
                return Ok((Vec::new(), Reply::Integer(0)));
            };
            let ids: Vec<EntryId> = ids
                .iter()
                .map(|id| strict_id(id))
                .collect::<Result<_, _>>()
                .map_err(Reply::error)?;
            let mut acked: Vec<EntryId> = ids
                .into_iter()
                .filter(|id| g.pending.contains_key(id))
                .collect();
            acked.sort_unstable();
            acked.dedup();
            let count = acked.len() as i64;
            let ops = match acked.is_empty() {
                true => Vec::new(),
                false => vec![GroupOp::Ack {
                    group: group.to_owned(),
                    ids: acked,
                }],
            };
            Ok((ops, Reply::Integer(count)))
        },
    )
    .await
    .map(Answer::from)
}

/// The IDs a range of PEL bounds covers.
fn id_range(start: Bound, end: Bound) -> Result<(EntryId, EntryId), Reply> {
    let from = match start {
        Bound::Min => EntryId::MIN,
        Bound::Max => EntryId::MAX,
        Bound::Inclusive(id) => id.id(),
        Bound::Exclusive(id) => {
            next(id.id()).ok_or_else(|| Reply::error("ERR invalid start ID for the interval"))?
        }
    };
    let to = match end {
        Bound::Min => EntryId::MIN,
        Bound::Max => EntryId::MAX,
        Bound::Inclusive(IdArg::TimestampOnly(ts)) => EntryId::new(ts, u64::MAX),
        Bound::Inclusive(id) => id.id(),
        Bound::Exclusive(id) => {
            previous(id.id()).ok_or_else(|| Reply::error("ERR invalid end ID for the interval"))?
        }
    };
    Ok((from, to))
}

fn next(id: EntryId) -> Option<EntryId> {
    match id.seq_num.checked_add(1) {
        Some(seq) => Some(EntryId::new(id.timestamp, seq)),
        None => Some(EntryId::new(id.timestamp.checked_add(1)?, 0)),
    }
}

fn previous(id: EntryId) -> Option<EntryId> {
    match id.seq_num.checked_sub(1) {
        Some(seq) => Some(EntryId::new(id.timestamp, seq)),
        None => Some(EntryId::new(id.timestamp.checked_sub(1)?, u64::MAX)),
    }
}

pub(crate) async fn xpending(
    session: &Session,
    key: &Bytes,
    group: &str,
    range: &Option<PendingRange>,
) -> Result<Answer, Reply> {
    let streams = session.streams()?;
    let name = stream_name(key)?;
    let bounds = match range {
        Some(r) => Some(id_range(r.start, r.end)?),
        None => None,
    };
    let missing = || no_key_or_group(group, key);
    let (reply, durable) = read(&streams, &name, missing, |groups, view| {
        let Some(g) = groups.get(group) else {
            return Err(no_key_or_group(group, key));
        };
        let Some(range) = range else {
            // The summary.
            let (Some(first), Some(last)) = (g.pending.keys().next(), g.pending.keys().next_back())
            else {
                return Ok(Reply::Array(vec![
                    Reply::Integer(0),
                    Reply::Null,
                    Reply::Null,
                    Reply::NullArray,
                ]));
            };
            let consumers = g
                .consumers
                .iter()
                .filter(|(_, c)| !c.pending.is_empty())
                .map(|(name, c)| {
                    Reply::Array(vec![
                        Reply::bulk(name.clone()),
                        Reply::bulk(c.pending.len().to_string()),
                    ])
                })
                .collect();
            return Ok(Reply::Array(vec![
                Reply::Integer(g.pending.len() as i64),
                Reply::Bulk(first.to_bytes()),
                Reply::Bulk(last.to_bytes()),
                Reply::Array(consumers),
            ]));
        };
        let (from, to) = bounds.expect("computed with the range");
        if from > to || range.count == 0 {
            return Ok(Reply::Array(Vec::new()));
        }
        // One consumer's entries come from its own list, as Redis walks it.
        let ids: Box<dyn Iterator<Item = &EntryId>> = match &range.consumer {
            Some(consumer) => match g.consumers.get(consumer) {
                Some(c) => Box::new(c.pending.range(from..=to)),
                None => Box::new(std::iter::empty()),
            },
            None => Box::new(g.pending.range(from..=to).map(|(id, _)| id)),
        };
        let entries = ids
            .filter_map(|id| g.pending.get_key_value(id))
            .filter(|(_, nack)| {
                range
                    .idle
                    .is_none_or(|idle| view.now_ms.saturating_sub(nack.delivered_ms) >= idle)
            })
            .take(range.count.min(MAX_READ_ENTRIES) as usize)
            .map(|(id, nack)| {
                Reply::Array(vec![
                    Reply::Bulk(id.to_bytes()),
                    Reply::bulk(nack.consumer.clone()),
                    Reply::Integer(view.now_ms.saturating_sub(nack.delivered_ms) as i64),
                    Reply::Integer(nack.deliveries as i64),
                ])
            })
            .collect();
        Ok(Reply::Array(entries))
    })
    .await?;
    Ok((reply?, durable).into())
}

pub(crate) async fn xclaim(session: &Session, claim: &XClaim) -> Result<Answer, Reply> {
    let streams = session.streams()?;
    let name = stream_name(&claim.key)?;
    let missing = || no_key_or_group(&claim.group, &claim.key);
    let mut positions: Vec<u64> = claim.ids.iter().map(|id| id.seq_num).collect();
    positions.sort_unstable();
    positions.dedup();
    let records = streams.records_at(&name, &positions).await?;
    change(&streams, &name, missing, |groups, view| {
        let Some(g) = groups.get(&claim.group) else {
            return Err(no_key_or_group(&claim.group, &claim.key));
        };
        if let Some(refused) = &claim.refused {
            return Err(Reply::error(refused.clone()));
        }
        let now = view.now_ms as i64;
        let delivered = match (claim.idle, claim.time) {
            (Some(idle), _) => now - idle,
            (None, Some(time)) => time,
            (None, None) => now,
        };
        let delivered = if delivered < 0 || delivered > now {
            now
        } else {
            delivered
        } as u64;
        let (mut gone, mut claimed, mut created) = (Vec::new(), Vec::new(), Vec::new());
        for id in &claim.ids {
            if !holds(&records, id) {
                if g.pending.contains_key(id) {
                    gone.push(*id);
                }
                continue;
            }
            match g.pending.get(id) {
                None if claim.force => created.push(*id),
                None => {}
                Some(nack) => {
                    if claim.min_idle > 0
                        && view.now_ms.saturating_sub(nack.delivered_ms) < claim.min_idle
                    {
                        continue;
                    }
                    claimed.push(*id);
                }
            }
        }
        let mut ops = Vec::new();
        if !gone.is_empty() {
            ops.push(GroupOp::Ack {
                group: claim.group.clone(),
                ids: gone,
            });
        }
        if let Some(last_id) = claim.last_id {
            if last_id > g.last_id {
                ops.push(GroupOp::Advance {
                    group: claim.group.clone(),
                    last_id,
                });
            }
        }
        let redeliver = |ids: Vec<EntryId>, create: bool| GroupOp::Redeliver {
            group: claim.group.clone(),
            consumer: claim.consumer.clone(),
            now_ms: view.now_ms,
            ids,
            delivered_ms: delivered,
            deliveries: claim.retry_count,
            count_up: !claim.just_id,
            create,
        };
        let answered: Vec<EntryId> = claim
            .ids
            .iter()
            .filter(|id| claimed.contains(id) || created.contains(id))
            .copied()
            .collect();
        if !created.is_empty() {
            ops.push(redeliver(created, true));
        }
        if !claimed.is_empty() {
            ops.push(redeliver(claimed, false));
        }
        let items = answered
            .iter()
            .map(|id| match claim.just_id {
                true => Ok(Reply::Bulk(id.to_bytes())),
                false => entry_reply(&records[&id.seq_num]),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok((ops, Reply::Array(items)))
    })
    .await
    .map(Answer::from)
}

/// What an XAUTOCLAIM takes, as Redis scans the pending entries: up to ten per entry
/// it may claim, each either gone from the stream (no longer pending), idle long
/// enough (claimed) or skipped; and where the next call should start.
#[derive(Debug, PartialEq, Eq)]
struct AutoClaimed {
    gone: Vec<EntryId>,
    claimed: Vec<EntryId>,
    cursor: EntryId,
}

fn auto_claimed(g: &Group, view: &GroupView, from: EntryId, claim: &XAutoClaim) -> AutoClaimed {
    let count = claim.count.min(MAX_READ_ENTRIES);
    let (mut attempts, mut left) = (count * 10, count);
    let (mut gone, mut claimed) = (Vec::new(), Vec::new());
    let mut scan = g.pending.range(from..);
    let mut last_seen = None;
    while attempts > 0 && left > 0 {
        attempts -= 1;
        let Some((id, nack)) = scan.next() else {
            last_seen = None; // the end: the next call starts over
            break;
        };
        last_seen = Some(*id);
        // Pending entries were all in the stream once: below the trim point they are
        // gone.
        if id.seq_num < view.trim_point {
            gone.push(*id);
            left -= 1;
        } else if view.now_ms.saturating_sub(nack.delivered_ms) >= claim.min_idle {
            claimed.push(*id);
            left -= 1;
        }
    }
    let cursor = last_seen
        .and_then(|last| {
            g.pending
                .range((std::ops::Bound::Excluded(last), std::ops::Bound::Unbounded))
                .next()
        })
        .map_or(EntryId::MIN, |(id, _)| *id);
    AutoClaimed {
        gone,
        claimed,
        cursor,
    }
}

pub(crate) async fn xautoclaim(session: &Session, claim: &XAutoClaim) -> Result<Answer, Reply> {
    let streams = session.streams()?;
    let name = stream_name(&claim.key)?;
    let (from, _) = id_range(claim.start, Bound::Max)?;
    let missing = || no_key_or_group(&claim.group, &claim.key);
    let _turn = turn(&streams, &name, missing).await?;
    loop {
        // The entries it would claim now, read before the claim is decided (which
        // decides again if it would claim others).
        let expected = peek(&streams, &name, missing, |groups, view| {
            groups
                .get(&claim.group)
                .map(|g| auto_claimed(g, view, from, claim).claimed)
        })
        .await?
        .ok_or_else(missing)?;
        let records = match claim.just_id {
            true => BTreeMap::new(),
            false => {
                let positions: Vec<u64> = expected.iter().map(|id| id.seq_num).collect();
                streams.records_at(&name, &positions).await?
            }
        };
        let (reply, durable) = change(&streams, &name, missing, |groups, view| {
            let Some(g) = groups.get(&claim.group) else {
                return Err(no_key_or_group(&claim.group, &claim.key));
            };
            let taken = auto_claimed(g, view, from, claim);
            let items = taken
                .claimed
                .iter()
                .map(|id| match claim.just_id {
                    true => Some(Ok(Reply::Bulk(id.to_bytes()))),
                    false => records
                        .get(&id.seq_num)
                        .filter(|_| holds(&records, id))
                        .map(entry_reply),
                })
                .collect::<Option<Result<Vec<_>, _>>>();
            let Some(items) = items else {
                return Ok((Vec::new(), None)); // not read: decide again
            };
            let mut ops = Vec::new();
            if !taken.gone.is_empty() {
                ops.push(GroupOp::Ack {
                    group: claim.group.clone(),
                    ids: taken.gone.clone(),
                });
            }
            if !taken.claimed.is_empty() {
                ops.push(GroupOp::Redeliver {
                    group: claim.group.clone(),
                    consumer: claim.consumer.clone(),
                    now_ms: view.now_ms,
                    ids: taken.claimed,
                    delivered_ms: view.now_ms,
                    deliveries: None,
                    count_up: !claim.just_id,
                    create: false,
                });
            }
            let reply = Reply::Array(vec![
                Reply::Bulk(taken.cursor.to_bytes()),
                Reply::Array(items?),
                Reply::Array(
                    taken
                        .gone
                        .iter()
                        .map(|id| Reply::Bulk(id.to_bytes()))
                        .collect(),
                ),
            ]);
            Ok((ops, Some(reply)))
        })
        .await?;
        if let Some(reply) = reply {
            return Ok((reply, durable).into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse::args;
    use super::*;

    #[test]
    fn group_commands_parse_with_redis_errors() {
        assert!(matches!(
            parse_xgroup(&args("XGROUP CREATE s g $ MKSTREAM")).unwrap(),
            Command::XGroup(XGroup::Create {
                mkstream: true,
                id: StartId::LastEntry,
                ..
            })
        ));
        assert_eq!(
            parse_xgroup(&args("XGROUP CREATE s g - MKSTREAM")).unwrap_err(),
            INVALID_ID
        );
        assert!(matches!(
            parse_xgroup(&args("XGROUP SETID s g -")).unwrap(),
            Command::XGroup(XGroup::SetId {
                id: StartId::Id(EntryId::MIN),
                ..
            })
        ));
        assert_eq!(
            parse_xgroup(&args("XGROUP CREATE s g $ BOGUS")).unwrap_err(),
            "ERR unknown subcommand or wrong number of arguments for 'CREATE'. Try XGROUP HELP."
        );
        assert_eq!(
            parse_xgroup(&args("XGROUP FOO s")).unwrap_err(),
            "ERR unknown subcommand 'FOO'. Try XGROUP HELP."
        );
        assert_eq!(
            parse_xgroup(&args("XGROUP DESTROY s")).unwrap_err(),
            "ERR wrong number of arguments for 'xgroup|destroy' command"
        );
        assert!(parse_xgroup(&args("XGROUP CREATE s g 0 ENTRIESREAD -5"))
            .unwrap_err()
            .contains("positive or -1"));
        let Command::XReadGroup(read) = parse_xreadgroup(&args(
            "XREADGROUP GROUP g c COUNT 2 BLOCK 0 NOACK STREAMS a b > 5-1",
        ))
        .unwrap() else {
            panic!()
        };
        assert_eq!(read.count, Some(2));
        assert_eq!(read.block, Some(0));
        assert!(read.noack);
        assert_eq!(
            read.from,
            [GroupFrom::New, GroupFrom::After(EntryId::new(5, 1))]
        );
        let Command::XReadGroup(read) =
            parse_xreadgroup(&args("XREADGROUP GROUP g c STREAMS a b $ -")).unwrap()
        else {
            panic!()
        };
        assert_eq!(
            read.from,
            [
                GroupFrom::Refused(DOLLAR_IN_XREADGROUP),
                GroupFrom::Refused(INVALID_ID)
            ]
        );
        assert_eq!(
            parse_xreadgroup(&args("XREADGROUP COUNT 1 NOACK STREAMS a >")).unwrap_err(),
            "ERR Missing GROUP option for XREADGROUP"
        );
        assert_eq!(
            parse_xreadgroup(&args("XREADGROUP COUNT 1 STREAMS a >")).unwrap_err(),
            "ERR wrong number of arguments for 'xreadgroup' command"
        );
        let Command::XClaim(claim) = parse_xclaim(&args(
            "XCLAIM s g c 10 1-0 2-0 IDLE 5 RETRYCOUNT 3 FORCE JUSTID LASTID 9-9",
        ))
        .unwrap() else {
            panic!()
        };
        assert_eq!(claim.ids.len(), 2);
        assert_eq!((claim.idle, claim.retry_count), (Some(5), Some(3)));
        assert!(claim.force && claim.just_id);
        assert_eq!(claim.last_id, Some(EntryId::new(9, 9)));
        let Command::XClaim(claim) = parse_xclaim(&args("XCLAIM s g c 0 1-0 JUSTID 2-0")).unwrap()
        else {
            panic!()
        };
        assert_eq!(
            claim.refused.unwrap(),
            "ERR Unrecognized XCLAIM option '2-0'"
        );
        assert_eq!(
            parse_xautoclaim(&args("XAUTOCLAIM s g c 0 - COUNT 0")).unwrap_err(),
            "ERR COUNT must be > 0"
        );
        assert!(matches!(
            parse_xpending(&args("XPENDING s g IDLE 10 - + 5 alice")).unwrap(),
            Command::XPending {
                range: Some(PendingRange {
                    idle: Some(10),
                    count: 5,
                    ..
                }),
                ..
            }
        ));
        assert_eq!(
            parse_xpending(&args("XPENDING s g - +")).unwrap_err(),
            syntax()
        );
    }

    #[test]
    fn pending_ranges_follow_the_bound_rules() {
        let full = |t, s| IdArg::Full(EntryId::new(t, s));
        assert_eq!(
            id_range(
                Bound::Exclusive(full(1, 5)),
                Bound::Inclusive(IdArg::TimestampOnly(3))
            )
            .unwrap(),
            (EntryId::new(1, 6), EntryId::new(3, u64::MAX))
        );
        assert_eq!(
            id_range(Bound::Min, Bound::Exclusive(full(2, 0)))
                .unwrap()
                .1,
            EntryId::new(1, u64::MAX)
        );
        assert!(id_range(Bound::Min, Bound::Exclusive(full(0, 0))).is_err());
        assert!(id_range(Bound::Exclusive(full(u64::MAX, u64::MAX)), Bound::Max).is_err());
    }
}
