"""The admin's overview per assistant and day, on many turns: time and query count.

    .venv/bin/python -m bench.overview [--database postgres|sqlite] [--turns 1000,10000,100000] [--runs 5]

Three assistants and the site's default answer turns spread over the last 30 days (so the
30-day overview has 120 rows). Turns are inserted with ``bulk_create`` in steps up to each
count in ``--turns``; after each step the overview is measured ``--runs`` times, as the
function that runs its queries (``conversations.admin.overview.overview``) and as the whole admin
page (a superuser's GET through Django's test client, templates included), and its SQL
queries are counted. Medians are printed as a Markdown table.
"""

import argparse
import random
import time
from datetime import timedelta
from decimal import Decimal

from bench.common import Stack, machine, median, table

STATUSES = ["completed"] * 86 + ["incomplete"] * 6 + ["failed"] * 5 + ["cancelled"] * 3


def add_turns(count, conversations, rng, now):
    """Insert ``count`` finished turns spread over the last 30 days, in batches."""
    from conversations.models import Turn

    rows = []
    for _ in range(count):
        conversation = rng.choice(conversations)
        enqueued = now - timedelta(days=rng.randrange(30), seconds=rng.randrange(86400))
        duration = rng.lognormvariate(1.2, 0.6)
        tokens_in, tokens_out = rng.randrange(200, 4000), rng.randrange(20, 600)
        rows.append(Turn(
            conversation=conversation, assistant_id=conversation.assistant_id, status=rng.choice(STATUSES),
            enqueued_at=enqueued, started_at=enqueued + timedelta(seconds=0.05),
            finished_at=enqueued + timedelta(seconds=0.05 + duration), job_timeout=120, deadline_margin=20,
            margin_left=max(0.0, 120 - duration - rng.random()), input_tokens=tokens_in, output_tokens=tokens_out,
            cost=(Decimal(tokens_in) * Decimal("0.15") + Decimal(tokens_out) * Decimal("0.60")) / 1_000_000,
            model="gpt-4o-mini", rating=rng.choice(["", "", "", "up", "up", "down"])))
        if len(rows) == 5000:
            Turn.objects.bulk_create(rows)
            rows = []
    Turn.objects.bulk_create(rows)


def measure(client, runs):
    """``(function ms, page ms, queries, rows)``, medians over ``runs``."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from conversations.admin.overview import overview

    function, page = [], []
    for _ in range(runs):
        started = time.perf_counter()
        rows = overview(30)
        function.append(time.perf_counter() - started)
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            response = client.get("/admin/conversations/assistant/overview/?days=30", HTTP_HOST="localhost")
            page.append(time.perf_counter() - started)
        assert response.status_code == 200, response.status_code
        overview_queries = [q for q in queries if "conversations_turn" in q["sql"]]
    return median(function) * 1000, median(page) * 1000, len(queries), len(overview_queries), len(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", default="postgres", help='"postgres", "sqlite" or a DATABASE_URL')
    parser.add_argument("--turns", default="1000,10000,100000", help="comma-separated turn counts, increasing")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    counts = [int(c) for c in args.turns.split(",")]

    print(machine())
    with Stack(database=args.database) as stack:
        from django.contrib.auth.models import User
        from django.db import connection
        from django.test import Client
        from django.utils import timezone

        from conversations.models import Assistant, Conversation

        assistants = [Assistant.objects.create(slug=slug, name=slug.title(), system_prompt="Help.")
                      for slug in ("support", "shop", "docs")]
        conversations = [Conversation.objects.create(owner_token=f"bench-{i}", assistant=assistant)
                         for i, assistant in enumerate(assistants + [None] * 1) for _ in range(50)]
        client = Client()
        client.force_login(User.objects.create_superuser("bench", "bench@example.com", "bench"))
        rng, now, made, results = random.Random(16), timezone.now(), 0, []
        for count in counts:
            started = time.perf_counter()
            add_turns(count - made, conversations, rng, now)
            insert = time.perf_counter() - started
            made = count
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute("ANALYZE conversations_turn")
            function_ms, page_ms, queries, turn_queries, rows = measure(client, args.runs)
            results.append([f"{count:,}", f"{insert:.1f} s", rows, queries, turn_queries, f"{function_ms:.0f}",
                             f"{page_ms:.0f}"])
        label = stack.database_label

    print(f"\n{label}; overview of the last 30 days (3 assistants and the site's default); "
          f"medians of {args.runs} runs\n")
    table(["turns", "bulk_create", "rows shown", "queries (page)", "of them on turns", "overview() ms", "page ms"],
          results)


if __name__ == "__main__":
    main()
