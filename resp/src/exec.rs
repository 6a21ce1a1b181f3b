//! Executing commands against the engine, for one connection's session.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use streamgate_core::access::Operation;
use streamgate_core::names::{BasinName, StreamName};
use streamgate_core::read::{ReadLimits, ReadStart, StreamReader};
use streamgate_core::record::{
    AppendInput, AppendRecord, Header, StreamPosition, MAX_BATCH_METERED_BYTES, MAX_BATCH_RECORDS,
};
use streamgate_core::{Caller, Engine, Error};
use tokio::sync::watch;

use crate::command::{Bound, Command, ReadFrom, Trim, MAX_READ_ENTRIES};
use crate::entry::{self, EntryId, IdArg};
use crate::reply::Reply;
use crate::RespSettings;

const RESP_VERSION: &str = "1";

pub struct Session {
    engine: Engine,
    settings: Arc<RespSettings>,
    sni_basin: Option<BasinName>,
    basin: Option<BasinName>,
    /// The engine as the AUTH token allows; `None` until AUTH succeeds.
    caller: Option<Caller>,
    pub resp3: bool,
    name: Option<Bytes>,
    client: crate::Client,
}

/// Pipelined XADDs to one stream, gathered into one append.
pub struct XaddBatch {
    key: Bytes,
    records: Vec<Vec<(Bytes, Bytes)>>,
    metered: u64,
}

impl XaddBatch {
    pub fn start(key: Bytes, fields: Vec<(Bytes, Bytes)>) -> Result<XaddBatch, Reply> {
        let metered = entry::metered_size(&fields);
        if metered > MAX_BATCH_METERED_BYTES {
            return Err(Reply::error(format!(
                "ERR entry of {metered} metered bytes exceeds the 1 MiB record limit"
            )));
        }
        Ok(XaddBatch {
            key,
            records: vec![fields],
            metered,
        })
    }

    /// Whether an XADD of `fields` to `key` can join this batch.
    pub fn accepts(&self, key: &Bytes, fields: &[(Bytes, Bytes)]) -> bool {
        *key == self.key
            && self.records.len() < MAX_BATCH_RECORDS
            && self.metered + entry::metered_size(fields) <= MAX_BATCH_METERED_BYTES
    }

    pub fn push(&mut self, fields: Vec<(Bytes, Bytes)>) {
        self.metered += entry::metered_size(&fields);
        self.records.push(fields);
    }
}

fn record(fields: &[(Bytes, Bytes)]) -> AppendRecord {
    AppendRecord {
        timestamp: None,
        headers: entry::encode_fields(fields),
        body: Bytes::new(),
    }
}

fn trim_record(point: u64) -> AppendRecord {
    AppendRecord {
        timestamp: None,
        headers: vec![Header {
            name: Bytes::new(),
            value: Bytes::from_static(b"trim"),
        }],
        body: Bytes::copy_from_slice(&point.to_be_bytes()),
    }
}

/// The reply to an engine error.
fn error_reply(err: &Error) -> Reply {
    match err {
        Error::ServerDraining | Error::Unavailable(_) | Error::RateLimited { .. } => {
            Reply::error(format!("TRYAGAIN {err}"))
        }
        // The connection stays open: other keys may be in scope.
        Error::PermissionDenied(_) => Reply::error(format!("NOPERM {err}")),
        Error::Unauthenticated(_) => Reply::error(format!("NOAUTH {err}")),
        _ => Reply::error(format!("ERR {err}")),
    }
}

fn entry_reply(record: &streamgate_core::record::SequencedRecord) -> Result<Reply, Reply> {
    let fields = entry::decode_fields(record).map_err(Reply::Error)?;
    Ok(Reply::Array(vec![
        Reply::Bulk(EntryId::of(record).to_bytes()),
        Reply::Array(
            fields
                .into_iter()
                .flat_map(|(f, v)| [Reply::Bulk(f), Reply::Bulk(v)])
                .collect(),
        ),
    ]))
}

impl Session {
    pub fn new(
        engine: Engine,
        settings: Arc<RespSettings>,
        sni_basin: Option<BasinName>,
        client: crate::Client,
    ) -> Session {
        Session {
            engine,
            settings,
            sni_basin,
            basin: None,
            caller: None,
            resp3: false,
            name: None,
            client,
        }
    }

    pub fn authenticated(&self) -> bool {
        self.caller.is_some()
    }

    fn caller(&self) -> &Caller {
        self.caller
            .as_ref()
            .expect("commands that need auth run only after AUTH")
    }

    fn basin(&self) -> &BasinName {
        self.basin
            .as_ref()
            .expect("authenticated sessions have a basin")
    }

    fn stream_name(key: &Bytes) -> Result<StreamName, Reply> {
        std::str::from_utf8(key)
            .ok()
            .and_then(|k| StreamName::new(k).ok())
            .ok_or_else(|| Reply::error("ERR keys are stream names: 1 to 512 bytes of UTF-8"))
    }

    /// AUTH: picks the basin (SNI, else the username, else the configured default) and
    /// verifies the access token; every later command runs with that token's scope.
    async fn authenticate(&mut self, username: Option<&Bytes>, token: &Bytes) -> Result<(), Reply> {
        let named = match username.map(|u| u.as_ref()) {
            None | Some(b"default") => None,
            Some(name) => Some(
                std::str::from_utf8(name)
                    .ok()
                    .and_then(|n| BasinName::new(n).ok())
                    .ok_or_else(|| {
                        Reply::error("WRONGPASS the username must be `default` or a basin name")
                    })?,
            ),
        };
        let basin = match (&self.sni_basin, named) {
            (Some(sni), Some(named)) if *sni != named => {
                return Err(Reply::error("WRONGPASS the username names another basin than the TLS SNI"))
            }
            (Some(sni), _) => sni.clone(),
            (None, Some(named)) => named,
            (None, None) => self.settings.default_basin.clone().ok_or_else(|| {
                Reply::error("ERR no basin: AUTH with the basin name as username, or connect with TLS SNI {basin}.…")
            })?,
        };
        let token = std::str::from_utf8(token)
            .map_err(|_| Reply::error("WRONGPASS the password must be an access token"))?;
        let caller = self
            .engine
            .authenticate(token, Some(self.client.address.ip()))
            .await
            .map_err(|err| match err {
                Error::Unauthenticated(why) => Reply::error(format!("WRONGPASS {why}")),
                other => error_reply(&other),
            })?;
        self.basin = Some(basin);
        self.caller = Some(caller);
        Ok(())
    }

    /// A token revoked or expired since AUTH ends the authentication: `NOAUTH` until
    /// the client authenticates again.
    async fn still_authenticated(&mut self, command: &Command) -> Result<(), Reply> {
        let Some(caller) = self.caller.as_ref().filter(|_| command.needs_auth()) else {
            return Ok(());
        };
        if let Err(err) = caller.still_valid().await {
            self.caller = None;
            return Err(Reply::error(format!("NOAUTH {err}")));
        }
        Ok(())
    }

    /// Checks the operations the S2 docs' permission table lists for a command, on
    /// every key it names, before running it: `NOPERM` if any is outside the scope.
    fn authorize(&self, command: &Command) -> Result<(), Reply> {
        use streamgate_core::access::Operation::*;
        let (keys, ops): (Vec<&Bytes>, Vec<Operation>) = match command {
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
            Command::Exists(keys) => (keys.iter().collect(), vec![GetStreamConfig]),
            Command::Type(key) => (vec![key], vec![GetStreamConfig]),
            _ => return Ok(()),
        };
        let Some(caller) = &self.caller else {
            return Ok(());
        };
        for key in keys {
            // A key that is no stream name gets the command's own error.
            let Ok(name) = Self::stream_name(key) else {
                continue;
            };
            for op in &ops {
                caller
                    .authorize_stream(*op, self.basin(), &name)
                    .map_err(|e| error_reply(&e))?;
            }
        }
        Ok(())
    }

    /// Submits gathered XADDs as one append; the future yields one ID per XADD.
    pub async fn submit_xadds(
        &mut self,
        batch: XaddBatch,
    ) -> BoxFuture<'static, (Vec<Reply>, bool)> {
        let count = batch.records.len();
        let name = match Self::stream_name(&batch.key) {
            Ok(name) => name,
            Err(reply) => return Box::pin(async move { (vec![reply; count], false) }),
        };
        let input = AppendInput {
            records: batch.records.iter().map(|fields| record(fields)).collect(),
            ..Default::default()
        };
        // The token may have been revoked (or have expired) since the batch began.
        let still_valid = match &self.caller {
            Some(caller) => caller.still_valid().await,
            None => Err(Error::Unauthenticated("Authentication required.".into())),
        };
        if let Err(err) = still_valid {
            self.caller = None;
            let reply = Reply::error(format!("NOAUTH {err}"));
            return Box::pin(async move { (vec![reply; count], false) });
        }
        match self
            .caller()
            .submit_append(self.basin(), &name, input, None)
            .await
        {
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
            Err(err) => {
                let reply = error_reply(&err);
                Box::pin(async move { (vec![reply; count], false) })
            }
        }
    }

    /// Runs one command; the flag says the connection closes after the reply.
    pub async fn execute(
        &mut self,
        command: Command,
        shutdown: &mut watch::Receiver<bool>,
    ) -> (Reply, bool) {
        if command.needs_auth() && self.caller.is_none() {
            return (Reply::error("NOAUTH Authentication required."), false);
        }
        if let Err(reply) = self.still_authenticated(&command).await {
            return (reply, false);
        }
        if let Err(reply) = self.authorize(&command) {
            return (reply, false);
        }
        let reply = match command {
            Command::Quit => return (Reply::ok(), true),
            Command::Ping(None) => Reply::Simple("PONG"),
            Command::Ping(Some(message)) | Command::Echo(message) => Reply::Bulk(message),
            Command::Auth { username, password } => {
                match self.authenticate(username.as_ref(), &password).await {
                    Ok(()) => Reply::ok(),
                    Err(reply) => reply,
                }
            }
            Command::Hello {
                protocol,
                auth,
                setname,
            } => {
                if let Some((username, password)) = &auth {
                    if let Err(reply) = self.authenticate(Some(username), password).await {
                        return (reply, false);
                    }
                }
                if self.caller.is_none() {
                    return (Reply::error("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time"), false);
                }
                if let Some(protocol) = protocol {
                    self.resp3 = protocol == 3;
                }
                if let Some(name) = setname {
                    self.name = Some(name);
                }
                self.hello()
            }
            Command::ClientSetName(name) => {
                if name.len() > 1024 || name.iter().any(|b| !b.is_ascii_graphic()) {
                    Reply::error(
                        "ERR Client names cannot contain spaces, newlines or special characters.",
                    )
                } else {
                    self.name = (!name.is_empty()).then_some(name);
                    Reply::ok()
                }
            }
            Command::ClientGetName => self.name.clone().map_or(Reply::Null, Reply::Bulk),
            Command::ClientSetInfo => Reply::ok(),
            Command::Select(db) if db.as_ref() == b"0" => Reply::ok(),
            Command::Select(_) => Reply::error("ERR only database 0 exists"),
            Command::CommandInfo => Reply::Array(vec![]),
            Command::Info(sections) => self.info(&sections),
            Command::Exists(keys) => {
                let mut count = 0;
                for key in &keys {
                    if self.exists(key).await {
                        count += 1;
                    }
                }
                Reply::Integer(count)
            }
            Command::Type(key) => Reply::Simple(if self.exists(&key).await {
                "stream"
            } else {
                "none"
            }),
            Command::XLen(key) => match self.xlen(&key).await {
                Ok(len) => Reply::Integer(len as i64),
                Err(reply) => reply,
            },
            Command::XAdd {
                key,
                nomkstream,
                trim,
                fields,
            } => self.xadd(&key, nomkstream, trim, &fields).await,
            Command::XTrim { key, trim } => {
                self.xtrim(&key, trim).await.unwrap_or_else(|reply| reply)
            }
            Command::XRange {
                key,
                start,
                end,
                count,
            } => self
                .xrange(&key, start, end, count)
                .await
                .unwrap_or_else(|reply| reply),
            Command::XRead {
                count,
                block,
                keys,
                from,
            } => {
                tokio::select! {
                    reply = self.xread(count, block, &keys, &from) => reply.unwrap_or_else(|reply| reply),
                    _ = crate::stopped(shutdown) => return (Reply::error("ERR session closing; blocking read interrupted"), true),
                }
            }
        };
        (reply, false)
    }

    fn hello(&self) -> Reply {
        Reply::Map(vec![
            (Reply::bulk("server"), Reply::bulk("s2-resp")),
            (Reply::bulk("version"), Reply::bulk("6.2.0")),
            (
                Reply::bulk("proto"),
                Reply::Integer(if self.resp3 { 3 } else { 2 }),
            ),
            (Reply::bulk("id"), Reply::Integer(self.client.id as i64)),
            (Reply::bulk("mode"), Reply::bulk("standalone")),
            (Reply::bulk("role"), Reply::bulk("master")),
            (Reply::bulk("modules"), Reply::Array(vec![])),
            (Reply::bulk("s2_resp_version"), Reply::bulk(RESP_VERSION)),
        ])
    }

    fn info(&self, sections: &[Bytes]) -> Reply {
        let wants = |name: &str| {
            sections.is_empty()
                || sections.iter().any(|s| {
                    let s = String::from_utf8_lossy(s).to_ascii_lowercase();
                    s == name || s == "all" || s == "default" || s == "everything"
                })
        };
        let mut text = String::new();
        if wants("server") {
            text.push_str(&format!(
                "# Server\r\nredis_version:6.2.0\r\nredis_mode:standalone\r\ns2_resp_version:{RESP_VERSION}\r\n"
            ));
        }
        if wants("persistence") {
            if !text.is_empty() {
                text.push_str("\r\n");
            }
            text.push_str("# Persistence\r\nloading:0\r\n");
        }
        Reply::Bulk(Bytes::from(text))
    }

    async fn exists(&self, key: &Bytes) -> bool {
        match Self::stream_name(key) {
            Ok(name) => self
                .caller()
                .stream_config(self.basin(), &name)
                .await
                .is_ok(),
            Err(_) => false,
        }
    }

    /// A reader at the first retained entry (trim point), creating the stream if the
    /// basin creates streams on read. `Ok(None)` if the stream does not exist.
    async fn reader(
        &self,
        name: &StreamName,
        start: ReadStart,
    ) -> Result<Option<StreamReader>, Reply> {
        match self
            .caller()
            .open_reader(self.basin(), name, start, true, None)
            .await
        {
            Ok(reader) => Ok(Some(reader)),
            Err(Error::StreamNotFound(_)) => Ok(None),
            Err(err) => Err(error_reply(&err)),
        }
    }

    /// The first sequence number at or after timestamp `ts` (the tail if none).
    async fn seq_at_timestamp(&self, name: &StreamName, ts: u64) -> Result<u64, Reply> {
        Ok(self
            .reader(name, ReadStart::Timestamp(ts))
            .await?
            .map_or(0, |r| r.position()))
    }

    /// The first sequence number whose entry ID is at least (`inclusive`) or greater
    /// than `id`. IDs order by (timestamp, seq_num), which for one stream is the order
    /// of sequence numbers; an ID that names no entry falls between entries.
    async fn seq_from_id(
        &self,
        name: &StreamName,
        id: IdArg,
        inclusive: bool,
    ) -> Result<u64, Reply> {
        let (ts, seq) = match id {
            IdArg::TimestampOnly(ts) => (ts, if inclusive { 0 } else { u64::MAX }),
            IdArg::Full(id) => (id.timestamp, id.seq_num),
        };
        let first_at = self.seq_at_timestamp(name, ts).await?;
        let first_after = self.seq_at_timestamp(name, ts.saturating_add(1)).await?;
        let threshold = if inclusive {
            seq
        } else {
            seq.saturating_add(1)
        };
        Ok(first_at.max(threshold).min(first_after))
    }

    async fn xlen(&self, key: &Bytes) -> Result<u64, Reply> {
        let name = Self::stream_name(key)?;
        Ok(match self.reader(&name, ReadStart::SeqNum(0)).await? {
            Some(reader) => reader.tail().seq_num - reader.position(),
            None => 0,
        })
    }

    /// Where a trim should put the trim point, given the stream's tail and first
    /// retained entry and how many records the trim's own append adds.
    async fn trim_point(
        &self,
        name: &StreamName,
        trim: Trim,
        tail: StreamPosition,
        appended: u64,
    ) -> Result<u64, Reply> {
        Ok(match trim {
            Trim::MaxLen(keep) => (tail.seq_num + appended).saturating_sub(keep),
            Trim::MinId(id) => self.seq_from_id(name, id, true).await?,
        })
    }

    async fn xadd(
        &self,
        key: &Bytes,
        nomkstream: bool,
        trim: Option<Trim>,
        fields: &[(Bytes, Bytes)],
    ) -> Reply {
        let name = match Self::stream_name(key) {
            Ok(name) => name,
            Err(reply) => return reply,
        };
        if nomkstream {
            // The check creates the stream if the basin creates streams on read.
            match self.caller().check_tail(self.basin(), &name, None).await {
                Ok(_) => {}
                Err(Error::StreamNotFound(_)) => return Reply::Null,
                Err(err) => return error_reply(&err),
            }
        }
        let mut records = vec![record(fields)];
        if let Some(trim) = trim {
            let tail = match self.reader(&name, ReadStart::TailOffset(0)).await {
                Ok(Some(reader)) => reader.tail(),
                Ok(None) => StreamPosition::default(),
                Err(reply) => return reply,
            };
            match self.trim_point(&name, trim, tail, 2).await {
                Ok(point) => records.push(trim_record(point)),
                Err(reply) => return reply,
            }
        }
        let input = AppendInput {
            records,
            ..Default::default()
        };
        match self.caller().append(self.basin(), &name, input, None).await {
            Ok(ack) => Reply::Bulk(
                EntryId {
                    timestamp: ack.start.timestamp,
                    seq_num: ack.start.seq_num,
                }
                .to_bytes(),
            ),
            Err(err) => error_reply(&err),
        }
    }

    async fn xtrim(&self, key: &Bytes, trim: Trim) -> Result<Reply, Reply> {
        let name = Self::stream_name(key)?;
        let Some(reader) = self.reader(&name, ReadStart::SeqNum(0)).await? else {
            return Ok(Reply::Integer(0));
        };
        let (first, tail) = (reader.position(), reader.tail());
        let point = self.trim_point(&name, trim, tail, 1).await?;
        if point <= first {
            return Ok(Reply::Integer(0));
        }
        let input = AppendInput {
            records: vec![trim_record(point)],
            ..Default::default()
        };
        self.caller()
            .append(self.basin(), &name, input, None)
            .await
            .map_err(|e| error_reply(&e))?;
        // The estimate counts entries that existed before the trim record.
        Ok(Reply::Integer((point.min(tail.seq_num) - first) as i64))
    }

    /// Reads entries from `reader` up to `count` and below `end_seq`, without waiting.
    async fn read_entries(
        reader: &mut StreamReader,
        count: u64,
        end_seq: u64,
    ) -> Result<Vec<Reply>, Reply> {
        let mut entries = Vec::new();
        while (entries.len() as u64) < count && reader.position() < end_seq && !reader.at_tail() {
            let limits = ReadLimits {
                count: Some((count - entries.len() as u64).min(MAX_BATCH_RECORDS as u64)),
                bytes: Some(MAX_BATCH_METERED_BYTES),
                until: None,
            };
            let (batch, _) = reader
                .next_batch(limits)
                .await
                .map_err(|e| error_reply(&e))?;
            if batch.records.is_empty() {
                break;
            }
            for record in batch.records.iter().take_while(|r| r.seq_num < end_seq) {
                entries.push(entry_reply(record)?);
            }
        }
        Ok(entries)
    }

    async fn xrange(
        &self,
        key: &Bytes,
        start: Bound,
        end: Bound,
        count: Option<u64>,
    ) -> Result<Reply, Reply> {
        let name = Self::stream_name(key)?;
        let count = count.unwrap_or(MAX_READ_ENTRIES).min(MAX_READ_ENTRIES);
        let start_seq = match start {
            Bound::Min => 0,
            Bound::Max => u64::MAX,
            Bound::Inclusive(id) => self.seq_from_id(&name, id, true).await?,
            Bound::Exclusive(id) => self.seq_from_id(&name, id, false).await?,
        };
        let end_seq = match end {
            Bound::Max => u64::MAX,
            Bound::Min => 0,
            Bound::Inclusive(id) => self.seq_from_id(&name, id, false).await?,
            Bound::Exclusive(id) => self.seq_from_id(&name, id, true).await?,
        };
        let Some(mut reader) = self.reader(&name, ReadStart::SeqNum(start_seq)).await? else {
            return Ok(Reply::Array(vec![]));
        };
        Ok(Reply::Array(
            Self::read_entries(&mut reader, count, end_seq).await?,
        ))
    }

    async fn xread(
        &self,
        count: Option<u64>,
        block: Option<u64>,
        keys: &[Bytes],
        from: &[ReadFrom],
    ) -> Result<Reply, Reply> {
        // Entries are shared out evenly across the streams.
        let per_stream = count
            .unwrap_or(MAX_READ_ENTRIES)
            .min(MAX_READ_ENTRIES / keys.len() as u64)
            .max(1);
        let mut readers = Vec::with_capacity(keys.len());
        for (key, from) in keys.iter().zip(from) {
            let name = Self::stream_name(key)?;
            let start = match from {
                ReadFrom::Tail => ReadStart::TailOffset(0),
                ReadFrom::After(id) => {
                    ReadStart::SeqNum(self.seq_from_id(&name, *id, false).await?)
                }
            };
            readers.push((key.clone(), self.reader(&name, start).await?));
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
            for (key, reader) in readers.iter_mut() {
                if let Some(reader) = reader {
                    let entries = Self::read_entries(reader, per_stream, u64::MAX).await?;
                    if !entries.is_empty() {
                        results.push((Reply::Bulk(key.clone()), Reply::Array(entries)));
                    }
                }
            }
            if !results.is_empty() {
                return Ok(if self.resp3 {
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
                .filter_map(|(_, reader)| reader.as_mut())
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
                Err(err) => return Err(error_reply(&err)),
            }
        }
    }
}
