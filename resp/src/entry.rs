//! How Redis stream entries map onto records, as the Redis Streams integration page
//! defines it: a first header `s2-resp.v: 1`, then one header per field/value pair, and
//! an empty body. Entry IDs are `<timestamp>-<seq_num>`.

use bytes::Bytes;
use streamgate_core::record::{Header, SequencedRecord};

pub const MARKER_NAME: &[u8] = b"s2-resp.v";
pub const MARKER_VALUE: &[u8] = b"1";

/// A stream entry ID (or a bound given as one): the engine's, which consumer groups
/// keep too.
pub use streamgate_core::groups::EntryId;

/// An ID argument: `ts-seq`, or `ts` alone (a timestamp-only ID).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdArg {
    Full(EntryId),
    TimestampOnly(u64),
}

impl IdArg {
    /// The ID it names: a timestamp alone means sequence number 0.
    pub fn id(self) -> EntryId {
        match self {
            IdArg::Full(id) => id,
            IdArg::TimestampOnly(ts) => EntryId::new(ts, 0),
        }
    }

    pub fn parse(arg: &[u8]) -> Option<IdArg> {
        let text = std::str::from_utf8(arg).ok()?;
        match text.split_once('-') {
            Some((ts, seq)) => Some(IdArg::Full(EntryId {
                timestamp: ts.parse().ok()?,
                seq_num: seq.parse().ok()?,
            })),
            None => Some(IdArg::TimestampOnly(text.parse().ok()?)),
        }
    }
}

/// The headers of a record that carries `fields` (pairs of field and value).
pub fn encode_fields(fields: &[(Bytes, Bytes)]) -> Vec<Header> {
    let mut headers = Vec::with_capacity(fields.len() + 1);
    headers.push(Header {
        name: Bytes::from_static(MARKER_NAME),
        value: Bytes::from_static(MARKER_VALUE),
    });
    for (field, value) in fields {
        // Header names cannot be empty, so an empty field name, or one that starts with
        // NUL, gets one extra leading NUL, removed again on read.
        let name = if field.is_empty() || field[0] == 0 {
            let mut escaped = Vec::with_capacity(field.len() + 1);
            escaped.push(0);
            escaped.extend_from_slice(field);
            Bytes::from(escaped)
        } else {
            field.clone()
        };
        headers.push(Header {
            name,
            value: value.clone(),
        });
    }
    headers
}

/// The fields of a record: `Ok(None)` for a record without the marker (native records
/// and command records read as entries with no fields), `Err` for a marked record with
/// a body, which the format does not allow.
pub fn decode_fields(record: &SequencedRecord) -> Result<Vec<(Bytes, Bytes)>, String> {
    let marked = record
        .headers
        .first()
        .is_some_and(|h| h.name.as_ref() == MARKER_NAME && h.value.as_ref() == MARKER_VALUE);
    if !marked {
        return Ok(Vec::new());
    }
    if !record.body.is_empty() {
        return Err(format!(
            "ERR entry {} has the Redis marker and a body; it cannot be read as a Redis entry",
            EntryId::of(record).to_bytes().escape_ascii()
        ));
    }
    Ok(record.headers[1..]
        .iter()
        .map(|h| {
            let name = if h.name.first() == Some(&0) {
                h.name.slice(1..)
            } else {
                h.name.clone()
            };
            (name, h.value.clone())
        })
        .collect())
}

/// Metered size of an entry with these fields: 8 + 2 per header + header bytes, with
/// the marker header included (the page's `20 + 2n + field and value bytes`).
pub fn metered_size(fields: &[(Bytes, Bytes)]) -> u64 {
    let escaped = fields
        .iter()
        .filter(|(f, _)| f.is_empty() || f[0] == 0)
        .count();
    let bytes: usize = fields.iter().map(|(f, v)| f.len() + v.len()).sum();
    (20 + 2 * fields.len() + bytes + escaped) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(headers: Vec<Header>, body: &'static [u8]) -> SequencedRecord {
        SequencedRecord {
            seq_num: 42,
            timestamp: 1713812735000,
            headers,
            body: Bytes::from_static(body),
        }
    }

    #[test]
    fn fields_round_trip_including_empty_and_nul_names() {
        let fields = vec![
            (Bytes::from_static(b"sensor"), Bytes::from_static(b"t1")),
            (Bytes::new(), Bytes::from_static(b"empty name")),
            (Bytes::from_static(b"\0x"), Bytes::from_static(b"nul name")),
            (Bytes::from_static(b"sensor"), Bytes::from_static(b"dup")),
        ];
        let headers = encode_fields(&fields);
        assert_eq!(headers[0].name.as_ref(), b"s2-resp.v");
        assert_eq!(headers[2].name.as_ref(), b"\0");
        assert_eq!(headers[3].name.as_ref(), b"\0\0x");
        let back = decode_fields(&record(headers.clone(), b"")).unwrap();
        assert_eq!(back, fields);
        let metered = streamgate_core::record::metered_size(&headers, b"");
        assert_eq!(metered, metered_size(&fields));
    }

    #[test]
    fn unmarked_records_have_no_fields_and_marked_bodies_are_errors() {
        let native = record(
            vec![Header {
                name: Bytes::from_static(b"k"),
                value: Bytes::new(),
            }],
            b"body",
        );
        assert!(decode_fields(&native).unwrap().is_empty());
        let late_marker = record(
            vec![
                Header {
                    name: Bytes::from_static(b"a"),
                    value: Bytes::new(),
                },
                Header {
                    name: Bytes::from_static(MARKER_NAME),
                    value: Bytes::from_static(MARKER_VALUE),
                },
            ],
            b"",
        );
        assert!(decode_fields(&late_marker).unwrap().is_empty());
        let marked_with_body = record(encode_fields(&[]), b"x");
        assert!(decode_fields(&marked_with_body).is_err());
    }

    #[test]
    fn ids_parse_and_print() {
        assert_eq!(
            IdArg::parse(b"1713812735000-42"),
            Some(IdArg::Full(EntryId {
                timestamp: 1713812735000,
                seq_num: 42
            }))
        );
        assert_eq!(IdArg::parse(b"17"), Some(IdArg::TimestampOnly(17)));
        assert_eq!(IdArg::parse(b"x-1"), None);
        assert_eq!(IdArg::parse(b"1-"), None);
        assert_eq!(
            EntryId {
                timestamp: 5,
                seq_num: 6
            }
            .to_bytes(),
            Bytes::from_static(b"5-6")
        );
    }
}
