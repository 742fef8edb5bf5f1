"""Where a turn's wall time goes inside each worker class, step by step: ``bench.turn_overhead``
run with every worker and web process logging when each step of a job begins and ends, with
the thread's CPU clock beside the wall clock, so that a step's wall time can be read as work
(its thread's CPU) or a wait (the rest: the network, the database file, another thread's work
or the GIL).

    PYTHONPATH=/tmp/pkgs .venv/bin/python -m bench.turn_trace [--turns 20] [--database sqlite]

``BENCH_TRACE`` (a directory) makes ``bench.settings`` install ``Tracing``, whose ``ready()``
wraps the steps below in each process; each process writes one log there (kept when the
directory was given, else a temporary one). Then, for each worker class, every two steps logged
one after the other by the same thread of a turn's job, from RQ's ``perform_job`` to its end:
the wall and thread-CPU milliseconds between them per job (means over the jobs, which add up to
the whole job's), and the median of one; for ``ConcurrentWorker``, how long a dequeued job
waits for its thread to run and for RQ's ``perform_job`` (its ``prepare_execution``, the start
semaphore), and the CPU its other threads (the main one's dequeues, the helpers', the boards',
the watchdog's) took over the run. The logging costs a few microseconds a step: the figures read
against each other, not against an untraced run.
"""

import collections
import contextlib
import functools
import importlib
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from django.apps import AppConfig

from bench.common import table

# The steps logged: (module, class or None, function names).
STEPS = [
    ("conversations.engine.runner", "TurnRunner", ["__init__", "start", "call_model", "save_step", "publish",
                                                  "run_tool", "finish"]),
    ("conversations.engine.job", None, ["_load"]),
    ("conversations.infra.state", None, ["publish_step"]),
    ("conversations.engine.worker", "ConcurrentWorker", ["execute_job", "_run"]),
    ("rq.worker", "BaseWorker", ["perform_job", "prepare_job_execution", "handle_job_success"]),
    ("django.db.backends.base.base", "BaseDatabaseWrapper", ["connect"]),  # a thread's first query opens one
]
SAMPLE = 0.5  # seconds between two samples of every thread's CPU clock


class Tracing(AppConfig):
    """Installed by ``bench.settings`` when ``BENCH_TRACE`` names a directory: wraps ``STEPS``."""

    name = "bench"
    label = "bench_turn_trace"

    def ready(self):
        for module, owner, names in STEPS:
            target = importlib.import_module(module)
            if owner is not None:
                target = getattr(target, owner)
            for name in names:
                _wrap(target, name, f"{owner or module.rsplit('.', 1)[-1]}.{name}")
        threading.Thread(target=_sample_threads, name="bench-turn-trace", daemon=True).start()


_files = {}  # pid -> its log (a forked work horse opens its own)
_lock = threading.Lock()  # one line at a time from the process's threads


def _unlock_in_child():
    """A work horse forked while another thread of its parent held ``_lock`` gets a free one."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_unlock_in_child)


def _write(event):
    line = f"{time.time():.6f} {time.thread_time() * 1000:.3f} {threading.current_thread().name} {event}\n"
    pid = os.getpid()
    with _lock:
        if pid not in _files:
            _files[pid] = open(Path(os.environ["BENCH_TRACE"]) / f"{pid}.log", "a", buffering=1)  # noqa: SIM115
        _files[pid].write(line)


def _sample_threads():
    """Every ``SAMPLE`` seconds, each live thread's CPU so far (``= ms name``): the last sample of a
    thread that lives as long as its process says what it took from the jobs' threads."""
    while True:
        time.sleep(SAMPLE)
        for thread in threading.enumerate():
            try:
                used = time.clock_gettime(time.pthread_getcpuclockid(thread.ident)) * 1000
            except (OSError, TypeError):  # it ended meanwhile
                continue
            _write(f"= {used:.1f} {thread.name}")



def _wrap(owner, name, label):
    function = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)

    @functools.wraps(function)
    def traced(*args, **kwargs):
        _write(f"> {label}")
        try:
            return function(*args, **kwargs)
        finally:
            _write(f"< {label}")

    setattr(owner, name, traced)


def turn_jobs(log):
    """The turns' jobs ``log`` holds, each the list of its steps ``(wall s, thread CPU ms, event)``
    from RQ's ``perform_job`` to its end, in the thread that ran it (a naive job logs no runner step)."""
    jobs, running = [], {}
    for line in log.read_text().splitlines():
        wall, cpu, thread, event = line.split(" ", 3)
        if event == "> BaseWorker.perform_job":
            running[thread] = []
        if thread in running:
            running[thread].append((float(wall), float(cpu), event))
        if event == "< BaseWorker.perform_job" and thread in running:
            steps = running.pop(thread)
            if any("TurnRunner" in event for _, _, event in steps):
                jobs.append(steps)
    return jobs


def starts(log):
    """``(to its thread, to perform_job)``: for each job a ``ConcurrentWorker`` logged in ``log``,
    the milliseconds from its ``execute_job`` (in the main thread) to its thread running, and from
    there to RQ's ``perform_job``."""
    to_thread, to_perform, executed, running = [], [], None, {}
    for line in log.read_text().splitlines():
        wall, _, thread, event = line.split(" ", 3)
        if event == "> ConcurrentWorker.execute_job":
            executed = float(wall)
        elif event == "> ConcurrentWorker._run" and executed is not None:
            to_thread.append((float(wall) - executed) * 1000)
            running[thread] = float(wall)
        elif event == "> BaseWorker.perform_job" and thread in running:
            to_perform.append((float(wall) - running.pop(thread)) * 1000)
    return to_thread, to_perform


def threads(log):
    """``{thread name: CPU ms}`` of ``log``'s threads that are not a job's own, from the last sample
    before its first job (the process's start-up left out) to its last sample."""
    used, before = {}, None
    for line in log.read_text().splitlines():
        event = line.split(" ", 3)[3]
        if event == "> BaseWorker.perform_job" and before is None:
            before = dict(used)
        if event.startswith("= "):
            _, ms, name = event.split(" ", 2)
            if not name.startswith(("job-", "tool-", "bench-")):
                used[name] = float(ms)
    return {name: ms - (before or {}).get(name, 0.0) for name, ms in used.items()}


def gaps(jobs):
    """``{(step, next step): [(wall ms, thread CPU ms), ...]}`` over ``jobs``."""
    found = collections.defaultdict(list)
    for steps in jobs:
        for (wall, cpu, step), (next_wall, next_cpu, following) in zip(steps, steps[1:]):
            found[(step, following)].append(((next_wall - wall) * 1000, next_cpu - cpu))
    return found


def main():
    from bench import turn_overhead

    kept = os.environ.get("BENCH_TRACE")  # a directory of one's own: the logs are kept there
    with contextlib.nullcontext(kept) if kept else tempfile.TemporaryDirectory() as directory:
        os.environ["BENCH_TRACE"] = directory
        sys.argv[1:1] = [] if "--turns" in sys.argv else ["--turns", "20"]
        turn_overhead.main()
        by_class = collections.defaultdict(list)
        for log in Path(directory).glob("*.log"):
            jobs = turn_jobs(log)
            concurrent = "ConcurrentWorker" in log.read_text()
            by_class["ConcurrentWorker" if concurrent else "Worker (its work horses)"].extend(jobs)
            if concurrent:
                to_thread, to_perform = starts(log)
                print(f"\nConcurrentWorker, its {len(to_thread)} jobs (naive ones too): from execute_job to its "
                      f"thread running, median {statistics.median(to_thread):.2f} ms (max {max(to_thread):.2f}); "
                      f"then to RQ's perform_job, median {statistics.median(to_perform):.2f} ms "
                      f"(max {max(to_perform):.2f})")
                print(f"\nConcurrentWorker, the CPU of its threads other than the jobs' and their tools', from its "
                      f"first job to its last sample, in ms and per job ({len(to_thread)} jobs):\n")
                table(["thread", "CPU", "per job"], [[name, f"{ms:.1f}", f"{ms / len(to_thread):.3f}"]
                                                     for name, ms in sorted(threads(log).items())])
        for name, jobs in by_class.items():
            if not jobs:
                continue
            print(f"\n{name}: {len(jobs)} turns' jobs (warm-up included), from RQ's perform_job to its end; ms\n")
            rows = []
            for (step, following), runs in gaps(jobs).items():
                wall, cpu = sum(w for w, _ in runs) / len(jobs), sum(c for _, c in runs) / len(jobs)
                rows.append([f"{step} -> {following}", f"{len(runs) / len(jobs):.0f}",
                             f"{statistics.median(w for w, _ in runs):.2f}", f"{wall:.2f}", f"{cpu:.2f}",
                             f"{wall - cpu:.2f}"])
            whole = [(steps[-1][0] - steps[0][0]) * 1000 for steps in jobs]
            rows.append(["whole job", "1", f"{statistics.median(whole):.2f}", f"{sum(whole) / len(jobs):.2f}",
                         f"{sum(steps[-1][1] - steps[0][1] for steps in jobs) / len(jobs):.2f}", ""])
            table(["from -> to", "times a job", "wall, median of one", "wall per job, mean", "thread CPU per job, mean",
                   "wall - CPU per job"], rows)


if __name__ == "__main__":
    main()
