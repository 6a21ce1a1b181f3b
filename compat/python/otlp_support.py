"""Helpers for the OTLP suites: the server's REST API and OTLP endpoint (a basin that creates
streams on append, reading a stream's records back as base64 JSON, raw OTLP posts), and
decoding OTLP values."""

import base64
import gzip
import json
import urllib.error
import urllib.parse
import urllib.request

BASIN = "otlp-compat-basin"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"


class Gate:
    """A running streamgate's REST API and OTLP endpoint, sending the server's access token
    (`server.token`, when the harness has one) with every request."""

    def __init__(self, server):
        self.endpoint = server.endpoint
        token = getattr(server, "token", None)
        self.auth = {"authorization": f"Bearer {token}"} if token else {}

    def rest(self, method, path, body=None, basin=None, extra_headers=None):
        request = urllib.request.Request(self.endpoint + "/v1" + path, method=method)
        request.add_header("content-type", JSON)
        if basin:
            request.add_header("s2-basin", basin)
        for name, value in {**self.auth, **(extra_headers or {})}.items():
            request.add_header(name, value)
        data = json.dumps(body).encode() if body is not None else None
        with urllib.request.urlopen(request, data=data, timeout=30) as response:
            text = response.read()
            return json.loads(text) if text else None

    def create_basin(self, name=BASIN):
        """A basin that creates streams on first append, as the OTLP front end needs."""
        self.rest("POST", "/basins", {"basin": name, "config": {"create_stream_on_append": True}})
        return name

    def stream_names(self, basin):
        return [s["name"] for s in self.rest("GET", "/streams", basin=basin)["streams"]]

    def read_records(self, basin, stream, missing_ok=False):
        """Every record of `stream` as (headers, body): headers a list of (name, value) str
        pairs. With `missing_ok`, a stream that does not exist yet, or exists with nothing in
        it yet (416: created on first export, its first append not yet acknowledged), reads
        as empty."""
        path = f"/streams/{urllib.parse.quote(stream, safe='')}/records?seq_num=0"
        try:
            batch = self.rest("GET", path, basin=basin, extra_headers={"s2-format": "base64"})
        except urllib.error.HTTPError as err:
            if missing_ok and err.code in (404, 416):
                return []
            raise
        records = []
        for record in batch["records"]:
            headers = [
                (base64.b64decode(n).decode(), base64.b64decode(v).decode()) for n, v in record.get("headers", [])
            ]
            records.append((headers, base64.b64decode(record.get("body", ""))))
        return records

    def otlp_url(self, signal):
        return f"{self.endpoint}/otlp/v1/{signal}"

    def otlp_headers(self, basin):
        """Headers for an OTLP exporter: the basin, and the access token if any."""
        return {"s2-basin": basin, **self.auth}

    def post_otlp(self, signal, body, content_type, basin, compress=False):
        """POSTs a raw OTLP request; returns (status, content type, body bytes)."""
        request = urllib.request.Request(self.otlp_url(signal), method="POST")
        request.add_header("content-type", content_type)
        for name, value in self.otlp_headers(basin).items():
            request.add_header(name, value)
        if compress:
            body = gzip.compress(body)
            request.add_header("content-encoding", "gzip")
        try:
            with urllib.request.urlopen(request, data=body, timeout=30) as response:
                return response.status, response.headers.get("content-type", ""), response.read()
        except urllib.error.HTTPError as err:
            return err.code, err.headers.get("content-type", ""), err.read()


def expect_headers(headers, signal, content_type):
    assert sorted(headers) == sorted([("s2-otlp.signal", signal), ("content-type", content_type)]), headers


GROUP_FIELDS = {"traces": "resource_spans", "metrics": "resource_metrics", "logs": "resource_logs"}


def decode_protobuf_records(records, signal, message_type):
    """Checks each record's headers and decodes its body, which holds exactly one group."""
    decoded = []
    for headers, body in records:
        expect_headers(headers, signal, PROTOBUF)
        message = message_type()
        message.ParseFromString(body)
        assert len(getattr(message, GROUP_FIELDS[signal])) == 1, message
        decoded.append(message)
    return decoded


def attributes(key_values):
    """OTLP KeyValue list (protobuf) -> dict of python values."""
    return {kv.key: any_value(kv.value) for kv in key_values}


def any_value(value):
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes(value.kvlist_value.values)
    return getattr(value, kind) if kind else None


def json_value(value):
    """An OTLP/JSON AnyValue -> python value (int64 may be a string or a number)."""
    [(kind, inner)] = value.items()
    if kind == "intValue":
        return int(inner)
    if kind == "arrayValue":
        return [json_value(v) for v in inner.get("values", [])]
    if kind == "kvlistValue":
        return json_attributes(inner.get("values", []))
    return inner


def json_attributes(key_values):
    return {kv["key"]: json_value(kv["value"]) for kv in key_values}
