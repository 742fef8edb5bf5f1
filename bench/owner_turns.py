"""What a visitor's ``POST …/turns/`` reads about its owner, by how many turns the owner has today.

    PYTHONPATH=/tmp/pkgs .venv/bin/python -m bench.owner_turns [--database sqlite] [--turns 0,1000,5000]
                                                               [--repeat 200]

Every POST of a turn runs, inside its transaction (on SQLite a ``BEGIN IMMEDIATE``: the write
lock is held from the first statement), two reads that span the owner: the lock of all of the
owner's conversations (``api.base._lock_owned``: every row of them, read back to Python) and
``limits.TurnCounts`` (the owner's active turns, and with a daily budget their tokens since
midnight). ``bench.retention``'s visitors kept one session, so one owner, for a whole run:
thousands of turns in hundreds of conversations by its last code. For an owner with each
``--turns`` turns today (completed, in conversations of 10, as those visitors left them), this
times both reads with the retention bench's settings (no daily budget) and with the demo's
(``DAILY_TOKEN_BUDGET`` 200,000) and prints SQLite's plan of each.
"""

import argparse
import sys
import time
import uuid

from bench.common import Stack, machine, median, percentile, table


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


def lock_query(conversation):
    """``_lock_owned``'s statement for an anonymous caller who is not a visitor token's (on SQLite
    ``select_for_update`` adds nothing): every column of every conversation the owner has."""
    from conversations.models import Conversation
    from conversations.owners import owned_by

    names = [field.attname for field in Conversation._meta.concrete_fields]
    return Conversation.objects.filter(owned_by(None, conversation.owner_token)).order_by("pk").values_list(*names)


def timed(call, repeat):
    values = []
    for _ in range(repeat):
        began = time.perf_counter()
        call()
        values.append(time.perf_counter() - began)
    return values


def plan(sql, params):
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
        return "; ".join(row[-1] for row in cursor.fetchall())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", default="sqlite")
    parser.add_argument("--turns", default="0,1000,5000")
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    counts = [int(value) for value in args.turns.split(",")]
    settings = {"PROVIDER": "demo"}
    with Stack(database=args.database, conversations=settings) as stack:
        from django.conf import settings as django_settings
        from django.db import connection
        from django.test.utils import CaptureQueriesContext, override_settings

        from conversations.engine import limits

        owners = {turns: owner_with(turns, f"owner-{turns}") for turns in counts}
        rows, plans = [], {}
        configs = (("bench (no budget)", {}), ("demo (DAILY_TOKEN_BUDGET 200000)", {"DAILY_TOKEN_BUDGET": 200000}))
        for label, extra in configs:
            with override_settings(CONVERSATIONS={**django_settings.CONVERSATIONS, **extra}):
                for turns, conversation in owners.items():
                    lock = timed(lambda: list(lock_query(conversation)), args.repeat)
                    count = timed(lambda: limits.TurnCounts(conversation), args.repeat)
                    rows.append([label, turns, turns // 10 + 1,
                                 *(f"{1000 * f(lock):.2f}" for f in (median, lambda v: percentile(v, 0.99))),
                                 *(f"{1000 * f(count):.2f}" for f in (median, lambda v: percentile(v, 0.99)))])
                    if turns == counts[-1]:
                        with CaptureQueriesContext(connection) as captured:
                            limits.TurnCounts(conversation)
                        query = lock_query(conversation).query.sql_with_params()
                        plans[f"lock ({label})"] = plan(*query)
                        sql = captured.captured_queries[-1]["sql"]
                        # The captured text has its parameters inlined: explain it as it was sent.
                        plans[f"TurnCounts ({label})"] = plan(sql, ())
        print(f"{machine()}; {stack.database_label}; {args.repeat} reads each")
        table(["settings", "owner's turns today", "owner's conversations", "lock: median (ms)", "lock: p99 (ms)",
               "TurnCounts: median (ms)", "TurnCounts: p99 (ms)"], rows)
        for name, text in plans.items():
            print(f"- plan of {name}: {text}")


if __name__ == "__main__":
    sys.exit(main())
