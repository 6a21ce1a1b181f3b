//! `Caller`: the engine as one authenticated principal sees it. Every operation checks
//! the principal's scope first, then maps stream names (auto-prefixing) on the way in
//! and out, so each front end — REST, sessions, RESP, OTLP — enforces the same rules by
//! calling the engine only through here.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use crate::access::{AccessTokenInfo, Operation, Principal, ResourceSet, Target};
use crate::appender::PendingAck;
use crate::catalog::Provisioned;
use crate::config::{BasinConfig, BasinReconfiguration, StreamConfig, StreamReconfiguration};
use crate::encryption::EncryptionKey;
use crate::engine::{Access, Engine, Submitted};
use crate::error::{Error, Resource, Result};
use crate::groups::{Durable, GroupOp, GroupTurn, GroupView, Groups};
use crate::metrics::{Metric, MetricLevel, MetricSet, TimeRange};
use crate::names::{BasinName, StreamName};
use crate::read::{ReadBatch, ReadLimits, ReadRequest, ReadStart, StreamReader};
use crate::record::{AppendAck, AppendInput, Command, StreamPosition};
use crate::remote::{RemoteStream, RemoteStreams};
use crate::storage::metadata::{BasinRecord, ListPage, ListRange, StreamRecord};
use crate::usage::ConnectionId;

#[derive(Clone)]
pub struct Caller {
    engine: Engine,
    principal: Arc<Principal>,
    /// The digest of the token's secret, to check it is still valid; `None` for the
    /// server's own root access.
    digest: Option<[u8; 32]>,
    /// The token itself, for calls this node makes on the caller's behalf at the node
    /// that sequences a stream (see `remote`); `None` for root access.
    bearer: Option<Arc<str>>,
    /// The request was forwarded here by another node: it is not sent on again (see
    /// `remote_at`), so a request can never travel in a circle between nodes.
    forwarded: bool,
    /// The key the request (or session) brought for an encrypted stream: kept only as
    /// long as the caller, which lives as long as its request or session.
    encryption_key: Option<EncryptionKey>,
    /// The client connection the request came on, for the usage counts.
    connection: Option<ConnectionId>,
    /// The token's last verification: a session checks its token before every batch,
    /// a RESP connection before every command, and asking the registry each time (a
    /// shared lock and map, two clock reads) was a few per cent of the server's CPU
    /// with 10,000 readers (BENCHMARKS.md, "Live readers"). Held inline, as each
    /// follower's state is out of the processor's caches by its next delivery.
    verified: RememberedVerification,
}

/// A verification of the caller's token, and until when it holds.
#[derive(Clone, Copy)]
struct VerifiedUntil {
    until: Instant,
    /// The registry's count of revocations before the verification.
    revocations: u64,
}

/// The caller's last `VerifiedUntil`, if any; a clone starts with the same.
#[derive(Default)]
struct RememberedVerification(Mutex<Option<VerifiedUntil>>);

impl Clone for RememberedVerification {
    fn clone(&self) -> Self {
        RememberedVerification(Mutex::new(*self.0.lock()))
    }
}

impl Caller {
    /// The engine as the holder of `bearer` (an access token's secret) sees it.
    /// `client` is the peer's address, when the front end knows it: failed attempts are
    /// throttled per address.
    pub async fn authenticate(
        engine: &Engine,
        bearer: &str,
        client: Option<std::net::IpAddr>,
    ) -> Result<Caller> {
        let (principal, digest) = engine.tokens().authenticate(bearer, client).await?;
        Ok(Caller {
            engine: engine.clone(),
            principal,
            digest: Some(digest),
            bearer: Some(bearer.into()),
            forwarded: false,
            encryption_key: None,
            connection: None,
            verified: RememberedVerification::default(),
        })
    }

    /// The engine with full access, for the server's own work and for tests.
    pub fn root(engine: &Engine) -> Caller {
        Caller {
            engine: engine.clone(),
            principal: Arc::new(Principal::root()),
            digest: None,
            bearer: None,
            forwarded: false,
            encryption_key: None,
            connection: None,
            verified: RememberedVerification::default(),
        }
    }

    /// The same caller, for a request another node forwarded here.
    pub fn forwarded(self) -> Caller {
        Caller {
            forwarded: true,
            ..self
        }
    }

    /// The same caller, with the key of an encrypted stream for its appends and reads
    /// (ignored for plaintext streams, as S2 does).
    pub fn with_encryption_key(self, encryption_key: Option<EncryptionKey>) -> Caller {
        Caller {
            encryption_key,
            ..self
        }
    }

    /// The same caller, on a client connection (what the usage counts count as one
    /// connection).
    pub fn with_connection(self, connection: Option<ConnectionId>) -> Caller {
        Caller { connection, ..self }
    }

    /// The connection the caller came on.
    pub fn connection(&self) -> Option<ConnectionId> {
        self.connection
    }

    fn access(&self) -> Access<'_> {
        Access {
            key: self.encryption_key.as_ref(),
            connection: self.connection,
        }
    }

    /// Counts a request that succeeded as an account operation (`basin` `None`) or a
    /// basin operation, for the metrics API.
    fn counted<T>(
        &self,
        op: Operation,
        basin: Option<&BasinName>,
        outcome: Result<T>,
    ) -> Result<T> {
        if outcome.is_ok() {
            self.engine.usage().operation(basin, op.name());
        }
        outcome
    }

    /// `authn` once the token has been revoked (seen within `CACHE_TTL`) or has
    /// expired. Every operation below checks this first, so a session or connection
    /// that goes on making calls stops as soon as its token is no longer valid.
    pub async fn still_valid(&self) -> Result<()> {
        let Some(digest) = &self.digest else {
            return Ok(());
        };
        let tokens = self.engine.tokens();
        let revocations = tokens.revocations();
        let remembered = *self.verified.0.lock();
        if remembered.is_some_and(|v| v.revocations == revocations && Instant::now() < v.until) {
            return Ok(());
        }
        let (_, until) = tokens.verified_until(digest).await?;
        *self.verified.0.lock() = until.map(|until| VerifiedUntil { until, revocations });
        Ok(())
    }

    /// What this server is configured with (location, storage class, ...).
    pub fn settings(&self) -> &crate::EngineSettings {
        self.engine.settings()
    }

    /// See `Engine::is_congested`.
    pub fn is_congested(&self, metered: u64) -> bool {
        self.engine.is_congested(metered)
    }

    /// Checks that `op` is allowed on a stream, without doing it: for front ends whose
    /// commands are documented to need more operations than the calls they make (RESP).
    pub fn authorize_stream(
        &self,
        op: Operation,
        basin: &BasinName,
        name: &StreamName,
    ) -> Result<()> {
        self.stream(op, basin, name).map(|_| ())
    }

    // ---- basins ----

    pub async fn create_basin(
        &self,
        name: BasinName,
        config: BasinConfig,
        request_token: Option<&str>,
    ) -> Result<BasinRecord> {
        self.still_valid().await?;
        self.principal
            .check(Operation::CreateBasin, Target::Basin(&name))?;
        let outcome = self
            .engine
            .catalog()
            .create_basin(name, config, request_token)
            .await;
        self.counted(Operation::CreateBasin, None, outcome)
    }

    /// Needs `create-basin` to create, `reconfigure-basin` to change an existing one.
    pub async fn ensure_basin(
        &self,
        name: BasinName,
        config: BasinConfig,
    ) -> Result<(BasinRecord, Provisioned)> {
        self.still_valid().await?;
        let op = match self.engine.catalog().basin(&name).await {
            Ok(_) => Operation::ReconfigureBasin,
            Err(_) => Operation::CreateBasin,
        };
        self.principal.check(op, Target::Basin(&name))?;
        let outcome = self.engine.catalog().ensure_basin(name, config).await;
        self.counted(op, None, outcome)
    }

    pub async fn basin(&self, name: &BasinName) -> Result<BasinRecord> {
        self.still_valid().await?;
        self.principal
            .check(Operation::GetBasinConfig, Target::Basin(name))?;
        let outcome = self.engine.catalog().basin(name).await;
        self.counted(Operation::GetBasinConfig, None, outcome)
    }

    pub async fn reconfigure_basin(
        &self,
        name: &BasinName,
        change: &BasinReconfiguration,
    ) -> Result<BasinConfig> {
        self.still_valid().await?;
        self.principal
            .check(Operation::ReconfigureBasin, Target::Basin(name))?;
        let outcome = self.engine.catalog().reconfigure_basin(name, change).await;
        self.counted(Operation::ReconfigureBasin, None, outcome)
    }

    /// Only the basins the token's `basins` matcher covers.
    pub async fn list_basins(&self, range: &ListRange) -> Result<ListPage<BasinRecord>> {
        self.still_valid().await?;
        self.principal
            .check(Operation::ListBasins, Target::Account)?;
        let Some(range) = within_matcher(&self.principal.scope().basins, range) else {
            return self.counted(Operation::ListBasins, None, Ok(empty_page()));
        };
        let page = self.engine.catalog().list_basins(&range).await?;
        let page = only_matching(&self.principal.scope().basins, page, |b| {
            self.principal.sees_basin(b.name.as_str())
        });
        self.counted(Operation::ListBasins, None, Ok(page))
    }

    pub async fn delete_basin(&self, name: &BasinName) -> Result<()> {
        self.still_valid().await?;
        self.principal
            .check(Operation::DeleteBasin, Target::Basin(name))?;
        let outcome = self.engine.catalog().delete_basin(name).await;
        self.counted(Operation::DeleteBasin, None, outcome)
    }

    // ---- streams ----

    /// The stored name of a stream the caller names, checked for `op`.
    fn stream(&self, op: Operation, basin: &BasinName, name: &StreamName) -> Result<StreamName> {
        let stored = self.principal.stored(name)?;
        self.principal.check(op, Target::Stream(basin, &stored))?;
        Ok(stored)
    }

    /// A stream record as the caller names it.
    fn shown(&self, mut record: StreamRecord) -> StreamRecord {
        if let Some(name) = self
            .principal
            .visible(&record.name)
            .and_then(|n| StreamName::new(n).ok())
        {
            record.name = name;
        }
        record
    }

    /// Errors name streams as the caller does, never with the hidden prefix.
    fn error(&self, err: Error) -> Error {
        err.map_resource(|resource| match resource {
            Resource::Stream(name) => match self
                .principal
                .visible(&name)
                .and_then(|n| StreamName::new(n).ok())
            {
                Some(shown) => Resource::Stream(shown),
                None => Resource::Stream(name),
            },
            other => other,
        })
    }

    pub async fn create_stream(
        &self,
        basin: &BasinName,
        name: StreamName,
        config: StreamConfig,
        request_token: Option<&str>,
    ) -> Result<StreamRecord> {
        self.still_valid().await?;
        let stored = self.stream(Operation::CreateStream, basin, &name)?;
        let record = self
            .engine
            .catalog()
            .create_stream(basin, stored, config, request_token)
            .await
            .map_err(|e| self.error(e))?;
        self.counted(Operation::CreateStream, Some(basin), Ok(self.shown(record)))
    }

    /// Needs `create-stream` to create, `reconfigure-stream` to change an existing one.
    pub async fn ensure_stream(
        &self,
        basin: &BasinName,
        name: StreamName,
        config: StreamConfig,
    ) -> Result<(StreamRecord, Provisioned)> {
        self.still_valid().await?;
        let stored = self.principal.stored(&name)?;
        let op = match self.engine.catalog().stream_config(basin, &stored).await {
            Ok(_) => Operation::ReconfigureStream,
            Err(_) => Operation::CreateStream,
        };
        self.principal.check(op, Target::Stream(basin, &stored))?;
        let (record, provisioned) = self
            .engine
            .catalog()
            .ensure_stream(basin, stored, config)
            .await
            .map_err(|e| self.error(e))?;
        self.counted(op, Some(basin), Ok((self.shown(record), provisioned)))
    }

    pub async fn stream_config(
        &self,
        basin: &BasinName,
        name: &StreamName,
    ) -> Result<StreamConfig> {
        self.still_valid().await?;
        let stored = self.stream(Operation::GetStreamConfig, basin, name)?;
        let outcome = self
            .engine
            .catalog()
            .stream_config(basin, &stored)
            .await
            .map_err(|e| self.error(e));
        self.counted(Operation::GetStreamConfig, Some(basin), outcome)
    }

    pub async fn reconfigure_stream(
        &self,
        basin: &BasinName,
        name: &StreamName,
        change: &StreamReconfiguration,
    ) -> Result<StreamConfig> {
        self.still_valid().await?;
        let stored = self.stream(Operation::ReconfigureStream, basin, name)?;
        let outcome = self
            .engine
            .catalog()
            .reconfigure_stream(basin, &stored, change)
            .await
            .map_err(|e| self.error(e));
        self.counted(Operation::ReconfigureStream, Some(basin), outcome)
    }

    /// Only the streams the token's `streams` matcher covers, named as the caller
    /// names them.
    pub async fn list_streams(
        &self,
        basin: &BasinName,
        range: &ListRange,
    ) -> Result<ListPage<StreamRecord>> {
        self.still_valid().await?;
        self.principal
            .check(Operation::ListStreams, Target::Basin(basin))?;
        let stored = ListRange {
            prefix: self.principal.stored_prefix(&range.prefix),
            start_after: if range.start_after.is_empty() {
                String::new()
            } else {
                self.principal.stored_prefix(&range.start_after)
            },
            limit: range.limit,
        };
        let Some(stored) = within_matcher(&self.principal.scope().streams, &stored) else {
            return self.counted(Operation::ListStreams, Some(basin), Ok(empty_page()));
        };
        let page = self.engine.catalog().list_streams(basin, &stored).await?;
        let mut page = only_matching(&self.principal.scope().streams, page, |s| {
            self.principal.sees_stream(&s.name)
        });
        page.items = page.items.into_iter().map(|s| self.shown(s)).collect();
        self.counted(Operation::ListStreams, Some(basin), Ok(page))
    }

    pub async fn delete_stream(&self, basin: &BasinName, name: &StreamName) -> Result<()> {
        self.still_valid().await?;
        let stored = self.stream(Operation::DeleteStream, basin, name)?;
        let outcome = self
            .engine
            .catalog()
            .delete_stream(basin, &stored)
            .await
            .map_err(|e| self.error(e));
        self.counted(Operation::DeleteStream, Some(basin), outcome)
    }

    // ---- records ----

    pub async fn open_for_append(
        &self,
        basin: &BasinName,
        name: &StreamName,
        create_config: Option<&StreamConfig>,
    ) -> Result<()> {
        self.still_valid().await?;
        let stored = self.stream(Operation::Append, basin, name)?;
        self.engine
            .open_for_append(basin, &stored, create_config, self.access())
            .await
            .map_err(|e| self.error(e))
    }

    /// Needs `append`, and `fence` / `trim` for batches carrying those commands.
    pub async fn submit_append(
        &self,
        basin: &BasinName,
        name: &StreamName,
        input: AppendInput,
        create_config: Option<&StreamConfig>,
    ) -> Result<PendingAck> {
        self.still_valid().await?;
        let stored = self.stream(Operation::Append, basin, name)?;
        for record in input
            .records
            .iter()
            .filter(|r| r.headers.iter().any(|h| h.name.is_empty()))
        {
            let op = match Command::parse(&record.headers, &record.body)? {
                Some(Command::Fence(_)) => Operation::Fence,
                Some(Command::Trim(_)) => Operation::Trim,
                None => continue,
            };
            self.principal.check(op, Target::Stream(basin, &stored))?;
        }
        match self
            .engine
            .submit_append(basin, &stored, input, create_config, self.access())
            .await
        {
            Ok(Submitted::Here(ack)) => Ok(ack),
            Ok(Submitted::Elsewhere {
                advertise_url,
                input,
            }) => {
                let (remote, at) = self.remote_at(advertise_url, basin, name)?;
                // Made whole before the next append is submitted, so appends of one
                // pipeline land in the order they were submitted.
                Ok(PendingAck::ready(remote.append(&at, input).await))
            }
            Err(err) => Err(self.error(err)),
        }
    }

    /// Where a call on `name` goes when the node at `advertise_url` sequences it: that
    /// node, with this caller's own token. Without a way to reach it (root access, or a
    /// front end without peers, or a request that was forwarded once already), the
    /// `OwnedElsewhere` error stands.
    fn remote_at(
        &self,
        advertise_url: String,
        basin: &BasinName,
        name: &StreamName,
    ) -> Result<(Arc<dyn RemoteStreams>, RemoteStream)> {
        // A forwarded request goes on only from a node that handed the stream over
        // (the node that forwarded it looked before the hand-over was recorded); the
        // node it goes on to never sends it further.
        if self.forwarded && !self.engine.forwards_on(basin, name) {
            return Err(Error::OwnedElsewhere { advertise_url });
        }
        match (self.engine.remote(), &self.bearer) {
            (Some(remote), Some(bearer)) => Ok((
                remote,
                RemoteStream {
                    node_url: advertise_url,
                    bearer: bearer.to_string(),
                    basin: basin.clone(),
                    stream: name.clone(),
                    encryption_key: self.encryption_key.clone(),
                    connection: self.connection,
                },
            )),
            _ => Err(Error::OwnedElsewhere { advertise_url }),
        }
    }

    /// Appends a batch atomically; returns only once it is durable.
    pub async fn append(
        &self,
        basin: &BasinName,
        name: &StreamName,
        input: AppendInput,
        create_config: Option<&StreamConfig>,
    ) -> Result<AppendAck> {
        self.submit_append(basin, name, input, create_config)
            .await?
            .await
    }

    pub async fn check_tail(
        &self,
        basin: &BasinName,
        name: &StreamName,
        create_config: Option<&StreamConfig>,
    ) -> Result<StreamPosition> {
        self.still_valid().await?;
        let stored = self.stream(Operation::CheckTail, basin, name)?;
        match self.engine.check_tail(basin, &stored, create_config).await {
            // Counted by the node that serves it.
            Err(Error::OwnedElsewhere { advertise_url }) => {
                let (remote, at) = self.remote_at(advertise_url, basin, name)?;
                remote.check_tail(&at).await
            }
            Ok(tail) => self.counted(Operation::CheckTail, Some(basin), Ok(tail)),
            outcome => outcome.map_err(|e| self.error(e)),
        }
    }

    pub async fn open_reader(
        &self,
        basin: &BasinName,
        name: &StreamName,
        start: ReadStart,
        clamp: bool,
        create_config: Option<&StreamConfig>,
    ) -> Result<StreamReader> {
        self.still_valid().await?;
        let stored = self.stream(Operation::Read, basin, name)?;
        match self
            .engine
            .open_reader(basin, &stored, start, clamp, create_config, self.access())
            .await
        {
            Err(Error::OwnedElsewhere { advertise_url }) => {
                let (remote, at) = self.remote_at(advertise_url, basin, name)?;
                StreamReader::open_remote(remote, at, start, clamp).await
            }
            outcome => outcome.map_err(|e| self.error(e)),
        }
    }

    /// After `StreamMoved` from `reader` (its stream was handed to another node while
    /// it was read here): the reader goes on from where it was, at the new owner.
    pub async fn follow_move(
        &self,
        reader: &mut StreamReader,
        basin: &BasinName,
        name: &StreamName,
    ) -> Result<()> {
        let start = ReadStart::SeqNum(reader.position());
        let replacement = self.open_reader(basin, name, start, true, None).await?;
        reader.replace_with(replacement);
        Ok(())
    }

    pub async fn read(
        &self,
        basin: &BasinName,
        name: &StreamName,
        request: ReadRequest,
        create_config: Option<&StreamConfig>,
    ) -> Result<ReadBatch> {
        self.still_valid().await?;
        let stored = self.stream(Operation::Read, basin, name)?;
        match self
            .engine
            .read(basin, &stored, request, create_config, self.access())
            .await
        {
            Err(Error::OwnedElsewhere { advertise_url }) => {
                let (remote, at) = self.remote_at(advertise_url, basin, name)?;
                remote.read(&at, request).await
            }
            outcome => outcome.map_err(|e| self.error(e)),
        }
    }

    /// The next batch of a reader this caller opened (see `StreamReader::next_batch`).
    pub async fn next_batch(
        &self,
        reader: &mut StreamReader,
        limits: ReadLimits,
    ) -> Result<(ReadBatch, bool)> {
        self.still_valid().await?;
        reader.next_batch(limits).await
    }

    /// Where a request doing `op` on a stream should be served (see `Engine::route`),
    /// with the same scope check as `op` itself.
    pub async fn route_stream(
        &self,
        op: Operation,
        basin: &BasinName,
        name: &StreamName,
        create_config: Option<&StreamConfig>,
        arrival: crate::Arrival,
    ) -> Result<crate::Route> {
        self.still_valid().await?;
        let stored = self.stream(op, basin, name)?;
        let kind = match op {
            Operation::Append => crate::catalog::AutoCreate::OnAppend,
            _ => crate::catalog::AutoCreate::OnRead,
        };
        let create_config = create_config.copied().unwrap_or_default();
        self.engine
            .route(basin, &stored, Some((kind, &create_config)), arrival)
            .await
            .map_err(|e| self.error(e))
    }

    // ---- access tokens ----

    /// Issues a token no broader than the caller's; returns its secret.
    pub async fn issue_access_token(&self, info: AccessTokenInfo) -> Result<String> {
        self.still_valid().await?;
        let outcome = self.engine.tokens().issue(&self.principal, info).await;
        self.counted(Operation::IssueAccessToken, None, outcome)
    }

    /// Only the tokens the caller's `access_tokens` matcher covers.
    pub async fn list_access_tokens(&self, range: &ListRange) -> Result<ListPage<AccessTokenInfo>> {
        self.still_valid().await?;
        self.principal
            .check(Operation::ListAccessTokens, Target::Account)?;
        let Some(range) = within_matcher(&self.principal.scope().access_tokens, range) else {
            return self.counted(Operation::ListAccessTokens, None, Ok(empty_page()));
        };
        let page = self.engine.tokens().list(&range).await?;
        let page = only_matching(&self.principal.scope().access_tokens, page, |t| {
            self.principal.sees_access_token(&t.id)
        });
        self.counted(Operation::ListAccessTokens, None, Ok(page))
    }

    pub async fn revoke_access_token(&self, id: &str) -> Result<()> {
        self.still_valid().await?;
        self.principal
            .check(Operation::RevokeAccessToken, Target::AccessToken(id))?;
        let outcome = self.engine.tokens().revoke(id).await;
        self.counted(Operation::RevokeAccessToken, None, outcome)
    }

    // ---- consumer groups ----

    /// Changes a stream's consumer groups: needs `read` and `append` (group state is
    /// written state of the stream). `plan` decides the ops from the groups as they are
    /// (see `Engine::change_groups`); the answer is to be given once `Durable` resolves.
    pub async fn change_groups<R>(
        &self,
        basin: &BasinName,
        name: &StreamName,
        plan: impl FnOnce(&Groups, &GroupView) -> Result<(Vec<GroupOp>, R)>,
    ) -> Result<(R, Durable)> {
        self.still_valid().await?;
        self.stream(Operation::Read, basin, name)?;
        let stored = self.stream(Operation::Append, basin, name)?;
        let (answer, durable) = self
            .engine
            .change_groups(basin, &stored, plan)
            .await
            .map_err(|e| self.error(e))?;
        Ok((answer, self.errors_shown(durable)))
    }

    /// Reads a stream's consumer groups (needs `read`): the answer is to be given once
    /// `Durable` resolves.
    pub async fn read_groups<R>(
        &self,
        basin: &BasinName,
        name: &StreamName,
        read: impl FnOnce(&Groups, &GroupView) -> R,
    ) -> Result<(R, Durable)> {
        self.still_valid().await?;
        let stored = self.stream(Operation::Read, basin, name)?;
        let (answer, durable) = self
            .engine
            .read_groups(basin, &stored, read)
            .await
            .map_err(|e| self.error(e))?;
        Ok((answer, self.errors_shown(durable)))
    }

    /// A RESP command on the consumer groups of `name` when another node sequences it:
    /// run whole there (the groups live with the stream), with this caller's token; its
    /// reply, encoded. `None` when it runs here, or when the stream is missing (the
    /// command gives its own error). A call another node forwarded is not sent on.
    pub async fn resp_command_at_owner(
        &self,
        basin: &BasinName,
        name: &StreamName,
        command: bytes::Bytes,
        resp3: bool,
        timeout: std::time::Duration,
    ) -> Result<Option<bytes::Bytes>> {
        // Alone, every stream is sequenced here: no lookups on a command's way.
        if !self.engine.has_peers() {
            return Ok(None);
        }
        self.still_valid().await?;
        let stored = self.stream(Operation::Read, basin, name)?;
        match self.engine.stream_for_groups(basin, &stored).await {
            Err(Error::OwnedElsewhere { advertise_url }) => {
                let (remote, at) = self.remote_at(advertise_url, basin, name)?;
                let reply = remote.resp_command(&at, command, resp3, timeout).await?;
                Ok(Some(reply))
            }
            _ => Ok(None),
        }
    }

    /// Waits for the stream's turn at a group change decided from records read first
    /// (see `GroupTurn`); needs `read`.
    pub async fn group_turn(&self, basin: &BasinName, name: &StreamName) -> Result<GroupTurn> {
        self.still_valid().await?;
        let stored = self.stream(Operation::Read, basin, name)?;
        self.engine
            .group_turn(basin, &stored)
            .await
            .map_err(|e| self.error(e))
    }

    /// The errors a group change may still end with, named as the caller sees them.
    fn errors_shown(&self, durable: Durable) -> Durable {
        let caller = self.clone();
        durable.map_err(move |e| caller.error(e))
    }

    // ---- metrics ----

    /// A metrics request: `basin` for basin-level sets, and `stream` too for
    /// stream-level ones. Needs `account-metrics`, `basin-metrics` or `stream-metrics`
    /// on what it names; counted as an account operation, as the docs say.
    pub async fn metrics(
        &self,
        basin: Option<&BasinName>,
        stream: Option<&StreamName>,
        set: &str,
        range: (Option<u64>, Option<u64>),
        interval: Option<&str>,
    ) -> Result<Vec<Metric>> {
        self.still_valid().await?;
        let (op, level, stored) = match (basin, stream) {
            (None, _) => {
                self.principal
                    .check(Operation::AccountMetrics, Target::Account)?;
                (Operation::AccountMetrics, MetricLevel::Account, None)
            }
            (Some(basin), None) => {
                self.principal
                    .check(Operation::BasinMetrics, Target::Basin(basin))?;
                (Operation::BasinMetrics, MetricLevel::Basin, None)
            }
            (Some(basin), Some(stream)) => {
                let stored = self.stream(Operation::StreamMetrics, basin, stream)?;
                (Operation::StreamMetrics, MetricLevel::Stream, Some(stored))
            }
        };
        let set = MetricSet::parse(level, set)?;
        let now = crate::record::now_ms() / 1000;
        let range = TimeRange::new(range.0, range.1, now)?;
        let outcome = crate::metrics::answer(
            self.engine.metadata(),
            set,
            basin.map_or("", |b| b.as_str()),
            stored.as_ref().map_or("", |s| s.as_str()),
            range,
            interval,
            |basins| {
                basins
                    .into_iter()
                    .filter(|b| self.principal.sees_basin(b))
                    .collect()
            },
        )
        .await;
        self.counted(op, None, outcome)
    }
}

/// A page without what the matcher does not cover. Under an exact matcher the page held
/// only names sharing its prefix, so there is never more to see (and saying so would
/// reveal that such names exist).
fn only_matching<T>(
    matcher: &Option<ResourceSet>,
    mut page: ListPage<T>,
    visible: impl Fn(&T) -> bool,
) -> ListPage<T> {
    page.items.retain(|item| visible(item));
    if matches!(matcher, Some(ResourceSet::Exact(_))) {
        page.has_more = false;
    }
    page
}

fn empty_page<T>() -> ListPage<T> {
    ListPage {
        items: Vec::new(),
        has_more: false,
    }
}

/// The part of a listing range a matcher allows, as a range the store can serve
/// directly (so pages stay full): `None` when nothing in it can match.
fn within_matcher(matcher: &Option<ResourceSet>, range: &ListRange) -> Option<ListRange> {
    let narrowed = match matcher.as_ref()? {
        ResourceSet::Prefix(allowed) | ResourceSet::Exact(allowed)
            if allowed.starts_with(range.prefix.as_str()) =>
        {
            allowed.clone()
        }
        ResourceSet::Prefix(allowed) if range.prefix.starts_with(allowed.as_str()) => {
            range.prefix.clone()
        }
        _ => return None,
    };
    Some(ListRange {
        prefix: narrowed,
        start_after: range.start_after.clone(),
        limit: range.limit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(prefix: &str) -> ListRange {
        ListRange {
            prefix: prefix.into(),
            start_after: String::new(),
            limit: 10,
        }
    }

    #[test]
    fn listing_ranges_intersect_the_matcher() {
        let prefix = |p: &str| Some(ResourceSet::Prefix(p.into()));
        let exact = |p: &str| Some(ResourceSet::Exact(p.into()));
        let narrowed = |m, r: &str| within_matcher(&m, &range(r)).map(|r| r.prefix);
        assert_eq!(narrowed(prefix("logs/"), ""), Some("logs/".into()));
        assert_eq!(
            narrowed(prefix("logs/"), "logs/app"),
            Some("logs/app".into())
        );
        assert_eq!(narrowed(prefix("logs/"), "metrics"), None);
        assert_eq!(narrowed(prefix(""), "x"), Some("x".into()));
        assert_eq!(narrowed(exact("logs/a"), "logs"), Some("logs/a".into()));
        assert_eq!(narrowed(exact("logs/a"), "metrics"), None);
        assert_eq!(narrowed(None, ""), None);
    }
}
