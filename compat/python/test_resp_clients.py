"""Redis clients against streamgate's RESP listener: redis-py running the integration
page's program (append three entries, page with XRANGE (last-id, tail with XREAD
BLOCK), pipelining, RESP3, the documented errors, interop with native records, and
redis-cli. A differential test compares reply shapes with a real Redis server."""

import json
import shutil
import ssl
import subprocess
import threading
import time
import urllib.request

import pytest
import redis
from conftest import ROOT_TOKEN

BASIN = "resp-basin-1"


def rest(server, method, path, body=None, basin=None):
    request = urllib.request.Request(server.endpoint + "/v1" + path, method=method)
    request.add_header("content-type", "application/json")
    request.add_header("authorization", f"Bearer {ROOT_TOKEN}")
    if basin:
        request.add_header("s2-basin", basin)
    data = json.dumps(body).encode() if body is not None else None
    with urllib.request.urlopen(request, data=data) as response:
        text = response.read()
        return json.loads(text) if text else None


def make_basin(server, **config):
    rest(server, "POST", "/basins", {"basin": BASIN, "config": config})


def connect(server, protocol=2, **kwargs):
    return redis.Redis(
        host="127.0.0.1",
        port=server.resp_port,
        username=BASIN,
        password=ROOT_TOKEN,
        decode_responses=True,
        socket_timeout=30,
        protocol=protocol,
        **kwargs,
    )


def test_the_docs_program_append_page_and_tail(server):
    make_basin(server, create_stream_on_append=True)
    r = connect(server)
    ids = [r.xadd("events", {"kind": "example", "n": str(i)}) for i in range(3)]
    seqs = [int(i.split("-")[1]) for i in ids]
    assert seqs == [0, 1, 2]

    seen, start, last_id = [], "-", None
    while True:
        page = r.xrange("events", min=start, max="+", count=2)
        if not page:
            break
        seen.extend(page)
        last_id = page[-1][0]
        start = f"({last_id}"
    assert [entry_id for entry_id, _ in seen] == ids
    assert seen[1][1] == {"kind": "example", "n": "1"}

    # Tail from the last entry: a blocking read wakes when a new entry lands.
    def late_append():
        time.sleep(0.3)
        connect(server).xadd("events", {"kind": "late"})

    threading.Thread(target=late_append).start()
    reply = r.xread({"events": last_id}, count=100, block=10_000)
    assert reply[0][0] == "events"
    assert reply[0][1][0][1] == {"kind": "late"}
    # Nothing newer: a short block times out with nil.
    assert r.xread({"events": reply[0][1][0][0]}, block=200) in (None, [], {})
    assert r.xlen("events") == 4


def test_pipelined_xadds_are_ordered_and_durable(server):
    make_basin(server, create_stream_on_append=True)
    r = connect(server)
    pipe = r.pipeline(transaction=False)
    for i in range(500):
        pipe.xadd("a" if i % 3 else "b", {"i": str(i)})
    pipe.xlen("a")
    results = pipe.execute()
    ids = results[:500]
    a_seqs = [int(x.split("-")[1]) for i, x in enumerate(ids) if i % 3]
    b_seqs = [int(x.split("-")[1]) for i, x in enumerate(ids) if i % 3 == 0]
    assert a_seqs == list(range(len(a_seqs)))
    assert b_seqs == list(range(len(b_seqs)))
    assert results[500] == len(a_seqs), "a command after XADDs sees them"
    entries = r.xrange("a", "-", "+", count=10_000)
    assert [fields["i"] for _, fields in entries] == [str(i) for i in range(500) if i % 3]


def test_resp3_hello_and_replies(server):
    make_basin(server, create_stream_on_append=True)
    r = connect(server, protocol=3)
    hello = r.execute_command("HELLO", "3")
    assert hello["server"] == "s2-resp" and hello["version"] == "6.2.0" and hello["proto"] == 3
    assert hello["s2_resp_version"] == "1"
    first = r.xadd("s3", {"f": "v"})
    reply = r.xread({"s3": "0-0"})
    assert reply == {"s3": [[(first, {"f": "v"})]]}, reply
    assert r.exists("s3", "nope") == 1
    assert r.type("s3") == "stream" and r.type("nope") == "none"
    assert r.client_setname("worker-1") and r.client_getname() == "worker-1"
    assert r.ping() and r.echo("hi") == "hi"
    assert "redis_version:6.2.0" in r.execute_command("INFO", "server") or r.info("server")["redis_version"] == "6.2.0"


def test_documented_errors_and_semantics(server):
    make_basin(server)  # neither creation setting
    unauthenticated = redis.Redis(host="127.0.0.1", port=server.resp_port, decode_responses=True)
    with pytest.raises(redis.exceptions.AuthenticationError):
        unauthenticated.xlen("x")
    r = connect(server)
    with pytest.raises(redis.ResponseError, match="does not exist"):
        r.xadd("missing", {"a": "b"})
    assert r.xadd("missing", {"a": "b"}, nomkstream=True) is None
    assert r.xrange("missing") == []
    assert r.xlen("missing") == 0
    with pytest.raises(redis.ResponseError, match="explicit IDs"):
        r.xadd("missing", {"a": "b"}, id="1-1")
    with pytest.raises(redis.ResponseError, match="approximate"):
        r.xtrim("missing", maxlen=5, approximate=False)
    with pytest.raises(redis.ResponseError, match="unknown command"):
        r.set("k", "v")
    assert r.ping(), "errors never drop the connection"

    rest(server, "POST", "/streams", {"stream": "trimmed"}, basin=BASIN)
    for i in range(3):
        r.xadd("trimmed", {"n": str(i)})
    assert r.xtrim("trimmed", maxlen=2, approximate=True) == 2
    entries = r.xrange("trimmed")
    assert len(entries) == 2 and entries[1][1] == {}, "C and the trim record remain"
    # Inline trimming appends the entry and its trim record together: MAXLEN ~ 1 keeps
    # only the newest of the two, the trim record.
    inline = r.xadd("trimmed", {"n": "3"}, maxlen=1, approximate=True)
    remaining = r.xrange("trimmed")
    assert len(remaining) == 1 and remaining[0][1] == {}
    assert int(remaining[0][0].split("-")[1]) == int(inline.split("-")[1]) + 1


def test_native_and_redis_clients_see_the_same_streams(server):
    make_basin(server, create_stream_on_append=True)
    r = redis.Redis(host="127.0.0.1", port=server.resp_port, username=BASIN, password=ROOT_TOKEN, socket_timeout=30)
    entry_id = r.xadd("mixed", {b"sensor": b"t1", b"": b"empty", b"\x00x": b"nul"}).decode()
    seq = int(entry_id.split("-")[1])
    native = rest(server, "GET", f"/streams/mixed/records?seq_num={seq}&count=1", basin=BASIN)
    headers = native["records"][0]["headers"]
    assert headers[0] == ["s2-resp.v", "1"] and headers[1] == ["sensor", "t1"]
    assert headers[2] == ["\u0000", "empty"] and headers[3] == ["\u0000\u0000x", "nul"]
    assert "body" not in native["records"][0]

    rest(server, "POST", "/streams/mixed/records", {"records": [{"body": "native", "headers": [["k", "v"]]}]}, basin=BASIN)
    entries = r.xrange("mixed", "-", "+")
    assert entries[0][1] == {b"sensor": b"t1", b"": b"empty", b"\x00x": b"nul"}
    assert entries[1][1] == {}, "native records read as entries with no fields"
    # A marked record with a body is a read error, not a silent drop.
    rest(server, "POST", "/streams/mixed/records", {"records": [{"body": "x", "headers": [["s2-resp.v", "1"]]}]}, basin=BASIN)
    with pytest.raises(redis.ResponseError, match="marker and a body"):
        r.xrange("mixed", "-", "+")


def test_redis_cli(server):
    make_basin(server, create_stream_on_append=True)
    cli = shutil.which("redis-cli")
    if not cli:
        pytest.fail("redis-cli is not installed (Debian package redis-tools)")

    def run(*args):
        out = subprocess.run(
            [cli, "-p", str(server.resp_port), "--user", BASIN, "--pass", ROOT_TOKEN, "--no-auth-warning", *args],
            capture_output=True, text=True, timeout=30,
        )
        return out.stdout.strip()

    entry_id = run("XADD", "cli", "*", "kind", "example")
    assert entry_id.endswith("-0")
    assert run("XRANGE", "cli", "-", "+", "COUNT", "100").split("\n") == [entry_id, "kind", "example"]
    assert run("XLEN", "cli") == "1"
    assert run("PING") == "PONG"


def test_tls_with_sni_selects_the_basin(tmp_path):
    from conftest import launch

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    with launch("--tls-cert", str(cert), "--tls-key", str(key)) as server:
        request = urllib.request.Request(server.endpoint + "/v1/basins", method="POST")
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        request.add_header("content-type", "application/json")
        request.add_header("authorization", f"Bearer {ROOT_TOKEN}")
        body = json.dumps({"basin": BASIN, "config": {"create_stream_on_append": True}}).encode()
        with urllib.request.urlopen(request, data=body, context=context) as response:
            assert response.status == 201

        def cli(sni, *args):
            command = [shutil.which("redis-cli") or "redis-cli", "--tls", "--insecure", "-h", "127.0.0.1",
                       "-p", str(server.resp_port), "--pass", ROOT_TOKEN, "--no-auth-warning"]
            if sni:
                command += ["--sni", sni]
            out = subprocess.run(command + list(args), capture_output=True, text=True, timeout=30)
            return out.stdout.strip() + out.stderr.strip()

        # The SNI host name {basin}.… selects the basin; no username is needed.
        entry_id = cli(f"{BASIN}.r.localhost", "XADD", "secure", "*", "k", "v")
        assert entry_id.endswith("-0"), entry_id
        assert cli(f"{BASIN}.r.localhost", "XRANGE", "secure", "-", "+").split("\n") == [entry_id, "k", "v"]
        # Without a basin in SNI the connection is refused.
        assert "-0" not in cli(None, "XADD", "secure", "*", "k", "v")
        assert cli(None, "PING") != "PONG"


REDIS_PORT = 6379


@pytest.fixture
def real_redis():
    client = redis.Redis(port=REDIS_PORT, decode_responses=True, db=0)
    try:
        client.ping()
    except redis.ConnectionError:
        if not shutil.which("redis-server"):
            pytest.fail("no Redis server to compare with: install redis-server")
        proc = subprocess.Popen(["redis-server", "--port", "16379", "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
        time.sleep(0.5)
        client = redis.Redis(port=16379, decode_responses=True)
        yield client
        proc.kill()
        return
    yield client


@pytest.mark.parametrize("protocol", [2, 3])
def test_reply_shapes_match_a_real_redis(server, real_redis, protocol):
    """Where Redis and S2 semantics agree, the reply shapes must be the same."""
    make_basin(server, create_stream_on_append=True)
    ours = connect(server, protocol=protocol)
    theirs = redis.Redis(port=real_redis.connection_pool.connection_kwargs["port"], decode_responses=True, protocol=protocol)
    key = f"diff-{protocol}-{time.time_ns()}"
    for client in (ours, theirs):
        client.delete(key) if client is theirs else None
        for i in range(3):
            client.xadd(key, {"f": str(i), "g": "x"})

    def shape(value):
        if isinstance(value, (list, tuple)):
            return [shape(v) for v in value]
        if isinstance(value, dict):
            return {shape(k): shape(v) for k, v in value.items()}
        return type(value).__name__

    def ids_stripped(entries):
        return [fields for _, fields in entries]

    assert ids_stripped(ours.xrange(key)) == ids_stripped(theirs.xrange(key))
    assert shape(ours.xrange(key, count=2)) == shape(theirs.xrange(key, count=2))
    assert shape(ours.xread({key: "0-0"}, count=2)) == shape(theirs.xread({key: "0-0"}, count=2))
    both = [ours.xread({key: "0-0", key + "-other": "0-0"}), theirs.xread({key: "0-0", key + "-other": "0-0"})]
    assert shape(both[0]) == shape(both[1])
    assert ours.xread({key: "$"}, block=100) == theirs.xread({key: "$"}, block=100)
    assert ours.xlen(key) == theirs.xlen(key)
    assert ours.exists(key, "missing") == theirs.exists(key, "missing")
    assert ours.type(key) == theirs.type(key)
    assert ours.xrange("missing-key") == theirs.xrange("missing-key")
    for client in (ours, theirs):
        with pytest.raises(redis.ResponseError, match="unknown command"):
            client.execute_command("NOSUCHCOMMAND", "x")
        with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
            client.execute_command("XADD", key)
    theirs.delete(key)


def test_large_replies_are_bounded_and_xrevrange_keeps_the_newest(server):
    """COUNT allows 10,000 entries; of 1 MiB each that would be 10 GiB in one reply. A
    read replies with at most 16 MiB of entries (the rest are a page away), and
    XREVRANGE cut short still starts from the newest."""
    make_basin(server, create_stream_on_append=True)
    r = connect(server)
    big = "x" * (1024 * 1024 - 1024)
    ids = [r.xadd("big", {"f": big}) for _ in range(20)]
    forward = [entry_id for entry_id, _ in r.xrange("big")]
    assert 0 < len(forward) < 20, len(forward)
    assert forward == ids[: len(forward)]
    backward = [entry_id for entry_id, _ in r.xrevrange("big")]
    assert backward == ids[::-1][: len(backward)]
    assert len(backward) == len(forward)
    # The next page holds the rest.
    rest = [entry_id for entry_id, _ in r.xrange("big", min=f"({forward[-1]}")]
    assert forward + rest == ids
