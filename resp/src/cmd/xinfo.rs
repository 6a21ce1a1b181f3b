//! `XINFO STREAM key [FULL [COUNT n]]`, `XINFO GROUPS key`, `XINFO CONSUMERS key group`
//! and `XINFO HELP`, with Redis 7.0's fields. A stream here never has deleted entries
//! in its middle (there is no XDEL), so `max-deleted-entry-id` is always `0-0` and a
//! group's lag is always known.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;

use bytes::Bytes;
use streamgate_core::groups::{EntryId, Group, GroupView, Groups};
use streamgate_core::names::StreamName;
use streamgate_core::read::ReadStart;
use streamgate_core::record::SequencedRecord;

use super::parse::{signed, upper};
use super::{Command, MAX_READ_ENTRIES};
use crate::entry::IdArg;
use crate::reply::Reply;
use crate::session::{error_reply, stream_name, Session};
use crate::streams::{entry_reply, Streams};

/// How many entries and pending entries `XINFO STREAM FULL` shows by default.
const FULL_COUNT: u64 = 10;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XInfo {
    /// `full` is `Some(count)` for the FULL form (0 for everything).
    Stream {
        key: Bytes,
        full: Option<u64>,
    },
    Groups {
        key: Bytes,
    },
    Consumers {
        key: Bytes,
        group: Bytes,
    },
    Help,
}

impl XInfo {
    /// The stream it is about (none for HELP).
    pub fn key(&self) -> Option<&Bytes> {
        match self {
            XInfo::Stream { key, .. } | XInfo::Groups { key } | XInfo::Consumers { key, .. } => {
                Some(key)
            }
            XInfo::Help => None,
        }
    }
}

pub(crate) fn parse(args: &[Bytes]) -> Result<Command, String> {
    let sub = upper(&args[1]);
    let n = args.len();
    let arity = |ok: bool| match ok {
        true => Ok(()),
        false => Err(format!(
            "ERR wrong number of arguments for 'xinfo|{}' command",
            sub.to_ascii_lowercase()
        )),
    };
    Ok(Command::XInfo(match sub.as_str() {
        "HELP" => {
            arity(n == 2)?;
            XInfo::Help
        }
        "GROUPS" => {
            arity(n == 3)?;
            XInfo::Groups {
                key: args[2].clone(),
            }
        }
        "CONSUMERS" => {
            arity(n == 4)?;
            XInfo::Consumers {
                key: args[2].clone(),
                group: args[3].clone(),
            }
        }
        "STREAM" => {
            arity(n >= 3)?;
            let options: Vec<String> = args[3..].iter().map(|a| upper(a)).collect();
            let full = match options.as_slice() {
                [] => None,
                [full] if full == "FULL" => Some(FULL_COUNT),
                [full, count, value] if full == "FULL" && count == "COUNT" => {
                    let value = signed(&args[5], "ERR value is not an integer or out of range")?;
                    Some(if value < 0 { FULL_COUNT } else { value as u64 })
                }
                _ => {
                    return Err(format!(
                    "ERR unknown subcommand or wrong number of arguments for '{}'. Try XINFO HELP.",
                    String::from_utf8_lossy(&args[1])
                ))
                }
            };
            XInfo::Stream {
                key: args[2].clone(),
                full,
            }
        }
        _ => {
            return Err(format!(
                "ERR unknown subcommand '{}'. Try XINFO HELP.",
                String::from_utf8_lossy(&args[1])
            ))
        }
    }))
}

pub(crate) async fn apply(session: &Session, command: &XInfo) -> Result<Reply, Reply> {
    let streams = session.streams()?;
    let key = match command {
        XInfo::Help => return Ok(help()),
        XInfo::Stream { key, .. } | XInfo::Groups { key } | XInfo::Consumers { key, .. } => key,
    };
    let name = stream_name(key)?;
    let no_such_key = || Reply::error("ERR no such key");
    let ((groups, view), durable) = streams
        .caller
        .read_groups(streams.basin, &name, |groups, view| (groups.clone(), *view))
        .await
        .map_err(|err| match err {
            streamgate_core::Error::NotFound(streamgate_core::Resource::Stream(_)) => no_such_key(),
            other => error_reply(&other),
        })?;
    // What it shows survives a crash (XINFO is seldom pipelined: it just waits).
    durable.await.map_err(|err| error_reply(&err))?;
    let facts = Facts::of(&streams, &name, &view, &groups).await?;
    match command {
        XInfo::Help => unreachable!("answered above"),
        XInfo::Groups { .. } => Ok(Reply::Array(
            groups
                .groups
                .iter()
                .map(|(name, g)| {
                    Reply::Map(vec![
                        field("name", Reply::bulk(name.clone())),
                        field("consumers", Reply::Integer(g.consumers.len() as i64)),
                        field("pending", Reply::Integer(g.pending.len() as i64)),
                        field("last-delivered-id", Reply::Bulk(g.last_id.to_bytes())),
                        field("entries-read", entries_read(g)),
                        field("lag", Reply::Integer(facts.lag(g))),
                    ])
                })
                .collect(),
        )),
        XInfo::Consumers { group, .. } => {
            let found = std::str::from_utf8(group)
                .ok()
                .and_then(|group| groups.get(group));
            let Some(g) = found else {
                return Err(Reply::error(format!(
                    "NOGROUP No such consumer group '{}' for key name '{}'",
                    String::from_utf8_lossy(group),
                    String::from_utf8_lossy(key)
                )));
            };
            Ok(Reply::Array(
                g.consumers
                    .iter()
                    .map(|(name, c)| {
                        Reply::Map(vec![
                            field("name", Reply::bulk(name.clone())),
                            field("pending", Reply::Integer(c.pending.len() as i64)),
                            field("idle", Reply::Integer(idle(view.now_ms, c.seen_ms))),
                        ])
                    })
                    .collect(),
            ))
        }
        XInfo::Stream { full: None, .. } => {
            let mut fields = facts.head(field);
            fields.extend([
                field("groups", Reply::Integer(groups.groups.len() as i64)),
                field(
                    "first-entry",
                    facts.first.as_ref().map_or(Ok(Reply::Null), entry_reply)?,
                ),
                field(
                    "last-entry",
                    facts.last.as_ref().map_or(Ok(Reply::Null), entry_reply)?,
                ),
            ]);
            Ok(Reply::Map(fields))
        }
        XInfo::Stream {
            full: Some(count), ..
        } => {
            let count = match *count {
                0 => MAX_READ_ENTRIES,
                n => n.min(MAX_READ_ENTRIES),
            };
            let entries = match streams.reader(&name, ReadStart::SeqNum(0)).await? {
                Some(mut reader) => streams.read_entries(&mut reader, count, u64::MAX).await?,
                None => Vec::new(),
            };
            let mut fields = facts.head(field);
            fields.push(field("entries", Reply::Array(entries)));
            fields.push(field("groups", full_groups(&groups, &facts, count)));
            Ok(Reply::Map(fields))
        }
    }
}

/// What XINFO reports of the stream itself.
struct Facts {
    view: GroupView,
    /// Retained entries.
    length: u64,
    first: Option<SequencedRecord>,
    last: Option<SequencedRecord>,
    /// For the last ID of each group that does not count its reads: how many entries
    /// were added up to it.
    read_through: BTreeMap<EntryId, u64>,
}

impl Facts {
    async fn of(
        streams: &Streams<'_>,
        name: &StreamName,
        view: &GroupView,
        groups: &Groups,
    ) -> Result<Facts, Reply> {
        let tail = view.tail.seq_num;
        let mut reader = streams.reader(name, ReadStart::SeqNum(0)).await?;
        let first_at = reader.as_ref().map_or(tail, |r| r.position().min(tail));
        let first = match reader.as_mut() {
            Some(reader) => streams.read_records(reader, 1, tail).await?.pop(),
            None => None,
        };
        let last = match tail.checked_sub(1) {
            Some(at) if at >= first_at => streams.records_at(name, &[at]).await?.remove(&at),
            _ => None,
        };
        // Positions order as IDs do, so the entries up to an ID end where the first
        // entry after it starts.
        let mut read_through = BTreeMap::new();
        for g in groups.groups.values().filter(|g| g.entries_read.is_none()) {
            if let Entry::Vacant(slot) = read_through.entry(g.last_id) {
                let after = streams
                    .seq_from_id(name, IdArg::Full(g.last_id), false)
                    .await?;
                slot.insert(after.min(tail));
            }
        }
        Ok(Facts {
            view: *view,
            length: tail - first_at,
            first,
            last,
            read_through,
        })
    }

    fn head(&self, field: impl Fn(&'static str, Reply) -> (Reply, Reply)) -> Vec<(Reply, Reply)> {
        let first_id = self.first.as_ref().map_or(EntryId::MIN, EntryId::of);
        vec![
            field("length", Reply::Integer(self.length as i64)),
            field("radix-tree-keys", Reply::Integer(0)),
            field("radix-tree-nodes", Reply::Integer(0)),
            field(
                "last-generated-id",
                Reply::Bulk(self.view.last_entry().to_bytes()),
            ),
            field("max-deleted-entry-id", Reply::Bulk(EntryId::MIN.to_bytes())),
            field(
                "entries-added",
                Reply::Integer(self.view.tail.seq_num as i64),
            ),
            field("recorded-first-entry-id", Reply::Bulk(first_id.to_bytes())),
        ]
    }

    /// Entries added to the stream that the group has not read: by the group's own
    /// count (which a client may set to anything, as in Redis), or else by where its
    /// last ID falls.
    fn lag(&self, group: &Group) -> i64 {
        let added = self.view.tail.seq_num;
        let read = group
            .entries_read
            .or_else(|| self.read_through.get(&group.last_id).copied())
            .unwrap_or(added);
        added as i64 - read as i64
    }
}

fn entries_read(group: &Group) -> Reply {
    group
        .entries_read
        .map_or(Reply::Null, |n| Reply::Integer(n as i64))
}

/// One field of an XINFO answer: Redis names them with bulk strings, not status replies.
fn field(name: &'static str, value: Reply) -> (Reply, Reply) {
    (Reply::Bulk(Bytes::from_static(name.as_bytes())), value)
}

fn idle(now_ms: u64, since_ms: u64) -> i64 {
    now_ms.saturating_sub(since_ms) as i64
}

fn full_groups(groups: &Groups, facts: &Facts, count: u64) -> Reply {
    let count = count as usize;
    Reply::Array(
        groups
            .groups
            .iter()
            .map(|(name, g)| {
                let pending = g
                    .pending
                    .iter()
                    .take(count)
                    .map(|(id, nack)| {
                        Reply::Array(vec![
                            Reply::Bulk(id.to_bytes()),
                            Reply::bulk(nack.consumer.clone()),
                            Reply::Integer(nack.delivered_ms as i64),
                            Reply::Integer(nack.deliveries as i64),
                        ])
                    })
                    .collect();
                let consumers = g
                    .consumers
                    .iter()
                    .map(|(name, c)| {
                        let pending = c
                            .pending
                            .iter()
                            .take(count)
                            .filter_map(|id| g.pending.get(id).map(|nack| (id, nack)))
                            .map(|(id, nack)| {
                                Reply::Array(vec![
                                    Reply::Bulk(id.to_bytes()),
                                    Reply::Integer(nack.delivered_ms as i64),
                                    Reply::Integer(nack.deliveries as i64),
                                ])
                            })
                            .collect();
                        Reply::Map(vec![
                            field("name", Reply::bulk(name.clone())),
                            field("seen-time", Reply::Integer(c.seen_ms as i64)),
                            field("pel-count", Reply::Integer(c.pending.len() as i64)),
                            field("pending", Reply::Array(pending)),
                        ])
                    })
                    .collect();
                Reply::Map(vec![
                    field("name", Reply::bulk(name.clone())),
                    field("last-delivered-id", Reply::Bulk(g.last_id.to_bytes())),
                    field("entries-read", entries_read(g)),
                    field("lag", Reply::Integer(facts.lag(g))),
                    field("pel-count", Reply::Integer(g.pending.len() as i64)),
                    field("pending", Reply::Array(pending)),
                    field("consumers", Reply::Array(consumers)),
                ])
            })
            .collect(),
    )
}

fn help() -> Reply {
    let lines = [
        "XINFO <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
        "CONSUMERS <key> <groupname>",
        "    Show consumers of <groupname>.",
        "GROUPS <key>",
        "    Show the stream consumer groups.",
        "STREAM <key> [FULL [COUNT <count>]",
        "    Show information about the stream.",
        "HELP",
        "    Prints this help.",
    ];
    Reply::Array(lines.iter().map(|l| Reply::Simple(l)).collect())
}

#[cfg(test)]
mod tests {
    use super::super::parse::args;
    use super::*;

    #[test]
    fn forms_and_redis_errors() {
        assert_eq!(
            parse(&args("XINFO STREAM s FULL COUNT -3")).unwrap(),
            Command::XInfo(XInfo::Stream {
                key: "s".into(),
                full: Some(FULL_COUNT)
            })
        );
        assert_eq!(
            parse(&args("xinfo stream s full")).unwrap(),
            Command::XInfo(XInfo::Stream {
                key: "s".into(),
                full: Some(FULL_COUNT)
            })
        );
        assert_eq!(
            parse(&args("XINFO stream s FULL COUNT")).unwrap_err(),
            "ERR unknown subcommand or wrong number of arguments for 'stream'. Try XINFO HELP."
        );
        assert_eq!(
            parse(&args("XINFO GROUPS")).unwrap_err(),
            "ERR wrong number of arguments for 'xinfo|groups' command"
        );
        assert_eq!(
            parse(&args("XINFO nope s")).unwrap_err(),
            "ERR unknown subcommand 'nope'. Try XINFO HELP."
        );
        assert!(matches!(
            parse(&args("XINFO CONSUMERS s g")).unwrap(),
            Command::XInfo(XInfo::Consumers { .. })
        ));
    }

    #[test]
    fn lag_counts_entries_added_after_what_the_group_read() {
        let record = |seq_num: u64| SequencedRecord {
            seq_num,
            timestamp: 100 + seq_num,
            headers: Vec::new(),
            body: Bytes::new(),
        };
        // Ten entries added, the first four trimmed away.
        let facts = Facts {
            view: GroupView {
                tail: streamgate_core::record::StreamPosition {
                    seq_num: 10,
                    timestamp: 109,
                },
                trim_point: 4,
                now_ms: 0,
            },
            length: 6,
            first: Some(record(4)),
            last: Some(record(9)),
            read_through: [(EntryId::MIN, 4), (EntryId::new(106, 0), 6)].into(),
        };
        let group = |last_id: EntryId, entries_read: Option<u64>| Group {
            last_id,
            entries_read,
            ..Default::default()
        };
        assert_eq!(facts.lag(&group(EntryId::MIN, None)), 6);
        assert_eq!(facts.lag(&group(EntryId::new(106, 0), None)), 4);
        assert_eq!(facts.lag(&group(EntryId::new(106, 6), Some(7))), 3);
        // A count set by the client wins, even a wrong one.
        assert_eq!(facts.lag(&group(EntryId::MIN, Some(12))), -2);
    }
}
