//! The log of failed requests (5xx), with bursts cut short. When a node dies, the
//! others fail every request for its streams until they have taken them over (up to a
//! lease, 10 s by default), and under load that is thousands a second with the same
//! message: a line each would bury everything else in the log and cost the log pipeline
//! dearly. Each error code gets a few lines a second in full, then one line saying the
//! rest of that second's are left out; the metric `streamgate_requests_total` (outcome
//! `5xx`) still counts every one.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Lines logged in full per error code and window.
const LINES_PER_WINDOW: u32 = 5;
const WINDOW: Duration = Duration::from_secs(1);

/// What to log for one failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The failure, in full.
    Log,
    /// That this window's further failures of its code are left out.
    SayTheRestAreLeftOut,
    Nothing,
}

/// Per error code, when its window started and how many failures it has seen.
#[derive(Default)]
pub(crate) struct FailureLog {
    windows: Mutex<HashMap<&'static str, (Instant, u32)>>,
}

impl FailureLog {
    /// Counts a failure with `code` at `now`.
    pub fn record(&self, code: &'static str, now: Instant) -> Verdict {
        let mut windows = self.windows.lock();
        let (started, seen) = windows.entry(code).or_insert((now, 0));
        if now.duration_since(*started) >= WINDOW {
            (*started, *seen) = (now, 0);
        }
        *seen = seen.saturating_add(1);
        match (*seen).cmp(&(LINES_PER_WINDOW + 1)) {
            std::cmp::Ordering::Less => Verdict::Log,
            std::cmp::Ordering::Equal => Verdict::SayTheRestAreLeftOut,
            std::cmp::Ordering::Greater => Verdict::Nothing,
        }
    }
}

/// Logs a failed request (see the module's comment).
pub(crate) fn log_failure(code: &'static str, error: &dyn std::fmt::Display) {
    static LOG: std::sync::OnceLock<FailureLog> = std::sync::OnceLock::new();
    match LOG
        .get_or_init(FailureLog::default)
        .record(code, Instant::now())
    {
        Verdict::Log => tracing::warn!(code, error = %error, "request failed"),
        Verdict::SayTheRestAreLeftOut => tracing::warn!(
            code,
            "more than {LINES_PER_WINDOW} requests failed with this code within a second; \
             the rest of this second's are not logged one by one (the metric \
             streamgate_requests_total counts every one)"
        ),
        Verdict::Nothing => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_logged_in_part_with_one_line_for_the_rest() {
        let log = FailureLog::default();
        let start = Instant::now();
        let verdicts: Vec<Verdict> = (0..100)
            .map(|i| log.record("unavailable", start + Duration::from_millis(i)))
            .collect();
        let mut expected = vec![Verdict::Log; LINES_PER_WINDOW as usize];
        expected.push(Verdict::SayTheRestAreLeftOut);
        expected.resize(100, Verdict::Nothing);
        assert_eq!(verdicts, expected);
        // Another code has a window of its own.
        assert_eq!(
            log.record("storage", start + Duration::from_millis(100)),
            Verdict::Log
        );
        // A second after the burst began, its failures are logged again.
        assert_eq!(log.record("unavailable", start + WINDOW), Verdict::Log);
    }

    #[test]
    fn a_failure_now_and_then_is_always_logged() {
        let log = FailureLog::default();
        let start = Instant::now();
        for second in 0..20 {
            assert_eq!(log.record("storage", start + WINDOW * second), Verdict::Log);
        }
    }
}
