//! Which test servers exited without the test stopping them, and what they logged
//! last. A request to a server that has died fails with "connection refused" and says
//! nothing of why; when a test then panics, the panic also prints each such exit with
//! the server's last log lines (a fenced node says so, a panicking one shows where), so
//! a failure in CI explains itself from the end of the log.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once};

/// How many of a server's last log lines a report shows.
const TAIL_LINES: usize = 30;

/// Exits no test asked for, as reports, oldest first.
static UNEXPECTED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// One run of a server process: whether its exit is the test's doing.
#[derive(Clone, Default)]
pub(crate) struct Run {
    expected_exit: Arc<AtomicBool>,
}

impl Run {
    /// The test stops the process, or waits for it to stop on its own: its exit is
    /// no failure of the server.
    pub fn expect_exit(&self) {
        self.expected_exit.store(true, Ordering::SeqCst);
    }

    /// Copies the process's `stderr` to this process's as it comes, each line headed
    /// by the server's address (the nodes of a cluster log to one stream), keeping its
    /// last lines. When it ends (the process has exited) and the exit was not expected,
    /// the exit is recorded for the panic report.
    pub fn follow_log(&self, stderr: impl Read + Send + 'static, listen: &str, pid: u32) {
        install_panic_report();
        let expected_exit = self.expected_exit.clone();
        let listen = listen.to_owned();
        std::thread::spawn(move || {
            let mut tail = VecDeque::with_capacity(TAIL_LINES);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                // Straight to the stream, not through `eprintln!`, which the test
                // harness would capture and show only for a failed test.
                let _ = writeln!(std::io::stderr(), "{listen} {line}");
                if tail.len() == TAIL_LINES {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
            if !expected_exit.load(Ordering::SeqCst) {
                let at = time::OffsetDateTime::now_utc()
                    .format(&time::format_description::well_known::Rfc3339)
                    .unwrap_or_default();
                let log = if tail.is_empty() {
                    "it logged nothing".to_owned()
                } else {
                    let lines: Vec<String> = tail.iter().map(|l| strip_colours(l)).collect();
                    format!("its last log lines:\n  {}", lines.join("\n  "))
                };
                UNEXPECTED.lock().unwrap().push(format!(
                    "streamgate on {listen} (pid {pid}) exited at {at} without the test stopping it; {log}"
                ));
            }
        });
    }
}

/// Adds the unexpected exits to every panic's message (once per test process).
fn install_panic_report() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            default(info);
            let reports = UNEXPECTED.lock().map(|r| r.clone()).unwrap_or_default();
            for report in reports {
                // Captured with the test's output, so it is printed with the failure.
                eprintln!("{report}");
            }
        }));
    });
}

/// A log line without its terminal colour codes.
fn strip_colours(line: &str) -> String {
    let mut plain = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ parameters final-letter
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_codes_are_stripped() {
        let line = "\u{1b}[2m2026-12-07\u{1b}[0m \u{1b}[31mERROR\u{1b}[0m fenced";
        assert_eq!(strip_colours(line), "2026-12-07 ERROR fenced");
    }
}
