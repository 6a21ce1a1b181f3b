// The official OpenTelemetry JS SDK and its OTLP/HTTP exporters (http/protobuf for traces,
// metrics and logs; http/json for traces) against streamgate's /otlp/v1/{signal}, which
// STREAMGATE_BIN's binary serves. Each resource group lands in the stream its `s2.stream`
// resource attribute names, as one record with headers `s2-otlp.signal` and `content-type`
// and a body holding an Export*ServiceRequest with that one group in the encoding it came
// in. The records are read back through the REST API and decoded (protobufjs with the OTLP
// field numbers below, or JSON.parse).
import { test, beforeEach } from "node:test";
import assert from "node:assert/strict";
import protobuf from "protobufjs";
import { context, diag, DiagLogLevel, trace } from "@opentelemetry/api";
import { SeverityNumber } from "@opentelemetry/api-logs";
import { defaultResource, resourceFromAttributes } from "@opentelemetry/resources";
import { BasicTracerProvider, BatchSpanProcessor, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { MeterProvider, PeriodicExportingMetricReader } from "@opentelemetry/sdk-metrics";
import { BatchLogRecordProcessor, LoggerProvider } from "@opentelemetry/sdk-logs";
import { OTLPTraceExporter as ProtoTraceExporter } from "@opentelemetry/exporter-trace-otlp-proto";
import { OTLPTraceExporter as JsonTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { OTLPMetricExporter } from "@opentelemetry/exporter-metrics-otlp-proto";
import { OTLPLogExporter } from "@opentelemetry/exporter-logs-otlp-proto";
import { startServer } from "./server.mjs";

const { endpoint, token } = await startServer();
// The server's access token, when the harness has one, goes with every request.
const auth = token ? { authorization: `Bearer ${token}` } : {};
const basin = "node-otlp-basin";
const otlpHeaders = { "s2-basin": basin, ...auth };
const created = await fetch(`${endpoint}/v1/basins`, {
	method: "POST",
	headers: { "content-type": "application/json", ...auth },
	body: JSON.stringify({ basin, config: { create_stream_on_append: true } }),
});
assert.equal(created.status, 201);

// The exporters report a response they cannot decode, a partial success, or a failed export
// only through diag; any warning or error there fails the test.
const diagnostics = [];
const record = (level) => (...args) => diagnostics.push(`${level}: ${args.map(String).join(" ")}`);
diag.setLogger(
	{ error: record("error"), warn: record("warn"), info() {}, debug() {}, verbose() {} },
	DiagLogLevel.WARN,
);
beforeEach(() => {
	diagnostics.length = 0;
});

// The parts of the OTLP protos the checks read (field numbers as in opentelemetry-proto).
const { root } = protobuf.parse(`
syntax = "proto3";
package otlp;
message AnyValue {
  oneof value {
    string string_value = 1; bool bool_value = 2; int64 int_value = 3; double double_value = 4;
    ArrayValue array_value = 5; KeyValueList kvlist_value = 6; bytes bytes_value = 7;
  }
}
message ArrayValue { repeated AnyValue values = 1; }
message KeyValueList { repeated KeyValue values = 1; }
message KeyValue { string key = 1; AnyValue value = 2; }
message Resource { repeated KeyValue attributes = 1; }
message Scope { string name = 1; string version = 2; }
message Span {
  bytes trace_id = 1; bytes span_id = 2; bytes parent_span_id = 4; string name = 5; int32 kind = 6;
  fixed64 start_time_unix_nano = 7; fixed64 end_time_unix_nano = 8; repeated KeyValue attributes = 9;
}
message ScopeSpans { Scope scope = 1; repeated Span spans = 2; }
message ResourceSpans { Resource resource = 1; repeated ScopeSpans scope_spans = 2; }
message ExportTraceServiceRequest { repeated ResourceSpans resource_spans = 1; }
message NumberDataPoint { repeated KeyValue attributes = 7; double as_double = 4; sfixed64 as_int = 6; }
message Sum { repeated NumberDataPoint data_points = 1; int32 aggregation_temporality = 2; bool is_monotonic = 3; }
message HistogramDataPoint { repeated KeyValue attributes = 9; fixed64 count = 4; double sum = 5; }
message Histogram { repeated HistogramDataPoint data_points = 1; }
message Metric { string name = 1; string description = 2; string unit = 3; Sum sum = 7; Histogram histogram = 9; }
message ScopeMetrics { Scope scope = 1; repeated Metric metrics = 2; }
message ResourceMetrics { Resource resource = 1; repeated ScopeMetrics scope_metrics = 2; }
message ExportMetricsServiceRequest { repeated ResourceMetrics resource_metrics = 1; }
message LogRecord {
  int32 severity_number = 2; string severity_text = 3; AnyValue body = 5; repeated KeyValue attributes = 6;
  bytes trace_id = 9; bytes span_id = 10;
}
message ScopeLogs { Scope scope = 1; repeated LogRecord log_records = 2; }
message ResourceLogs { Resource resource = 1; repeated ScopeLogs scope_logs = 2; }
message ExportLogsServiceRequest { repeated ResourceLogs resource_logs = 1; }
`);
const decoders = {
	traces: root.lookupType("otlp.ExportTraceServiceRequest"),
	metrics: root.lookupType("otlp.ExportMetricsServiceRequest"),
	logs: root.lookupType("otlp.ExportLogsServiceRequest"),
};

/// Every record of `stream`: { headers: [[name, value]...], body: Buffer }.
async function readRecords(stream) {
	const response = await fetch(`${endpoint}/v1/streams/${encodeURIComponent(stream)}/records?seq_num=0`, {
		headers: { "s2-basin": basin, "s2-format": "base64", ...auth },
	});
	assert.equal(response.status, 200, await response.clone().text());
	const { records } = await response.json();
	const text = (b64) => Buffer.from(b64, "base64").toString();
	return records.map((r) => ({
		headers: (r.headers ?? []).map(([name, value]) => [text(name), text(value)]),
		body: Buffer.from(r.body ?? "", "base64"),
	}));
}

function assertHeaders(headers, signal, contentType) {
	const sorted = (pairs) => [...pairs].sort((a, b) => a[0].localeCompare(b[0]));
	assert.deepEqual(sorted(headers), sorted([["s2-otlp.signal", signal], ["content-type", contentType]]));
}

/// Decodes protobuf records of `signal`, checking headers and that each holds one group.
function decodeProtobuf(records, signal) {
	return records.map(({ headers, body }) => {
		assertHeaders(headers, signal, "application/x-protobuf");
		const message = decoders[signal].toObject(decoders[signal].decode(body), { longs: String });
		const groups = message.resourceSpans ?? message.resourceMetrics ?? message.resourceLogs;
		assert.equal(groups.length, 1);
		return groups[0];
	});
}

function anyValue(value) {
	if (value.arrayValue) return (value.arrayValue.values ?? []).map(anyValue);
	if (value.kvlistValue) return attributes(value.kvlistValue.values);
	if ("intValue" in value) return Number(value.intValue);
	for (const key of ["stringValue", "boolValue", "doubleValue"]) if (key in value) return value[key];
	return undefined;
}

/// A protobufjs-decoded or OTLP/JSON KeyValue list as a plain object.
function attributes(keyValues = []) {
	return Object.fromEntries(keyValues.map((kv) => [kv.key, anyValue(kv.value)]));
}

const hex = (bytes) => Buffer.from(bytes).toString("hex");

function resource(stream, service) {
	return defaultResource().merge(resourceFromAttributes({ "service.name": service, "s2.stream": stream }));
}

/// Emits a root span with two children, one with attributes; returns the root span.
function emitSpans(provider) {
	const tracer = provider.getTracer("compat.node", "4.5.6");
	const root = tracer.startSpan("checkout", { attributes: { "http.route": "/checkout" } });
	const parent = trace.setSpan(context.active(), root);
	tracer.startSpan("load-cart", { attributes: { "cart.items": 3 } }, parent).end();
	tracer
		.startSpan(
			"charge-card",
			{ attributes: { amount: 12.5, currency: "EUR", retry: false, tags: ["a", "b"] } },
			parent,
		)
		.end();
	root.end();
	return root;
}

test("traces through the http/protobuf exporter", async () => {
	const exporter = new ProtoTraceExporter({ url: `${endpoint}/otlp/v1/traces`, headers: otlpHeaders });
	const provider = new BasicTracerProvider({
		resource: resource("node-traces-proto", "checkout-node"),
		// A long delay, so that forceFlush sends every span in one request.
		spanProcessors: [new BatchSpanProcessor(exporter, { scheduledDelayMillis: 60_000 })],
	});
	const root = emitSpans(provider);
	await provider.forceFlush();
	await provider.shutdown();

	const records = await readRecords("node-traces-proto");
	assert.equal(records.length, 1);
	const [group] = decodeProtobuf(records, "traces");
	const res = attributes(group.resource.attributes);
	assert.equal(res["s2.stream"], "node-traces-proto");
	assert.equal(res["service.name"], "checkout-node");
	assert.equal(res["telemetry.sdk.language"], "nodejs");
	assert.equal(group.scopeSpans.length, 1);
	assert.deepEqual(group.scopeSpans[0].scope, { name: "compat.node", version: "4.5.6" });
	const spans = Object.fromEntries(group.scopeSpans[0].spans.map((s) => [s.name, s]));
	assert.deepEqual(Object.keys(spans).sort(), ["charge-card", "checkout", "load-cart"]);
	for (const span of Object.values(spans)) assert.equal(hex(span.traceId), root.spanContext().traceId);
	assert.equal(hex(spans.checkout.spanId), root.spanContext().spanId);
	assert.equal(hex(spans["load-cart"].parentSpanId), root.spanContext().spanId);
	assert.deepEqual(attributes(spans["charge-card"].attributes), {
		amount: 12.5,
		currency: "EUR",
		retry: false,
		tags: ["a", "b"],
	});
	assert.deepEqual(attributes(spans["load-cart"].attributes), { "cart.items": 3 });
	assert.ok(BigInt(spans.checkout.endTimeUnixNano) >= BigInt(spans.checkout.startTimeUnixNano));
	assert.deepEqual(diagnostics, []);
});

test("traces through the http/json exporter", async () => {
	const exporter = new JsonTraceExporter({ url: `${endpoint}/otlp/v1/traces`, headers: otlpHeaders });
	const provider = new BasicTracerProvider({
		resource: resource("node-traces-json", "checkout-json"),
		spanProcessors: [new BatchSpanProcessor(exporter, { scheduledDelayMillis: 60_000 })],
	});
	const root = emitSpans(provider);
	await provider.forceFlush();
	await provider.shutdown();

	const records = await readRecords("node-traces-json");
	assert.equal(records.length, 1);
	assertHeaders(records[0].headers, "traces", "application/json");
	const stored = JSON.parse(records[0].body.toString());
	assert.equal(stored.resourceSpans.length, 1);
	const [group] = stored.resourceSpans;
	const res = attributes(group.resource.attributes);
	assert.equal(res["s2.stream"], "node-traces-json");
	assert.equal(res["service.name"], "checkout-json");
	const spans = Object.fromEntries(group.scopeSpans[0].spans.map((s) => [s.name, s]));
	assert.deepEqual(Object.keys(spans).sort(), ["charge-card", "checkout", "load-cart"]);
	// OTLP/JSON carries ids as hex.
	for (const span of Object.values(spans)) assert.equal(span.traceId.toLowerCase(), root.spanContext().traceId);
	assert.equal(spans.checkout.spanId.toLowerCase(), root.spanContext().spanId);
	assert.equal(spans["load-cart"].parentSpanId.toLowerCase(), root.spanContext().spanId);
	assert.deepEqual(attributes(spans["charge-card"].attributes), {
		amount: 12.5,
		currency: "EUR",
		retry: false,
		tags: ["a", "b"],
	});
	assert.ok(BigInt(spans.checkout.endTimeUnixNano) >= BigInt(spans.checkout.startTimeUnixNano));
	assert.deepEqual(diagnostics, []);
});

test("gzip-compressed traces through the http/protobuf exporter", async () => {
	const exporter = new ProtoTraceExporter({
		url: `${endpoint}/otlp/v1/traces`,
		headers: otlpHeaders,
		compression: "gzip",
	});
	const provider = new BasicTracerProvider({
		resource: resource("node-traces-gzip", "gzip-node"),
		spanProcessors: [new SimpleSpanProcessor(exporter)],
	});
	const tracer = provider.getTracer("compat.gzip");
	const payload = "x".repeat(5000);
	for (let i = 0; i < 3; i++) tracer.startSpan(`gz-${i}`, { attributes: { payload, i } }).end();
	await provider.forceFlush();
	await provider.shutdown();

	// One request, so one record, per span; SimpleSpanProcessor does not wait for one export
	// before starting the next, so they may land in any order.
	const groups = decodeProtobuf(await readRecords("node-traces-gzip"), "traces");
	assert.equal(groups.length, 3);
	const spans = groups.map((g) => g.scopeSpans[0].spans[0]).sort((a, b) => a.name.localeCompare(b.name));
	assert.deepEqual(spans.map((s) => s.name), ["gz-0", "gz-1", "gz-2"]);
	spans.forEach((s, i) => assert.deepEqual(attributes(s.attributes), { payload, i }));
	assert.deepEqual(diagnostics, []);
});

test("metrics through the http/protobuf exporter", async () => {
	const exporter = new OTLPMetricExporter({ url: `${endpoint}/otlp/v1/metrics`, headers: otlpHeaders });
	// An hour between periodic exports: only forceFlush sends.
	const reader = new PeriodicExportingMetricReader({ exporter, exportIntervalMillis: 3_600_000 });
	const provider = new MeterProvider({ resource: resource("node-metrics", "orders-node"), readers: [reader] });
	const meter = provider.getMeter("compat.meter", "0.1");
	const orders = meter.createCounter("orders.placed", { description: "orders placed" });
	const latency = meter.createHistogram("order.latency", { unit: "ms" });
	orders.add(3, { region: "eu" });
	orders.add(4, { region: "eu" });
	orders.add(10, { region: "us" });
	for (const value of [5, 15, 25]) latency.record(value, { region: "eu" });
	await provider.forceFlush();

	const records = await readRecords("node-metrics");
	assert.equal(records.length, 1);
	const [group] = decodeProtobuf(records, "metrics");
	const res = attributes(group.resource.attributes);
	assert.equal(res["s2.stream"], "node-metrics");
	assert.equal(res["service.name"], "orders-node");
	const metrics = Object.fromEntries(group.scopeMetrics.flatMap((s) => s.metrics).map((m) => [m.name, m]));
	assert.deepEqual(Object.keys(metrics).sort(), ["order.latency", "orders.placed"]);

	const counter = metrics["orders.placed"];
	assert.equal(counter.description, "orders placed");
	assert.equal(counter.sum.isMonotonic, true);
	const byRegion = Object.fromEntries(
		counter.sum.dataPoints.map((p) => [attributes(p.attributes).region, Number(p.asInt ?? p.asDouble)]),
	);
	assert.deepEqual(byRegion, { eu: 7, us: 10 });

	const histogram = metrics["order.latency"];
	assert.equal(histogram.unit, "ms");
	assert.equal(histogram.histogram.dataPoints.length, 1);
	const [point] = histogram.histogram.dataPoints;
	assert.equal(Number(point.count), 3);
	assert.equal(point.sum, 45);
	await provider.shutdown();
	assert.deepEqual(diagnostics, []);
});

test("logs through the http/protobuf exporter", async () => {
	const exporter = new OTLPLogExporter({ url: `${endpoint}/otlp/v1/logs`, headers: otlpHeaders });
	const provider = new LoggerProvider({
		resource: resource("node-logs", "billing-node"),
		processors: [new BatchLogRecordProcessor({ exporter, scheduledDelayMillis: 60_000 })],
	});
	const logger = provider.getLogger("compat.logger");
	const span = new BasicTracerProvider().getTracer("compat").startSpan("invoice");
	logger.emit({
		body: "invoice created",
		severityNumber: SeverityNumber.INFO,
		severityText: "INFO",
		attributes: { "invoice.id": 1001 },
		context: trace.setSpan(context.active(), span),
	});
	span.end();
	logger.emit({
		body: "payment declined",
		severityNumber: SeverityNumber.WARN,
		attributes: { reason: "insufficient funds", attempt: 2 },
	});
	logger.emit({ body: { order: 42, items: ["pen", "ink"], paid: true }, severityNumber: SeverityNumber.ERROR });
	await provider.forceFlush();
	await provider.shutdown();

	const records = await readRecords("node-logs");
	assert.equal(records.length, 1);
	const [group] = decodeProtobuf(records, "logs");
	const res = attributes(group.resource.attributes);
	assert.equal(res["s2.stream"], "node-logs");
	assert.equal(res["service.name"], "billing-node");
	assert.equal(group.scopeLogs[0].scope.name, "compat.logger");
	const logs = group.scopeLogs.flatMap((s) => s.logRecords);
	assert.deepEqual(logs.map((l) => anyValue(l.body)), [
		"invoice created",
		"payment declined",
		{ order: 42, items: ["pen", "ink"], paid: true },
	]);
	assert.deepEqual(logs.map((l) => l.severityNumber), [9, 13, 17]);
	assert.equal(logs[0].severityText, "INFO");
	assert.deepEqual(attributes(logs[0].attributes), { "invoice.id": 1001 });
	assert.deepEqual(attributes(logs[1].attributes), { reason: "insufficient funds", attempt: 2 });
	assert.equal(hex(logs[0].traceId), span.spanContext().traceId);
	assert.equal(hex(logs[0].spanId), span.spanContext().spanId);
	assert.deepEqual(diagnostics, []);
});

test("the exporters report a group without s2.stream as a partial success", async () => {
	// Spans from two providers (one resource naming a stream, one not) handed to the JSON
	// exporter together go out as one request with two resource groups.
	const exporter = new JsonTraceExporter({ url: `${endpoint}/otlp/v1/traces`, headers: otlpHeaders });
	const spansOf = (res) => {
		const finished = [];
		const provider = new BasicTracerProvider({
			resource: res,
			spanProcessors: [{ onStart() {}, onEnd: (s) => finished.push(s), forceFlush: async () => {}, shutdown: async () => {} }],
		});
		provider.getTracer("compat").startSpan("one").end();
		provider.getTracer("compat").startSpan("two").end();
		return finished;
	};
	const good = spansOf(resource("node-partial", "good"));
	const bad = spansOf(resourceFromAttributes({ "service.name": "no-stream" }));
	const result = await new Promise((resolve) => exporter.export([...good, ...bad], resolve));
	await exporter.shutdown();
	// A partial success is still a success for the exporter; it only warns through diag.
	assert.equal(result.code, 0, String(result.error));
	assert.ok(
		diagnostics.some((d) => d.includes("Partial Success") && /"rejectedSpans":"?2"?[,}]/.test(d)),
		diagnostics.join("\n"),
	);
	const records = await readRecords("node-partial");
	assert.equal(records.length, 1);
	const stored = JSON.parse(records[0].body.toString());
	assert.deepEqual(stored.resourceSpans[0].scopeSpans[0].spans.map((s) => s.name), ["one", "two"]);
});
