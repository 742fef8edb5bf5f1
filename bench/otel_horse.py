"""What tracing costs a forking worker's work horse, without the rest of a turn around it.

    .venv/bin/python -m bench.otel_horse [--forks 40] [--rounds 3]

A process set up as a ``conversations.worker.Worker``'s parent is (``TELEMETRY="otlp"``, exporting
to a receiver on loopback; ``telemetry.warm_up(forking=True)``) forks, again and again, a child
that makes the telemetry calls of one tool turn as the engine does (the job's span, five call
spans with their GenAI attributes, the queue wait, the first word, the breaker, the turn's count
and durations), then what the job does after its final write (``flush``: the export before
``os._exit``). Per child: the time from the parent's ``os.fork()`` to the child running (the
at-fork handlers, the SDK's among them); the wall and CPU time to the final write, and after it;
the CPU of its whole job (every thread's: the export thread's too); its minor page faults (each
a first write to a page shared with the parent); and the parent's CPU per horse for taking what
the horse measured (``telemetry.from_horses()`` after each horse, as the worker's loop calls it,
and its export, at the end of the run: one export per ``OTEL_METRIC_EXPORT_INTERVAL``, 60 s,
shared by the horses of that minute). Three ways, alternated in rounds:

- ``off``: the package installed, ``TELEMETRY=""`` (the API's no-op providers);
- ``each horse exports its metrics``: each horse makes a meter provider after the final write
  and exports its metrics itself before it exits, and its HTTP client imports ``netrc`` at its
  first request (before this change);
- ``metrics handed to the parent``: each horse writes its measurements to its parent, which
  exports them (as shipped).

(Earlier versions compared a horse that measures as the calls end with one that measures at its
job's end, then providers made in the parent with providers made by each horse; docs/benchmarks.md
keeps their figures.)
"""

import argparse
import ast
import os
import resource
import statistics
import sys
import time
import traceback
import types

from bench.common import machine, table

# Seconds each at-fork handler took in this process, by where it was registered (``timed_at_fork``).
AT_FORK = {}


def timed_at_fork():
    """Wrap every ``after_in_child`` handler registered from now on with a timer (``AT_FORK``)."""
    register = os.register_at_fork

    def wrapped(**handlers):
        handler = handlers.get("after_in_child")
        if handler is not None:
            frame = traceback.extract_stack(limit=2)[0]
            where = f"{os.path.relpath(frame.filename)}:{frame.lineno} {frame.line}"

            def timed(handler=handler, where=where):
                started = time.perf_counter()
                handler()
                AT_FORK[where] = AT_FORK.get(where, 0.0) + time.perf_counter() - started

            handlers["after_in_child"] = timed
        register(**handlers)

    os.register_at_fork = wrapped


BEFORE, NOW = "each horse exports its metrics (before)", "metrics handed to the parent (as shipped)"
ROUND = [("off", ""), (BEFORE, "otlp"), (NOW, "otlp")]


def child(telemetry, mode, forked_at):
    """One horse's telemetry: returns (to done wall, to done CPU, after wall, faults before, faults
    after, from the parent's ``os.fork()`` to this child running: the SDK's at-fork handlers)."""
    running = time.perf_counter() - forked_at
    at_fork = dict(AT_FORK)
    def record(kind, name, offset):
        return types.SimpleNamespace(kind=kind, name=name, started_offset=offset, duration=0.002, outcome="ok",
                                     attempt=1, timeout=10.0, remaining_before=20.0, detail="",
                                     status_code=200 if kind == "model" else None)

    reply = {"provider": "openai", "fallback": 0, "breaker": "closed",
             "reply": {"model": "bench", "finish": "stop", "input_tokens": 40, "output_tokens": 17}}
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    wall, cpu = time.perf_counter(), time.process_time()
    meta = {"otel": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
    with telemetry.job_span(meta, **{"conversations.turn.id": "t", "messaging.message.id": "j",
                                     "messaging.destination.name": "forking", "conversations.worker.name": "w",
                                     "conversations.job.timeout": 30}) as trace:
        telemetry.in_flight(1, "w")
        telemetry.queue_wait(0.01, "default")
        telemetry.breaker_state("openai:bench", "closed")
        steps = [("model", "bench"), ("tool", "current_time"), ("model", "bench"), ("tool", "search_faq"),
                 ("model", "bench")]
        for number, (kind, name) in enumerate(steps):
            trace.record(record(kind, name, number * 0.01), reply if kind == "model" else None)
            if number == 0:
                telemetry.first_word("default", 0.05)
        trace.outcome("completed", 20.0, **{"conversations.turn.model_calls": 3})
        telemetry.count_turn("completed", "default", duration=0.1, margin=20.0)
        done = time.perf_counter() - wall, time.process_time() - cpu
        faults_done = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        telemetry.in_flight(-1, "w")
    if mode:
        telemetry.flush()
    after = time.perf_counter() - wall - done[0]
    return (done[0], done[1], after, faults_done - faults,
            resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_done, running, at_fork,
            time.process_time() - cpu)


def run(label, mode, forks, endpoint):
    """``forks`` children of a fresh parent process set up for ``mode``; their medians."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker's parent: a process of its own, so that each way sets the SDK up anew
        os.close(read)
        os.environ.update({"CONVERSATIONS_TELEMETRY": mode, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
        timed_at_fork()
        import django

        django.setup()
        from conversations.conf import get_config
        from conversations.infra import telemetry

        telemetry.configure(get_config()["TELEMETRY"])
        telemetry.warm_up(forking=True)
        if label == BEFORE:  # no pipe: each horse makes its meter provider and exports, as before
            telemetry._from_horses = None
            for name in ("netrc", "shlex"):  # nor imported by the warm-up (each horse's export did)
                sys.modules.pop(name, None)
        parent_cpu = 0.0
        for _ in range(forks):
            forked_at = time.perf_counter()  # CLOCK_MONOTONIC: the same clock in the child
            horse = os.fork()
            if horse == 0:
                os.write(write, (repr(child(telemetry, mode, forked_at)) + "\n").encode())
                os._exit(0)
            os.waitpid(horse, 0)
            cpu = time.process_time()
            telemetry.from_horses()
            parent_cpu += time.process_time() - cpu
        cpu = time.process_time()
        telemetry.from_horses(final=True)
        parent_cpu += time.process_time() - cpu
        os.write(write, (repr(("parent", parent_cpu / forks)) + "\n").encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as lines:
        rows = [ast.literal_eval(line) for line in lines.read().splitlines()]
    os.waitpid(pid, 0)
    return [row for row in rows if row[0] != "parent"], [row[1] for row in rows if row[0] == "parent"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forks", type=int, default=40, help="children per way and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatproject.settings")
    from tests.support.otel import OtlpReceiver  # the otel extra

    print(machine())
    results = {label: [] for label, _ in ROUND}
    parents = {label: [] for label, _ in ROUND}
    with OtlpReceiver() as receiver:
        for _ in range(args.rounds):
            for label, mode in ROUND:
                rows, parent = run(label, mode, args.forks, receiver.url)
                results[label] += rows
                parents[label] += parent
    ms = lambda rows, i: f"{statistics.median(r[i] for r in rows) * 1000:.2f}"  # noqa: E731
    print(f"\n{args.rounds} rounds x {args.forks} forks per way, alternated; medians\n")
    table(["way", "fork to child running, wall ms", "to the final write, wall ms", "to the final write, CPU ms", "after it (export), wall ms",
           "the horse's job, CPU ms (all its threads)", "the parent's, CPU ms per horse", "page faults to the final write",
           "page faults after it"],
          [[label, ms(rows, 5), ms(rows, 0), ms(rows, 1), ms(rows, 2), ms(rows, 7),
            f"{statistics.median(parents[label]) * 1000:.2f}",
            f"{statistics.median(r[3] for r in rows):.0f}", f"{statistics.median(r[4] for r in rows):.0f}"]
           for label, rows in results.items()])
    print("\nThe at-fork handlers that took a child 0.1 ms or more (median ms), by where they were registered\n")
    handlers = []
    for label, rows in results.items():
        for where in rows[0][6]:
            took = statistics.median(r[6].get(where, 0.0) for r in rows) * 1000
            if took >= 0.1:
                handlers.append([label, f"{took:.2f}", where])
    table(["way", "ms", "registered at"], handlers)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
