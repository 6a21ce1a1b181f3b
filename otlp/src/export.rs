//! Storing a parsed export: each stream's records go into one append (or, beyond the
//! limits of one append, consecutive appends), submitted in request order and
//! acknowledged only once durable.

use bytes::Bytes;
use futures::future::try_join_all;
use streamgate_core::names::{BasinName, StreamName};
use streamgate_core::record::{
    metered_size, AppendInput, AppendRecord, BatchPacker, Header, MAX_BATCH_METERED_BYTES,
};
use streamgate_core::{Caller, Error, ErrorKind, Resource};

use crate::request::{Encoding, ParsedGroup};
use crate::signal::Signal;

/// Record header naming the signal: `traces`, `metrics` or `logs`.
pub const SIGNAL_HEADER: &str = "s2-otlp.signal";
/// Record header naming the body's encoding, as the request's media type.
pub const CONTENT_TYPE_HEADER: &str = "content-type";

/// What was stored and what was turned away (reported through `partial_success`).
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub accepted_groups: usize,
    pub rejected_groups: usize,
    pub rejected_items: u64,
    /// Of the rejected groups, those refused for the token's scope.
    pub denied_groups: usize,
    pub messages: Vec<String>,
}

impl Outcome {
    fn reject(&mut self, groups: usize, items: u64, message: String) {
        self.rejected_groups += groups;
        self.rejected_items += items;
        if !self.messages.contains(&message) {
            self.messages.push(message);
        }
    }
}

/// Whether an engine error fails the whole export rather than one stream's part of it:
/// a missing basin, an expired token, and every transient failure (which exporters
/// retry). Lasting refusals of one stream (missing and not auto-created, being deleted,
/// outside the token's scope) are reported as partial success instead.
fn fails_whole_export(err: &Error) -> bool {
    matches!(err, Error::NotFound(Resource::Basin(_)))
        || err.kind().is_retryable()
        || matches!(err.kind(), ErrorKind::Unauthenticated | ErrorKind::Internal)
}

/// The records headers of one signal and encoding, and the most body one record holds.
pub(crate) fn record_headers(signal: Signal, encoding: Encoding) -> Vec<Header> {
    vec![
        Header {
            name: Bytes::from_static(SIGNAL_HEADER.as_bytes()),
            value: Bytes::from_static(signal.name().as_bytes()),
        },
        Header {
            name: Bytes::from_static(CONTENT_TYPE_HEADER.as_bytes()),
            value: Bytes::from_static(encoding.media_type().as_bytes()),
        },
    ]
}

/// The largest record body that fits one record next to `headers`.
pub(crate) fn record_body_limit(headers: &[Header]) -> usize {
    (MAX_BATCH_METERED_BYTES - metered_size(headers, &[])) as usize
}

struct StreamWork {
    stream: StreamName,
    groups: usize,
    items: u64,
    bodies: Vec<Bytes>,
}

pub(crate) async fn store(
    caller: &Caller,
    basin: &BasinName,
    headers: Vec<Header>,
    groups: Vec<ParsedGroup>,
) -> Result<Outcome, Error> {
    let mut outcome = Outcome::default();
    // Per stream, in the order streams first appear in the request.
    let mut work: Vec<StreamWork> = Vec::new();
    for group in groups {
        match group.target {
            Err(message) => outcome.reject(1, group.items, message),
            Ok((stream, bodies)) => {
                let entry = match work.iter().position(|w| w.stream == stream) {
                    Some(at) => &mut work[at],
                    None => {
                        work.push(StreamWork {
                            stream,
                            groups: 0,
                            items: 0,
                            bodies: Vec::new(),
                        });
                        work.last_mut().expect("just pushed")
                    }
                };
                entry.groups += 1;
                entry.items += group.items;
                entry.bodies.extend(bodies);
            }
        }
    }

    let total: u64 = work
        .iter()
        .flat_map(|w| &w.bodies)
        .map(|b| metered_size(&headers, b))
        .sum();
    if caller.is_congested(total) {
        return Err(Error::Unavailable(
            "the server is writing as fast as storage allows; retry shortly".into(),
        ));
    }

    let mut pending = Vec::new();
    for stream in work {
        let batches = batches(&headers, stream.bodies);
        let mut stored = true;
        for (index, records) in batches.into_iter().enumerate() {
            let input = AppendInput {
                records,
                ..Default::default()
            };
            match caller
                .submit_append(basin, &stream.stream, input, None)
                .await
            {
                Ok(ack) => pending.push(ack),
                Err(e) if fails_whole_export(&e) => return Err(e),
                // A lasting refusal (the stream is missing and the basin does not create
                // streams on append, is being deleted, is outside the token's scope): the
                // exporter learns which data was turned away and why, and does not retry
                // it.
                Err(e) => {
                    if matches!(e, Error::PermissionDenied(_)) {
                        outcome.denied_groups += stream.groups;
                    }
                    let message = if index == 0 {
                        e.to_string()
                    } else {
                        format!("{e} (after {index} of its appends were stored)")
                    };
                    outcome.reject(stream.groups, stream.items, message);
                    stored = false;
                    break;
                }
            }
        }
        if stored {
            outcome.accepted_groups += stream.groups;
        }
    }
    try_join_all(pending).await?;
    Ok(outcome)
}

/// The records of one stream's items, packed into as few appends as the limits allow.
fn batches(headers: &[Header], bodies: Vec<Bytes>) -> Vec<Vec<AppendRecord>> {
    BatchPacker::pack(bodies.into_iter().map(|body| AppendRecord {
        timestamp: None,
        headers: headers.to_vec(),
        body,
    }))
}
