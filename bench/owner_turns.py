"""What a visitor's ``POST …/turns/`` reads about its owner, by how many turns the owner has today.

    PYTHONPATH=/tmp/pkgs .venv/bin/python -m bench.owner_turns [--database sqlite] [--turns 0,1000,5000]
                                                               [--repeat 200] [--before REV [--rounds 3]]

Every POST of a turn runs, inside its transaction (on SQLite a ``BEGIN IMMEDIATE``: the write
lock is held from the first statement), two reads that may span the owner: the owner's lock
(``api.base._lock_owned``, which read every conversation of the owner until it took one lock per
owner) and ``limits.TurnCounts`` (the owner's active turns, and with a daily budget their tokens
since midnight). ``bench.retention``'s visitors kept one session, so one owner, for a whole run:
thousands of turns in hundreds of conversations by its last code. For an owner with each
``--turns`` turns today (completed, in conversations of 10, as those visitors left them), while
20 other visitors have a turn queued, this times both, each in a transaction of its own, with
the retention bench's settings (no daily budget) and with the demo's (``DAILY_TOKEN_BUDGET``
200,000), and prints the plan of each of their statements (SQLite's ``EXPLAIN QUERY PLAN``,
PostgreSQL's ``EXPLAIN``, its tables analyzed once loaded).

``--before REV``: the code at git revision REV and this tree's are run in turn, ``--rounds``
times each, alternated (REV's first), each in a process and database of its own: REV's files
are written out (``git archive``) and imported before this tree's. The database is migrated by
this tree's migrations, so REV must have the same ones.
"""

import argparse
import subprocess
import sys
import tempfile
import time
import uuid

from bench.common import ROOT, Stack, machine, median, percentile, table


def owner_with(turns, token):
    """An anonymous owner ``token`` with ``turns`` completed turns today in conversations of 10, and
    one more conversation, empty, that the next turn is posted in (returned)."""
    from decimal import Decimal

    from django.db import transaction
    from django.utils import timezone

    from conversations.models import Conversation, Turn

    now = timezone.now()
    with transaction.atomic():
        rows = Conversation.objects.bulk_create([Conversation(id=uuid.uuid4(), owner_token=token)
                                                 for _ in range(turns // 10)])
        Turn.objects.bulk_create([Turn(id=uuid.uuid4(), conversation=row, status="completed", enqueued_at=now,
                                       input_tokens=200, output_tokens=50, cost=Decimal("0.0004"))
                                  for row in rows for _ in range(10)], batch_size=500)
        return Conversation.objects.create(owner_token=token)


# Turns of other visitors queued or running meanwhile (the site is not idle).
OTHERS_ACTIVE = 20


def others_active(count):
    """``count`` other visitors, each with a turn queued."""
    from conversations.models import Conversation, Turn

    for _ in range(count):
        Turn.objects.create(conversation=Conversation.objects.create(owner_token=uuid.uuid4().hex), status="queued")


def analyze():
    """Give the planner the tables' statistics, as PostgreSQL's autovacuum would have by then (with
    none it guesses every owner has one conversation, and may read them all for one key)."""
    from django.db import connection

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")


def visitor_request(token):
    """A request of the anonymous visitor whose session holds owner ``token``."""
    from django.contrib.auth.models import AnonymousUser
    from django.test import RequestFactory

    from conversations.owners import SESSION_KEY

    request = RequestFactory().post("/")
    request.session, request.user = {SESSION_KEY: token}, AnonymousUser()
    return request


def lock(request, conversation):
    """The POST's lock, in a transaction of its own, as ``owned_conversation(for_update=True)`` takes it."""
    from django.db import transaction

    from conversations.api import base

    with transaction.atomic():
        assert base._lock_owned(request, None, conversation.pk).pk == conversation.pk


def counts(conversation):
    from django.db import transaction

    from conversations.engine import limits

    with transaction.atomic():
        limits.TurnCounts(conversation)


def timed(call, repeat):
    values = []
    for _ in range(repeat):
        began = time.perf_counter()
        call()
        values.append(time.perf_counter() - began)
    return values


def plans(call):
    """The plan of each statement ``call`` sends that reads a table (as sent: the captured text has
    its parameters inlined)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        call()
    found = []
    with connection.cursor() as cursor:
        for query in captured.captured_queries:
            if not query["sql"].startswith("SELECT") or " FROM " not in query["sql"]:
                continue
            if connection.vendor == "sqlite":
                cursor.execute("EXPLAIN QUERY PLAN " + query["sql"])
                found.append("; ".join(row[-1] for row in cursor.fetchall()))
            else:
                cursor.execute("EXPLAIN " + query["sql"])
                found.append(" / ".join(" ".join(row[0].split()) for row in cursor.fetchall()))
    return " || ".join(found)


def measure(args):
    """Time this process's code (``--tree``'s when given) and print its table and plans."""
    counts_of = [int(value) for value in args.turns.split(",")]
    with Stack(database=args.database, conversations={"PROVIDER": "demo"}) as stack:
        from django.conf import settings as django_settings
        from django.test.utils import override_settings

        owners = {turns: owner_with(turns, f"owner-{turns}") for turns in counts_of}
        others_active(OTHERS_ACTIVE)
        analyze()
        rows, found = [], {}
        configs = (("bench (no budget)", {}), ("demo (DAILY_TOKEN_BUDGET 200000)", {"DAILY_TOKEN_BUDGET": 200000}))
        for label, extra in configs:
            with override_settings(CONVERSATIONS={**django_settings.CONVERSATIONS, **extra}):
                for turns, conversation in owners.items():
                    request = visitor_request(conversation.owner_token)
                    locked = timed(lambda: lock(request, conversation), args.repeat)
                    counted = timed(lambda: counts(conversation), args.repeat)
                    rows.append([label, turns, turns // 10 + 1,
                                 *(f"{1000 * f(locked):.2f}" for f in (median, lambda v: percentile(v, 0.99))),
                                 *(f"{1000 * f(counted):.2f}" for f in (median, lambda v: percentile(v, 0.99)))])
                    if turns == counts_of[-1]:
                        found[f"lock ({label})"] = plans(lambda: lock(request, conversation))
                        found[f"TurnCounts ({label})"] = plans(lambda: counts(conversation))
        code = f"code at {args.tree_label}" if args.tree else "this tree's code"
        print(f"{machine()}; {stack.database_label}; {code}; {args.repeat} reads each")
        table(["settings", "owner's turns today", "owner's conversations", "lock: median (ms)", "lock: p99 (ms)",
               "TurnCounts: median (ms)", "TurnCounts: p99 (ms)"], rows)
        for name, text in found.items():
            print(f"- plan of {name}: {text}")
    sys.stdout.flush()


def alternate(args, rest):
    """Run ``--before``'s code and this tree's, ``--rounds`` times each, alternated, each in a process
    of its own (``measure``)."""
    revision = subprocess.run(["git", "rev-parse", "--short", args.before], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout.strip()
    archive = subprocess.run(["git", "archive", revision], cwd=ROOT, capture_output=True, check=True).stdout
    with tempfile.TemporaryDirectory(prefix="owner-turns-") as tree:
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        for _ in range(args.rounds):
            for extra in (["--tree", tree, "--tree-label", revision], []):
                sys.stdout.flush()
                subprocess.run([sys.executable, "-m", "bench.owner_turns", *rest, *extra], cwd=ROOT, check=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", default="sqlite")
    parser.add_argument("--turns", default="0,1000,5000")
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--before", help="a git revision whose code is timed too, alternated with this tree's")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tree", help=argparse.SUPPRESS)  # the files of --before's code (alternate)
    parser.add_argument("--tree-label", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.before:
        rest = ["--database", args.database, "--turns", args.turns, "--repeat", str(args.repeat)]
        return alternate(args, rest)
    if args.tree:  # its conversations and chatproject, imported instead of this tree's (bench stays this tree's)
        sys.path.insert(0, args.tree)
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())
