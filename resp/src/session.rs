//! A connection's session: who is authenticated, in which basin, with which protocol
//! version and client name. Commands act through it.

use std::sync::Arc;

use bytes::Bytes;
use streamgate_core::names::{BasinName, StreamName};
use streamgate_core::usage::ConnectionId;
use streamgate_core::{Caller, Engine, Error, ErrorKind};

use crate::reply::Reply;
use crate::streams::Streams;
use crate::RespSettings;

pub struct Session {
    engine: Engine,
    settings: Arc<RespSettings>,
    sni_basin: Option<BasinName>,
    /// The basin and the engine as the AUTH token allows; `None` until AUTH succeeds.
    authenticated: Option<(BasinName, Caller)>,
    pub resp3: bool,
    /// What `CLIENT SETNAME` set.
    pub name: Option<Bytes>,
    pub client: crate::Client,
}

/// The RESP error prefix for each kind of engine failure: clients retry `TRYAGAIN`.
fn error_prefix(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Unavailable | ErrorKind::StorageFailed | ErrorKind::RateLimited => "TRYAGAIN",
        // The connection stays open: other keys may be in scope.
        ErrorKind::PermissionDenied => "NOPERM",
        ErrorKind::Unauthenticated => "NOAUTH",
        ErrorKind::Invalid
        | ErrorKind::NotFound
        | ErrorKind::Conflict
        | ErrorKind::ConditionFailed
        | ErrorKind::RangeNotSatisfiable
        | ErrorKind::DecryptionFailed
        | ErrorKind::NotImplemented
        | ErrorKind::Internal => "ERR",
    }
}

/// The reply to an engine error.
pub(crate) fn error_reply(err: &Error) -> Reply {
    Reply::error(format!("{} {err}", error_prefix(err.kind())))
}

/// A key as a stream name.
pub(crate) fn stream_name(key: &Bytes) -> Result<StreamName, Reply> {
    std::str::from_utf8(key)
        .ok()
        .and_then(|k| StreamName::new(k).ok())
        .ok_or_else(|| Reply::error("ERR keys are stream names: 1 to 512 bytes of UTF-8"))
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
            authenticated: None,
            resp3: false,
            name: None,
            client,
        }
    }

    /// The session of a command another node passed on: its client's `caller`, in
    /// `basin`, speaking `resp3` or RESP2 (see `crate::forwarded`).
    pub(crate) fn forwarded(
        engine: Engine,
        basin: BasinName,
        caller: Caller,
        resp3: bool,
    ) -> Session {
        let client = crate::Client {
            id: 0,
            address: std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
        };
        let mut session = Session::new(engine, Arc::default(), None, client);
        session.authenticated = Some((basin, caller));
        session.resp3 = resp3;
        session
    }

    pub fn authenticated(&self) -> bool {
        self.authenticated.is_some()
    }

    /// The streams of the session's basin as its token sees them.
    pub(crate) fn streams(&self) -> Result<Streams<'_>, Reply> {
        match &self.authenticated {
            Some((basin, caller)) => Ok(Streams::new(caller, basin)),
            None => Err(Reply::error("NOAUTH Authentication required.")),
        }
    }

    /// AUTH: picks the basin (SNI, else the username, else the configured default) and
    /// verifies the access token; every later command runs with that token's scope.
    pub(crate) async fn authenticate(
        &mut self,
        username: Option<&Bytes>,
        token: &Bytes,
    ) -> Result<(), Reply> {
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
        let caller = Caller::authenticate(&self.engine, token, Some(self.client.address.ip()))
            .await
            .map_err(|err| match err {
                Error::Unauthenticated(why) => Reply::error(format!("WRONGPASS {why}")),
                other => error_reply(&other),
            })?;
        let connection = ConnectionId::accepted(self.engine.epoch(), self.client.address);
        self.authenticated = Some((basin, caller.with_connection(Some(connection))));
        Ok(())
    }

    /// A token revoked or expired since AUTH ends the authentication: `NOAUTH` until
    /// the client authenticates again. Checked before every command that needs it (some
    /// commands turn engine errors into answers, e.g. EXISTS into 0, so the engine's own
    /// check would not surface there).
    pub(crate) async fn still_authenticated(&mut self) -> Result<(), Reply> {
        let Some((_, caller)) = &self.authenticated else {
            return Err(Reply::error("NOAUTH Authentication required."));
        };
        match caller.still_valid().await {
            Ok(()) => Ok(()),
            Err(err) => Err(self.failed(&err)),
        }
    }

    /// The reply to an engine error. An `authn` error (every engine call re-checks the
    /// token) also ends the authentication, as above.
    pub(crate) fn failed(&mut self, err: &Error) -> Reply {
        if err.kind() == ErrorKind::Unauthenticated {
            self.authenticated = None;
        }
        error_reply(err)
    }
}
