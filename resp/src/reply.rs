//! Replies, encoded for the connection's protocol (RESP2 or RESP3) with the
//! `redis-protocol` crate's encoders.

use bytes::{Bytes, BytesMut};
use redis_protocol::resp2::types::BytesFrame as Resp2;
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
}

impl Reply {
    pub fn ok() -> Reply {
        Reply::Simple("OK")
    }

    pub fn error(message: impl Into<String>) -> Reply {
        Reply::Error(message.into())
    }

    pub fn bulk(text: impl Into<Bytes>) -> Reply {
        Reply::Bulk(text.into())
    }

    fn resp2(&self) -> Resp2 {
        match self {
            Reply::Simple(s) => Resp2::SimpleString(Bytes::from_static(s.as_bytes())),
            Reply::Error(e) => Resp2::Error(e.as_str().into()),
            Reply::Integer(i) => Resp2::Integer(*i),
            Reply::Bulk(b) => Resp2::BulkString(b.clone()),
            Reply::Null => Resp2::Null,
            // RESP2's null array is `*-1`, which the crate has no frame for; clients
            // treat the null bulk string `$-1` the same way for these replies.
            Reply::NullArray => Resp2::Null,
            Reply::Array(items) => Resp2::Array(items.iter().map(Reply::resp2).collect()),
            Reply::Map(pairs) => Resp2::Array(
                pairs
                    .iter()
                    .flat_map(|(k, v)| [k.resp2(), v.resp2()])
                    .collect(),
            ),
        }
    }

    fn resp3(&self) -> Resp3 {
        match self {
            Reply::Simple(s) => Resp3::SimpleString {
                data: Bytes::from_static(s.as_bytes()),
                attributes: None,
            },
            Reply::Error(e) => Resp3::SimpleError {
                data: e.as_str().into(),
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
        }
    }

    /// Appends the encoded reply to `out`.
    pub fn encode(&self, resp3: bool, out: &mut BytesMut) {
        let result = if resp3 {
            redis_protocol::resp3::encode::complete::extend_encode(out, &self.resp3(), false)
        } else {
            redis_protocol::resp2::encode::extend_encode(out, &self.resp2(), false)
        };
        result.expect("replies are always encodable");
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
        assert_eq!(encoded(&Reply::error("ERR nope"), false), "-ERR nope\r\n");
        let map = Reply::Map(vec![(Reply::bulk("k"), Reply::Integer(1))]);
        assert_eq!(encoded(&map, false), "*2\r\n$1\r\nk\r\n:1\r\n");
        assert_eq!(encoded(&map, true), "%1\r\n$1\r\nk\r\n:1\r\n");
    }
}
