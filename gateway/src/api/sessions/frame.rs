//! S2S framing: a 3-byte big-endian length (of what follows), a flag byte, and a body.
//! Flags: bit 7 terminal, bits 6-5 compression (0 none, 1 zstd, 2 gzip), bit 4 set by
//! the server to advise the client to reconnect (while draining). A regular body is a
//! protobuf message; a terminal body is a 2-byte status and the JSON error of a unary call.

use std::io::{Read, Write};

use axum::http::HeaderMap;
use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Largest frame (flag byte and body), as the protocol enforces.
pub const MAX_FRAME_BYTES: usize = 2 * 1024 * 1024;
/// Messages smaller than this are never compressed.
const COMPRESS_ABOVE: usize = 1024;

const TERMINAL: u8 = 0x80;
const COMPRESSION_SHIFT: u8 = 5;
const COMPRESSION_MASK: u8 = 0b11 << COMPRESSION_SHIFT;
/// Set by the server on regular frames sent while it drains: reconnect soon.
pub const RECONNECT_ADVISED: u8 = 0x10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Zstd,
    Gzip,
}

impl Compression {
    /// What to compress server messages with: zstd if the client accepts it, else gzip.
    pub fn negotiate(headers: &HeaderMap) -> Compression {
        let accepted: Vec<String> = headers
            .get_all(axum::http::header::ACCEPT_ENCODING)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            // Entries with `q=0` are refusals, not offers.
            .filter(|entry| {
                !entry.split(';').skip(1).any(|param| {
                    let param = param.trim().replace(' ', "");
                    param
                        .strip_prefix("q=")
                        .is_some_and(|q| q.parse::<f32>() == Ok(0.0))
                })
            })
            .map(|v| {
                v.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase()
            })
            .collect();
        if accepted.iter().any(|e| e == "zstd") {
            Compression::Zstd
        } else if accepted.iter().any(|e| e == "gzip") {
            Compression::Gzip
        } else {
            Compression::None
        }
    }

    fn bits(self) -> u8 {
        match self {
            Compression::None => 0,
            Compression::Zstd => 1,
            Compression::Gzip => 2,
        }
    }

    fn from_bits(bits: u8) -> Result<Compression, FrameError> {
        match bits {
            0 => Ok(Compression::None),
            1 => Ok(Compression::Zstd),
            2 => Ok(Compression::Gzip),
            other => Err(FrameError(format!(
                "unknown compression {other} in frame flags"
            ))),
        }
    }

    fn compress(self, data: &[u8]) -> Vec<u8> {
        match self {
            Compression::None => data.to_vec(),
            Compression::Zstd => zstd::bulk::compress(data, 1).expect("zstd compresses memory"),
            Compression::Gzip => {
                let mut encoder =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                encoder.write_all(data).expect("gzip compresses memory");
                encoder.finish().expect("gzip compresses memory")
            }
        }
    }

    fn decompress(self, data: Bytes) -> Result<Bytes, FrameError> {
        let mut out = Vec::new();
        let result = match self {
            Compression::None => return Ok(data),
            Compression::Zstd => zstd::stream::read::Decoder::new(&data[..])
                .and_then(|d| d.take(MAX_FRAME_BYTES as u64 * 4 + 1).read_to_end(&mut out)),
            Compression::Gzip => flate2::read::GzDecoder::new(&data[..])
                .take(MAX_FRAME_BYTES as u64 * 4 + 1)
                .read_to_end(&mut out),
        };
        match result {
            Ok(n) if n > MAX_FRAME_BYTES * 4 => {
                Err(FrameError("decompressed message is too large".into()))
            }
            Ok(_) => Ok(Bytes::from(out)),
            Err(e) => Err(FrameError(format!("cannot decompress message: {e}"))),
        }
    }
}

/// A malformed frame; it ends the session with a `bad_frame` terminal message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameError(pub String);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A (decompressed) protobuf message.
    Message(Bytes),
    /// The peer ended the session with a status and a JSON body.
    Terminal { status: u16, body: Bytes },
}

/// Splits a byte stream into frames, whatever the chunking of the input.
#[derive(Default)]
pub struct FrameDecoder {
    buffer: BytesMut,
}

impl FrameDecoder {
    pub fn push(&mut self, data: &[u8]) {
        self.buffer.extend_from_slice(data);
    }

    /// Bytes received but not yet part of a whole frame.
    pub fn pending(&self) -> usize {
        self.buffer.len()
    }

    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if self.buffer.len() < 3 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([0, self.buffer[0], self.buffer[1], self.buffer[2]]) as usize;
        if len == 0 {
            return Err(FrameError("frame without a flag byte".into()));
        }
        if len > MAX_FRAME_BYTES {
            return Err(FrameError(format!(
                "frame of {len} bytes exceeds the {MAX_FRAME_BYTES}-byte limit"
            )));
        }
        if self.buffer.len() < 3 + len {
            return Ok(None);
        }
        self.buffer.advance(3);
        let mut body = self.buffer.split_to(len).freeze();
        let flags = body.get_u8();
        if flags & TERMINAL != 0 {
            if body.len() < 2 {
                return Err(FrameError("terminal frame without a status".into()));
            }
            let status = body.get_u16();
            return Ok(Some(Frame::Terminal { status, body }));
        }
        let compression = Compression::from_bits((flags & COMPRESSION_MASK) >> COMPRESSION_SHIFT)?;
        Ok(Some(Frame::Message(compression.decompress(body)?)))
    }
}

fn frame(flags: u8, body: &[u8]) -> Bytes {
    let mut out = frame_header(flags, body.len());
    out.put_slice(body);
    out.freeze()
}

/// A buffer holding a frame's header, with room for the `body_len` bytes that follow.
fn frame_header(flags: u8, body_len: usize) -> BytesMut {
    let len = body_len + 1;
    let mut out = BytesMut::with_capacity(3 + len);
    out.put_slice(&(len as u32).to_be_bytes()[1..]);
    out.put_u8(flags);
    out
}

/// A regular frame carrying `message`, compressed if it is 1 KiB or more.
pub fn encode_message(
    message: &impl prost::Message,
    compression: Compression,
    extra_flags: u8,
) -> Bytes {
    let len = message.encoded_len();
    if len >= COMPRESS_ABOVE && compression != Compression::None {
        let compressed = compression.compress(&message.encode_to_vec());
        frame(
            (compression.bits() << COMPRESSION_SHIFT) | extra_flags,
            &compressed,
        )
    } else {
        // Encoded right after the header: a catch-up's records are copied once here,
        // not once to encode and again to frame.
        let mut out = frame_header(extra_flags, len);
        message.encode_raw(&mut out);
        out.freeze()
    }
}

/// A terminal frame: the status and the JSON body a unary call would have returned.
pub fn encode_terminal(status: u16, body: &serde_json::Value, extra_flags: u8) -> Bytes {
    let mut payload = status.to_be_bytes().to_vec();
    payload.extend_from_slice(body.to_string().as_bytes());
    frame(TERMINAL | extra_flags, &payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::proto::{ReadBatch, StreamPosition};

    fn batch(body_len: usize) -> ReadBatch {
        ReadBatch {
            records: vec![crate::api::proto::SequencedRecord {
                seq_num: 1,
                timestamp: 2,
                headers: vec![],
                body: Bytes::from(vec![b'a'; body_len]),
            }],
            tail: Some(StreamPosition {
                seq_num: 2,
                timestamp: 2,
            }),
        }
    }

    fn decode_all(bytes: &[u8], chunk: usize) -> Vec<Frame> {
        let mut decoder = FrameDecoder::default();
        let mut frames = Vec::new();
        for piece in bytes.chunks(chunk.max(1)) {
            decoder.push(piece);
            while let Some(frame) = decoder.next_frame().unwrap() {
                frames.push(frame);
            }
        }
        assert_eq!(decoder.pending(), 0);
        frames
    }

    #[test]
    fn frames_survive_any_split_and_coalescing() {
        let mut stream = Vec::new();
        for (size, compression) in [
            (10, Compression::None),
            (5000, Compression::Zstd),
            (5000, Compression::Gzip),
        ] {
            stream.extend_from_slice(&encode_message(&batch(size), compression, 0));
        }
        stream.extend_from_slice(&encode_terminal(
            412,
            &serde_json::json!({"seq_num_mismatch": 3}),
            0,
        ));
        for chunk in [1, 2, 3, 7, 1000, stream.len()] {
            let frames = decode_all(&stream, chunk);
            assert_eq!(frames.len(), 4, "chunk size {chunk}");
            for (frame, size) in frames.iter().take(3).zip([10, 5000, 5000]) {
                let Frame::Message(body) = frame else {
                    panic!("expected a message")
                };
                let decoded = <ReadBatch as prost::Message>::decode(body.clone()).unwrap();
                assert_eq!(decoded, batch(size));
            }
            assert_eq!(
                frames[3],
                Frame::Terminal {
                    status: 412,
                    body: Bytes::from_static(br#"{"seq_num_mismatch":3}"#)
                }
            );
        }
    }

    #[test]
    fn negotiation_prefers_zstd_and_honours_refusals() {
        let negotiate = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(axum::http::header::ACCEPT_ENCODING, value.parse().unwrap());
            Compression::negotiate(&headers)
        };
        assert_eq!(negotiate("gzip, zstd"), Compression::Zstd);
        assert_eq!(negotiate("gzip"), Compression::Gzip);
        assert_eq!(negotiate("zstd;q=0, gzip"), Compression::Gzip);
        assert_eq!(negotiate("identity"), Compression::None);
        assert_eq!(Compression::negotiate(&HeaderMap::new()), Compression::None);
    }

    #[test]
    fn flags_say_what_the_frame_is() {
        let small = encode_message(&batch(10), Compression::Zstd, 0);
        assert_eq!(small[3], 0, "messages under 1 KiB are not compressed");
        let big = encode_message(&batch(5000), Compression::Zstd, 0);
        assert_eq!(big[3] & COMPRESSION_MASK, 1 << COMPRESSION_SHIFT);
        let gzip = encode_message(&batch(5000), Compression::Gzip, RECONNECT_ADVISED);
        assert_eq!(gzip[3], (2 << COMPRESSION_SHIFT) | RECONNECT_ADVISED);
        let terminal = encode_terminal(503, &serde_json::json!({"code": "server_draining"}), 0);
        assert_eq!(terminal[3], TERMINAL);
        assert_eq!(&terminal[4..6], &503u16.to_be_bytes());
        let len = u32::from_be_bytes([0, terminal[0], terminal[1], terminal[2]]) as usize;
        assert_eq!(len, terminal.len() - 3);
    }

    #[test]
    fn malformed_frames_are_errors() {
        let mut oversized = FrameDecoder::default();
        oversized.push(&[0x20, 0x00, 0x01, 0x00]);
        assert!(oversized.next_frame().is_err());
        let mut empty = FrameDecoder::default();
        empty.push(&[0, 0, 0]);
        assert!(empty.next_frame().is_err());
        let mut bad_compression = FrameDecoder::default();
        bad_compression.push(&[0, 0, 2, 0b0110_0000, 1]);
        assert!(bad_compression.next_frame().is_err());
        let mut garbage_zstd = FrameDecoder::default();
        garbage_zstd.push(&[0, 0, 4, 1 << COMPRESSION_SHIFT, 1, 2, 3]);
        assert!(garbage_zstd.next_frame().is_err());
        let mut short_terminal = FrameDecoder::default();
        short_terminal.push(&[0, 0, 2, TERMINAL, 1]);
        assert!(short_terminal.next_frame().is_err());
        let mut incomplete = FrameDecoder::default();
        incomplete.push(&[0, 0, 9, 0, 1]);
        assert_eq!(incomplete.next_frame(), Ok(None));
    }
}
