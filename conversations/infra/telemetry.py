"""OpenTelemetry traces and metrics of turns, calls and tools: the one module that imports
``opentelemetry`` (the optional extra ``conversations[otel]``).

Without the package every function here does nothing and returns at once: no import is
tried again, no span or instrument is made. With it, spans and measurements go to whatever
providers the process has: the site's own (set up by its code or ``opentelemetry-instrument``),
or the SDK's, which ``configure()`` sets up when ``CONVERSATIONS["TELEMETRY"]`` is ``"otlp"``
(the exporters read the SDK's standard ``OTEL_*`` environment variables) or ``"console"``.

The span tree (docs/observability.md)::

    conversations.turn.enqueue      PRODUCER, in the web request (or the admin's re-run)
    └─ conversations.turn.job       CONSUMER, one per RQ job; parented through the job's meta
       ├─ chat {model}              CLIENT, one per provider attempt (GenAI attributes)
       └─ execute_tool {tool}       INTERNAL, one per tool run
    └─ conversations.turn.resume    INTERNAL, made where a dead or stopping job's turn is continued
       └─ conversations.turn.job    the continuation

Call and tool spans are made from the call records (``CallRecord``) once they are saved, with the
same start and duration as the admin's timeline shows: one story, told twice. Message text is put
in a span only when ``CONVERSATIONS["TELEMETRY_CONTENT"]`` is on.
"""

import importlib
import json
import logging
import math
import os
import threading
import time
from contextlib import contextmanager
from contextvars import ContextVar

from ..redaction import hide_keys
from .watchdog import BODY, CONNECT, FIRST_BYTE, SEND

try:
    from opentelemetry import context as otel_context
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # the extra is not installed: everything below is a no-op
    trace = None

logger = logging.getLogger("conversations.telemetry")

SCOPE = "conversations"
AVAILABLE = trace is not None
# The meta key of an RQ job that carries the trace context of the request that enqueued it.
META_KEY = "otel"
# The key, beside the trace context in a continuation's meta, of what its job span says of the
# job before it (``resume_span``): propagators read only their own keys (``traceparent``...).
PREVIOUS_KEY = "conversations.previous_job"

# The outcomes of a call record that are no error (``core.types.Outcome``'s values).
NOT_ERRORS = {"ok", "skipped", "cancelled"}
# The phase a timed-out call ended in, as its record's detail names it (``http._failure``).
PHASES = {CONNECT: "connect", SEND: "send", FIRST_BYTE: "first_byte", BODY: "body"}
# Gauge values of a breaker's state.
BREAKER_STATES = {"closed": 0, "half-open": 1, "open": 2}

_configured_in = None  # the pid of the process whose configure() set up the SDK
_metrics_mode = None  # the mode whose meter provider is still to be set up (at the first measurement)
_span_exporter = None  # the exporter whose tracer provider is still to be set up (at the first span)
_metric_exporter = None  # the same for the meter provider (at the first measurement)
_sdk_resource = None  # the resource configure() made, which every provider of this process and its forks shares
_horses_of = None  # the pid of a forking worker's parent (``warm_up(forking=True)``)
_setup_lock = threading.Lock()
_flushing = False  # a work horse sending what it holds before it exits (``flush``)
# A forking worker's parent (``warm_up(forking=True)``, the SDK configured here) aggregates its
# horses' measurements: each horse writes what its job measured to this pipe (read end, write end)
# as its job ends, and the parent exports them with its own, every OTEL_METRIC_EXPORT_INTERVAL
# (``from_horses``). None: every process measures and exports for itself.
_from_horses = None
_held = []  # the measurements a forking worker's parent has not exported yet
_exported_at = 0.0  # when (monotonic) the parent last exported them
# The level of each up-down counter a forking worker's parent reports, by instrument and attributes
# (JSON): each export is a meter provider of its own, whose sum starts at zero (``_with_levels``).
_levels = {}
UP_DOWN = {"in_flight"}  # the instruments ``_levels`` keeps
# The pid of a forking worker's parent while it runs a work horse for a turn (``horse_in_flight``):
# the parent counts that turn in flight, and the horse, which inherits this, does not count it again.
_counting_horses = None


def enabled():
    return AVAILABLE


def configure(mode):
    """Set up the SDK for ``mode`` (``"otlp"``, ``"console"``; ``""`` leaves the process's
    providers as the site set them). Once per process; never raises: a site whose exporter cannot
    be built still serves its visitors (the reason is logged).

    The exporter and the resource are made now; the providers when the process first needs
    them: the tracer provider at the first span (``_tracer``), the meter provider at the first
    measurement (``instruments``). A forking worker's parent (``warm_up(forking=True)``) makes
    no tracer provider until it makes a span of its own (a horse died): each horse makes its own,
    with the parent's resource, at its job's start; and no lasting meter provider: its horses hand
    it their measurements, which it exports with its own (``from_horses``). A provider in the parent would run
    the SDK's at-fork handlers in every horse (each recomputes the process's resource in a new
    thread pool: milliseconds of every fork), and a thread exporting metrics in the parent at
    the moment of a fork would leave the SDK's locks held in the horse for ever."""
    global _configured_in, _metrics_mode, _span_exporter, _metric_exporter, _sdk_resource
    if not mode or not AVAILABLE or _configured_in is not None:
        return False
    try:
        span_exporter, metric_exporter = _make_exporters(mode)
        resource = _resource()
    except Exception:  # noqa: BLE001 - telemetry never stops a site
        logger.exception("Could not set up OpenTelemetry (TELEMETRY=%r)", mode)
        return False
    _configured_in, _metrics_mode, _sdk_resource = os.getpid(), mode, resource
    _span_exporter, _metric_exporter = span_exporter, metric_exporter
    return True


def _make_exporters(mode):
    """The span and the metric exporter of ``mode``. Made once, in the process that configures the
    SDK: a forking worker's horses inherit them unused (no connection open yet) rather than each
    making its own."""
    if mode == "otlp":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(), OTLPMetricExporter()
    if mode == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter(), ConsoleMetricExporter()
    raise ValueError(f"unknown TELEMETRY mode {mode!r}")


def _setup_traces():
    """Set up the tracer provider ``configure()`` left for later, once per process (a horse
    forked before its parent made one makes its own)."""
    global _span_exporter
    with _setup_lock:
        exporter, _span_exporter = _span_exporter, None
        if exporter is None:
            return
        try:
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            provider = TracerProvider(resource=_sdk_resource)
            provider.add_span_processor(BatchSpanProcessor(exporter))
            trace.set_tracer_provider(provider)
        except Exception:  # noqa: BLE001 - telemetry never stops a site
            logger.exception("Could not set up OpenTelemetry's traces")


def _exports_when_flushed():
    """Whether this process's metrics are exported only when flushed: a forking worker's parent
    and its horses (see ``configure``): ``_horses_of``, set in the parent (only where it configured
    the SDK), is inherited by each horse."""
    return _horses_of is not None


def _resource():
    from opentelemetry.sdk.resources import Resource

    # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES are read by Resource.create().
    return Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or "conversations"})


def _setup_metrics(periodic=True):
    """Set up the meter provider ``configure()`` left for later, once: exporting every
    ``OTEL_METRIC_EXPORT_INTERVAL`` in a thread, or (``periodic`` False) only when flushed."""
    global _metrics_mode
    with _setup_lock:
        mode, _metrics_mode = _metrics_mode, None
        if mode is None:
            return
        try:
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

            reader = PeriodicExportingMetricReader(_metric_exporter,
                                                   export_interval_millis=None if periodic else math.inf)
            otel_metrics.set_meter_provider(MeterProvider(resource=_sdk_resource, metric_readers=[reader]))
        except Exception:  # noqa: BLE001 - telemetry never stops a site
            logger.exception("Could not set up OpenTelemetry's metrics (TELEMETRY=%r)", mode)


def flush(timeout_millis=5000):
    """Export what this process holds now. Called at the end of a job in a forked work horse,
    which ends with ``os._exit`` and so would drop what its batch processors held."""
    global _flushing
    if not AVAILABLE:
        return
    _flushing = True
    try:
        for provider in (trace.get_tracer_provider(), otel_metrics.get_meter_provider()):
            force_flush = getattr(provider, "force_flush", None)
            if force_flush is not None:
                try:
                    force_flush(timeout_millis)
                except Exception:  # noqa: BLE001
                    logger.warning("Could not flush telemetry", exc_info=True)
    finally:
        _flushing = False


def forked():
    """Whether this process is a fork of the one that set up the SDK (a forking worker's horse)."""
    return _configured_in is not None and _configured_in != os.getpid()


_tracers = {}


def _tracer():
    """The app's tracer, made once per tracer provider (a test or a site may set the provider late)."""
    if _span_exporter is not None:
        _setup_traces()
    provider = trace.get_tracer_provider()
    tracer = _tracers.get(id(provider))
    if tracer is None:
        tracer = _tracers[id(provider)] = trace.get_tracer(SCOPE)
    return tracer


def warm_up(forking=False):
    """Make the tracer and the instruments now, so that no turn waits for their making. ``forking``:
    this is a forking worker's parent; when the app set up the SDK here (``configure``), it makes
    no provider (each horse makes its tracer provider at its job's start, and hands its
    measurements to this process when it ends: see ``configure``), opens the pipe they come
    through, and only rehearses a span. The providers a site set up itself are
    its own: their tracer and instruments are made here for every horse to inherit."""
    global _horses_of, _from_horses, _exported_at
    if AVAILABLE:
        _adopt()
        if forking and _configured_in == os.getpid():
            _horses_of = os.getpid()
            _from_horses, _exported_at = _pipe(), time.monotonic()
            _rehearse(own_provider=True)
            # The OTLP exporters' HTTP client (requests) imports ``netrc`` (and ``shlex``) at its first
            # request, to look for credentials: each horse, whose first request is its export, did
            # (about a tenth of its job's CPU with tracing on, sampled with cProfile).
            importlib.import_module("netrc")
            return
        _tracer()
        instruments()
        _rehearse()


def _adopt():
    """Take over, in a worker forked from the process that configured the SDK (``manage.py
    rqworker-pool`` forks its workers from its own process) before that process made a provider,
    the part the configuring process would have had: the worker is then set up as one started
    alone (a forking worker's parent with no provider and no export thread, a concurrent worker's
    jobs measured as they run), not as a work horse. Providers already made are inherited as
    they are."""
    global _configured_in
    if forked() and _span_exporter is not None and _metrics_mode is not None:
        _configured_in = os.getpid()


def _rehearse(own_provider=False):
    """Start, once, a span as a job does (a parent read from a job's meta, attributes of every
    type the app sets), so that the work horses forked from this process find the interpreter's
    ``isinstance`` caches of the API's abstract classes (``Span``, ``Sequence``) filled: each
    horse filled them again for its turn (about 3 ms of a horse's job span, sampled with py-spy).
    The span is never ended, so never exported. ``own_provider``: with a tracer provider of its
    own, dropped at once (not shut down at exit: nothing holds it), so that no horse runs its
    at-fork handler."""
    if own_provider:
        from opentelemetry.sdk.trace import TracerProvider

        tracer = TracerProvider(resource=_sdk_resource, shutdown_on_exit=False).get_tracer(SCOPE)
    else:
        tracer = _tracer()
    parent = _extract({"traceparent": f"00-{'1' * 32}-{'1' * 16}-01"})
    span = tracer.start_span("conversations.warm_up", context=parent, kind=SpanKind.CONSUMER,
                             attributes={"str": "-", "int": 1, "float": 1.0, "bool": True, "list": ["-"]})
    trace.get_current_span(trace.set_span_in_context(span, parent))


# -- context through RQ -------------------------------------------------------------------


def carrier():
    """The current trace context as a dict for a job's meta (W3C ``traceparent``), or None."""
    if not AVAILABLE:
        return None
    data = {}
    propagate.inject(data)
    return data or None


def _extract(data):
    return propagate.extract(data) if data else otel_context.Context()


# -- spans ----------------------------------------------------------------------------------


@contextmanager
def enqueue_span(**attributes):
    """The span of a request that starts a turn; a job enqueued inside it carries its context."""
    if not AVAILABLE:
        yield None
        return
    with _tracer().start_as_current_span("conversations.turn.enqueue", kind=SpanKind.PRODUCER,
                                         attributes=_clean(attributes)) as span:
        yield span


def set_attributes(span, **attributes):
    if span is not None:
        span.set_attributes(_clean(attributes))


class JobTrace:
    """The span of one job of a turn, and the spans of its call records (``record``)."""

    def __init__(self, span, context, *, content=False):
        self.span = span
        self.context = context  # the job span's, as the parent of its call spans
        self.content = content
        # The epoch (ns) of offset 0 of the turn's budget: a record's start is this plus its offset.
        self.zero_ns = time.time_ns()

    def anchor(self, elapsed):
        """Place offset 0 of the records at ``elapsed`` seconds before now (the budget's start)."""
        self.zero_ns = time.time_ns() - int(elapsed * 1e9)

    def record(self, record, info=None):
        """One span for a saved call record (``kind`` model or tool), timed as the timeline times it."""
        info = info or {}
        start = self.zero_ns + int(record.started_offset * 1e9)
        end = start + int(max(0.0, record.duration or 0.0) * 1e9)
        error = None if record.outcome in NOT_ERRORS else record.outcome
        common = {"conversations.call.outcome": record.outcome, "conversations.call.attempt": record.attempt,
                  "conversations.call.timeout": record.timeout,
                  "conversations.call.remaining_before": record.remaining_before, "error.type": error}
        if record.kind == "tool":
            name = f"execute_tool {record.name}"
            attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": record.name, **common}
            kind = SpanKind.INTERNAL
        else:
            name = f"chat {record.name}"
            provider = info.get("provider") or ""
            attributes = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": provider, "gen_ai.system": provider,
                          "gen_ai.request.model": record.name, "http.response.status_code": record.status_code,
                          "conversations.call.fallback": info.get("fallback", 0),
                          "conversations.breaker.state": info.get("breaker"), **common}
            reply = info.get("reply")
            if reply is not None:
                attributes.update({"gen_ai.response.model": reply.get("model") or record.name,
                                   "gen_ai.response.finish_reasons": [reply["finish"]] if reply.get("finish") else None,
                                   "gen_ai.usage.input_tokens": reply.get("input_tokens"),
                                   "gen_ai.usage.output_tokens": reply.get("output_tokens")})
                if self.content and reply.get("text") is not None:
                    attributes["gen_ai.output.messages"] = json.dumps(
                        [{"role": "assistant", "parts": [{"type": "text", "content": reply["text"]}]}])
            kind = SpanKind.CLIENT
            metric_attributes = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": provider,
                                 "gen_ai.request.model": record.name, "error.type": error}
            if record.outcome != "skipped":
                _measure("operation_duration", record.duration or 0.0, _clean(metric_attributes))
                if error:
                    _measure("provider_errors", 1, _clean(metric_attributes), "add")
                if reply is not None:
                    for token_type in ("input", "output"):
                        if reply.get(f"{token_type}_tokens") is not None:
                            _measure("token_usage", reply[f"{token_type}_tokens"], _clean(
                                {**metric_attributes, "gen_ai.response.model": reply.get("model") or record.name,
                                 "gen_ai.token.type": token_type}))
        if record.outcome == "timeout":
            attributes["conversations.call.phase"] = next(
                (name for words, name in PHASES.items() if f"timed out {words}" in (record.detail or "")), None)
        if record.detail and error and self.content:
            # The timeline's line for a failed call (keys hidden): only with TELEMETRY_CONTENT, since a
            # provider's error may quote the request (the visitor's text) and a failed tool's is its
            # result, a message of the transcript. Without it, the span says what carries no content:
            # ``error.type``, the HTTP status and, for a timeout, the phase.
            attributes["conversations.call.detail"] = hide_keys(record.detail)
        span = _tracer().start_span(name, context=self.context, kind=kind, attributes=_clean(attributes),
                                    start_time=start)
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=end)

    def outcome(self, status, margin_left, **attributes):
        """The turn's outcome and the margin left at its final write, on the job span."""
        self.span.set_attributes(_clean({"conversations.turn.status": status,
                                         "conversations.turn.margin_left": margin_left, **attributes}))
        if status == "failed":
            self.span.set_status(Status(StatusCode.ERROR, status))


@contextmanager
def job_span(meta, **attributes):
    """The span of one job (``meta``: the job's meta, whose trace context is its parent), current
    inside the block; yields a ``JobTrace`` (None without the extra). Each thread of a concurrent
    worker has its own current context, so its turns' spans never mix."""
    if not AVAILABLE:
        yield None
        return
    content = bool(attributes.pop("content", False))
    # A forked work horse's metrics leave it when its job ends (to its parent, or ``flush``), not
    # before: it makes its measurements then too, after the turn's final write, which an operator cannot tell
    # apart, and the visitor's turn no longer waits for the SDK's first touch, in a fresh
    # process, of each instrument and aggregation.
    pending = _pending.set([]) if forked() else None
    carried = (meta or {}).get(META_KEY) or {}
    parent = _extract(carried)
    span = _tracer().start_span("conversations.turn.job", context=parent, kind=SpanKind.CONSUMER,
                                attributes=_clean(attributes))
    if carried.get(PREVIOUS_KEY):  # a continuation: the job before it died (its span with it) or handed over
        span.add_event("conversations.job.previous_attempt", attributes=_clean(carried[PREVIOUS_KEY]))
    token = otel_context.attach(trace.set_span_in_context(span, parent))
    job = JobTrace(span, trace.set_span_in_context(span, parent), content=content)
    try:
        yield job
    except BaseException as exc:
        if content:
            span.record_exception(exc)
        else:  # its message may quote what the job was handling (a database error quotes values)
            span.add_event("exception", attributes={"exception.type": type(exc).__name__})
        span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        raise
    finally:
        if pending is not None:
            _measure_pending()
            _pending.reset(pending)
        otel_context.detach(token)
        span.end()


def resume_span(meta, *, died=True, **attributes):
    """The span of a turn continued by a new job (instant: made where the death or the stop was
    noticed), child of the request's span; returns what the continuation's meta carries: this
    span's context, and what its job span records as an event of the job before it (``died``:
    that job was killed, so its own span was lost with it, or False: it handed the turn over)."""
    if not AVAILABLE:
        return None
    parent = _extract((meta or {}).get(META_KEY))
    span = _tracer().start_span("conversations.turn.resume", context=parent, kind=SpanKind.INTERNAL,
                                attributes=_clean(attributes))
    span.end()
    data = {}
    propagate.inject(data, context=trace.set_span_in_context(span, parent))
    data[PREVIOUS_KEY] = {key: attributes.get(key) for key in (
        "conversations.resume.from_job", "conversations.resume.cause", "conversations.resume.number")}
    data[PREVIOUS_KEY]["conversations.resume.previous_job_died"] = died
    return data


# -- metrics --------------------------------------------------------------------------------

_instruments = None
_instruments_lock = threading.Lock()
# The measurements a forked work horse's job keeps until it ends (``job_span``); None: make them now.
_pending = ContextVar("conversations_telemetry_pending", default=None)


def _measure(instrument, value, attributes, method="record"):
    """``instruments().<instrument>.<method>(value, attributes)``, now or when the job ends (in a
    forking worker's parent: when it exports, ``from_horses``)."""
    pending = _pending.get()
    if pending is not None:
        pending.append((instrument, method, value, attributes))
    elif _from_horses is not None and _horses_of == os.getpid():
        _held.append((instrument, method, value, attributes))
    else:
        instruments().record_all([(instrument, method, value, attributes)])


def _measure_pending():
    """Make the measurements a horse's job kept: hand them to its parent where it aggregates
    them, or record them here."""
    pending = _pending.get()
    if _from_horses is not None:
        _to_parent(pending)
    else:
        instruments().record_all(pending)
    pending.clear()


# -- a forking worker's metrics, aggregated in its parent -------------------------------------
#
# A horse that exported its own metrics paid, after the turn's final write, for a meter provider,
# the instruments and their aggregations made anew in a fresh fork, and an OTLP request of its own
# (about half the CPU tracing added to its job: docs/benchmarks.md). It writes its measurements to
# its parent instead, one line of JSON, and the parent exports every horse's together. The parent
# keeps no meter provider between exports: one made for each export and dropped after it, so that
# no SDK at-fork handler runs in the horses and no export thread holds a lock at a fork.


def _pipe():
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)  # a parent that stopped reading never blocks a horse: it loses the line
    try:
        import fcntl

        fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, 1 << 20)  # room for a long turn's line (Linux; 64 KiB without)
    except (ImportError, AttributeError, OSError):
        pass
    return read, write


def _to_parent(pending):
    data = (json.dumps(pending) + "\n").encode()
    try:
        while data:
            data = data[os.write(_from_horses[1], data):]
    except OSError:  # BlockingIOError: the pipe is full
        logger.warning("Could not hand this job's measurements to the worker's parent", exc_info=True)


def from_horses(final=False, horse_running=False):
    """Called by a forking worker's parent between jobs (at least every second when idle), while a
    horse runs (``horse_running``: when ``next_export_in()`` says an export is due) and, with
    ``final``, as it exits: take what its horses measured (not while one runs: it writes only as its
    job ends), and export it with what the parent measured itself once ``OTEL_METRIC_EXPORT_INTERVAL``
    (60 s by default, as the SDK's) has passed since its last export; ``final``: now. Returns
    nothing; never raises."""
    global _exported_at
    if _from_horses is None or _horses_of != os.getpid():
        return
    if not horse_running:
        _read_horses()
    if _has_to_report() and (final or time.monotonic() - _exported_at >= _export_interval()):
        _exported_at = time.monotonic()
        _export_held()


def next_export_in():
    """Seconds until a forking worker's parent is due to export (0: now), or None where this process
    is no such parent or has nothing to report (then nothing is due)."""
    if _from_horses is None or _horses_of != os.getpid() or not _has_to_report():
        return None
    return max(0.0, _exported_at + _export_interval() - time.monotonic())


def _has_to_report():
    """Measurements held, or a turn in flight: reported at every export while it runs."""
    return bool(_held) or any(_levels.values())


def _export_interval():
    try:
        return float(os.environ.get("OTEL_METRIC_EXPORT_INTERVAL") or 60000) / 1000
    except ValueError:  # as the SDK's reader does with a value it cannot read
        return 60.0


def _read_horses():
    """Take the lines the horses wrote to the pipe into ``_held``; called when no horse runs."""
    received = b""
    try:
        while chunk := os.read(_from_horses[0], 1 << 16):
            received += chunk
    except BlockingIOError:
        pass
    except OSError:  # noqa: BLE001 - telemetry never stops a worker
        logger.warning("Could not read the work horses' measurements", exc_info=True)
    # No horse is running now: a line without its end is one a horse was killed while it wrote.
    *lines, cut = received.split(b"\n")
    for line in lines:
        try:
            _held.extend(json.loads(line))
        except ValueError:
            cut = line
    if cut:
        logger.warning("Dropped the measurements of a work horse killed while it handed them over")


def _export_held():
    """Export the parent's held measurements through a meter provider of their own, then drop it."""
    held = _with_levels(_held)
    _held.clear()
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        reader = PeriodicExportingMetricReader(_metric_exporter, export_interval_millis=math.inf)
        provider = MeterProvider(resource=_sdk_resource, metric_readers=[reader], shutdown_on_exit=False)
        _Instruments(provider.get_meter(SCOPE)).record_all(held)
        provider.force_flush(5000)
    except Exception:  # noqa: BLE001 - telemetry never stops a worker
        logger.warning("Could not export the work horses' measurements", exc_info=True)


def _with_levels(held):
    """``held`` with the changes of each up-down counter (``UP_DOWN``) added to its level in
    ``_levels``, and that level in their place, for every attribute set seen so far (0 included):
    a provider made for one export adds the level, so the sum it exports is the level now."""
    measurements = []
    for instrument, method, value, attributes in held:
        if instrument in UP_DOWN:
            key = json.dumps([instrument, method, attributes], sort_keys=True)
            _levels[key] = _levels.get(key, 0) + value
        else:
            measurements.append((instrument, method, value, attributes))
    for key, level in _levels.items():
        instrument, method, attributes = json.loads(key)
        measurements.append((instrument, method, level, attributes))
    return measurements


class _Instruments:
    def __init__(self, meter):
        seconds = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160]
        self.turns = meter.create_counter("conversations.turns", unit="{turn}",
                                          description="Turns ended, by status and assistant.")
        self.first_word = meter.create_histogram(
            "conversations.turn.time_to_first_word", unit="s", explicit_bucket_boundaries_advisory=seconds,
            description="From the visitor's message being queued to the first word of the answer shown.")
        self.duration = meter.create_histogram(
            "conversations.turn.duration", unit="s", explicit_bucket_boundaries_advisory=seconds,
            description="From the visitor's message being queued to the turn's final write.")
        self.margin = meter.create_histogram(
            "conversations.turn.deadline_margin", unit="s", explicit_bucket_boundaries_advisory=seconds,
            description="Seconds left before RQ's job timeout at the turn's final write.")
        self.queue_wait = meter.create_histogram(
            "conversations.queue.wait", unit="s", explicit_bucket_boundaries_advisory=seconds,
            description="From a turn being queued to a worker starting it.")
        self.in_flight = meter.create_up_down_counter("conversations.turns.in_flight", unit="{turn}",
                                                      description="Turns running in this worker process now.")
        self.operation_duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s", explicit_bucket_boundaries_advisory=seconds,
            description="GenAI operation duration (one provider attempt).")
        self.token_usage = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}",
            explicit_bucket_boundaries_advisory=[1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576],
            description="Input and output tokens used.")
        self.provider_errors = meter.create_counter("conversations.provider.errors", unit="{error}",
                                                    description="Provider attempts that failed, by error kind.")
        self.breaker = meter.create_gauge("conversations.breaker.state", unit="1",
                                          description="A provider's circuit: 0 closed, 1 half-open, 2 open.")
        self.polls = meter.create_histogram(
            "conversations.poll.duration", unit="s",
            explicit_bucket_boundaries_advisory=[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1],
            description="Poll requests answered, by HTTP status (200, 304, ...), and their latency.")
        self.handoffs = None

    def record_all(self, measurements):
        """Make ``measurements``, ``(instrument, method, value, attributes)`` each (``_measure``'s)."""
        for instrument, method, value, attributes in measurements:
            getattr(getattr(self, instrument), method)(value, attributes)


def instruments():
    global _instruments
    if _instruments is None:
        if _metrics_mode is not None:
            _setup_metrics(periodic=not _exports_when_flushed())
        with _instruments_lock:
            if _instruments is None:
                _instruments = _Instruments(otel_metrics.get_meter(SCOPE))
                if _handoff_count is not None:
                    _observe_handoffs(_instruments)
    return _instruments


def count_turn(status, assistant, *, duration=None, margin=None):
    if not AVAILABLE:
        return
    attributes = _clean({"conversations.turn.status": status, "conversations.assistant": assistant})
    _measure("turns", 1, attributes, "add")
    if duration is not None:
        _measure("duration", max(0.0, duration), attributes)
    if margin is not None:
        _measure("margin", max(0.0, margin), attributes)


def first_word(assistant, seconds):
    if AVAILABLE:
        _measure("first_word", max(0.0, seconds), _clean({"conversations.assistant": assistant}))


def queue_wait(seconds, assistant):
    if AVAILABLE:
        _measure("queue_wait", max(0.0, seconds), _clean({"conversations.assistant": assistant}))


def in_flight(change, worker):
    """A turn starts (+1) or ends (-1) in ``worker``; in a forking worker's work horse nothing: its
    parent counts it (``horse_in_flight``)."""
    if AVAILABLE and _counting_horses in (None, os.getpid()):
        _measure("in_flight", change, {"conversations.worker.name": worker}, "add")


@contextmanager
def horse_in_flight(worker):
    """In a forking worker's parent, around the work horse of one turn's job, from before its fork
    to its end, however it ends (its job's end, an exception, SIGKILL, the parent killing it past
    its job timeout): the turn is in flight in ``worker`` for that long. The parent counts it, as it
    lives (and exports) for the whole run; the horse, which measures only when its job ends, would
    report the rise with the fall. The horse inherits ``_counting_horses`` and skips its own count."""
    global _counting_horses
    if not AVAILABLE:
        yield
        return
    _counting_horses = os.getpid()
    in_flight(1, worker)
    try:
        yield
    finally:
        in_flight(-1, worker)
        _counting_horses = None


def breaker_state(label, state):
    if AVAILABLE:
        _measure("breaker", BREAKER_STATES.get(state, 0), {"conversations.provider": label}, "set")


def poll_answered(status_code, seconds):
    """Measure a poll answered ``status_code`` in ``seconds``: nothing but a look at the instrument
    while no meter provider is set (every widget polls; see ``_drops``)."""
    if AVAILABLE and not _drops(instruments().polls):
        _measure("polls", seconds, {"http.response.status_code": status_code})


def _drops(instrument):
    """Whether ``instrument`` drops what it is given: the API's proxy instrument, made while no
    meter provider was set, until one is set (it then makes its real instrument and keeps what it
    is given from then on). An instrument of a provider, or of an API without proxies, keeps it."""
    return getattr(instrument, "_real_instrument", True) is None


_handoff_count = None


def observe_handoffs(count):
    """Report ``count()`` (the hand-overs waiting for staff) as an observable gauge, from the
    moment the instruments are made (not before: see ``configure``)."""
    global _handoff_count
    if not AVAILABLE:
        return
    _handoff_count = count
    with _instruments_lock:
        if _instruments is not None:
            _observe_handoffs(_instruments)


def _observe_handoffs(recorded):
    """Make the hand-overs' gauge on ``recorded`` once; call with ``_instruments_lock`` held."""
    if recorded.handoffs is None:
        count = _handoff_count

        def callback(options):
            if _flushing:  # a work horse's last export: the long-lived processes report it
                return
            try:
                yield otel_metrics.Observation(count())
            except Exception:  # noqa: BLE001 - a failed read (no table yet, no database) skips one observation
                logger.debug("Could not count the hand-overs waiting", exc_info=True)

        recorded.handoffs = otel_metrics.get_meter(SCOPE).create_observable_gauge(
            "conversations.handoffs.waiting", callbacks=[callback], unit="{conversation}",
            description="Conversations handed to staff and waiting for one to answer.")


def _clean(attributes):
    """Attributes without the unset ones (OpenTelemetry refuses None)."""
    return {key: value for key, value in attributes.items() if value is not None and value != ""}
