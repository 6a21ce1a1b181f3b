//! Just enough of the protobuf wire format to walk a message's fields without decoding
//! it: OTLP cuts resource groups, scopes and items out of an export request as the exact
//! bytes the client sent (unknown fields too), and the REST API counts what an
//! `AppendInput` holds before it lets a decoder allocate for it. Fields are produced one
//! at a time, so walking a message costs no memory whatever it holds.

use bytes::{BufMut, Bytes};

/// One field of a message, as it appears on the wire.
pub struct Field {
    pub number: u32,
    /// Whether it is length-delimited (a message, string or bytes).
    pub is_len: bool,
    /// The whole field: tag, length (if any) and payload.
    pub raw: Bytes,
    /// For length-delimited fields, the payload; otherwise empty.
    pub payload: Bytes,
}

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

/// The fields of a message, in order; an item is an error (and the last) on anything
/// that is not well-formed protobuf (truncation, bad varints, the deprecated group wire
/// types).
pub fn fields(message: &Bytes) -> Fields<'_> {
    Fields { message, at: 0 }
}

pub struct Fields<'a> {
    message: &'a Bytes,
    at: usize,
}

impl Iterator for Fields<'_> {
    type Item = Result<Field, String>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.at >= self.message.len() {
            return None;
        }
        let field = self.read();
        if field.is_err() {
            self.at = self.message.len(); // nothing after an error can be trusted
        }
        Some(field)
    }
}

impl Fields<'_> {
    fn read(&mut self) -> Result<Field, String> {
        let message = self.message;
        let at = &mut self.at;
        let start = *at;
        let tag = read_varint(message, at)?;
        let number = u32::try_from(tag >> 3)
            .ok()
            .filter(|n| *n > 0)
            .ok_or("invalid field number")?;
        let wire_type = (tag & 7) as u8;
        let (payload_start, end) = match wire_type {
            VARINT => {
                read_varint(message, at)?;
                (*at, *at)
            }
            FIXED64 => (*at + 8, *at + 8),
            FIXED32 => (*at + 4, *at + 4),
            LEN => {
                let len = usize::try_from(read_varint(message, at)?)
                    .map_err(|_| "length out of range")?;
                (*at, at.checked_add(len).ok_or("length out of range")?)
            }
            other => return Err(format!("unsupported wire type {other}")),
        };
        if end > message.len() {
            return Err("message is truncated".into());
        }
        let payload = if payload_start < end {
            message.slice(payload_start..end)
        } else {
            Bytes::new()
        };
        *at = end;
        Ok(Field {
            number,
            is_len: wire_type == LEN,
            raw: message.slice(start..end),
            payload,
        })
    }
}

fn read_varint(buf: &[u8], at: &mut usize) -> Result<u64, String> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *buf.get(*at).ok_or("message is truncated")?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("varint is too long".into())
}

/// Appends a length-delimited field `number` holding `payload`.
pub fn put_len_field(out: &mut Vec<u8>, number: u32, payload: &[u8]) {
    put_varint(out, u64::from(number) << 3 | u64::from(LEN));
    put_varint(out, payload.len() as u64);
    out.put_slice(payload);
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_through_put_len_field() {
        let mut message = Vec::new();
        put_len_field(&mut message, 1, b"first");
        message.extend_from_slice(&[0x10, 0x96, 0x01]); // field 2, varint 150
        put_len_field(&mut message, 1, &vec![7u8; 300]);
        let message = Bytes::from(message);
        let fields: Vec<Field> = fields(&message).collect::<Result<_, _>>().unwrap();
        assert_eq!(
            fields.iter().map(|f| f.number).collect::<Vec<_>>(),
            [1, 2, 1]
        );
        assert_eq!(&fields[0].payload[..], b"first");
        assert_eq!(&fields[1].raw[..], [0x10, 0x96, 0x01]);
        assert_eq!(fields[2].payload.len(), 300);
        let joined: Vec<u8> = fields.iter().flat_map(|f| f.raw.to_vec()).collect();
        assert_eq!(joined, message);
    }

    #[test]
    fn malformed_messages_are_errors() {
        for bad in [
            &[0x0a, 0x05, b'a'][..], // length past the end
            &[0x08][..],             // varint missing
            &[0x0b][..],             // group start wire type
            &[0x00, 0x01][..],       // field number 0
            &[
                0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ][..],
        ] {
            let bad = Bytes::copy_from_slice(bad);
            let walked: Result<Vec<Field>, String> = fields(&bad).collect();
            assert!(walked.is_err(), "{bad:?}");
        }
    }
}
