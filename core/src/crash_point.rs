//! Test hooks for crash and containment tests, inert unless their environment variable
//! is set:
//!
//! - `STREAMGATE_CRASH_AT=<point>`: the process aborts (as abruptly as `kill -9`) the
//!   first time it reaches that point, so a test can stop it exactly between two steps of
//!   multi-step background work;
//! - `STREAMGATE_PANIC_ON=<marker>`: an append holding a record whose body or a header
//!   value is exactly `<marker>` panics before anything is sequenced, so a test can check
//!   that a panic ends only the request or connection it happened in;
//! - `STREAMGATE_PAUSE_AT=<point>:<milliseconds>`: the task that reaches that point
//!   sleeps that long there, every time, so a test can make one step slow (a takeover
//!   that outlasts the lease, say);
//! - `STREAMGATE_FAIL_AT=<point>`: the first time the process reaches that point once
//!   its start-up is over, the step there fails with a storage error, as if the store
//!   had refused it (a takeover that fails part way, say); later passes go through. Not
//!   during start-up, where such a failure ends the process: a test arms the hook when
//!   it starts a node, and a peer may hand that node streams while it is still starting.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use crate::record::AppendRecord;

pub(crate) fn crash_point(point: &str) {
    static CRASH_AT: OnceLock<Option<String>> = OnceLock::new();
    let crash_at = CRASH_AT.get_or_init(|| std::env::var("STREAMGATE_CRASH_AT").ok());
    if crash_at.as_deref() == Some(point) {
        eprintln!("STREAMGATE_CRASH_AT={point}: aborting here, as asked");
        std::process::abort();
    }
}

pub(crate) async fn pause_point(point: &str) {
    static PAUSE_AT: OnceLock<Option<(String, u64)>> = OnceLock::new();
    let pause_at = PAUSE_AT.get_or_init(|| {
        let value = std::env::var("STREAMGATE_PAUSE_AT").ok()?;
        let (at, ms) = value.rsplit_once(':')?;
        Some((at.to_owned(), ms.parse().ok()?))
    });
    if let Some((at, ms)) = pause_at {
        if at == point {
            tracing::warn!(point, ms, "STREAMGATE_PAUSE_AT: pausing here, as asked");
            tokio::time::sleep(std::time::Duration::from_millis(*ms)).await;
        }
    }
}

/// Set once an engine has finished starting: `fail_point` is armed from then on.
static STARTED: AtomicBool = AtomicBool::new(false);

pub(crate) fn start_up_done() {
    STARTED.store(true, Ordering::SeqCst);
}

pub(crate) fn fail_point(point: &str) -> crate::error::Result<()> {
    static FAIL_AT: OnceLock<Option<String>> = OnceLock::new();
    static FAILED: AtomicBool = AtomicBool::new(false);
    let fail_at = FAIL_AT.get_or_init(|| std::env::var("STREAMGATE_FAIL_AT").ok());
    if fail_at.as_deref() == Some(point)
        && STARTED.load(Ordering::SeqCst)
        && !FAILED.swap(true, Ordering::SeqCst)
    {
        tracing::warn!(point, "STREAMGATE_FAIL_AT: failing here once, as asked");
        return Err(crate::error::Error::storage(format!(
            "STREAMGATE_FAIL_AT={point}: failing here once, as asked"
        )));
    }
    Ok(())
}

pub(crate) fn panic_point(records: &[AppendRecord]) {
    static MARKER: OnceLock<Option<Vec<u8>>> = OnceLock::new();
    let marker = MARKER.get_or_init(|| {
        std::env::var("STREAMGATE_PANIC_ON")
            .ok()
            .map(String::into_bytes)
    });
    let Some(marker) = marker else { return };
    let marked = records.iter().any(|record| {
        record.body.as_ref() == marker.as_slice()
            || record
                .headers
                .iter()
                .any(|h| h.value.as_ref() == marker.as_slice())
    });
    if marked {
        panic!("STREAMGATE_PANIC_ON: an append carries the marker; panicking here, as asked");
    }
}
