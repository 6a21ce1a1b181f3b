//! `Caller`: the engine as one authenticated principal sees it. Every operation checks
//! the principal's scope first, then maps stream names (auto-prefixing) on the way in
//! and out, so each front end — REST, sessions, RESP, OTLP — enforces the same rules by
//! calling the engine only through here.

use std::sync::Arc;

use crate::access::{AccessTokenInfo, Operation, Principal, ResourceSet, Target};
use crate::config::{BasinConfig, BasinReconfiguration, StreamConfig, StreamReconfiguration};
use crate::engine::{Engine, PendingAck, Provisioned};
use crate::error::{Error, Result};
use crate::names::{BasinName, StreamName};
use crate::read::{ReadBatch, ReadRequest, ReadStart, StreamReader};
use crate::record::{AppendAck, AppendInput, Command, StreamPosition};
use crate::storage::metadata::{BasinRecord, ListPage, ListRange, StreamRecord};

#[derive(Clone)]
pub struct Caller {
    engine: Engine,
    principal: Arc<Principal>,
    /// The digest of the token's secret, to check it is still valid; `None` for the
    /// server's own root access.
    digest: Option<[u8; 32]>,
}

impl Caller {
    pub(crate) fn new(
        engine: Engine,
        principal: Arc<Principal>,
        digest: Option<[u8; 32]>,
    ) -> Caller {
        Caller {
            engine,
            principal,
            digest,
        }
    }

    /// `authn` once the token has been revoked (seen within `CACHE_TTL`) or has
    /// expired: sessions and connections call this as they go.
    pub async fn still_valid(&self) -> Result<()> {
        match &self.digest {
            None => Ok(()),
            Some(digest) => self.engine.tokens().verified(digest).await.map(|_| ()),
        }
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
        self.principal
            .check(Operation::CreateBasin, Target::Basin(&name))?;
        self.engine.create_basin(name, config, request_token).await
    }

    /// Needs `create-basin` to create, `reconfigure-basin` to change an existing one.
    pub async fn ensure_basin(
        &self,
        name: BasinName,
        config: BasinConfig,
    ) -> Result<(BasinRecord, Provisioned)> {
        let op = match self.engine.basin(&name).await {
            Ok(_) => Operation::ReconfigureBasin,
            Err(_) => Operation::CreateBasin,
        };
        self.principal.check(op, Target::Basin(&name))?;
        self.engine.ensure_basin(name, config).await
    }

    pub async fn basin(&self, name: &BasinName) -> Result<BasinRecord> {
        self.principal
            .check(Operation::GetBasinConfig, Target::Basin(name))?;
        self.engine.basin(name).await
    }

    pub async fn reconfigure_basin(
        &self,
        name: &BasinName,
        change: &BasinReconfiguration,
    ) -> Result<BasinConfig> {
        self.principal
            .check(Operation::ReconfigureBasin, Target::Basin(name))?;
        self.engine.reconfigure_basin(name, change).await
    }

    /// Only the basins the token's `basins` matcher covers.
    pub async fn list_basins(&self, range: &ListRange) -> Result<ListPage<BasinRecord>> {
        self.principal
            .check(Operation::ListBasins, Target::Account)?;
        let Some(range) = within_matcher(&self.principal.scope().basins, range) else {
            return Ok(empty_page());
        };
        let page = self.engine.list_basins(&range).await?;
        Ok(only_matching(&self.principal.scope().basins, page, |b| {
            self.principal.sees_basin(b.name.as_str())
        }))
    }

    pub async fn delete_basin(&self, name: &BasinName) -> Result<()> {
        self.principal
            .check(Operation::DeleteBasin, Target::Basin(name))?;
        self.engine.delete_basin(name).await
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
        let rename = |name: String| {
            StreamName::new(name.as_str())
                .ok()
                .and_then(|n| self.principal.visible(&n))
                .unwrap_or(name)
        };
        match err {
            Error::StreamNotFound(name) => Error::StreamNotFound(rename(name)),
            Error::StreamDeletionPending(name) => Error::StreamDeletionPending(rename(name)),
            Error::AlreadyExists(what) => match self.principal.stored_prefix("") {
                prefix if prefix.is_empty() => Error::AlreadyExists(what),
                prefix => Error::AlreadyExists(what.replace(&format!("`{prefix}"), "`")),
            },
            other => other,
        }
    }

    pub async fn create_stream(
        &self,
        basin: &BasinName,
        name: StreamName,
        config: StreamConfig,
        request_token: Option<&str>,
    ) -> Result<StreamRecord> {
        let stored = self.stream(Operation::CreateStream, basin, &name)?;
        let record = self
            .engine
            .create_stream(basin, stored, config, request_token)
            .await
            .map_err(|e| self.error(e))?;
        Ok(self.shown(record))
    }

    /// Needs `create-stream` to create, `reconfigure-stream` to change an existing one.
    pub async fn ensure_stream(
        &self,
        basin: &BasinName,
        name: StreamName,
        config: StreamConfig,
    ) -> Result<(StreamRecord, Provisioned)> {
        let stored = self.principal.stored(&name)?;
        let op = match self.engine.stream_config(basin, &stored).await {
            Ok(_) => Operation::ReconfigureStream,
            Err(_) => Operation::CreateStream,
        };
        self.principal.check(op, Target::Stream(basin, &stored))?;
        let (record, provisioned) = self
            .engine
            .ensure_stream(basin, stored, config)
            .await
            .map_err(|e| self.error(e))?;
        Ok((self.shown(record), provisioned))
    }

    pub async fn stream_config(
        &self,
        basin: &BasinName,
        name: &StreamName,
    ) -> Result<StreamConfig> {
        let stored = self.stream(Operation::GetStreamConfig, basin, name)?;
        self.engine
            .stream_config(basin, &stored)
            .await
            .map_err(|e| self.error(e))
    }

    pub async fn reconfigure_stream(
        &self,
        basin: &BasinName,
        name: &StreamName,
        change: &StreamReconfiguration,
    ) -> Result<StreamConfig> {
        let stored = self.stream(Operation::ReconfigureStream, basin, name)?;
        self.engine
            .reconfigure_stream(basin, &stored, change)
            .await
            .map_err(|e| self.error(e))
    }

    /// Only the streams the token's `streams` matcher covers, named as the caller
    /// names them.
    pub async fn list_streams(
        &self,
        basin: &BasinName,
        range: &ListRange,
    ) -> Result<ListPage<StreamRecord>> {
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
            return Ok(empty_page());
        };
        let page = self.engine.list_streams(basin, &stored).await?;
        let mut page = only_matching(&self.principal.scope().streams, page, |s| {
            self.principal.sees_stream(&s.name)
        });
        page.items = page.items.into_iter().map(|s| self.shown(s)).collect();
        Ok(page)
    }

    pub async fn delete_stream(&self, basin: &BasinName, name: &StreamName) -> Result<()> {
        let stored = self.stream(Operation::DeleteStream, basin, name)?;
        self.engine
            .delete_stream(basin, &stored)
            .await
            .map_err(|e| self.error(e))
    }

    // ---- records ----

    pub async fn open_for_append(
        &self,
        basin: &BasinName,
        name: &StreamName,
        create_config: Option<&StreamConfig>,
    ) -> Result<()> {
        let stored = self.stream(Operation::Append, basin, name)?;
        self.engine
            .open_for_append(basin, &stored, create_config)
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
        self.engine
            .submit_append(basin, &stored, input, create_config)
            .await
            .map_err(|e| self.error(e))
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
        let stored = self.stream(Operation::CheckTail, basin, name)?;
        self.engine
            .check_tail(basin, &stored, create_config)
            .await
            .map_err(|e| self.error(e))
    }

    pub async fn open_reader(
        &self,
        basin: &BasinName,
        name: &StreamName,
        start: ReadStart,
        clamp: bool,
        create_config: Option<&StreamConfig>,
    ) -> Result<StreamReader> {
        let stored = self.stream(Operation::Read, basin, name)?;
        self.engine
            .open_reader(basin, &stored, start, clamp, create_config)
            .await
            .map_err(|e| self.error(e))
    }

    pub async fn read(
        &self,
        basin: &BasinName,
        name: &StreamName,
        request: ReadRequest,
        create_config: Option<&StreamConfig>,
    ) -> Result<ReadBatch> {
        let stored = self.stream(Operation::Read, basin, name)?;
        self.engine
            .read(basin, &stored, request, create_config)
            .await
            .map_err(|e| self.error(e))
    }

    // ---- access tokens ----

    /// Issues a token no broader than the caller's; returns its secret.
    pub async fn issue_access_token(&self, info: AccessTokenInfo) -> Result<String> {
        self.engine.tokens().issue(&self.principal, info).await
    }

    /// Only the tokens the caller's `access_tokens` matcher covers.
    pub async fn list_access_tokens(&self, range: &ListRange) -> Result<ListPage<AccessTokenInfo>> {
        self.principal
            .check(Operation::ListAccessTokens, Target::Account)?;
        let Some(range) = within_matcher(&self.principal.scope().access_tokens, range) else {
            return Ok(empty_page());
        };
        let page = self.engine.tokens().list(&range).await?;
        Ok(only_matching(
            &self.principal.scope().access_tokens,
            page,
            |t| self.principal.sees_access_token(&t.id),
        ))
    }

    pub async fn revoke_access_token(&self, id: &str) -> Result<()> {
        self.principal
            .check(Operation::RevokeAccessToken, Target::AccessToken(id))?;
        self.engine.tokens().revoke(id).await
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
