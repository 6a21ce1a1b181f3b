//! Entry points for the fuzzers (`fuzz/`), also replayed over the committed corpus by
//! `cargo test` (`tests/tests/fuzz_corpus.rs`). Each takes arbitrary bytes and must
//! neither panic nor allocate without bound; each asserts a property that must hold for
//! every input.

use axum::http::{header, HeaderMap, HeaderValue, Uri};
use streamgate_core::config::{BasinConfig, StreamConfig};
use streamgate_core::record::MAX_BATCH_RECORDS;

use crate::api::extract::json_body;
use crate::api::json::{AppendInputJson, Format};
use crate::api::proto::decode_append_input;
use crate::api::records::ReadQuery;
use crate::api::sessions::frame::{Frame, FrameDecoder, MAX_FRAME_BYTES};

/// The bytes of an S2S append session's request body, however they are cut into reads:
/// framed, decompressed and decoded as `AppendInput`s. The decoder never holds more than
/// one frame's worth of bytes undecided.
pub fn s2s_frames(data: &[u8]) {
    let Some((&cut, data)) = data.split_first() else {
        return;
    };
    let step = usize::from(cut).max(1);
    let mut decoder = FrameDecoder::default();
    for piece in data.chunks(step) {
        decoder.push(piece);
        loop {
            match decoder.next_frame() {
                Ok(Some(Frame::Message(message))) => {
                    if let Ok(input) = decode_append_input(message) {
                        assert!(input.records.len() <= MAX_BATCH_RECORDS);
                        let _ = input.validate();
                    }
                }
                Ok(Some(Frame::Terminal { .. })) => {}
                Ok(None) => {
                    assert!(decoder.pending() <= 3 + MAX_FRAME_BYTES + step);
                    break;
                }
                Err(_) => return, // the session would end with bad_frame here
            }
        }
    }
}

/// A unary request body or query of the kind the first byte picks: an append in JSON
/// (raw or base64) or protobuf, a stream or basin configuration, or a read's query.
pub fn rest_bodies(data: &[u8]) {
    let Some((&choice, body)) = data.split_first() else {
        return;
    };
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    match choice % 6 {
        kind @ (0 | 1) => {
            let format = if kind == 0 {
                Format::Raw
            } else {
                Format::Base64
            };
            if let Ok(Some(input)) = json_body::<AppendInputJson>(&headers, body) {
                assert!(input.records.len() <= MAX_BATCH_RECORDS);
                if let Ok(input) = input.into_core(format) {
                    let _ = input.validate();
                }
            }
        }
        2 => {
            if let Ok(input) = decode_append_input(bytes::Bytes::copy_from_slice(body)) {
                assert!(input.records.len() <= MAX_BATCH_RECORDS);
                let _ = input.validate();
            }
        }
        3 => {
            if let Ok(Some(config)) = json_body::<StreamConfig>(&headers, body) {
                let _ = config.validate();
            }
        }
        4 => {
            if let Ok(Some(config)) = json_body::<BasinConfig>(&headers, body) {
                let _ = config.validate();
            }
        }
        _ => {
            let Ok(query) = std::str::from_utf8(body) else {
                return;
            };
            let Ok(uri) = format!("/records?{query}").parse::<Uri>() else {
                return;
            };
            if let Ok(axum::extract::Query(query)) =
                axum::extract::Query::<ReadQuery>::try_from_uri(&uri)
            {
                if let Ok(request) = query.request() {
                    let _ = request.validate();
                }
            }
        }
    }
}
