//! Decoding client requests. A request is either a flat array of bulk strings
//! (`*<n>\r\n` then `n` times `$<len>\r\n<bytes>\r\n`) or an inline command line
//! (`PING hello\r\n`), as Redis accepts them. Nothing here recurses, and every count and
//! length the client announces is checked against a bound before anything is allocated
//! for it, so no input can exhaust the stack or memory.

use bytes::{Buf, Bytes, BytesMut};

/// Largest request (all its bytes, framing included).
pub const MAX_REQUEST_BYTES: usize = 2 * 1024 * 1024;
/// Most arguments in one request (Redis's own multibulk limit).
pub const MAX_ARGUMENTS: usize = 1024 * 1024;
/// Longest inline command line.
pub const MAX_INLINE_BYTES: usize = 64 * 1024;
/// Arguments reserved up front, whatever count the client announces.
const PREALLOCATED_ARGUMENTS: usize = 64;
/// The longest `*<n>` / `$<n>` line worth reading (after its `*` or `$`): a sign, the
/// 19 digits of an i64, CRLF, and some slack.
const MAX_HEADER_LINE: usize = 24;

/// A request that breaks the protocol; the connection answers with this error and
/// closes, since the byte stream cannot be resynchronised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl ProtocolError {
    fn new(what: impl std::fmt::Display) -> Self {
        ProtocolError(format!("ERR Protocol error: {what}"))
    }
}

/// Decodes the requests of one connection from its input buffer, which the caller only
/// appends to and lets this take whole requests from. What was scanned of a request that
/// has not fully arrived is kept, so a request arriving a byte at a time costs time
/// linear in its size.
#[derive(Default)]
pub struct RequestDecoder {
    /// The array request at the front of the input, as far as it has been scanned.
    array: Option<PartialArray>,
    /// How much of the front of the input was searched for the end of an inline line.
    inline_searched: usize,
}

struct PartialArray {
    count: usize,
    /// Where each argument found so far lies in the request.
    arguments: Vec<(usize, usize)>,
    /// Where scanning resumes.
    at: usize,
}

impl RequestDecoder {
    /// The next whole request in `input` as its arguments (removed from `input`),
    /// `Ok(None)` if more bytes are needed.
    pub fn next_request(
        &mut self,
        input: &mut BytesMut,
    ) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        loop {
            match input.first() {
                None => return Ok(None),
                Some(b'*') => {
                    let Some((len, arguments)) = self.scan_array(input)? else {
                        return Ok(None);
                    };
                    self.array = None;
                    // `*0` and `*-1` are empty requests, which Redis skips.
                    if arguments.is_empty() {
                        input.advance(len);
                        continue;
                    }
                    let request = input.split_to(len).freeze();
                    return Ok(Some(
                        arguments
                            .into_iter()
                            .map(|(start, end)| request.slice(start..end))
                            .collect(),
                    ));
                }
                Some(_) => match self.inline_line(input)? {
                    None => return Ok(None),
                    Some(arguments) if arguments.is_empty() => {} // a blank line
                    Some(arguments) => return Ok(Some(arguments)),
                },
            }
        }
    }

    /// Scans the array request at the front of `input` further: its length and where
    /// each argument lies once it is complete, `None` while more bytes are needed.
    #[allow(clippy::type_complexity)]
    fn scan_array(
        &mut self,
        input: &[u8],
    ) -> Result<Option<(usize, Vec<(usize, usize)>)>, ProtocolError> {
        let partial = match &mut self.array {
            Some(partial) => partial,
            None => {
                let Some((count, at)) = header_line(input, 0, b'*')? else {
                    return Ok(None);
                };
                if count <= 0 {
                    return Ok(Some((at, Vec::new())));
                }
                let count = usize::try_from(count)
                    .ok()
                    .filter(|n| *n <= MAX_ARGUMENTS)
                    .ok_or_else(|| ProtocolError::new("invalid multibulk length"))?;
                self.array.insert(PartialArray {
                    count,
                    arguments: Vec::with_capacity(count.min(PREALLOCATED_ARGUMENTS)),
                    at,
                })
            }
        };
        while partial.arguments.len() < partial.count {
            let at = partial.at;
            if at >= input.len() {
                return Ok(None);
            }
            if input[at] != b'$' {
                return Err(ProtocolError::new(format!(
                    "expected '$', got '{}'",
                    char::from(input[at]).escape_default()
                )));
            }
            let Some((len, body)) = header_line(input, at, b'$')? else {
                return Ok(None);
            };
            let len = usize::try_from(len)
                .ok()
                .filter(|n| *n <= MAX_REQUEST_BYTES)
                .ok_or_else(|| ProtocolError::new("invalid bulk length"))?;
            let end = body + len;
            // Whether or not it has all arrived: a request may not pass the limit.
            if end + 2 > MAX_REQUEST_BYTES {
                return Err(too_large());
            }
            if end + 2 > input.len() {
                return Ok(None);
            }
            if &input[end..end + 2] != b"\r\n" {
                return Err(ProtocolError::new("a bulk string does not end in CRLF"));
            }
            partial.arguments.push((body, end));
            partial.at = end + 2;
        }
        Ok(Some((partial.at, std::mem::take(&mut partial.arguments))))
    }

    /// An inline command (as typed into a raw TCP session): the words of the first
    /// line, removed from `input`; `None` if the line is not complete yet.
    fn inline_line(&mut self, input: &mut BytesMut) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        let window = &input[..input.len().min(MAX_INLINE_BYTES + 1)];
        let from = self.inline_searched.min(window.len());
        let Some(end) = window[from..]
            .iter()
            .position(|&b| b == b'\n')
            .map(|i| from + i)
        else {
            if input.len() > MAX_INLINE_BYTES {
                return Err(ProtocolError::new("too big inline request"));
            }
            self.inline_searched = window.len();
            return Ok(None);
        };
        self.inline_searched = 0;
        let line = input.split_to(end + 1).freeze();
        Ok(Some(
            line.split(|b| b.is_ascii_whitespace())
                .filter(|word| !word.is_empty())
                .map(|word| line.slice_ref(word))
                .collect(),
        ))
    }
}

fn too_large() -> ProtocolError {
    ProtocolError::new(format!(
        "a request may be at most {MAX_REQUEST_BYTES} bytes"
    ))
}

/// Parses `<kind><integer>\r\n` at `at`: the integer and where the next line starts,
/// or `None` if the line is not complete yet.
fn header_line(input: &[u8], at: usize, kind: u8) -> Result<Option<(i64, usize)>, ProtocolError> {
    debug_assert_eq!(input.get(at), Some(&kind));
    let rest = &input[at + 1..];
    let window = &rest[..rest.len().min(MAX_HEADER_LINE)];
    let Some(newline) = window.iter().position(|&b| b == b'\n') else {
        if rest.len() >= MAX_HEADER_LINE {
            return Err(ProtocolError::new(match kind {
                b'*' => "invalid multibulk length",
                _ => "invalid bulk length",
            }));
        }
        return Ok(None);
    };
    let digits = window[..newline]
        .strip_suffix(b"\r")
        .and_then(|d| std::str::from_utf8(d).ok())
        .and_then(|d| d.parse::<i64>().ok());
    match digits {
        Some(value) => Ok(Some((value, at + 1 + newline + 1))),
        None => Err(ProtocolError::new(match kind {
            b'*' => "invalid multibulk length",
            _ => "invalid bulk length",
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(wire: &[u8]) -> Result<Vec<Vec<Bytes>>, ProtocolError> {
        let mut input = BytesMut::from(wire);
        let mut decoder = RequestDecoder::default();
        let mut requests = Vec::new();
        while let Some(request) = decoder.next_request(&mut input)? {
            requests.push(request);
        }
        Ok(requests)
    }

    #[test]
    fn requests_split_across_reads_and_coalesced_in_one() {
        let wire = b"*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n*1\r\n$4\r\nPING\r\n";
        let mut input = BytesMut::new();
        let mut decoder = RequestDecoder::default();
        let mut requests = Vec::new();
        for byte in wire.iter() {
            input.extend_from_slice(&[*byte]);
            while let Some(args) = decoder.next_request(&mut input).unwrap() {
                requests.push(args);
            }
        }
        assert_eq!(requests.len(), 2);
        assert_eq!(requests[0], vec![Bytes::from("ECHO"), Bytes::from("hi")]);
        assert_eq!(requests[1], vec![Bytes::from("PING")]);
        assert!(input.is_empty());
        assert_eq!(all(wire).unwrap(), requests);
    }

    #[test]
    fn binary_arguments_and_empty_requests() {
        let requests = all(b"*0\r\n*-1\r\n*2\r\n$3\r\nSET\r\n$4\r\na\r\n\0\r\n").unwrap();
        assert_eq!(
            requests,
            vec![vec![Bytes::from("SET"), Bytes::from(&b"a\r\n\0"[..])]]
        );
    }

    #[test]
    fn inline_requests_and_blank_lines() {
        let mut blank = vec![b'\n'; 1_000_000];
        blank.extend_from_slice(b"PING  hello\r\n");
        assert_eq!(
            all(&blank).unwrap(),
            vec![vec![Bytes::from("PING"), Bytes::from("hello")]]
        );
        assert_eq!(
            all(&vec![b'a'; MAX_INLINE_BYTES + 1]).unwrap_err().0,
            "ERR Protocol error: too big inline request"
        );
        assert_eq!(all(&[b'a'; 100]).unwrap(), Vec::<Vec<Bytes>>::new());
    }

    #[test]
    fn nesting_and_non_bulk_elements_are_refused() {
        let nested = b"*1\r\n".repeat(10_000);
        assert_eq!(
            all(&nested).unwrap_err().0,
            "ERR Protocol error: expected '$', got '*'"
        );
        assert!(all(b"*1\r\n:1\r\n").is_err());
        assert!(all(b"*1\r\n+OK\r\n").is_err());
    }

    #[test]
    fn announced_sizes_are_bounded_before_allocation() {
        let refused = |wire: &[u8]| all(wire).unwrap_err().0;
        assert_eq!(
            refused(b"*99999999999\r\n"),
            "ERR Protocol error: invalid multibulk length"
        );
        assert_eq!(
            refused(b"*x\r\n"),
            "ERR Protocol error: invalid multibulk length"
        );
        assert_eq!(
            refused(b"*1\r\n$-1\r\n"),
            "ERR Protocol error: invalid bulk length"
        );
        assert_eq!(
            refused(b"*1\r\n$3000000\r\n"),
            "ERR Protocol error: invalid bulk length"
        );
        assert_eq!(
            refused(&[b"*1".as_slice(), &[b'1'; 40]].concat()),
            "ERR Protocol error: invalid multibulk length"
        );
        assert!(refused(b"*1\r\n$1\r\nab\r\n").contains("CRLF"));
        // A request that would pass the size limit is refused before it all arrives, and
        // also when it arrives all at once.
        let mut whole = b"*2\r\n$1900000\r\n".to_vec();
        whole.extend(std::iter::repeat_n(b'a', 1_900_000));
        whole.extend_from_slice(b"\r\n$1900000\r\n");
        whole.extend(std::iter::repeat_n(b'a', 1_900_000));
        whole.extend_from_slice(b"\r\n");
        assert!(refused(&whole).contains("at most"));
        let mut large = b"*2\r\n$1900000\r\n".to_vec();
        large.extend(std::iter::repeat_n(b'a', 1_900_000));
        large.extend_from_slice(b"\r\n$1900000\r\n");
        assert!(refused(&large).contains("at most"));
        // Announcing a million arguments reserves nothing for them.
        let mut input = BytesMut::from(&b"*1048576\r\n$1\r\na\r\n"[..]);
        let mut decoder = RequestDecoder::default();
        assert_eq!(decoder.next_request(&mut input).unwrap(), None);
    }
}
