"""The official OpenTelemetry Python SDK and its OTLP/HTTP exporters (http/protobuf) against
streamgate's `/otlp/v1/{traces,metrics,logs}`, plus raw OTLP/JSON and OTLP/protobuf posts
for what the exporters cannot show (two resource groups in one request, partial success,
the 400 for a request with nothing acceptable).

Every group lands in the stream its resource attribute `s2.stream` names, as one record
with headers `s2-otlp.signal` and `content-type` and a body holding an Export*ServiceRequest
with exactly that one resource group, in the encoding it arrived in. The tests read the
streams back through the REST API and decode the bodies with the OTLP protobuf classes
(or json.loads), so what they check is what a reader of the stream gets.
"""

import json
import urllib.parse

import pytest
import requests
from opentelemetry._logs import SeverityNumber
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as ResourceProto
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.trace import SpanKind
from otlp_support import (
    BASIN,
    Gate,
    JSON,
    PROTOBUF,
    any_value,
    attributes,
    decode_protobuf_records,
    expect_headers,
    json_attributes,
)

RESPONSE_TYPES = {
    "traces": ExportTraceServiceResponse,
    "metrics": ExportMetricsServiceResponse,
    "logs": ExportLogsServiceResponse,
}


@pytest.fixture
def gate(server):
    return Gate(server)


@pytest.fixture
def basin(gate):
    return gate.create_basin()


# ---- what the exporters sent and got back -------------------------------------------------


class Recorder:
    """A requests.Session for an exporter that remembers every response (and so its request)."""

    def __init__(self):
        self.session = requests.Session()
        self.responses = []
        self.session.hooks["response"].append(lambda response, *args, **kwargs: self.responses.append(response))

    def check_all_accepted(self, signal, path, compressed=False):
        """Every export reached `path`, got 200 and a protobuf Export*ServiceResponse with no
        partial success (what the official exporters and the Collector parse)."""
        assert self.responses, "the exporter sent nothing"
        for response in self.responses:
            request = response.request
            assert urllib.parse.urlsplit(request.url).path == path
            assert request.headers["content-type"] == PROTOBUF
            assert request.headers["s2-basin"] == BASIN
            if compressed:
                assert request.headers["content-encoding"] == "gzip"
                assert request.body[:2] == b"\x1f\x8b"
            else:
                assert "content-encoding" not in request.headers
            assert response.status_code == 200, (response.status_code, response.content)
            assert response.headers["content-type"].split(";")[0].strip() == PROTOBUF
            parsed = RESPONSE_TYPES[signal]()
            parsed.ParseFromString(response.content)
            assert not parsed.HasField("partial_success"), parsed


def resource(stream, service):
    return Resource.create({"service.name": service, "s2.stream": stream, "deployment.environment": "compat"})


# ---- the SDK with its exporters -----------------------------------------------------------


def test_sdk_traces_arrive_in_the_named_stream(gate, basin):
    recorder = Recorder()
    exporter = OTLPSpanExporter(
        endpoint=gate.otlp_url("traces"), headers=gate.otlp_headers(basin), session=recorder.session
    )
    provider = TracerProvider(resource=resource("py-traces", "checkout-svc"))
    # A long delay, so that force_flush sends every span in one request.
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=60_000))
    tracer = provider.get_tracer("compat.tracer", "1.2.3")

    with tracer.start_as_current_span("checkout", kind=SpanKind.SERVER, attributes={"http.route": "/checkout"}) as root:
        with tracer.start_as_current_span("load-cart", attributes={"cart.items": 3}):
            pass
        with tracer.start_as_current_span(
            "charge-card",
            kind=SpanKind.CLIENT,
            attributes={"amount": 12.5, "currency": "EUR", "retry": False, "tags": ["a", "b"]},
        ) as charge:
            charge.add_event("authorized", {"auth.code": "X1"})
        for i in range(3):
            with tracer.start_as_current_span(f"audit-{i}", attributes={"index": i}):
                pass
    assert provider.force_flush(30_000)
    recorder.check_all_accepted("traces", "/otlp/v1/traces")
    assert len(recorder.responses) == 1

    records = gate.read_records(basin, "py-traces")
    assert len(records) == 1
    [request] = decode_protobuf_records(records, "traces", ExportTraceServiceRequest)
    [group] = request.resource_spans
    res = attributes(group.resource.attributes)
    assert res["s2.stream"] == "py-traces"
    assert res["service.name"] == "checkout-svc"
    assert res["telemetry.sdk.language"] == "python"
    [scope] = group.scope_spans
    assert (scope.scope.name, scope.scope.version) == ("compat.tracer", "1.2.3")
    spans = {s.name: s for s in scope.spans}
    assert sorted(spans) == ["audit-0", "audit-1", "audit-2", "charge-card", "checkout", "load-cart"]

    trace_id = root.get_span_context().trace_id.to_bytes(16, "big")
    assert all(s.trace_id == trace_id for s in spans.values())
    assert spans["checkout"].span_id == root.get_span_context().span_id.to_bytes(8, "big")
    assert spans["checkout"].parent_span_id == b""
    assert spans["load-cart"].parent_span_id == spans["checkout"].span_id
    assert spans["checkout"].kind == 2  # SPAN_KIND_SERVER
    assert spans["charge-card"].kind == 3  # SPAN_KIND_CLIENT
    assert attributes(spans["charge-card"].attributes) == {
        "amount": 12.5,
        "currency": "EUR",
        "retry": False,
        "tags": ["a", "b"],
    }
    assert attributes(spans["load-cart"].attributes) == {"cart.items": 3}
    assert attributes(spans["audit-2"].attributes) == {"index": 2}
    [event] = spans["charge-card"].events
    assert event.name == "authorized" and attributes(event.attributes) == {"auth.code": "X1"}
    assert spans["checkout"].end_time_unix_nano >= spans["checkout"].start_time_unix_nano > 0
    provider.shutdown()


def test_sdk_metrics_arrive_in_the_named_stream(gate, basin):
    recorder = Recorder()
    exporter = OTLPMetricExporter(
        endpoint=gate.otlp_url("metrics"), headers=gate.otlp_headers(basin), session=recorder.session
    )
    # An hour between periodic exports: only force_flush sends.
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = MeterProvider(resource=resource("py-metrics", "orders-svc"), metric_readers=[reader])
    meter = provider.get_meter("compat.meter", "0.1")

    orders = meter.create_counter("orders.placed", unit="1", description="orders placed")
    latency = meter.create_histogram("order.latency", unit="ms", description="time to place an order")
    orders.add(3, {"region": "eu"})
    orders.add(4, {"region": "eu"})
    orders.add(10, {"region": "us"})
    for value in (5, 15, 25):
        latency.record(value, {"region": "eu"})
    assert provider.force_flush(30_000)
    recorder.check_all_accepted("metrics", "/otlp/v1/metrics")

    records = gate.read_records(basin, "py-metrics")
    assert len(records) == len(recorder.responses) == 1
    [request] = decode_protobuf_records(records, "metrics", ExportMetricsServiceRequest)
    [group] = request.resource_metrics
    res = attributes(group.resource.attributes)
    assert (res["s2.stream"], res["service.name"]) == ("py-metrics", "orders-svc")
    metrics = {m.name: m for scope in group.scope_metrics for m in scope.metrics}
    assert sorted(metrics) == ["order.latency", "orders.placed"]

    counter = metrics["orders.placed"]
    assert counter.WhichOneof("data") == "sum"
    assert counter.sum.is_monotonic
    assert counter.description == "orders placed"
    by_region = {attributes(p.attributes)["region"]: p.as_int for p in counter.sum.data_points}
    assert by_region == {"eu": 7, "us": 10}

    histogram = metrics["order.latency"]
    assert histogram.WhichOneof("data") == "histogram"
    assert histogram.unit == "ms"
    [point] = histogram.histogram.data_points
    assert (point.count, point.sum, point.min, point.max) == (3, 45.0, 5.0, 25.0)
    assert sum(point.bucket_counts) == 3
    provider.shutdown()


def test_sdk_logs_arrive_in_the_named_stream(gate, basin):
    recorder = Recorder()
    exporter = OTLPLogExporter(endpoint=gate.otlp_url("logs"), headers=gate.otlp_headers(basin), session=recorder.session)
    provider = LoggerProvider(resource=resource("py-logs", "billing-svc"))
    provider.add_log_record_processor(BatchLogRecordProcessor(exporter, schedule_delay_millis=60_000))
    logger = provider.get_logger("compat.logger")

    # A log inside a span carries that span's trace and span ids.
    tracer = TracerProvider().get_tracer("compat.tracer")
    with tracer.start_as_current_span("invoice") as span:
        logger.emit(body="invoice created", severity_number=SeverityNumber.INFO, severity_text="INFO",
                    attributes={"invoice.id": 1001})
    logger.emit(body="payment declined", severity_number=SeverityNumber.WARN, severity_text="WARN",
                attributes={"reason": "insufficient funds", "attempt": 2})
    logger.emit(body={"order": 42, "items": ["pen", "ink"], "paid": True}, severity_number=SeverityNumber.ERROR)
    provider.force_flush(30_000)
    recorder.check_all_accepted("logs", "/otlp/v1/logs")

    records = gate.read_records(basin, "py-logs")
    assert len(records) == len(recorder.responses) == 1
    [request] = decode_protobuf_records(records, "logs", ExportLogsServiceRequest)
    [group] = request.resource_logs
    res = attributes(group.resource.attributes)
    assert (res["s2.stream"], res["service.name"]) == ("py-logs", "billing-svc")
    logs = [log for scope in group.scope_logs for log in scope.log_records]
    assert [any_value(log.body) for log in logs] == [
        "invoice created",
        "payment declined",
        {"order": 42, "items": ["pen", "ink"], "paid": True},
    ]
    assert [log.severity_number for log in logs] == [9, 13, 17]
    assert logs[0].severity_text == "INFO"
    assert attributes(logs[0].attributes) == {"invoice.id": 1001}
    assert attributes(logs[1].attributes) == {"reason": "insufficient funds", "attempt": 2}
    assert logs[0].trace_id == span.get_span_context().trace_id.to_bytes(16, "big")
    assert logs[0].span_id == span.get_span_context().span_id.to_bytes(8, "big")
    assert group.scope_logs[0].scope.name == "compat.logger"
    provider.shutdown()


def test_sdk_gzip_compressed_exports(gate, basin):
    recorder = Recorder()
    exporter = OTLPSpanExporter(
        endpoint=gate.otlp_url("traces"),
        headers=gate.otlp_headers(basin),
        compression=Compression.Gzip,
        session=recorder.session,
    )
    provider = TracerProvider(resource=resource("py-gzip", "gzip-svc"))
    # One request per span.
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("compat.gzip")
    big = "x" * 5000  # compresses well, so a server that skipped decompression would store junk
    for i in range(4):
        with tracer.start_as_current_span(f"gz-{i}", attributes={"payload": big, "i": i}):
            pass
    recorder.check_all_accepted("traces", "/otlp/v1/traces", compressed=True)
    assert len(recorder.responses) == 4
    assert all(len(r.request.body) < 1000 for r in recorder.responses)

    records = gate.read_records(basin, "py-gzip")
    assert len(records) == 4
    decoded = decode_protobuf_records(records, "traces", ExportTraceServiceRequest)
    spans = [s for r in decoded for s in r.resource_spans[0].scope_spans[0].spans]
    assert [s.name for s in spans] == ["gz-0", "gz-1", "gz-2", "gz-3"]
    assert all(attributes(s.attributes) == {"payload": big, "i": i} for i, s in enumerate(spans))
    provider.shutdown()


def test_sdk_export_to_several_streams_from_several_providers(gate, basin):
    """Each provider's resource names its own stream; nothing leaks between them."""
    for stream in ("py-multi-a", "py-multi-b"):
        recorder = Recorder()
        exporter = OTLPSpanExporter(
            endpoint=gate.otlp_url("traces"), headers=gate.otlp_headers(basin), session=recorder.session
        )
        provider = TracerProvider(resource=resource(stream, stream + "-svc"))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        with provider.get_tracer("compat").start_as_current_span("span-in-" + stream):
            pass
        recorder.check_all_accepted("traces", "/otlp/v1/traces")
        provider.shutdown()
    assert gate.stream_names(basin) == ["py-multi-a", "py-multi-b"]
    for stream in ("py-multi-a", "py-multi-b"):
        [request] = decode_protobuf_records(gate.read_records(basin, stream), "traces", ExportTraceServiceRequest)
        assert [s.name for s in request.resource_spans[0].scope_spans[0].spans] == ["span-in-" + stream]


# ---- raw OTLP/JSON ------------------------------------------------------------------------


def json_resource_spans(stream, trace_id, span_ids, name_prefix):
    attrs = [{"key": "service.name", "value": {"stringValue": name_prefix + "-svc"}}]
    if stream is not None:
        attrs.append({"key": "s2.stream", "value": {"stringValue": stream}})
    return {
        "resource": {"attributes": attrs},
        "scopeSpans": [
            {
                "scope": {"name": "raw-json", "version": "1"},
                "spans": [
                    {
                        "traceId": trace_id,
                        "spanId": span_id,
                        "name": f"{name_prefix}-{i}",
                        "kind": 2,
                        "startTimeUnixNano": "1544712660000000000",
                        "endTimeUnixNano": "1544712661000000000",
                        "attributes": [
                            {"key": "http.status_code", "value": {"intValue": "200"}},
                            {"key": "ok", "value": {"boolValue": True}},
                        ],
                    }
                    for i, span_id in enumerate(span_ids)
                ],
            }
        ],
    }


TRACE_A = "5b8efff798038103d269b633813fc60c"
TRACE_B = "0af7651916cd43dd8448eb211c80319c"


def assert_fully_accepted_json(content_type, body):
    assert content_type.split(";")[0].strip() == JSON
    parsed = json.loads(body) if body else {}
    partial = parsed.get("partialSuccess") or {}
    assert int(partial.get("rejectedSpans", 0)) == 0 and not partial.get("errorMessage"), parsed


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
def test_json_request_with_two_groups_lands_in_two_streams(gate, basin, compress):
    request = {
        "resourceSpans": [
            json_resource_spans("json-a", TRACE_A, ["eee19b7ec3c1b174", "eee19b7ec3c1b175"], "alpha"),
            json_resource_spans("json-b", TRACE_B, ["b7ad6b7169203331"], "beta"),
        ]
    }
    status, content_type, body = gate.post_otlp(
        "traces", json.dumps(request).encode(), JSON, basin, compress=compress
    )
    assert status == 200, body
    assert_fully_accepted_json(content_type, body)

    assert gate.stream_names(basin) == ["json-a", "json-b"]
    for stream, trace_id, span_ids, prefix in [
        ("json-a", TRACE_A, ["eee19b7ec3c1b174", "eee19b7ec3c1b175"], "alpha"),
        ("json-b", TRACE_B, ["b7ad6b7169203331"], "beta"),
    ]:
        records = gate.read_records(basin, stream)
        assert len(records) == 1
        headers, record_body = records[0]
        expect_headers(headers, "traces", JSON)
        stored = json.loads(record_body)
        assert len(stored["resourceSpans"]) == 1
        group = stored["resourceSpans"][0]
        res = json_attributes(group["resource"]["attributes"])
        assert res == {"service.name": prefix + "-svc", "s2.stream": stream}
        spans = group["scopeSpans"][0]["spans"]
        assert [s["name"] for s in spans] == [f"{prefix}-{i}" for i in range(len(span_ids))]
        assert [s["traceId"].lower() for s in spans] == [trace_id] * len(span_ids)
        assert [s["spanId"].lower() for s in spans] == span_ids
        assert int(spans[0]["startTimeUnixNano"]) == 1544712660000000000
        assert int(spans[0]["endTimeUnixNano"]) == 1544712661000000000
        attrs = json_attributes(spans[0]["attributes"])
        assert attrs == {"http.status_code": 200, "ok": True}
        assert group["scopeSpans"][0]["scope"]["name"] == "raw-json"


def test_json_group_without_stream_is_rejected_through_partial_success(gate, basin):
    request = {
        "resourceSpans": [
            json_resource_spans("json-good", TRACE_A, ["eee19b7ec3c1b174", "eee19b7ec3c1b175"], "good"),
            json_resource_spans(None, TRACE_B, ["b7ad6b7169203331", "b7ad6b7169203332", "b7ad6b7169203333"], "bad"),
        ]
    }
    status, content_type, body = gate.post_otlp("traces", json.dumps(request).encode(), JSON, basin)
    assert status == 200, body
    assert content_type.split(";")[0].strip() == JSON
    partial = json.loads(body)["partialSuccess"]
    assert int(partial["rejectedSpans"]) == 3
    assert isinstance(partial["errorMessage"], str) and partial["errorMessage"]

    assert gate.stream_names(basin) == ["json-good"]
    [(headers, record_body)] = gate.read_records(basin, "json-good")
    expect_headers(headers, "traces", JSON)
    spans = json.loads(record_body)["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert [s["name"] for s in spans] == ["good-0", "good-1"]


def test_json_request_with_only_bad_groups_is_a_400(gate, basin):
    for groups in (
        [json_resource_spans(None, TRACE_B, ["b7ad6b7169203331"], "bad")],
        [
            json_resource_spans(None, TRACE_A, ["eee19b7ec3c1b174"], "bad1"),
            json_resource_spans(None, TRACE_B, ["b7ad6b7169203331"], "bad2"),
        ],
    ):
        status, _, body = gate.post_otlp("traces", json.dumps({"resourceSpans": groups}).encode(), JSON, basin)
        assert status == 400, (status, body)
    assert gate.stream_names(basin) == []


def test_json_logs_partial_success_counts_log_records(gate, basin):
    def group(stream, bodies):
        attrs = [] if stream is None else [{"key": "s2.stream", "value": {"stringValue": stream}}]
        return {
            "resource": {"attributes": attrs},
            "scopeLogs": [{"logRecords": [{"timeUnixNano": "1700000000000000000", "body": {"stringValue": b}} for b in bodies]}],
        }

    request = {"resourceLogs": [group(None, ["x", "y"]), group("json-logs", ["kept"])]}
    status, content_type, body = gate.post_otlp("logs", json.dumps(request).encode(), JSON, basin)
    assert status == 200, body
    assert content_type.split(";")[0].strip() == JSON
    partial = json.loads(body)["partialSuccess"]
    assert int(partial["rejectedLogRecords"]) == 2 and partial["errorMessage"]
    [(headers, record_body)] = gate.read_records(basin, "json-logs")
    expect_headers(headers, "logs", JSON)
    stored = json.loads(record_body)["resourceLogs"]
    assert len(stored) == 1
    assert stored[0]["scopeLogs"][0]["logRecords"][0]["body"] == {"stringValue": "kept"}


# ---- raw OTLP/protobuf partial success ----------------------------------------------------


def test_protobuf_metrics_partial_success_response(gate, basin):
    def group(stream, points):
        attrs = [KeyValue(key="service.name", value=AnyValue(string_value="gauges"))]
        if stream is not None:
            attrs.append(KeyValue(key="s2.stream", value=AnyValue(string_value=stream)))
        return ResourceMetrics(
            resource=ResourceProto(attributes=attrs),
            scope_metrics=[
                ScopeMetrics(
                    metrics=[
                        Metric(
                            name="queue.depth",
                            gauge=Gauge(
                                data_points=[NumberDataPoint(time_unix_nano=1700000000000000000 + i, as_int=v)
                                             for i, v in enumerate(points)]
                            ),
                        )
                    ]
                )
            ],
        )

    request = ExportMetricsServiceRequest(
        resource_metrics=[group("pb-gauges", [1, 2]), group(None, [3, 4, 5])]
    )
    status, content_type, body = gate.post_otlp("metrics", request.SerializeToString(), PROTOBUF, basin)
    assert status == 200, body
    assert content_type.split(";")[0].strip() == PROTOBUF
    response = ExportMetricsServiceResponse()
    response.ParseFromString(body)
    assert response.partial_success.rejected_data_points == 3
    assert response.partial_success.error_message

    [stored] = decode_protobuf_records(gate.read_records(basin, "pb-gauges"), "metrics", ExportMetricsServiceRequest)
    assert stored.resource_metrics[0] == request.resource_metrics[0]

    only_bad = ExportMetricsServiceRequest(resource_metrics=[group(None, [6])])
    status, _, _ = gate.post_otlp("metrics", only_bad.SerializeToString(), PROTOBUF, basin)
    assert status == 400
    assert gate.stream_names(basin) == ["pb-gauges"]
