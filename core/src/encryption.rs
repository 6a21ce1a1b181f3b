//! Stream encryption with a key the client supplies on each request (the S2
//! "Encryption" page): a stream captures its basin's `stream_cipher` when it is created
//! and keeps it for its lifetime; the headers and body of each of its records are sealed
//! before the record reaches the sequencer (so nothing plaintext is ever written) and
//! opened only when a read presents the key. Command records stay plaintext, since the
//! server must interpret them.
//!
//! A sealed record is stored with no headers and this body (integers big-endian):
//!
//! ```text
//! format u8 (1 = AEGIS-256, 2 = AES-256-GCM) | metered size u32 | nonce | ciphertext | tag (16)
//! ```
//!
//! The plaintext is `u32 header count | (u32 len, name, u32 len, value)* | body`. The
//! associated data is the stream's immutable id followed by the format byte and the
//! metered size, so a sealed record cannot be moved to another stream (or have its size
//! changed) without failing authentication. The metered size is the plaintext record's,
//! so batch limits and read limits count exactly what they count on a plaintext stream.
//!
//! Nonces: every record gets a fresh uniformly random nonce from a cryptographically
//! secure generator (the thread-local ChaCha12 generator of `rand`, seeded and reseeded
//! from the operating system). For AEGIS-256 the nonce has 256 bits: among 2^64 records
//! under one key, the chance that any two share a nonce is below 2^-129. For AES-256-GCM
//! the nonce has 96 bits, which is why a stream of that cipher takes at most 2^32 records
//! (the bound NIST SP 800-38D sets for random nonces: below 2^-32 for a repeat under one
//! key). Nonces are never derived from positions, because a position can be written
//! twice (a batch that was never acknowledged before a crash, or a node that lost its
//! lease) and a repeat of (key, nonce) with different plaintext is exactly what must not
//! happen.
//!
//! The key is never stored or logged: it lives in the request (or session) that brought
//! it, in memory that is wiped when it is dropped, and its `Debug` form is redacted.

use aes_gcm::aead::{Aead, KeyInit, Payload};
use bytes::{BufMut, Bytes, BytesMut};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::error::{Error, Result};
use crate::record::{AppendInput, AppendRecord, Header, SequencedRecord};

/// A stream's cipher.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Cipher {
    #[serde(rename = "aegis-256")]
    Aegis256,
    #[serde(rename = "aes-256-gcm")]
    Aes256Gcm,
}

impl Cipher {
    pub fn as_str(self) -> &'static str {
        match self {
            Cipher::Aegis256 => "aegis-256",
            Cipher::Aes256Gcm => "aes-256-gcm",
        }
    }

    pub fn parse(text: &str) -> Option<Cipher> {
        match text {
            "aegis-256" => Some(Cipher::Aegis256),
            "aes-256-gcm" => Some(Cipher::Aes256Gcm),
            _ => None,
        }
    }

    /// The format byte of records sealed with this cipher.
    fn format(self) -> u8 {
        match self {
            Cipher::Aegis256 => 1,
            Cipher::Aes256Gcm => 2,
        }
    }

    fn nonce_len(self) -> usize {
        match self {
            Cipher::Aegis256 => 32,
            Cipher::Aes256Gcm => 12,
        }
    }

    /// The most records a stream of this cipher may hold (sequence numbers from 0): a
    /// 96-bit random nonce is safe for 2^32 messages under one key, no more.
    pub fn max_records(self) -> u64 {
        match self {
            Cipher::Aegis256 => u64::MAX,
            Cipher::Aes256Gcm => 1 << 32,
        }
    }
}

impl std::fmt::Display for Cipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Longest `s2-encryption-key` value: 32 bytes in padded base64.
pub const MAX_KEY_TEXT: usize = 44;
/// Bytes of a key.
const KEY_LEN: usize = 32;
/// Bytes of the authentication tag.
const TAG_LEN: usize = 16;
/// Format byte and metered size, before the nonce.
const PREFIX_LEN: usize = 1 + 4;
/// What binds a sealed record to its stream, with the stream id after it.
const AAD_LABEL: &[u8] = b"streamgate record v1";

/// An encryption key as the client sent it (base64 text), decoded only for a stream
/// that has a cipher: like S2, a key sent for a plaintext stream is ignored, even one
/// that would not decode. Wiped from memory when dropped; never printed.
#[derive(Clone)]
pub struct EncryptionKey {
    text: Zeroizing<String>,
}

impl std::fmt::Debug for EncryptionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EncryptionKey(<redacted>)")
    }
}

impl EncryptionKey {
    /// Takes the text of an `s2-encryption-key` header (surrounding whitespace trimmed):
    /// 1 to 44 characters. Whether it is base64 of 32 bytes is checked when it is used.
    pub fn from_text(text: &str) -> Result<EncryptionKey> {
        let text = text.trim();
        if text.is_empty() || text.len() > MAX_KEY_TEXT {
            return Err(Error::invalid(format!(
                "an encryption key is 32 bytes in base64 (44 characters); got {} characters",
                text.len()
            )));
        }
        Ok(EncryptionKey {
            text: Zeroizing::new(text.to_owned()),
        })
    }

    /// The key as the client sent it: only to pass it on, as `s2-encryption-key`, to the
    /// node that serves the stream.
    pub fn as_header_text(&self) -> &str {
        &self.text
    }

    /// The key itself, for a stream of `cipher`.
    fn bytes(&self, cipher: Cipher) -> Result<Zeroizing<[u8; KEY_LEN]>> {
        use base64::Engine as _;
        let mut decoded = Zeroizing::new([0u8; KEY_LEN + 3]);
        let len = base64::engine::general_purpose::STANDARD
            .decode_slice(self.text.as_bytes(), &mut decoded[..])
            .map_err(|_| {
                Error::invalid(format!(
                    "the encryption key for this {cipher} stream is not valid base64 \
                     (standard alphabet, padded); generate one with `openssl rand -base64 32`"
                ))
            })?;
        if len != KEY_LEN {
            return Err(Error::invalid(format!(
                "the encryption key for this {cipher} stream must be {KEY_LEN} bytes; it \
                 decodes to {len}"
            )));
        }
        let mut key = Zeroizing::new([0u8; KEY_LEN]);
        key.copy_from_slice(&decoded[..KEY_LEN]);
        Ok(key)
    }
}

/// How one stream's records are sealed and opened: its cipher, the key, its id.
pub(crate) struct StreamCrypto {
    cipher: Cipher,
    key: Zeroizing<[u8; KEY_LEN]>,
    stream_id: u64,
    /// AES-GCM's expanded key, made once per request or session rather than per record
    /// (wiped on drop: the `aes` crate's `zeroize` feature).
    /// Boxed: a reader of a plaintext stream carries no room for it.
    gcm: Option<Box<aes_gcm::Aes256Gcm>>,
}

impl StreamCrypto {
    /// What it takes to read or append on a stream: nothing for a plaintext stream
    /// (a key sent anyway is ignored), the key for an encrypted one.
    pub fn for_stream(
        cipher: Option<Cipher>,
        stream_id: u64,
        key: Option<&EncryptionKey>,
    ) -> Result<Option<StreamCrypto>> {
        let Some(cipher) = cipher else {
            return Ok(None);
        };
        let key = key.ok_or_else(|| {
            Error::invalid(format!(
                "this stream is encrypted ({cipher}): appends and reads need its key in the \
                 `s2-encryption-key` header of the S2 API (RESP and OTLP cannot carry one)"
            ))
        })?;
        let key = key.bytes(cipher)?;
        let gcm = (cipher == Cipher::Aes256Gcm).then(|| {
            Box::new(aes_gcm::Aes256Gcm::new(
                aes_gcm::Key::<aes_gcm::Aes256Gcm>::from_slice(&key[..]),
            ))
        });
        Ok(Some(StreamCrypto {
            cipher,
            key,
            stream_id,
            gcm,
        }))
    }

    fn aes_gcm(&self) -> &aes_gcm::Aes256Gcm {
        self.gcm.as_ref().expect("made for an AES-256-GCM stream")
    }

    fn associated_data(&self, prefix: &[u8]) -> [u8; AAD_LABEL.len() + 8 + PREFIX_LEN] {
        let mut aad = [0u8; AAD_LABEL.len() + 8 + PREFIX_LEN];
        aad[..AAD_LABEL.len()].copy_from_slice(AAD_LABEL);
        aad[AAD_LABEL.len()..AAD_LABEL.len() + 8].copy_from_slice(&self.stream_id.to_be_bytes());
        aad[AAD_LABEL.len() + 8..].copy_from_slice(prefix);
        aad
    }

    /// An append with every record sealed but its command records.
    pub fn seal_input(&self, input: &AppendInput) -> AppendInput {
        AppendInput {
            records: input
                .records
                .iter()
                .map(|record| {
                    let (headers, body) = self.seal(record.headers.clone(), record.body.clone());
                    AppendRecord {
                        timestamp: record.timestamp,
                        headers,
                        body,
                    }
                })
                .collect(),
            match_seq_num: input.match_seq_num,
            fencing_token: input.fencing_token.clone(),
        }
    }

    /// The stored form of a record's headers and body: sealed, unless it is a command
    /// record (which stays plaintext).
    pub fn seal(&self, headers: Vec<Header>, body: Bytes) -> (Vec<Header>, Bytes) {
        if is_command(&headers) {
            return (headers, body);
        }
        let metered = crate::record::metered_size(&headers, &body) as u32;
        let mut plaintext = Vec::with_capacity(
            4 + headers
                .iter()
                .map(|h| 8 + h.name.len() + h.value.len())
                .sum::<usize>()
                + body.len(),
        );
        plaintext.put_u32(headers.len() as u32);
        for header in &headers {
            plaintext.put_u32(header.name.len() as u32);
            plaintext.put_slice(&header.name);
            plaintext.put_u32(header.value.len() as u32);
            plaintext.put_slice(&header.value);
        }
        plaintext.put_slice(&body);

        let nonce_len = self.cipher.nonce_len();
        let mut sealed =
            BytesMut::with_capacity(PREFIX_LEN + nonce_len + plaintext.len() + TAG_LEN);
        sealed.put_u8(self.cipher.format());
        sealed.put_u32(metered);
        let mut nonce = [0u8; 32];
        rand::rng().fill_bytes(&mut nonce[..nonce_len]);
        sealed.put_slice(&nonce[..nonce_len]);
        let aad = self.associated_data(&sealed[..PREFIX_LEN]);
        let ciphertext = match self.cipher {
            Cipher::Aegis256 => {
                let nonce: &[u8; 32] = &nonce;
                let (ciphertext, tag) = aegis::aegis256::Aegis256::<TAG_LEN>::new(&self.key, nonce)
                    .encrypt(&plaintext, &aad);
                let mut out = ciphertext;
                out.extend_from_slice(&tag);
                out
            }
            Cipher::Aes256Gcm => {
                let gcm = self.aes_gcm();
                gcm.encrypt(
                    aes_gcm::Nonce::from_slice(&nonce[..nonce_len]),
                    Payload {
                        msg: &plaintext,
                        aad: &aad,
                    },
                )
                // Only fails for inputs longer than 64 GiB; a record is at most 1 MiB.
                .expect("AES-GCM seals any record")
            }
        };
        sealed.put_slice(&ciphertext);
        (Vec::new(), sealed.freeze())
    }

    /// A stored record as the client wrote it: opened with the key, or as stored for a
    /// command record. A wrong key (or a record that was tampered with) is
    /// `DecryptionFailed`.
    pub fn open(&self, record: SequencedRecord) -> Result<SequencedRecord> {
        if is_command(&record.headers) {
            return Ok(record);
        }
        let body = &record.body;
        let damaged = || {
            Error::storage(format!(
                "record {} of an encrypted stream is not a sealed record",
                record.seq_num
            ))
        };
        let nonce_len = self.cipher.nonce_len();
        if !record.headers.is_empty() || body.len() < PREFIX_LEN + nonce_len + TAG_LEN {
            return Err(damaged());
        }
        if body[0] != self.cipher.format() {
            return Err(damaged());
        }
        let metered = u32::from_be_bytes(body[1..5].try_into().expect("4 bytes")) as u64;
        let aad = self.associated_data(&body[..PREFIX_LEN]);
        let nonce = &body[PREFIX_LEN..PREFIX_LEN + nonce_len];
        let sealed = &body[PREFIX_LEN + nonce_len..];
        let plaintext = Bytes::from(match self.cipher {
            Cipher::Aegis256 => {
                let (ciphertext, tag) = sealed.split_at(sealed.len() - TAG_LEN);
                let nonce: &[u8; 32] = nonce.try_into().expect("32 bytes");
                let tag: &[u8; TAG_LEN] = tag.try_into().expect("16 bytes");
                aegis::aegis256::Aegis256::<TAG_LEN>::new(&self.key, nonce)
                    .decrypt(ciphertext, tag, &aad)
                    .map_err(|_| Error::DecryptionFailed)?
            }
            Cipher::Aes256Gcm => {
                let nonce = aes_gcm::Nonce::from_slice(nonce);
                self.aes_gcm()
                    .decrypt(
                        nonce,
                        Payload {
                            msg: sealed,
                            aad: &aad,
                        },
                    )
                    .map_err(|_| Error::DecryptionFailed)?
            }
        });
        let (headers, body) = decode_plaintext(plaintext).ok_or_else(damaged)?;
        if crate::record::metered_size(&headers, &body) != metered {
            return Err(damaged());
        }
        Ok(SequencedRecord {
            headers,
            body,
            ..record
        })
    }
}

/// The metered size of a stored record as its writer sent it: for a sealed record, the
/// size its prefix carries (authenticated when the record is opened).
pub(crate) fn stored_metered_size(cipher: Option<Cipher>, record: &SequencedRecord) -> u64 {
    match cipher {
        Some(_) if record.headers.is_empty() && record.body.len() >= PREFIX_LEN => {
            u32::from_be_bytes(record.body[1..5].try_into().expect("4 bytes")) as u64
        }
        _ => record.metered_size(),
    }
}

/// Whether a record is a command record (one header, with an empty name): stored as is.
fn is_command(headers: &[Header]) -> bool {
    headers.len() == 1 && headers[0].name.is_empty()
}

/// The headers and body of an opened record (slices of the plaintext, not copies);
/// `None` if the plaintext is not one.
fn decode_plaintext(mut rest: Bytes) -> Option<(Vec<Header>, Bytes)> {
    fn take(rest: &mut Bytes, len: usize) -> Option<Bytes> {
        (rest.len() >= len).then(|| rest.split_to(len))
    }
    fn take_u32(rest: &mut Bytes) -> Option<usize> {
        take(rest, 4).map(|b| u32::from_be_bytes(b[..].try_into().expect("4 bytes")) as usize)
    }
    let count = take_u32(&mut rest)?;
    // Each header takes at least 8 bytes: a count beyond that is not a record.
    if count > rest.len() / 8 {
        return None;
    }
    let mut headers = Vec::with_capacity(count);
    for _ in 0..count {
        let len = take_u32(&mut rest)?;
        let name = take(&mut rest, len)?;
        let len = take_u32(&mut rest)?;
        let value = take(&mut rest, len)?;
        headers.push(Header { name, value });
    }
    Some((headers, rest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    fn key_text(byte: u8) -> String {
        base64::engine::general_purpose::STANDARD.encode([byte; 32])
    }

    fn crypto(cipher: Cipher, stream_id: u64, byte: u8) -> StreamCrypto {
        let key = EncryptionKey::from_text(&key_text(byte)).unwrap();
        StreamCrypto::for_stream(Some(cipher), stream_id, Some(&key))
            .unwrap()
            .unwrap()
    }

    fn header(name: &str, value: &str) -> Header {
        Header {
            name: Bytes::copy_from_slice(name.as_bytes()),
            value: Bytes::copy_from_slice(value.as_bytes()),
        }
    }

    fn stored(seq_num: u64, (headers, body): (Vec<Header>, Bytes)) -> SequencedRecord {
        SequencedRecord {
            seq_num,
            timestamp: 7,
            headers,
            body,
        }
    }

    #[test]
    fn records_round_trip_and_hide_their_contents() {
        for cipher in [Cipher::Aegis256, Cipher::Aes256Gcm] {
            let c = crypto(cipher, 42, 1);
            let headers = vec![header("secret-name", "secret-value"), header("", "x")];
            // Two headers, one with an empty name: not a command record, so sealed.
            let body = Bytes::from_static(b"secret body");
            let sealed = c.seal(headers.clone(), body.clone());
            assert!(sealed.0.is_empty());
            let text = String::from_utf8_lossy(&sealed.1);
            assert!(!text.contains("secret"), "{cipher}: plaintext in {text}");
            let record = stored(3, sealed);
            assert_eq!(
                stored_metered_size(Some(cipher), &record),
                crate::record::metered_size(&headers, &body)
            );
            let opened = c.open(record).unwrap();
            assert_eq!((opened.headers, opened.body), (headers, body));
            // A fresh nonce each time: the same record seals differently.
            let a = c.seal(vec![], Bytes::from_static(b"same"));
            let b = c.seal(vec![], Bytes::from_static(b"same"));
            assert_ne!(a.1, b.1);
        }
    }

    #[test]
    fn a_wrong_key_another_stream_or_a_changed_byte_fail_to_open() {
        for cipher in [Cipher::Aegis256, Cipher::Aes256Gcm] {
            let sealed = stored(
                0,
                crypto(cipher, 1, 1).seal(vec![], Bytes::from_static(b"x")),
            );
            let wrong_key = crypto(cipher, 1, 2).open(sealed.clone()).unwrap_err();
            assert_eq!(wrong_key.code(), "decryption_failed");
            let other_stream = crypto(cipher, 2, 1).open(sealed.clone()).unwrap_err();
            assert_eq!(other_stream.code(), "decryption_failed");
            for at in [1, 5, sealed.body.len() - 1] {
                let mut body = sealed.body.to_vec();
                body[at] ^= 1;
                let tampered = SequencedRecord {
                    body: body.into(),
                    ..sealed.clone()
                };
                assert!(crypto(cipher, 1, 1).open(tampered).is_err(), "byte {at}");
            }
        }
    }

    #[test]
    fn command_records_stay_plaintext() {
        let c = crypto(Cipher::Aegis256, 1, 1);
        let fence = (vec![header("", "fence")], Bytes::from_static(b"token"));
        assert_eq!(c.seal(fence.0.clone(), fence.1.clone()), fence);
        let opened = c.open(stored(0, fence.clone())).unwrap();
        assert_eq!((opened.headers, opened.body), fence);
    }

    #[test]
    fn keys_are_checked_only_for_encrypted_streams() {
        let junk = EncryptionKey::from_text("not base64!").unwrap();
        assert!(StreamCrypto::for_stream(None, 1, Some(&junk))
            .unwrap()
            .is_none());
        let err = StreamCrypto::for_stream(Some(Cipher::Aegis256), 1, Some(&junk)).err();
        assert!(err.unwrap().to_string().contains("not valid base64"));
        let short =
            EncryptionKey::from_text(&base64::engine::general_purpose::STANDARD.encode([0u8; 16]))
                .unwrap();
        let err = StreamCrypto::for_stream(Some(Cipher::Aes256Gcm), 1, Some(&short)).err();
        assert!(err.unwrap().to_string().contains("must be 32 bytes"));
        let missing = StreamCrypto::for_stream(Some(Cipher::Aes256Gcm), 1, None).err();
        assert_eq!(missing.unwrap().code(), "invalid");
        assert!(EncryptionKey::from_text("  ").is_err());
        assert!(EncryptionKey::from_text(&"A".repeat(45)).is_err());
        assert_eq!(
            format!("{:?}", EncryptionKey::from_text(&key_text(9)).unwrap()),
            "EncryptionKey(<redacted>)"
        );
    }
}
