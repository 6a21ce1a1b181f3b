#!/usr/bin/env python3
"""Writes the seed corpus of each fuzz target into fuzz/corpus/<target>/seed-*: small,
valid (and a few nearly valid) inputs from which the fuzzers mutate. Run from anywhere;
needs the `zstd` command for the compressed S2S frames."""
import gzip, json, pathlib, subprocess

root = pathlib.Path(__file__).parent / "corpus"

def varint(n):
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80); n >>= 7
    out.append(n); return bytes(out)

def field(number, payload):
    return varint(number << 3 | 2) + varint(len(payload)) + payload

def vfield(number, value):
    return varint(number << 3) + varint(value)

def write(target, seeds):
    d = root / target; d.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(seeds):
        (d / f"seed-{i:02}").write_bytes(seed)

# s2s.v1 AppendInput: records = 1 { timestamp = 1, headers = 2 { name 1, value 2 }, body = 3 }
record = vfield(1, 5) + field(2, field(1, b"h") + field(2, b"v")) + field(3, b"hello")
fence = field(2, field(1, b"") + field(2, b"fence")) + field(3, b"token")
append = field(1, record) + field(1, field(3, b"x")) + vfield(2, 3) + field(3, b"token")
def frame(flags, body):
    return (len(body) + 1).to_bytes(3, "big") + bytes([flags]) + body
zstd = subprocess.run(["zstd", "-q", "-c"], input=append * 40, capture_output=True, check=True).stdout
write("s2s_frames", [
    b"\x07" + frame(0, append) + frame(0, field(1, fence)),
    b"\x01" + frame(1 << 5, zstd),
    b"\xff" + frame(2 << 5, gzip.compress(append * 40)),
    b"\x10" + frame(0x80, b"\x01\x9c" + b'{"code":"x"}'),
    b"\x03" + frame(0, b"") + b"\x00\x00",
])

def js(value): return json.dumps(value).encode()
write("rest_bodies", [
    b"\x00" + js({"records": [{"body": "hi", "headers": [["a", "b"]], "timestamp": 3}], "match_seq_num": 0}),
    b"\x01" + js({"records": [{"body": "aGk=", "headers": [["", "ZmVuY2U="]]}], "fencing_token": "t"}),
    b"\x02" + append,
    b"\x03" + js({"storage_class": "express", "retention_policy": {"age": 3600}, "timestamping": {"mode": "client-prefer", "uncapped": False}, "delete_on_empty": {"min_age_secs": 60}}),
    b"\x04" + js({"default_stream_config": {"retention_policy": {"infinite": {}}}, "create_stream_on_append": True, "create_stream_on_read": False}),
    b"\x05" + b"seq_num=0&count=10&bytes=100&until=5&wait=1&clamp=true",
    b"\x05" + b"tail_offset=3",
])

def resp(*args):
    out = b"*%d\r\n" % len(args)
    for a in args: out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out
write("resp_requests", [
    b"\x05" + resp(b"AUTH", b"my-basin-1", b"token") + resp(b"XADD", b"s", b"MAXLEN", b"~", b"10", b"*", b"f", b"v"),
    b"\x40" + resp(b"XREAD", b"COUNT", b"10", b"BLOCK", b"100", b"STREAMS", b"a", b"b", b"0-0", b"$"),
    b"\x01" + resp(b"XRANGE", b"s", b"-", b"+", b"COUNT", b"5") + resp(b"XTRIM", b"s", b"MINID", b"~", b"5-0"),
    b"\x02" + b"PING hello\r\n\r\nHELLO 3\r\n" + resp(b"CLIENT", b"SETNAME", b"x") + resp(b"XLEN", b"s"),
    b"\x08" + b"*1\r\n*1\r\n$1\r\n",
])

write("resp_entry", [
    b"field\xffvalue\xffother\xff",
    b"\xff\xff\x00nul\xffv",
    b"1713812735000-42",
    b"",
])

def kv(key, value): return field(1, key) + field(2, field(1, value))
resource = field(1, kv(b"s2.stream", b"orders") + kv(b"service.name", b"checkout"))
span = field(1, b"\x01" * 16) + field(2, b"\x02" * 8) + field(5, b"GET /") + vfield(6, 2)
log = field(5, field(1, b"a log line")) + vfield(2, 9)
gauge = field(1, b"cpu") + field(5, field(1, b"\x31" + b"\x00" * 8))
def export(items):
    return field(1, resource + field(2, field(1, field(1, b"scope")) + b"".join(field(2, i) for i in items)) + field(3, b"url"))
def jexport(key, scopes_key, items_key, items):
    return js({key: [{"resource": {"attributes": [{"key": "s2.stream", "value": {"stringValue": "orders"}}]},
                      scopes_key: [{"scope": {"name": "s"}, items_key: items}]}]})
write("otlp_export", [
    b"\x00" + export([span] * 30),
    b"\x01" + export([gauge] * 10),
    b"\x02" + export([log] * 30),
    b"\x80" + jexport("resourceSpans", "scopeSpans", "spans", [{"traceId": "01" * 16, "spanId": "02" * 8, "name": "n", "kind": 2, "startTimeUnixNano": "5"}] * 20),
    b"\x81" + jexport("resourceMetrics", "scopeMetrics", "metrics", [{"name": "m", "gauge": {"dataPoints": [{"asDouble": 1.5, "timeUnixNano": 7}]}}] * 10),
    b"\x82" + jexport("resourceLogs", "scopeLogs", "logRecords", [{"body": {"stringValue": "x"}, "severityNumber": 9}] * 20),
])

write("token_scope", [
    js({"id": "tenant-7", "expires_at": "2030-01-01T00:00:00Z", "auto_prefix_streams": True,
        "scope": {"basins": {"exact": "my-basin-1"}, "streams": {"prefix": "tenant-7/"}, "access_tokens": None,
                  "op_groups": {"stream": {"read": True, "write": True}}, "ops": ["append", "read"]}}),
    js({"id": "svc", "scope": {"basins": {"prefix": ""}, "ops": ["list-basins", "issue-access-token"],
                               "op_groups": {"account": {"read": True}, "basin": {"write": False}}}}),
    js({"id": "x", "scope": {}}),
])
