//! A small RESP2 client for the black-box tests, written from the protocol's description
//! so the tests check the server against the wire format, not against its own parser:
//! commands out as arrays of bulk strings, replies parsed whole. Pipelining is sending
//! several commands before reading their replies.

use std::io;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// A reply, as RESP2 has them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Simple(String),
    Error(String),
    Integer(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// A bulk string's text (panics on anything else: the test expected one).
    pub fn text(&self) -> String {
        match self {
            Reply::Bulk(Some(bytes)) => String::from_utf8(bytes.clone()).expect("UTF-8"),
            other => panic!("expected a bulk string, got {other:?}"),
        }
    }
}

/// A command as RESP sends it.
pub fn command(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// One connection.
pub struct Connection {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
}

impl Connection {
    /// Connects to `127.0.0.1:port` and, when `basin` is given, logs in with the root
    /// token (`AUTH <basin> <token>`). A login the server answered with anything but
    /// `+OK` is an error of kind `PermissionDenied`, so that a caller can tell a server
    /// that refused it from one it could not reach or lost.
    pub async fn open(port: u16, basin: Option<&str>) -> io::Result<Connection> {
        let (reader, writer) = TcpStream::connect(("127.0.0.1", port)).await?.into_split();
        let mut connection = Connection {
            reader: BufReader::new(reader),
            writer,
        };
        if let Some(basin) = basin {
            connection.send(&["AUTH", basin, crate::ROOT_TOKEN]).await?;
            match connection.reply().await? {
                Reply::Simple(ok) if ok == "OK" => {}
                other => {
                    return Err(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!("AUTH answered {other:?}"),
                    ));
                }
            }
        }
        Ok(connection)
    }

    /// Sends one command (its reply is read with `reply`).
    pub async fn send(&mut self, args: &[&str]) -> io::Result<()> {
        self.writer.write_all(&command(args)).await
    }

    /// Sends several commands in one write.
    pub async fn send_pipelined(&mut self, commands: &[Vec<String>]) -> io::Result<()> {
        let mut out = Vec::new();
        for args in commands {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            out.extend(command(&args));
        }
        self.writer.write_all(&out).await
    }

    /// Sends a command and reads its reply.
    pub async fn call(&mut self, args: &[&str]) -> io::Result<Reply> {
        self.send(args).await?;
        self.reply().await
    }

    /// The next reply.
    pub async fn reply(&mut self) -> io::Result<Reply> {
        // Iterative over arrays (a stack of partly filled ones), so depth costs no stack.
        let mut open: Vec<(usize, Vec<Reply>)> = Vec::new();
        loop {
            let mut reply = match self.element().await? {
                Element::Whole(reply) => reply,
                Element::ArrayOf(0) => Reply::Array(Some(Vec::new())),
                Element::ArrayOf(len) => {
                    open.push((len, Vec::with_capacity(len.min(1024))));
                    continue;
                }
            };
            loop {
                let Some((len, items)) = open.last_mut() else {
                    return Ok(reply);
                };
                items.push(reply);
                if items.len() < *len {
                    break;
                }
                let (_, items) = open.pop().unwrap();
                reply = Reply::Array(Some(items));
            }
        }
    }

    async fn line(&mut self) -> io::Result<String> {
        let mut line = String::new();
        if self.reader.read_line(&mut line).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        line.strip_suffix("\r\n")
            .map(str::to_owned)
            .ok_or_else(|| io::Error::other(format!("a reply line without CRLF: {line:?}")))
    }

    async fn element(&mut self) -> io::Result<Element> {
        let line = self.line().await?;
        let (kind, rest) = line.split_at(1.min(line.len()));
        let number = || -> io::Result<i64> {
            rest.parse()
                .map_err(|_| io::Error::other(format!("not a number in {line:?}")))
        };
        Ok(match kind {
            "+" => Element::Whole(Reply::Simple(rest.to_owned())),
            "-" => Element::Whole(Reply::Error(rest.to_owned())),
            ":" => Element::Whole(Reply::Integer(number()?)),
            "$" if number()? < 0 => Element::Whole(Reply::Bulk(None)),
            "$" => {
                let mut bytes = vec![0; number()? as usize + 2];
                self.reader.read_exact(&mut bytes).await?;
                bytes.truncate(bytes.len() - 2);
                Element::Whole(Reply::Bulk(Some(bytes)))
            }
            "*" if number()? < 0 => Element::Whole(Reply::Array(None)),
            "*" => Element::ArrayOf(number()? as usize),
            _ => return Err(io::Error::other(format!("not a RESP2 reply: {line:?}"))),
        })
    }
}

enum Element {
    Whole(Reply),
    ArrayOf(usize),
}
