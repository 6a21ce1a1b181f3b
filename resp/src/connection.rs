//! One RESP connection: buffered framing, pipelining, and the order of replies.
//!
//! Pipelined XADDs to the same stream are gathered into one engine append (up to the
//! batch limits) and acknowledged together once durable. Consumer-group commands are
//! decided at once and answered once durable, so a pipeline of them shares log writes.
//! Any other command (and a group command after XADDs) first waits for the commands
//! before it, so it sees their effects; replies always go out in request order.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use futures::future::BoxFuture;
use streamgate_core::in_order::InOrder;
use streamgate_core::names::BasinName;
use streamgate_core::{telemetry, Engine};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use crate::cmd::xadd::{self, XaddBatch};
use crate::cmd::{self, Command};
use crate::reply::Reply;
use crate::session::{error_reply, Session};
use crate::RespSettings;
use streamgate_core::groups::Durable;

/// Bytes read ahead while a command runs (a client pipelining behind a blocked XREAD):
/// past this the connection stops reading until the command is done.
const MAX_BUFFERED_INPUT: usize = crate::request::MAX_REQUEST_BYTES + 64 * 1024;
/// The least room a read gets in the input buffer. Parsed commands keep parts of the
/// buffer alive, so its front is not reused, and a read got only the room left at its
/// end: a pipeline read in several small pieces became several appends.
const MIN_READ_ROOM: usize = 8 * 1024;
/// Encoded replies held before they are written out.
const MAX_BUFFERED_OUTPUT: usize = 64 * 1024;
/// Replies a pipelining client may have outstanding before the connection stops reading
/// its further commands (they wait in the socket, so the client feels backpressure).
const MAX_PENDING_REPLIES: usize = 1024;
/// A command must arrive in full within this long.
const ARRIVAL_TIMEOUT: Duration = Duration::from_secs(30);
/// A connection must authenticate within this long of being accepted (as on S2).
const AUTH_TIMEOUT: Duration = Duration::from_secs(30);

/// Replies still to be written, in request order; each item is the replies of one or
/// more commands, and whether the connection must close after them. Each is a wait for
/// work already under way (an append, a durable change), so only the front is polled.
type Pending = InOrder<BoxFuture<'static, (Vec<Reply>, bool)>>;

pub async fn run<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    engine: Engine,
    settings: Arc<RespSettings>,
    sni_basin: Option<BasinName>,
    client: crate::Client,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let _open = telemetry::OpenGuard::new("resp");
    let mut session = Session::new(engine, settings, sni_basin, client);
    let mut decoder = crate::request::RequestDecoder::default();
    let mut input = BytesMut::with_capacity(16 * 1024);
    let mut output = BytesMut::with_capacity(16 * 1024);
    let mut pending = Pending::default();
    let mut batch: Option<XaddBatch> = None;
    // Whether `pending` may hold XADDs, which a group command must wait for.
    let mut xadds_pending = false;
    let mut partial_since: Option<tokio::time::Instant> = None;
    let auth_deadline = tokio::time::Instant::now() + AUTH_TIMEOUT;
    let mut ever_authenticated = false;

    loop {
        // Run every complete command in the buffer.
        let mut decoded_any = false;
        loop {
            let args = match decoder.next_request(&mut input) {
                Ok(Some(args)) => {
                    decoded_any = true;
                    args
                }
                Ok(None) => break,
                Err(crate::request::ProtocolError(message)) => {
                    flush_batch(&mut session, &mut batch, &mut pending).await;
                    drain(&mut pending, session.resp3, &mut output).await;
                    Reply::error(message).encode(session.resp3, &mut output);
                    stream.write_all(&output).await?;
                    return Ok(()); // the stream cannot be resynchronised
                }
            };
            let command = cmd::parse(&args);
            // A group command is kept as sent, to run whole where its stream is.
            let sent = matches!(&command, Ok(c) if c.group_keys().is_some())
                .then(|| crate::forwarded::encode_command(&args));
            // Gather pipelined XADDs per stream.
            if let Ok(Command::XAdd {
                key,
                nomkstream: false,
                trim: None,
                fields,
            }) = &command
            {
                if session.authenticated() {
                    if let Some(current) = &mut batch {
                        if current.accepts(key, fields) {
                            current.push(fields);
                            continue;
                        }
                    }
                    xadds_pending |= flush_batch(&mut session, &mut batch, &mut pending).await;
                    match XaddBatch::start(key.clone(), fields) {
                        Ok(started) => batch = Some(started),
                        Err(reply) => {
                            pending.push_back(Box::pin(async move { (vec![reply], false) }))
                        }
                    }
                    continue;
                }
            }
            xadds_pending |= flush_batch(&mut session, &mut batch, &mut pending).await;
            // Other commands run after the ones before them are done (durable).
            let defers = matches!(&command, Ok(c) if c.defers_reply());
            if !defers || xadds_pending {
                xadds_pending = false;
                if drain(&mut pending, session.resp3, &mut output).await {
                    stream.write_all(&output).await?;
                    return Ok(());
                }
            }
            let (reply, close, durable) = match command {
                Ok(command) => {
                    let (name, started) = (command.name(), Instant::now());
                    // While a command runs (an XREAD may block for long), keep watching
                    // the socket: a client that hangs up cancels its blocked read.
                    let execution = cmd::execute(&mut session, command, &mut shutdown, sent);
                    tokio::pin!(execution);
                    let outcome = loop {
                        make_read_room(&mut input);
                        tokio::select! {
                            outcome = &mut execution => break outcome,
                            read = stream.read_buf(&mut input), if input.len() < MAX_BUFFERED_INPUT => {
                                if read? == 0 {
                                    return Ok(());
                                }
                            }
                        }
                    };
                    telemetry::request("resp", name.into(), outcome.0.outcome(), started.elapsed());
                    outcome
                }
                Err(message) => (Reply::error(message), false, Vec::new()),
            };
            if close {
                drain(&mut pending, session.resp3, &mut output).await;
                reply.encode(session.resp3, &mut output);
                stream.write_all(&output).await?;
                return Ok(());
            }
            if !durable.is_empty() || !pending.is_empty() {
                // Behind replies still held back, or itself to be held back.
                pending.push_back(Box::pin(once_durable(reply, durable)));
                continue;
            }
            reply.encode(session.resp3, &mut output);
            // Replies go out as they accumulate, so a pipeline of large reads holds at
            // most this much, and a client that does not read them stops this loop.
            if output.len() >= MAX_BUFFERED_OUTPUT {
                stream.write_all(&output).await?;
                output.clear();
            }
        }
        xadds_pending |= flush_batch(&mut session, &mut batch, &mut pending).await;
        if !output.is_empty() {
            stream.write_all(&output).await?;
            output.clear();
        }

        ever_authenticated |= session.authenticated();
        // The arrival deadline is for the command at the front of the input: it starts
        // again whenever a command completed.
        partial_since = match (input.is_empty(), partial_since) {
            (true, _) => None,
            (false, Some(since)) if !decoded_any => Some(since),
            (false, _) => Some(tokio::time::Instant::now()),
        };
        let arrival_deadline = partial_since.map(|since| since + ARRIVAL_TIMEOUT);
        make_read_room(&mut input);
        tokio::select! {
            Some((replies, close)) = pending.pop_front(), if !pending.is_empty() => {
                for reply in &replies {
                    reply.encode(session.resp3, &mut output);
                }
                stream.write_all(&output).await?;
                output.clear();
                if close {
                    return Ok(());
                }
            }
            read = stream.read_buf(&mut input), if pending.len() < MAX_PENDING_REPLIES => {
                if read? == 0 {
                    // The client closed its side: finish what it sent, then stop.
                    drain(&mut pending, session.resp3, &mut output).await;
                    let _ = stream.write_all(&output).await;
                    return Ok(());
                }
            }
            _ = tokio::time::sleep_until(auth_deadline), if !ever_authenticated => {
                Reply::error("ERR not authenticated within 30 seconds of connecting; AUTH <basin> <token> first").encode(session.resp3, &mut output);
                stream.write_all(&output).await?;
                return Ok(());
            }
            _ = sleep_until(arrival_deadline) => {
                Reply::error("ERR the command did not arrive in full within 30 seconds").encode(session.resp3, &mut output);
                stream.write_all(&output).await?;
                return Ok(());
            }
            _ = crate::stopped(&mut shutdown), if pending.is_empty() => {
                return Ok(());
            }
        }
    }
}

/// Makes room for the next read once less than [`MIN_READ_ROOM`] is left: twice that, in
/// a new buffer if the old one is still held. Only then, so that a new buffer is taken
/// once per several KiB read rather than once per command.
fn make_read_room(input: &mut BytesMut) {
    if input.capacity() - input.len() < MIN_READ_ROOM {
        input.reserve(2 * MIN_READ_ROOM);
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// A reply given once the group changes it reflects are durable (an error if they
/// could not be made so).
async fn once_durable(reply: Reply, durable: Vec<Durable>) -> (Vec<Reply>, bool) {
    for change in durable {
        if let Err(err) = change.await {
            return (vec![error_reply(&err)], false);
        }
    }
    (vec![reply], false)
}

/// Submits the gathered XADDs as one append; its replies join the queue. Whether there
/// were any.
async fn flush_batch(
    session: &mut Session,
    batch: &mut Option<XaddBatch>,
    pending: &mut Pending,
) -> bool {
    let Some(batch) = batch.take() else {
        return false;
    };
    {
        let started = Instant::now();
        let acks = xadd::submit(session, batch).await;
        pending.push_back(Box::pin(async move {
            let (replies, close) = acks.await;
            let took = started.elapsed();
            // The replies of one append mostly share an outcome: each run of equal ones
            // is recorded at once.
            let mut rest = &replies[..];
            while let Some(first) = rest.first() {
                let outcome = first.outcome();
                let alike = rest.iter().take_while(|r| r.outcome() == outcome).count();
                telemetry::requests("resp", "xadd".into(), outcome, took, alike);
                rest = &rest[alike..];
            }
            (replies, close)
        }));
    }
    true
}

/// Writes every queued reply into `output`, waiting for each. Returns whether the
/// connection must close.
async fn drain(pending: &mut Pending, resp3: bool, output: &mut BytesMut) -> bool {
    let mut close = false;
    while let Some((replies, must_close)) = pending.pop_front().await {
        for reply in &replies {
            reply.encode(resp3, output);
        }
        close |= must_close;
    }
    close
}
