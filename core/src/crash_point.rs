//! A test hook for crash tests: with `STREAMGATE_CRASH_AT=<point>` in its environment,
//! the process aborts (as abruptly as `kill -9`) the first time it reaches that point,
//! so a test can stop it exactly between two steps of multi-step background work.

use std::sync::OnceLock;

pub(crate) fn crash_point(point: &str) {
    static CRASH_AT: OnceLock<Option<String>> = OnceLock::new();
    let crash_at = CRASH_AT.get_or_init(|| std::env::var("STREAMGATE_CRASH_AT").ok());
    if crash_at.as_deref() == Some(point) {
        eprintln!("STREAMGATE_CRASH_AT={point}: aborting here, as asked");
        std::process::abort();
    }
}
