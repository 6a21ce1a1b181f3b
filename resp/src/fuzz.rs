//! Entry points for the fuzzers (`fuzz/`), also replayed over the committed corpus by
//! `cargo test` (`tests/tests/fuzz_corpus.rs`). Each takes arbitrary bytes and must
//! neither panic nor allocate without bound; each asserts a property that must hold for
//! every input.

use bytes::{Bytes, BytesMut};
use streamgate_core::record::{metered_size, SequencedRecord};

use crate::entry::{self, EntryId, IdArg};
use crate::request::{self, MAX_REQUEST_BYTES};

/// Bytes from a client, however they are cut into reads: decoded into requests and
/// parsed as commands. Decoding consumes whole requests only, and never holds more than
/// one request's worth of bytes undecided.
pub fn requests(data: &[u8]) {
    let Some((&cut, data)) = data.split_first() else {
        return;
    };
    let step = usize::from(cut).max(1);
    let mut input = BytesMut::new();
    let mut decoder = request::RequestDecoder::default();
    for piece in data.chunks(step) {
        input.extend_from_slice(piece);
        loop {
            let before = input.len();
            match decoder.next_request(&mut input) {
                Ok(Some(args)) => {
                    let taken: usize = args.iter().map(Bytes::len).sum();
                    assert!(
                        taken <= before - input.len(),
                        "arguments come from consumed bytes"
                    );
                    let _ = crate::cmd::parse(&args);
                }
                Ok(None) => {
                    assert!(
                        input.len() <= MAX_REQUEST_BYTES + step,
                        "undecided bytes stay bounded"
                    );
                    break;
                }
                Err(_) => return, // the connection would close here
            }
        }
    }
}

/// Fields and values (split at 0xFF bytes, alternately) stored as an entry and read back:
/// the same fields, metered as the Redis page says.
pub fn entry_round_trip(data: &[u8]) {
    let parts: Vec<Bytes> = data
        .split(|b| *b == 0xff)
        .map(Bytes::copy_from_slice)
        .collect();
    let fields: Vec<(Bytes, Bytes)> = parts
        .chunks_exact(2)
        .map(|pair| (pair[0].clone(), pair[1].clone()))
        .collect();
    let headers = entry::encode_fields(&fields);
    assert_eq!(
        metered_size(&headers, b""),
        entry::metered_size(&fields),
        "an entry is metered as its record is"
    );
    let record = SequencedRecord {
        seq_num: data.len() as u64,
        timestamp: u64::from(data.first().copied().unwrap_or(0)),
        headers,
        body: Bytes::new(),
    };
    let decoded = entry::decode_fields(&record).expect("an encoded entry decodes");
    assert_eq!(decoded, fields, "fields survive the entry encoding");
    let id = EntryId::of(&record);
    assert_eq!(
        IdArg::parse(&id.to_bytes()),
        Some(IdArg::Full(id)),
        "IDs survive their text"
    );
    if let Some(IdArg::Full(parsed)) = IdArg::parse(data) {
        assert_eq!(IdArg::parse(&parsed.to_bytes()), Some(IdArg::Full(parsed)));
    }
}
