"""Retention while visitors chat: ``purge_conversations``' work over 100,000 old messages, and what
visitors' writes waited meanwhile, against the same visitors without a purge, and against the
purge's earlier code, in the same run.

    .venv/bin/python -m bench.retention [--database sqlite|postgres|URL] [--messages 100000]
                                        [--visitors 2] [--baseline 20]
                                        [--codes before,after[,nice][,turns-before][,switch-1ms]]

A gunicorn (2 sync workers) and one ``manage.py rqworker`` (the demo project's worker class) serve
the demo model (``DEMO_DELAY`` 0.05 s). ``--messages`` messages in conversations of 10 messages
(5 turns each, a rating on one in five, a call record per turn) are written 60 days old; the
site keeps conversations 30 days. ``--visitors`` threads each chat as the widget does: a
conversation, then turn after turn (``POST …/turns/``, then polls every 100 ms until ``done``).
Beside them, a probe in this process writes what a visitor's message writes, every 20 ms: in one
transaction, its conversation's row locked (``select_for_update``, as ``lifecycle.start`` does)
and a message inserted; on SQLite the transaction begins ``IMMEDIATE`` (the demo's setting), so
its time includes any wait for the database's one write lock. The messages of every purge are
written first, not yet old; then, for each code of ``--codes`` in turn, its messages are made old
(not measured), ``--baseline`` seconds go without a purge, then
the purge runs (a process of its own, as cron runs it, with the site's ``RETENTION_BATCH``,
``RETENTION_BATCH_TIME`` and ``RETENTION_PAUSE``) while the visitors and the probe go on.
``after`` is ``manage.py purge_conversations``' code: its transactions read nothing (what is due
and the totals are read before each; its first ``DELETE`` checks what is still due); ``before``
is the purge of commit ``BEFORE`` (its module read from git), which checked what was still due and
read the totals inside its transaction, under SQLite's write lock; ``nice`` is ``after`` in a
process at niceness 10 (``os.nice``), to see whether the scheduler's preferring the visitors
helps them. ``turns-before`` is ``after``'s purge with the visitors' turns run by a worker of
commit ``TURNS_BEFORE`` (its files written out by ``git archive``; the worker is restarted between
the phases of two codes that differ), whose turn transactions built their statements after their
``BEGIN``, under SQLite's write lock; ``switch-1ms`` is ``after`` with the worker's interpreter
switching threads every 1 ms (``sys.setswitchinterval``) instead of Python's 5 ms. A write that waited on a lock the purge held is slower than the baseline's by that
wait; the machine's load (printed) slows all of them, so the last table sets each purge's
writes that waited over 50 ms beside those of the baseline just before it, per thousand writes.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import threading
import time
import uuid

from bench.common import PYTHON, ROOT, Stack, machine, median, percentile, table, visitor

OLD_DAYS = 60


def seed(messages, prefix="old-"):
    """``messages`` messages in conversations of 10 (5 turns of a question and an answer), owned
    by ``prefix`` + a number; not due until ``age(prefix)``."""
    from decimal import Decimal

    from django.db import transaction
    from django.utils import timezone

    from conversations.models import CallRecord, Conversation, Message, Turn

    old = timezone.now() - datetime.timedelta(days=OLD_DAYS)
    conversations = messages // 10
    for start in range(0, conversations, 500):
        with transaction.atomic():
            rows = Conversation.objects.bulk_create(
                [Conversation(id=uuid.uuid4(), owner_token=f"{prefix}{n}") for n in range(start, min(start + 500,
                                                                                              conversations))])
            turns = Turn.objects.bulk_create(
                [Turn(id=uuid.uuid4(), conversation=row, status="completed", enqueued_at=old, input_tokens=200,
                      output_tokens=50, cost=Decimal("0.0004"), rating="up" if (index + n) % 5 == 0 else "")
                 for index, row in enumerate(rows) for n in range(5)])
            CallRecord.objects.bulk_create([CallRecord(turn=turn, kind="model", name="demo", started_offset=0,
                                                       outcome="ok") for turn in turns])
            Message.objects.bulk_create(
                [Message(conversation_id=turn.conversation_id, turn=turn, role=role,
                         content=f"{role} words of an old conversation, about as long as a real question")
                 for turn in turns for role in ("user", "assistant")])


def age(prefix="old-"):
    """Make the conversations ``seed`` wrote for ``prefix`` ``OLD_DAYS`` days old: due."""
    from django.utils import timezone

    from conversations.models import Conversation, Message

    old = timezone.now() - datetime.timedelta(days=OLD_DAYS)
    Conversation.objects.filter(owner_token__startswith=prefix).update(created_at=old)
    Message.objects.filter(conversation__owner_token__startswith=prefix).update(created_at=old)


# The purge before its transactions stopped reading (time-boxed batches, statements built first).
BEFORE = "8f3fba30589f6494a63f667da95ddf1156dd8afa"
# The turns' write path before their transactions only sent statements built before them (``turns-before``).
TURNS_BEFORE = "717c5dc18d2b851f7e78f406e6de8cc16e0157c1"
# What each code runs: the purge's code, the commit of the worker's tree (None: this one), and the
# worker's interpreter switch interval (None: Python's 5 ms).
CODES = {"before": ("before", None, None), "after": ("after", None, None), "nice": ("nice", None, None),
         "turns-before": ("after", TURNS_BEFORE, None), "switch-1ms": ("after", None, 0.001)}


def module_at(commit, path="conversations/engine/retention.py", name="conversations.engine.retention_before"):
    """The module at ``path`` as it was at ``commit`` (read from git), imported as ``name`` beside
    today's, its relative imports resolved in today's package."""
    import importlib.util

    source = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))
    module.__package__ = name.rpartition(".")[0]
    exec(compile(source, f"{commit[:7]}:{path}", "exec"), module.__dict__)
    return module


def run_purge(code):
    """``python -m bench.retention --purge before|after|nice``, in the stack's environment: one
    purge as ``purge_conversations`` runs it, with ``code``'s module; prints what it did as JSON."""
    import django

    django.setup()
    from conversations.engine import retention

    if code == "nice":
        os.nice(10)
    done = (module_at(BEFORE) if code == "before" else retention).purge()
    held, sizes = done.held or [0.0], done.sizes or [0]
    print(json.dumps({"counts": done.counts, "batches": done.batches, "held_median": median(held),
                      "held_p99": percentile(held, 0.99), "held_max": max(held), "size_median": median(sizes),
                      "size_min": min(sizes), "size_max": max(sizes)}))


class Probe:
    """Writes a visitor's message every 20 ms (see the module): every (phase, seconds) of the whole
    write, and of getting its lock (``waits``): on SQLite, beginning the transaction (the
    database's one write lock), on PostgreSQL locking the conversation's row.

    The clock also counts the probe's own waits for a core on a loaded machine. So the database
    itself is asked to give up a wait for a lock past ``LOCK_LIMIT`` (SQLite's busy timeout,
    PostgreSQL's ``lock_timeout``): ``over`` lists the phase of each write that waited that long
    for a lock, which is then not timed."""

    LOCK_LIMIT = 0.05

    def __init__(self):
        from conversations.models import Conversation

        self.conversation = Conversation.objects.create(owner_token="probe").pk
        self.phase, self.samples, self.waits, self.over = "baseline", [], [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        from django.db import OperationalError, connection, connections, transaction

        from conversations.models import Conversation, Message

        limit = int(self.LOCK_LIMIT * 1000)
        try:
            connection.ensure_connection()
            if connection.vendor == "sqlite":
                with connection.cursor() as cursor:
                    cursor.execute(f"PRAGMA busy_timeout = {limit}")
            while not self.stop.is_set():
                phase, began = self.phase, time.monotonic()
                try:
                    with transaction.atomic():
                        if connection.vendor == "postgresql":
                            with connection.cursor() as cursor:
                                cursor.execute(f"SET LOCAL lock_timeout = '{limit}ms'")
                        Conversation.objects.select_for_update().get(pk=self.conversation)
                        locked = time.monotonic()
                        Message.objects.create(conversation_id=self.conversation, role="user", content="probe")
                except OperationalError:  # "database is locked", or "canceling statement due to lock timeout"
                    self.over.append(phase)
                else:
                    self.samples.append((phase, time.monotonic() - began))
                    self.waits.append((phase, locked - began))
                time.sleep(0.02)
        finally:
            connections.close_all()


class Visitors:
    """``count`` threads chatting through gunicorn; every request's (phase, kind, seconds). Each
    thread is a new visitor (a new session: a new owner) for every conversation of ``TURNS``
    turns, as on a site: every POST of a turn reads, while it holds SQLite's write lock, all of
    its owner's conversations and counts the owner's turns (``bench.owner_turns``), which one
    visitor for a whole run (``--one-owner``: thousands of turns) made a little longer turn after
    turn (about 1 ms by a run's end; it did not show in the waits, docs/benchmarks.md)."""

    TURNS = 10

    def __init__(self, base, count, one_owner=False):
        self.base, self.count, self.visitors, self.one_owner = base, count, 0, one_owner
        self.phase, self.samples, self.turns = "baseline", [], []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.chat, daemon=True) for _ in range(count)]

    def timed(self, kind, call):
        began = time.monotonic()
        response = call()
        self.samples.append((self.phase, kind, time.monotonic() - began))
        return response

    def chat(self):
        turns, session = self.TURNS, None
        while not self.stop.is_set():
            if turns == self.TURNS:  # a new visitor: a new session, so a new owner, and its conversation
                if session is None or not self.one_owner:  # --one-owner: the same session, a new conversation
                    session = visitor(self.base)
                    self.visitors += 1
                conversation, turns = session.post(self.base + "/api/conversations/", json={}).json()["id"], 0
            phase, began = self.phase, time.monotonic()
            response = self.timed("POST turn", lambda: session.post(
                f"{self.base}/api/conversations/{conversation}/turns/", json={"content": "What time is it?"}))
            response.raise_for_status()
            turns += 1
            poll = response.json()["poll_url"]
            while not self.stop.is_set():
                time.sleep(0.1)
                state = self.timed("poll", lambda: session.get(self.base + poll)).json()
                if state.get("done"):
                    self.turns.append((phase, time.monotonic() - began))
                    break

    def start(self):
        for thread in self.threads:
            thread.start()

    def finish(self):
        self.stop.set()
        for thread in self.threads:
            thread.join(30)


# The visitors' worker: ``manage.py rqworker`` of the tree ``manage`` is in, its interpreter's switch
# interval set, each transaction on SQLite timed from its BEGIN's return to its COMMIT's or
# ROLLBACK's (what it held the write lock for) and appended to ``held`` (a line per transaction).
WORKER = """
import os, runpy, sys, time
sys.setswitchinterval({switch})
from django.db.backends.sqlite3 import base
begin, commit, rollback = (base.DatabaseWrapper._start_transaction_under_autocommit, base.DatabaseWrapper._commit,
                           base.DatabaseWrapper._rollback)
out = os.open({held!r}, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
def began(self):
    begin(self)
    self.bench_began = (time.time(), time.perf_counter())
def ended(end):
    def timed(self):
        try:
            return end(self)
        finally:
            mark, self.bench_began = getattr(self, "bench_began", None), None
            if mark is not None:
                os.write(out, f"{{mark[0]:.6f}} {{time.perf_counter() - mark[1]:.6f}}\\n".encode())
    return timed
base.DatabaseWrapper._start_transaction_under_autocommit = began
base.DatabaseWrapper._commit, base.DatabaseWrapper._rollback = ended(commit), ended(rollback)
sys.argv = [{manage!r}, "rqworker"]
runpy.run_path({manage!r}, run_name="__main__")
"""


def wait_until_no_worker(timeout=60):
    """Wait until no RQ worker is registered (the one stopped has left)."""
    from rq import Worker

    from conversations.infra.queue import get_queue

    deadline = time.monotonic() + timeout
    while Worker.all(connection=get_queue().connection) and time.monotonic() < deadline:
        time.sleep(0.1)


def ms(seconds):
    return f"{seconds * 1000:.0f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", default="sqlite")
    parser.add_argument("--messages", type=int, default=100000)
    parser.add_argument("--visitors", type=int, default=2)
    parser.add_argument("--baseline", type=float, default=20.0)
    parser.add_argument("--codes", default="before,after", help="the purges to run, in this order")
    parser.add_argument("--one-owner", action="store_true",
                        help="each visitor keeps its session (one owner) for the whole run, as before")
    parser.add_argument("--purge", choices=("before", "after", "nice"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.purge:
        return run_purge(args.purge)
    codes = args.codes.split(",")
    unknown = set(codes) - set(CODES)
    if unknown:
        parser.error(f"unknown codes: {', '.join(sorted(unknown))} (known: {', '.join(CODES)})")

    # A visitor's conversation ends after 10 turns (``Visitors.TURNS``, counted by the visitor, who
    # then begins a new one; the site's MAX_TURNS_PER_CONVERSATION stays off, so that no POST is
    # refused) and a new visitor begins the next: in one conversation per visitor, thousands of turns over a run,
    # every turn's history grew with it, and the worker's CPU per turn (and the interpreter lock
    # its threads contend for inside their transactions) from one code's phases to the next's.
    settings = {"PROVIDER": "demo", "DEMO_DELAY": "0.05", "RETENTION_DAYS": "30"}
    with Stack(database=args.database, conversations=settings) as stack:
        # Every purge's messages are written first, before anyone chats (writing them beside the
        # visitors took ten minutes on a loaded machine); each purge's are made old just before it.
        seeded = time.monotonic()
        for code in codes:
            seed(args.messages, f"old-{code}-")
        seeded = (time.monotonic() - seeded) / len(codes)
        base = stack.gunicorn(2)
        worker, running = None, None
        held = stack.tmp / "held.txt"  # the worker's transactions: when each began (epoch s), how long it held
        windows = {}  # phase -> (start, end), epoch seconds, to read the worker's transactions by phase
        wal = {}  # phase -> the size of SQLite's write-ahead log at its end (MB), to see whether it grows
        log = stack.tmp / "bench.sqlite3-wal"

        def worker_for(code):
            """The worker ``code`` runs its visitors' turns with (the one running, when it is that)."""
            nonlocal worker, running
            _purge, commit, switch = CODES[code]
            if running == (commit, switch):
                return
            if worker is not None:
                stack.stop(worker)
                wait_until_no_worker()
            root = stack.tree_at(commit) if commit else ROOT
            env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(root), stack.outer_path]))}
            worker = stack.spawn(PYTHON, "-c", WORKER.format(switch=switch or sys.getswitchinterval(),
                                                             manage=str(root / "manage.py"), held=str(held)),
                                 env=env, cwd=root)
            stack.wait_for_workers(1)
            running = (commit, switch)

        worker_for(codes[0])
        from conversations.conf import get_config
        from conversations.models import Message

        crowd, probe = Visitors(base, args.visitors, args.one_owner), Probe()
        crowd.phase = probe.phase = "starting"
        crowd.start()
        probe.thread.start()
        purges, phases = [], []
        for code in codes:
            crowd.phase = probe.phase = "making them old"
            worker_for(code)
            age(f"old-{code}-")
            crowd.phase = probe.phase = f"without a purge (before {code})"
            quiet = time.time()
            time.sleep(args.baseline)
            windows[f"without a purge (before {code})"] = (quiet, time.time())
            wal[f"without a purge (before {code})"] = log.stat().st_size / 1e6 if log.exists() else None
            crowd.phase = probe.phase = f"purge: {code}"
            purging = time.time()
            load = os.getloadavg()[0]
            began = time.monotonic()
            done = subprocess.run([PYTHON, "-m", "bench.retention", "--purge", CODES[code][0]], env=stack.env, cwd=ROOT,
                                  capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
            took = time.monotonic() - began
            windows[f"purge: {code}"] = (purging, time.time())
            wal[f"purge: {code}"] = log.stat().st_size / 1e6 if log.exists() else None
            left = Message.objects.filter(conversation__owner_token__startswith=f"old-{code}-").count()
            purges.append((code, seeded, load, os.getloadavg()[0], took, json.loads(done), left))
            phases += [f"without a purge (before {code})", f"purge: {code}"]
        crowd.finish()
        probe.stop.set()
        probe.thread.join(10)

        cfg = get_config()
        print(f"{machine()}; {stack.database_label}; {args.messages} old messages per purge; "
              f"before: {BEFORE[:7]}; turns-before: {TURNS_BEFORE[:7]}; RETENTION_BATCH {cfg['RETENTION_BATCH']}, RETENTION_BATCH_TIME "
              f"{cfg['RETENTION_BATCH_TIME']}, RETENTION_PAUSE {cfg['RETENTION_PAUSE']}")
        table(["code", "seeded (s)", "1-min load at start → end", "deleted", "transactions", "wall time (s)",
               "messages per transaction: median (min–max)", "held: median / p99 / max (ms)", "old messages left"],
              [[code, f"{seeded:.0f}", f"{start:.2f} → {end:.2f}",
                f"{done['counts'].get('messages', 0)} messages, {done['counts'].get('conversations', 0)} conv.",
                done["batches"], f"{took:.1f}",
                f"{done['size_median']:.0f} ({done['size_min']}–{done['size_max']})",
                f"{ms(done['held_median'])} / {ms(done['held_p99'])} / {ms(done['held_max'])}", left]
               for code, seeded, start, end, took, done, left in purges])
        rows = []
        for phase in phases:
            for kind, samples in (("probe: its lock", probe.waits), ("probe: the whole write", probe.samples)):
                writes = [seconds for p, seconds in samples if p == phase]
                rows.append([phase, kind, len(writes), ms(median(writes)), ms(percentile(writes, 0.99)),
                             ms(max(writes) if writes else float("nan"))])
            rows.append([phase, f"probe: waited > {ms(Probe.LOCK_LIMIT)} ms for a lock (the database says)",
                         probe.over.count(phase), "", "", ""])
            for kind in ("POST turn", "poll"):
                values = [s for p, k, s in crowd.samples if p == phase and k == kind]
                rows.append([phase, kind, len(values), ms(median(values)), ms(percentile(values, 0.99)),
                             ms(max(values) if values else float("nan"))])
            turns = [s for p, s in crowd.turns if p == phase]
            rows.append([phase, "whole turn", len(turns), ms(median(turns)), ms(percentile(turns, 0.99)),
                         ms(max(turns) if turns else float("nan"))])
        table(["phase", "request", "n", "median (ms)", "p99 (ms)", "max (ms)"], rows)
        print(f"{crowd.visitors} visitors ({'one session each for the whole run' if args.one_owner else f'{Visitors.TURNS} turns each'}); SQLite's WAL at the end of each phase (MB): "
              + ", ".join(f"{phase}: {'-' if size is None else f'{size:.1f}'}" for phase, size in wal.items()))

        # What each purge adds to the waits the visitors' own turns cause: its phase against the
        # baseline just before it, the probe's lock (its clock) and the writes the database gave up.
        summary = []
        for code in codes:
            cells = [code]
            for phase in (f"without a purge (before {code})", f"purge: {code}"):
                waits = [seconds for p, seconds in probe.waits if p == phase]
                over, writes = probe.over.count(phase), len(waits) + probe.over.count(phase)
                cells += [f"{ms(percentile(waits, 0.99))} / {ms(max(waits) if waits else float('nan'))}",
                          f"{over} of {writes} ({1000 * over / max(writes, 1):.1f}‰)"]
            summary.append(cells)
        table(["code", "without a purge: lock p99 / max (ms)", "without: waited > 50 ms",
               "purge: lock p99 / max (ms)", "purge: waited > 50 ms"], summary)

        # How long the worker's own transactions (its turns': claim, round trips, final write) held
        # SQLite's write lock: from their BEGIN IMMEDIATE's return to their COMMIT's (or ROLLBACK's).
        if held.exists():
            spans = [tuple(map(float, line.split())) for line in held.read_text().splitlines() if line.strip()]
            rows = []
            for phase in phases:
                start, end = windows[phase]
                values = [seconds for began, seconds in spans if start <= began < end]
                cells = [f"{1000 * v:.1f}" for v in (median(values), percentile(values, 0.99), max(values))] \
                    if values else ["", "", ""]
                rows.append([phase, len(values), *cells, sum(value > 0.03 for value in values)])
            table(["phase", "worker's transactions", "held: median (ms)", "p99 (ms)", "max (ms)", "held > 30 ms"],
                  rows)

if __name__ == "__main__":
    sys.exit(main())
