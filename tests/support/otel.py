"""OpenTelemetry for the tests: the SDK's in-memory exporter and metric reader in this process,
and an OTLP/HTTP receiver on 127.0.0.1 that decodes the protobuf the SDK's OTLP exporters send
(from this process, its forked work horses and ``manage.py rqworker`` processes alike).

The SDK's providers can be set once per process: ``Telemetry.get()`` sets them up the first time
a test asks, with processors that keep nothing until a test turns them on (``recording``), so the
tests after it run as before.
"""

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry import metrics, trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

SPAN_KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


def _value(any_value):
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


class OtlpReceiver:
    """A small OTLP/HTTP receiver: ``spans`` (dicts, in the order they arrived) and ``metrics``
    (``{name: [data point dicts]}``) as the SDK's exporters sent them."""

    def __init__(self):
        self.spans, self.metric_points, self.requests = [], {}, 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/traces":
                    receiver.take_traces(body)
                elif self.path == "/v1/metrics":
                    receiver.take_metrics(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def take_traces(self, body):
        request = ExportTraceServiceRequest.FromString(body)
        spans = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append({
                        "name": span.name, "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                        "parent_id": span.parent_span_id.hex() or None, "kind": SPAN_KINDS[span.kind],
                        "start": span.start_time_unix_nano, "end": span.end_time_unix_nano,
                        "attributes": {a.key: _value(a.value) for a in span.attributes},
                        "events": [{"name": e.name, "attributes": {a.key: _value(a.value) for a in e.attributes}}
                                   for e in span.events],
                        "status": span.status.code, "service": resource.get("service.name"),
                        "instance": resource.get("service.instance.id"), "pid": resource.get("process.pid")})
        with self.lock:
            self.spans += spans
            self.requests += 1

    def take_metrics(self, body):
        request = ExportMetricsServiceRequest.FromString(body)
        with self.lock:
            self.requests += 1
            for resource_metrics in request.resource_metrics:
                for scope_metrics in resource_metrics.scope_metrics:
                    for metric in scope_metrics.metrics:
                        data = getattr(metric, metric.WhichOneof("data"))
                        for point in data.data_points:
                            entry = {"attributes": {a.key: _value(a.value) for a in point.attributes},
                                     "unit": metric.unit}
                            for field in ("count", "sum", "as_int", "as_double"):
                                if point.DESCRIPTOR.fields_by_name.get(field) is not None:
                                    entry[field] = getattr(point, field)
                            self.metric_points.setdefault(metric.name, []).append(entry)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


class _Gate(SpanProcessor):
    """A span processor that hands spans to ``inner`` only while ``recording`` is set."""

    def __init__(self, inner, telemetry):
        self.inner, self.telemetry = inner, telemetry

    def on_start(self, span, parent_context=None):
        pass

    def on_end(self, span):
        if self.telemetry.recording:
            self.inner.on_end(span)

    def shutdown(self):
        self.inner.shutdown()

    def force_flush(self, timeout_millis=30000):
        return self.inner.force_flush(timeout_millis)


class _Forward(SpanProcessor):
    """An OTLP exporter whose endpoint a test sets (``Telemetry.forward_to``); none: nothing sent."""

    def __init__(self):
        self.exporter = None

    def on_end(self, span):
        if self.exporter is not None:
            self.exporter.export([span])

    def shutdown(self):
        pass

    def force_flush(self, timeout_millis=30000):
        return True


class Telemetry:
    """The SDK set up in this process once: ``spans`` (in-memory), ``metric_reader``; ``recording``."""

    _instance = None

    def __init__(self):
        self.recording = False
        self.spans = InMemorySpanExporter()
        self.forward = _Forward()
        # Deltas: each reading holds what was recorded since the one before, so a test reads its own.
        self.metric_reader = InMemoryMetricReader(preferred_temporality={
            Counter: AggregationTemporality.DELTA, Histogram: AggregationTemporality.DELTA})
        provider = TracerProvider()
        provider.add_span_processor(_Gate(SimpleSpanProcessor(self.spans), self))
        provider.add_span_processor(_Gate(self.forward, self))
        trace.set_tracer_provider(provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[self.metric_reader]))
        self.provider = provider

    @classmethod
    def get(cls):
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def start(self, forward_to=None):
        self.spans.clear()
        self.metric_reader.get_metrics_data()  # the readings so far are not this test's
        self.forward.exporter = OTLPSpanExporter(endpoint=f"{forward_to}/v1/traces") if forward_to else None
        self.recording = True

    def stop(self):
        self.recording = False
        self.forward.exporter = None
        self.spans.clear()

    def metric_points(self):
        """``{name: [data point, ...]}`` of what the metrics recorded since the last reading."""
        points = {}
        data = self.metric_reader.get_metrics_data()
        for resource_metrics in (data.resource_metrics if data else []):
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    points.setdefault(metric.name, []).extend(metric.data.data_points)
        return points


def turns_counted(points):
    """What ``conversations.turns`` and its two histograms hold in ``points`` (``Telemetry.metric_points()``):
    ``({status: count}, time-to-done readings, deadline-margin readings)``."""
    counted = {}
    for point in points.get("conversations.turns", []):
        status = point.attributes["conversations.turn.status"]
        counted[status] = counted.get(status, 0) + point.value
    readings = lambda name: sum(p.count for p in points.get(name, []))  # noqa: E731
    return counted, readings("conversations.turn.duration"), readings("conversations.turn.deadline_margin")
