//! Parsing commands: exactly the forms the Redis Streams integration page supports.
//! Anything else is an error reply; nothing here can fail the connection.

use bytes::Bytes;

use crate::entry::IdArg;

/// Most arguments one command may carry.
pub const MAX_ARGS: usize = 16_384;
/// Most entries one XRANGE or XREAD returns.
pub const MAX_READ_ENTRIES: u64 = 10_000;
/// Most streams one XREAD may name.
pub const MAX_XREAD_STREAMS: usize = 100;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trim {
    /// `MAXLEN ~ n`: keep about the last n entries.
    MaxLen(u64),
    /// `MINID ~ id`: drop entries before id.
    MinId(IdArg),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    Min,
    Max,
    Inclusive(IdArg),
    Exclusive(IdArg),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFrom {
    /// `$`: entries added after the command arrives.
    Tail,
    /// Entries after this ID.
    After(IdArg),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    Ping(Option<Bytes>),
    Echo(Bytes),
    Quit,
    Auth {
        username: Option<Bytes>,
        password: Bytes,
    },
    Hello {
        protocol: Option<u8>,
        auth: Option<(Bytes, Bytes)>,
        setname: Option<Bytes>,
    },
    ClientSetName(Bytes),
    ClientGetName,
    ClientSetInfo,
    Select(Bytes),
    CommandInfo,
    Info(Vec<Bytes>),
    Exists(Vec<Bytes>),
    Type(Bytes),
    XLen(Bytes),
    XAdd {
        key: Bytes,
        nomkstream: bool,
        trim: Option<Trim>,
        fields: Vec<(Bytes, Bytes)>,
    },
    XTrim {
        key: Bytes,
        trim: Trim,
    },
    XRange {
        key: Bytes,
        start: Bound,
        end: Bound,
        count: Option<u64>,
    },
    XRead {
        count: Option<u64>,
        block: Option<u64>,
        keys: Vec<Bytes>,
        from: Vec<ReadFrom>,
    },
}

impl Command {
    /// Whether the command needs an authenticated connection.
    pub fn needs_auth(&self) -> bool {
        !matches!(
            self,
            Command::Auth { .. } | Command::Hello { .. } | Command::Quit
        )
    }
}

fn upper(arg: &[u8]) -> String {
    String::from_utf8_lossy(arg).to_ascii_uppercase()
}

fn arity(name: &str) -> String {
    format!(
        "ERR wrong number of arguments for '{}' command",
        name.to_ascii_lowercase()
    )
}

fn syntax() -> String {
    "ERR syntax error".into()
}

fn integer(arg: &[u8]) -> Result<u64, String> {
    std::str::from_utf8(arg)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| "ERR value is not an integer or out of range".to_string())
}

fn id(arg: &[u8]) -> Result<IdArg, String> {
    IdArg::parse(arg)
        .ok_or_else(|| "ERR Invalid stream ID specified as stream command argument".to_string())
}

fn bound(arg: &[u8]) -> Result<Bound, String> {
    match arg {
        b"-" => Ok(Bound::Min),
        b"+" => Ok(Bound::Max),
        [b'(', rest @ ..] => Ok(Bound::Exclusive(id(rest)?)),
        other => Ok(Bound::Inclusive(id(other)?)),
    }
}

/// Parses `MAXLEN|MINID [~|=] threshold [LIMIT n]` at `args[i..]`; returns the trim and
/// how many arguments it took.
fn trim(args: &[Bytes], i: usize) -> Result<(Trim, usize), String> {
    let kind = upper(&args[i]);
    let mut j = i + 1;
    let approximate = match args.get(j).map(|a| a.as_ref()) {
        Some(b"~") => {
            j += 1;
            true
        }
        Some(b"=") => {
            j += 1;
            false
        }
        _ => false,
    };
    let threshold = args.get(j).ok_or_else(syntax)?;
    j += 1;
    if args.get(j).is_some_and(|a| upper(a) == "LIMIT") {
        return Err("ERR LIMIT is not supported; only approximate trimming (~) is".into());
    }
    if !approximate {
        return Err("ERR only approximate trimming is supported: use MAXLEN ~ or MINID ~".into());
    }
    let trim = match kind.as_str() {
        "MAXLEN" => Trim::MaxLen(integer(threshold)?),
        "MINID" => Trim::MinId(id(threshold)?),
        _ => return Err(syntax()),
    };
    Ok((trim, j - i))
}

/// Parses one command from its arguments (the first is the command name).
pub fn parse(args: Vec<Bytes>) -> Result<Command, String> {
    let Some(name) = args.first() else {
        return Err("ERR empty command".into());
    };
    if args.len() > MAX_ARGS {
        return Err(format!(
            "ERR a command may have at most {MAX_ARGS} arguments"
        ));
    }
    let name = upper(name);
    let n = args.len();
    Ok(match name.as_str() {
        "PING" => match n {
            1 => Command::Ping(None),
            2 => Command::Ping(Some(args[1].clone())),
            _ => return Err(arity(&name)),
        },
        "ECHO" if n == 2 => Command::Echo(args[1].clone()),
        "QUIT" => Command::Quit,
        "AUTH" => match n {
            2 => Command::Auth {
                username: None,
                password: args[1].clone(),
            },
            3 => Command::Auth {
                username: Some(args[1].clone()),
                password: args[2].clone(),
            },
            _ => return Err(arity(&name)),
        },
        "HELLO" => {
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
            Command::Hello {
                protocol,
                auth,
                setname,
            }
        }
        "CLIENT" if n >= 2 => match upper(&args[1]).as_str() {
            "SETNAME" if n == 3 => Command::ClientSetName(args[2].clone()),
            "GETNAME" if n == 2 => Command::ClientGetName,
            "SETINFO" if n == 4 => Command::ClientSetInfo,
            sub => {
                return Err(format!(
                    "ERR unknown or unsupported CLIENT subcommand '{sub}'"
                ))
            }
        },
        "SELECT" if n == 2 => Command::Select(args[1].clone()),
        "COMMAND" => Command::CommandInfo,
        "INFO" => Command::Info(args[1..].to_vec()),
        "EXISTS" if n >= 2 => Command::Exists(args[1..].to_vec()),
        "TYPE" if n == 2 => Command::Type(args[1].clone()),
        "XLEN" if n == 2 => Command::XLen(args[1].clone()),
        "XADD" => {
            if n < 5 {
                return Err(arity(&name));
            }
            let key = args[1].clone();
            let mut i = 2;
            let mut nomkstream = false;
            let mut trim_spec = None;
            loop {
                match upper(&args[i]).as_str() {
                    "NOMKSTREAM" => {
                        nomkstream = true;
                        i += 1;
                    }
                    "MAXLEN" | "MINID" => {
                        let (t, used) = trim(&args, i)?;
                        trim_spec = Some(t);
                        i += used;
                    }
                    _ => break,
                }
                if i >= n {
                    return Err(arity(&name));
                }
            }
            if args[i].as_ref() != b"*" {
                return Err(
                    "ERR explicit IDs are not supported: IDs are always generated, use *".into(),
                );
            }
            let pairs = &args[i + 1..];
            if pairs.is_empty() || !pairs.len().is_multiple_of(2) {
                return Err(arity(&name));
            }
            let fields = pairs
                .chunks(2)
                .map(|p| (p[0].clone(), p[1].clone()))
                .collect();
            Command::XAdd {
                key,
                nomkstream,
                trim: trim_spec,
                fields,
            }
        }
        "XTRIM" => {
            if n < 4 {
                return Err(arity(&name));
            }
            let (t, used) = trim(&args, 2)?;
            if 2 + used != n {
                return Err(syntax());
            }
            Command::XTrim {
                key: args[1].clone(),
                trim: t,
            }
        }
        "XRANGE" => {
            if n != 4 && n != 6 {
                return Err(arity(&name));
            }
            let count = if n == 6 {
                if upper(&args[4]) != "COUNT" {
                    return Err(syntax());
                }
                Some(integer(&args[5])?)
            } else {
                None
            };
            Command::XRange {
                key: args[1].clone(),
                start: bound(&args[2])?,
                end: bound(&args[3])?,
                count,
            }
        }
        "XREAD" => {
            let (mut count, mut block) = (None, None);
            let mut i = 1;
            while i < n {
                match upper(&args[i]).as_str() {
                    "COUNT" if i + 1 < n => {
                        count = Some(integer(&args[i + 1])?);
                        i += 2;
                    }
                    "BLOCK" if i + 1 < n => {
                        block = Some(integer(&args[i + 1])?);
                        i += 2;
                    }
                    "STREAMS" => {
                        i += 1;
                        break;
                    }
                    _ => return Err(syntax()),
                }
            }
            let rest = &args[i.min(n)..];
            if rest.is_empty() || !rest.len().is_multiple_of(2) {
                return Err("ERR Unbalanced 'xread' list of streams: for each stream key an ID or '$' must be specified.".into());
            }
            let streams = rest.len() / 2;
            if streams > MAX_XREAD_STREAMS {
                return Err(format!(
                    "ERR XREAD may name at most {MAX_XREAD_STREAMS} streams"
                ));
            }
            let keys = rest[..streams].to_vec();
            let from = rest[streams..]
                .iter()
                .map(|a| match a.as_ref() {
                    b"$" => Ok(ReadFrom::Tail),
                    b"+" => Err("ERR the + ID is not supported by XREAD here".to_string()),
                    other => Ok(ReadFrom::After(id(other)?)),
                })
                .collect::<Result<_, _>>()?;
            Command::XRead {
                count,
                block,
                keys,
                from,
            }
        }
        "ECHO" | "CLIENT" | "SELECT" | "EXISTS" | "TYPE" | "XLEN" => return Err(arity(&name)),
        _ => {
            let preview: Vec<String> = args[1..]
                .iter()
                .take(3)
                .map(|a| format!("'{}'", String::from_utf8_lossy(a)))
                .collect();
            return Err(format!(
                "ERR unknown command '{}', with args beginning with: {}",
                String::from_utf8_lossy(&args[0]),
                preview.join(" ")
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::EntryId;

    fn args(line: &str) -> Vec<Bytes> {
        line.split(' ')
            .map(|s| Bytes::copy_from_slice(s.as_bytes()))
            .collect()
    }

    #[test]
    fn xadd_forms() {
        assert_eq!(
            parse(args("XADD events * kind example n 1")).unwrap(),
            Command::XAdd {
                key: "events".into(),
                nomkstream: false,
                trim: None,
                fields: vec![("kind".into(), "example".into()), ("n".into(), "1".into())],
            }
        );
        let Command::XAdd {
            nomkstream, trim, ..
        } = parse(args("xadd s NOMKSTREAM MAXLEN ~ 5 * a b")).unwrap()
        else {
            panic!()
        };
        assert!(nomkstream);
        assert_eq!(trim, Some(Trim::MaxLen(5)));
        assert!(parse(args("XADD s 1-1 a b"))
            .unwrap_err()
            .contains("explicit IDs"));
        assert!(parse(args("XADD s MAXLEN 5 * a b"))
            .unwrap_err()
            .contains("approximate"));
        assert!(parse(args("XADD s MAXLEN ~ 5 LIMIT 10 * a b"))
            .unwrap_err()
            .contains("LIMIT"));
        assert!(parse(args("XADD s * a"))
            .unwrap_err()
            .contains("wrong number"));
        assert!(parse(args("XADD s")).unwrap_err().contains("wrong number"));
    }

    #[test]
    fn range_and_read_forms() {
        assert_eq!(
            parse(args("XRANGE s - + COUNT 10")).unwrap(),
            Command::XRange {
                key: "s".into(),
                start: Bound::Min,
                end: Bound::Max,
                count: Some(10)
            }
        );
        let Command::XRange { start, end, .. } = parse(args("XRANGE s (5-3 99")).unwrap() else {
            panic!()
        };
        assert_eq!(
            start,
            Bound::Exclusive(IdArg::Full(EntryId {
                timestamp: 5,
                seq_num: 3
            }))
        );
        assert_eq!(end, Bound::Inclusive(IdArg::TimestampOnly(99)));
        assert!(parse(args("XRANGE s - + LIMIT 1")).is_err());
        let Command::XRead {
            count,
            block,
            keys,
            from,
        } = parse(args("XREAD COUNT 5 BLOCK 0 STREAMS a b $ 1-2")).unwrap()
        else {
            panic!()
        };
        assert_eq!((count, block), (Some(5), Some(0)));
        assert_eq!(keys, vec![Bytes::from("a"), Bytes::from("b")]);
        assert_eq!(from[0], ReadFrom::Tail);
        assert!(parse(args("XREAD STREAMS a"))
            .unwrap_err()
            .contains("Unbalanced"));
        assert!(parse(args("XTRIM s MAXLEN ~ 2")).is_ok());
        assert!(parse(args("XTRIM s MINID ~ 7-0")).is_ok());
        assert!(parse(args("XTRIM s MAXLEN 2")).is_err());
    }

    #[test]
    fn connection_commands_and_unknowns() {
        assert_eq!(
            parse(args("HELLO 3 AUTH default tok SETNAME me")).unwrap(),
            Command::Hello {
                protocol: Some(3),
                auth: Some(("default".into(), "tok".into())),
                setname: Some("me".into())
            }
        );
        assert!(parse(args("HELLO 4")).unwrap_err().starts_with("NOPROTO"));
        assert!(parse(args("SET k v"))
            .unwrap_err()
            .starts_with("ERR unknown command 'SET'"));
        assert!(parse(vec![]).is_err());
        assert!(parse(vec![Bytes::from("PING"); MAX_ARGS + 1]).is_err());
        assert_eq!(
            parse(args("client setinfo LIB-NAME x")).unwrap(),
            Command::ClientSetInfo
        );
    }
}
