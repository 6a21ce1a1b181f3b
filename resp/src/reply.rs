//! Replies, encoded for the connection's protocol: RESP2 directly, RESP3 with the
//! `redis-protocol` crate's encoder.

use bytes::{Bytes, BytesMut};
use redis_protocol::resp3::types::BytesFrame as Resp3;

#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Simple(&'static str),
    Error(String),
    Integer(i64),
    Bulk(Bytes),
    /// Null bulk string in RESP2, null in RESP3.
    Null,
    /// Null array in RESP2 (what XREAD and friends return on nothing), null in RESP3.
    NullArray,
    Array(Vec<Reply>),
    /// A map in RESP3; a flat array of keys and values in RESP2.
    Map(Vec<(Reply, Reply)>),
    /// A whole reply encoded already, in the client's protocol, by the node that ran
    /// the command (see `crate::forwarded`). Only ever a command's whole reply.
    Encoded(Bytes),
}

impl Reply {
    pub fn ok() -> Reply {
        Reply::Simple("OK")
    }

    /// How operator metrics count the reply: `error` for an error reply.
    pub fn outcome(&self) -> &'static str {
        match self {
            Reply::Error(_) => "error",
            Reply::Encoded(encoded) if encoded.starts_with(b"-") => "error",
            _ => "ok",
        }
    }

    pub fn error(message: impl Into<String>) -> Reply {
        Reply::Error(message.into())
    }

    pub fn bulk(text: impl Into<Bytes>) -> Reply {
        Reply::Bulk(text.into())
    }

    /// RESP2, written directly: it is small, and it has the null array (`*-1`) that
    /// XREAD and friends reply with, which the crate's RESP2 frames cannot express.
    fn encode_resp2(&self, out: &mut BytesMut) {
        fn line(out: &mut BytesMut, kind: u8, text: &[u8]) {
            out.extend_from_slice(&[kind]);
            out.extend_from_slice(text);
            out.extend_from_slice(b"\r\n");
        }
        match self {
            Reply::Simple(s) => line(out, b'+', s.as_bytes()),
            Reply::Error(e) => line(out, b'-', one_line(e).as_bytes()),
            Reply::Integer(i) => line(out, b':', i.to_string().as_bytes()),
            Reply::Bulk(b) => {
                line(out, b'$', b.len().to_string().as_bytes());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Null => line(out, b'$', b"-1"),
            Reply::NullArray => line(out, b'*', b"-1"),
            Reply::Array(items) => {
                line(out, b'*', items.len().to_string().as_bytes());
                for item in items {
                    item.encode_resp2(out);
                }
            }
            Reply::Map(pairs) => {
                line(out, b'*', (pairs.len() * 2).to_string().as_bytes());
                for (key, value) in pairs {
                    key.encode_resp2(out);
                    value.encode_resp2(out);
                }
            }
            Reply::Encoded(encoded) => out.extend_from_slice(encoded),
        }
    }

    fn resp3(&self) -> Resp3 {
        match self {
            Reply::Simple(s) => Resp3::SimpleString {
                data: Bytes::from_static(s.as_bytes()),
                attributes: None,
            },
            Reply::Error(e) => Resp3::SimpleError {
                data: one_line(e).as_ref().into(),
                attributes: None,
            },
            Reply::Integer(i) => Resp3::Number {
                data: *i,
                attributes: None,
            },
            Reply::Bulk(b) => Resp3::BlobString {
                data: b.clone(),
                attributes: None,
            },
            Reply::Null | Reply::NullArray => Resp3::Null,
            Reply::Array(items) => Resp3::Array {
                data: items.iter().map(Reply::resp3).collect(),
                attributes: None,
            },
            Reply::Map(pairs) => Resp3::Map {
                data: pairs.iter().map(|(k, v)| (k.resp3(), v.resp3())).collect(),
                attributes: None,
            },
            // `encode` writes a whole encoded reply itself; none is ever nested.
            Reply::Encoded(_) => Resp3::SimpleError {
                data: "ERR a forwarded reply cannot be nested".into(),
                attributes: None,
            },
        }
    }

    /// Appends the encoded reply to `out`.
    pub fn encode(&self, resp3: bool, out: &mut BytesMut) {
        if let Reply::Encoded(encoded) = self {
            out.extend_from_slice(encoded);
        } else if resp3 {
            redis_protocol::resp3::encode::complete::extend_encode(out, &self.resp3(), false)
                .expect("replies are always encodable");
        } else {
            self.encode_resp2(out);
        }
    }
}

/// An error message on one line: it may quote what a client sent (a key name), and a
/// line break there would end the reply early, as Redis avoids too.
fn one_line(message: &str) -> std::borrow::Cow<'_, str> {
    match message.contains(['\r', '\n']) {
        true => message.replace(['\r', '\n'], " ").into(),
        false => message.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(reply: &Reply, resp3: bool) -> String {
        let mut out = BytesMut::new();
        reply.encode(resp3, &mut out);
        String::from_utf8(out.to_vec()).unwrap()
    }

    #[test]
    fn replies_encode_per_protocol() {
        assert_eq!(encoded(&Reply::ok(), false), "+OK\r\n");
        assert_eq!(encoded(&Reply::Integer(7), true), ":7\r\n");
        assert_eq!(encoded(&Reply::bulk("hi"), false), "$2\r\nhi\r\n");
        assert_eq!(encoded(&Reply::Null, false), "$-1\r\n");
        assert_eq!(encoded(&Reply::Null, true), "_\r\n");
        assert_eq!(encoded(&Reply::NullArray, false), "*-1\r\n");
        assert_eq!(encoded(&Reply::NullArray, true), "_\r\n");
        let nested = Reply::Array(vec![Reply::bulk(""), Reply::NullArray, Reply::Integer(-3)]);
        assert_eq!(encoded(&nested, false), "*3\r\n$0\r\n\r\n*-1\r\n:-3\r\n");
        let quoted = Reply::error("NOGROUP No such key 'a\r\n+OK'");
        assert_eq!(encoded(&quoted, false), "-NOGROUP No such key 'a  +OK'\r\n");
        assert_eq!(encoded(&quoted, true), "-NOGROUP No such key 'a  +OK'\r\n");
        assert_eq!(encoded(&Reply::error("ERR nope"), false), "-ERR nope\r\n");
        let map = Reply::Map(vec![(Reply::bulk("k"), Reply::Integer(1))]);
        assert_eq!(encoded(&map, false), "*2\r\n$1\r\nk\r\n:1\r\n");
        assert_eq!(encoded(&map, true), "%1\r\n$1\r\nk\r\n:1\r\n");
    }
}
