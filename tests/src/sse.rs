//! SSE read sessions as the tests read them: event by event, or until some text arrives.

use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};

/// An open SSE session's response, and what it has sent so far.
pub struct SseSession {
    body: Pin<Box<dyn Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    /// Everything the session has sent so far.
    pub seen: String,
    /// How much of `seen` `next_event` has handed out.
    taken: usize,
}

impl SseSession {
    /// Sends `request` (a read of a stream's records, asking for `text/event-stream`);
    /// the session must be accepted.
    pub async fn open(request: reqwest::RequestBuilder) -> SseSession {
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 200);
        SseSession {
            body: Box::pin(response.bytes_stream()),
            seen: String::new(),
            taken: 0,
        }
    }

    /// The next event, as (event, id, data).
    pub async fn next_event(&mut self) -> (String, String, String) {
        loop {
            if let Some(end) = self.seen[self.taken..].find("\n\n") {
                let event = &self.seen[self.taken..self.taken + end + 2];
                self.taken += end + 2;
                return events(event).remove(0);
            }
            self.read_more().await;
        }
    }

    /// Reads until what the session has sent contains `needle`.
    pub async fn read_until(&mut self, needle: &str) {
        while !self.seen.contains(needle) {
            self.read_more().await;
        }
    }

    /// The session's next chunk, which must come within 20 s.
    async fn read_more(&mut self) {
        let chunk = tokio::time::timeout(Duration::from_secs(20), self.body.next())
            .await
            .expect("the session sends within 20 s")
            .expect("the session is open")
            .unwrap();
        self.seen.push_str(std::str::from_utf8(&chunk).unwrap());
    }
}

/// Parses SSE text into (event, id, data) triples.
pub fn events(text: &str) -> Vec<(String, String, String)> {
    text.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let field = |name: &str| {
                block
                    .lines()
                    .find_map(|l| l.strip_prefix(&format!("{name}: ")))
                    .unwrap_or("")
                    .to_owned()
            };
            (field("event"), field("id"), field("data"))
        })
        .collect()
}
