//! The connection commands: `PING`, `ECHO`, `QUIT`, `AUTH`, `HELLO`, `CLIENT SETNAME |
//! GETNAME | SETINFO`, `SELECT`, `COMMAND` and `INFO`.

use bytes::Bytes;

use super::parse::{arity, syntax, upper};
use super::Command;
use crate::reply::Reply;
use crate::session::Session;

/// The version of the S2 Redis Streams integration this server implements.
const RESP_VERSION: &str = "1";

pub(crate) fn parse_auth(args: &[Bytes]) -> Result<Command, String> {
    match args.len() {
        2 => Ok(Command::Auth {
            username: None,
            password: args[1].clone(),
        }),
        3 => Ok(Command::Auth {
            username: Some(args[1].clone()),
            password: args[2].clone(),
        }),
        _ => Err(arity("AUTH")),
    }
}

pub(crate) fn parse_hello(args: &[Bytes]) -> Result<Command, String> {
    let n = args.len();
    let protocol = match args.get(1) {
        None => None,
        Some(v) => match v.as_ref() {
            b"2" => Some(2),
            b"3" => Some(3),
            _ => return Err("NOPROTO unsupported protocol version".into()),
        },
    };
    let (mut auth, mut setname) = (None, None);
    let mut i = 2;
    while i < n {
        match upper(&args[i]).as_str() {
            "AUTH" if i + 2 < n => {
                auth = Some((args[i + 1].clone(), args[i + 2].clone()));
                i += 3;
            }
            "SETNAME" if i + 1 < n => {
                setname = Some(args[i + 1].clone());
                i += 2;
            }
            _ => return Err(syntax()),
        }
    }
    Ok(Command::Hello {
        protocol,
        auth,
        setname,
    })
}

pub(crate) fn parse_client(args: &[Bytes]) -> Result<Command, String> {
    let n = args.len();
    match upper(&args[1]).as_str() {
        "SETNAME" if n == 3 => Ok(Command::ClientSetName(args[2].clone())),
        "GETNAME" if n == 2 => Ok(Command::ClientGetName),
        "SETINFO" if n == 4 => Ok(Command::ClientSetInfo),
        sub => Err(format!(
            "ERR unknown or unsupported CLIENT subcommand '{sub}'"
        )),
    }
}

pub(crate) async fn auth(
    session: &mut Session,
    username: Option<&Bytes>,
    password: &Bytes,
) -> Reply {
    match session.authenticate(username, password).await {
        Ok(()) => Reply::ok(),
        Err(reply) => reply,
    }
}

pub(crate) async fn hello(
    session: &mut Session,
    protocol: Option<u8>,
    auth: Option<(Bytes, Bytes)>,
    setname: Option<Bytes>,
) -> Reply {
    if let Some((username, password)) = &auth {
        if let Err(reply) = session.authenticate(Some(username), password).await {
            return reply;
        }
    }
    if !session.authenticated() {
        return Reply::error("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time");
    }
    if let Some(protocol) = protocol {
        session.resp3 = protocol == 3;
    }
    if let Some(name) = setname {
        session.name = Some(name);
    }
    Reply::Map(vec![
        (Reply::bulk("server"), Reply::bulk("s2-resp")),
        (Reply::bulk("version"), Reply::bulk("6.2.0")),
        (
            Reply::bulk("proto"),
            Reply::Integer(if session.resp3 { 3 } else { 2 }),
        ),
        (Reply::bulk("id"), Reply::Integer(session.client.id as i64)),
        (Reply::bulk("mode"), Reply::bulk("standalone")),
        (Reply::bulk("role"), Reply::bulk("master")),
        (Reply::bulk("modules"), Reply::Array(vec![])),
        (Reply::bulk("s2_resp_version"), Reply::bulk(RESP_VERSION)),
    ])
}

pub(crate) fn client_setname(session: &mut Session, name: Bytes) -> Reply {
    if name.len() > 1024 || name.iter().any(|b| !b.is_ascii_graphic()) {
        Reply::error("ERR Client names cannot contain spaces, newlines or special characters.")
    } else {
        session.name = (!name.is_empty()).then_some(name);
        Reply::ok()
    }
}

pub(crate) fn info(sections: &[Bytes]) -> Reply {
    let wants = |name: &str| {
        sections.is_empty()
            || sections.iter().any(|s| {
                let s = String::from_utf8_lossy(s).to_ascii_lowercase();
                s == name || s == "all" || s == "default" || s == "everything"
            })
    };
    let mut text = String::new();
    if wants("server") {
        text.push_str(&format!(
            "# Server\r\nredis_version:6.2.0\r\nredis_mode:standalone\r\ns2_resp_version:{RESP_VERSION}\r\n"
        ));
    }
    if wants("persistence") {
        if !text.is_empty() {
            text.push_str("\r\n");
        }
        text.push_str("# Persistence\r\nloading:0\r\n");
    }
    Reply::Bulk(Bytes::from(text))
}
