"""Retention while visitors chat: ``purge_conversations``' work over 100,000 old messages, and what
visitors' writes waited meanwhile, against the same visitors without a purge in the same run.

    .venv/bin/python -m bench.retention [--database sqlite|postgres|URL] [--messages 100000]
                                        [--visitors 2] [--baseline 20]

A gunicorn (2 sync workers) and one ``manage.py rqworker`` (the demo project's worker class) serve
the demo model (``DEMO_DELAY`` 0.05 s). ``--messages`` messages in conversations of 10 messages
(5 turns each, a rating on one in five, a call record per turn) are written 60 days old; the
site keeps conversations 30 days. ``--visitors`` threads each chat as the widget does: a
conversation, then turn after turn (``POST …/turns/``, then polls every 100 ms until ``done``).
Beside them, a probe in this process writes what a visitor's message writes, every 20 ms: in one
transaction, its conversation's row locked (``select_for_update``, as ``lifecycle.start`` does)
and a message inserted; on SQLite the transaction begins ``IMMEDIATE`` (the demo's setting), so
its time includes any wait for the database's one write lock. First ``--baseline`` seconds
without a purge; then ``manage.py purge_conversations`` (a process of its own, as cron runs it,
with the site's ``RETENTION_BATCH`` and ``RETENTION_PAUSE``) while the visitors and the probe go
on; then as many seconds again without it. A write that waited on a lock the purge held is
slower than the baseline's by that wait; the machine's load (printed) slows all of them.
"""

import argparse
import datetime
import os
import subprocess
import threading
import time
import uuid

import requests

from bench.common import PYTHON, ROOT, Stack, machine, median, percentile, table, visitor

OLD_DAYS = 60


def seed(messages):
    """``messages`` old messages in conversations of 10 (5 turns of a question and an answer)."""
    from decimal import Decimal

    from django.db import transaction
    from django.utils import timezone

    from conversations.models import CallRecord, Conversation, Message, Turn

    old = timezone.now() - datetime.timedelta(days=OLD_DAYS)
    conversations = messages // 10
    for start in range(0, conversations, 500):
        with transaction.atomic():
            rows = Conversation.objects.bulk_create(
                [Conversation(id=uuid.uuid4(), owner_token=f"old-{n}") for n in range(start, min(start + 500,
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
    Conversation.objects.filter(owner_token__startswith="old-").update(created_at=old)
    Message.objects.filter(conversation__owner_token__startswith="old-").update(created_at=old)


class Probe:
    """Writes a visitor's message every 20 ms (see the module): every (phase, seconds) of the whole
    write, and of getting its lock (``waits``): on SQLite, beginning the transaction (the
    database's one write lock), on PostgreSQL locking the conversation's row."""

    def __init__(self):
        from conversations.models import Conversation

        self.conversation = Conversation.objects.create(owner_token="probe").pk
        self.phase, self.samples, self.waits = "baseline", [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        from django.db import connections, transaction

        from conversations.models import Conversation, Message

        try:
            while not self.stop.is_set():
                phase, began = self.phase, time.monotonic()
                with transaction.atomic():
                    Conversation.objects.select_for_update().get(pk=self.conversation)
                    locked = time.monotonic()
                    Message.objects.create(conversation_id=self.conversation, role="user", content="probe")
                self.samples.append((phase, time.monotonic() - began))
                self.waits.append((phase, locked - began))
                time.sleep(0.02)
        finally:
            connections.close_all()


class Visitors:
    """``count`` threads chatting through gunicorn; every request's (phase, kind, seconds)."""

    def __init__(self, base, count):
        self.base, self.count = base, count
        self.phase, self.samples, self.turns = "baseline", [], []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.chat, daemon=True) for _ in range(count)]

    def timed(self, kind, call):
        began = time.monotonic()
        response = call()
        self.samples.append((self.phase, kind, time.monotonic() - began))
        return response

    def chat(self):
        session = visitor(self.base)
        conversation = session.post(self.base + "/api/conversations/", json={}).json()["id"]
        while not self.stop.is_set():
            phase, began = self.phase, time.monotonic()
            response = self.timed("POST turn", lambda: session.post(
                f"{self.base}/api/conversations/{conversation}/turns/", json={"content": "What time is it?"}))
            if response.status_code == 400:  # MAX_TURNS_PER_CONVERSATION: a new conversation
                conversation = session.post(self.base + "/api/conversations/", json={}).json()["id"]
                continue
            response.raise_for_status()
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


def ms(seconds):
    return f"{seconds * 1000:.0f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", default="sqlite")
    parser.add_argument("--messages", type=int, default=100000)
    parser.add_argument("--visitors", type=int, default=2)
    parser.add_argument("--baseline", type=float, default=20.0)
    args = parser.parse_args()

    settings = {"PROVIDER": "demo", "DEMO_DELAY": "0.05", "RETENTION_DAYS": "30", "MAX_TURNS_PER_CONVERSATION": "0"}
    with Stack(database=args.database, conversations=settings) as stack:
        seeded = time.monotonic()
        seed(args.messages)
        seeded = time.monotonic() - seeded
        base = stack.gunicorn(2)
        stack.workers(1)
        from conversations.conf import get_config
        from conversations.models import Message

        before = Message.objects.count()
        crowd, probe = Visitors(base, args.visitors), Probe()
        crowd.start()
        probe.thread.start()
        time.sleep(args.baseline)
        crowd.phase = probe.phase = "during the purge"
        load_before = os.getloadavg()[0]
        began = time.monotonic()
        purged = subprocess.run([PYTHON, str(ROOT / "manage.py"), "purge_conversations"], env=stack.env, cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout.strip()
        took = time.monotonic() - began
        crowd.phase = probe.phase = "after"
        time.sleep(args.baseline)
        crowd.finish()
        probe.stop.set()
        probe.thread.join(10)
        after = Message.objects.filter(conversation__owner_token__startswith="old-").count()

        print(f"{machine()}; {stack.database_label}; 1-min load {load_before:.2f} at the purge's start, "
              f"{os.getloadavg()[0]:.2f} after")
        print(f"{args.messages} old messages seeded in {seeded:.0f} s, {after} left after the purge; "
              f"RETENTION_BATCH {get_config()['RETENTION_BATCH']}, RETENTION_PAUSE {get_config()['RETENTION_PAUSE']}")
        print(f"purge_conversations: {purged} Wall time {took:.1f} s.")
        rows = []
        for phase in ("baseline", "during the purge", "after"):
            for kind, samples in (("probe: its lock", probe.waits), ("probe: the whole write", probe.samples)):
                writes = [seconds for p, seconds in samples if p == phase]
                rows.append([phase, kind, len(writes), ms(median(writes)), ms(percentile(writes, 0.99)),
                             ms(max(writes) if writes else float("nan"))])
            for kind in ("POST turn", "poll"):
                values = [s for p, k, s in crowd.samples if p == phase and k == kind]
                rows.append([phase, kind, len(values), ms(median(values)), ms(percentile(values, 0.99)),
                             ms(max(values) if values else float("nan"))])
            turns = [s for p, s in crowd.turns if p == phase]
            rows.append([phase, "whole turn", len(turns), ms(median(turns)), ms(percentile(turns, 0.99)),
                         ms(max(turns) if turns else float("nan"))])
        table(["phase", "request", "n", "median (ms)", "p99 (ms)", "max (ms)"], rows)


if __name__ == "__main__":
    main()
