"""Deadlines: how far past its limit each kind of stalled provider call ends, and how much of
the margin is left when a turn's final write lands.

    .venv/bin/python -m bench.deadlines [--http-runs 5] [--turn-runs 3] [--limit 2] [--database sqlite]

1. HTTP calls. For each fault the fake provider offers, ``BudgetedHTTP.post_json`` makes one
   attempt with a total limit of ``--limit`` seconds (a connect timeout above it, so only the
   total limit can end the call). Overrun = the attempt's duration − its limit, as recorded in
   the attempt's ``CallRecord`` fields. Target: ≤ 0.25 s for every fault, every run.
2. Turns. A real ``manage.py rqworker --burst`` (our forking Worker class) runs turns with
   JOB_TIMEOUT 10, DEADLINE_MARGIN 4 and CALL_TIMEOUT 60 against a provider that stalls in
   each way, so each turn runs into its own deadline. Margin left = JOB_TIMEOUT − (the final
   write − the job's start), both as the job measured it (``Turn.margin_left``) and from RQ's
   ``started_at`` to the row's ``finished_at``. Target: ≥ DEADLINE_MARGIN − 1 s in every run.
"""

import argparse
import contextlib
import datetime
import statistics
import subprocess
import sys
import time

from bench.common import PYTHON, ROOT, Stack, machine, table

JOB_TIMEOUT, MARGIN = 10, 4
TARGET_OVERRUN = 0.25


def nap() -> str:
    """A tool that takes a second (for the model that asks for tools for ever)."""
    time.sleep(1)
    return "rested"


@contextlib.contextmanager
def serving(behaviour):
    from tests.support.fakes import FakeProvider

    with FakeProvider(default=behaviour) as fake:
        yield fake.url


@contextlib.contextmanager
def silent():
    from tests.support.fakes import SilentListener

    with SilentListener() as listener:
        yield listener.url


def faults():
    """{name: (a context manager factory yielding a base URL, request payload)} for every stall."""
    from tests.support.fakes import cut_short_then_stall, full_accept_queue, hang, never_read, trickle_body, trickle_headers

    small = {"model": "bench", "messages": [{"role": "user", "content": "hi"}]}
    big = {"model": "bench", "messages": [{"role": "user", "content": "x" * (16 << 20)}]}
    return {
        "silent after accept": (silent, small),
        "reads the request, never answers": (lambda: serving(hang), small),
        "body trickled, 1 byte / 0.1 s": (lambda: serving(trickle_body(0.1)), small),
        "headers trickled, 1 byte / 0.1 s": (lambda: serving(trickle_headers(0.1)), small),
        "body cut short, then stall": (lambda: serving(cut_short_then_stall), small),
        "16 MiB upload never read": (lambda: serving(never_read), big),
        "connect never completes": (full_accept_queue, small),
    }


def http_overruns(limit, runs):
    from conversations.core.budget import Budget
    from conversations.infra.http import BudgetedHTTP, CallFailed

    config = {"CALL_TIMEOUT": limit, "CONNECT_TIMEOUT": limit * 5, "MIN_CALL_BUDGET": 0.5, "MAX_ATTEMPTS": 1,
              "BACKOFF_BASE": 0.05, "BACKOFF_MAX": 0.2}
    results = {}
    for name, (serve, payload) in faults().items():
        overruns = []
        for _ in range(runs):
            records = []
            http = BudgetedHTTP(Budget(60), config, recorder=lambda **fields: records.append(fields))
            with serve() as url:
                try:
                    http.post_json(url + "/chat/completions", payload, {})
                except CallFailed as failure:
                    assert failure.outcome == "timeout", (name, failure.outcome, failure.detail)
                else:
                    raise AssertionError(f"{name}: the call succeeded")
            http.close()
            (record,) = records
            overruns.append(record["duration"] - record["timeout"])
        results[name] = overruns
    return results


def turn_faults():
    from tests.support.fakes import cut_short_then_stall, full_accept_queue, hang, openai_tool_calls, trickle_body, \
        trickle_headers

    return {
        "silent after accept": silent,
        "reads the request, never answers": lambda: serving(hang),
        "body trickled": lambda: serving(trickle_body(0.1)),
        "headers trickled": lambda: serving(trickle_headers(0.1)),
        "body cut short, then stall": lambda: serving(cut_short_then_stall),
        "connect never completes": full_accept_queue,
        "asks for a 1 s tool for ever": lambda: serving(openai_tool_calls(("nap", {}))),
    }


def turn_margins(stack, runs):
    from django.db import transaction
    from rq.job import Job

    from conversations.infra.queue import get_queue
    from conversations.models import Conversation, Turn
    from conversations.engine.lifecycle import create as create_turn

    results = {}
    for name, serve in turn_faults().items():
        with serve() as url:
            turns = []
            for number in range(runs):
                with transaction.atomic():
                    conversation = Conversation.objects.create(owner_token=f"bench-{name}-{number}")
                    turns.append(create_turn(conversation, "Hello?")[0])
            env = {**stack.env, "CONVERSATIONS_BASE_URL": url}
            subprocess.run([PYTHON, str(ROOT / "manage.py"), "rqworker", "--burst"], env=env, cwd=ROOT,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=runs * 30)
        rows = []
        for turn in turns:
            turn = Turn.objects.get(pk=turn.pk)
            job = Job.fetch(turn.job_id, connection=get_queue().connection)
            started = job.started_at.replace(tzinfo=datetime.timezone.utc)
            outside = JOB_TIMEOUT - (turn.finished_at - started).total_seconds()
            rows.append((turn.status, turn.margin_left, outside))
        results[name] = rows
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http-runs", type=int, default=5, help="calls per fault")
    parser.add_argument("--turn-runs", type=int, default=3, help="turns per fault")
    parser.add_argument("--limit", type=float, default=2.0, help="each call's total limit, seconds")
    parser.add_argument("--database", default="sqlite", help='"sqlite", "postgres" or a DATABASE_URL')
    args = parser.parse_args()

    print(machine())
    print("command: .venv/bin/python -m bench.deadlines " + " ".join(sys.argv[1:]))
    conversations = {
        "PROVIDER": "openai", "API_KEY": "bench", "MODEL": "bench", "JOB_TIMEOUT": JOB_TIMEOUT,
        "DEADLINE_MARGIN": MARGIN, "CALL_TIMEOUT": 60, "CONNECT_TIMEOUT": 60, "MIN_CALL_BUDGET": 1,
        "MAX_ATTEMPTS": 3, "TOOL_TIMEOUT": 2, "TOOL_RESERVE": 1, "MAX_STEPS": 100, "STATE_TTL": 600,
        "TOOLS": "bench.deadlines.nap",
    }
    with Stack(database=args.database, conversations=conversations) as stack:
        overruns = http_overruns(args.limit, args.http_runs)
        print(f"\n1. One call, total limit {args.limit:.1f} s, {args.http_runs} runs per fault: seconds past the limit\n")
        rows, worst = [], 0.0
        for name, values in overruns.items():
            worst = max(worst, max(values))
            rows.append([name, f"{max(values):.3f}", f"{statistics.median(values):.3f}", f"{min(values):.3f}",
                         "yes" if max(values) <= TARGET_OVERRUN else "NO"])
        table(["fault", "max overrun", "median", "min", f"≤ {TARGET_OVERRUN} s"], rows)

        margins = turn_margins(stack, args.turn_runs)
        print(f"\n2. Turns in a forking rqworker, JOB_TIMEOUT {JOB_TIMEOUT} s, DEADLINE_MARGIN {MARGIN} s, "
              f"{args.turn_runs} runs per fault: seconds left before the job timeout at the final write "
              f"({stack.database_label})\n")
        rows = []
        for name, runs in margins.items():
            job_view = [r[1] for r in runs]
            rq_view = [r[2] for r in runs]
            rows.append([name, ", ".join(sorted({r[0] for r in runs})), f"{min(job_view):.3f}",
                         f"{statistics.median(job_view):.3f}", f"{min(rq_view):.3f}",
                         "yes" if min(min(job_view), min(rq_view)) >= MARGIN - 1 else "NO"])
        table(["fault", "status", "margin left, min (job clock)", "median", "min (RQ started_at → row)",
               f"≥ {MARGIN - 1} s"], rows)


if __name__ == "__main__":
    main()
