"""A turn's round trip saved on PostgreSQL two ways, alternated: in a transaction (``BEGIN``, the
statements as one string, ``COMMIT``: three network round trips), and as one string outside any
transaction, which PostgreSQL runs as a transaction of its own (``runner.TurnRunner.commit_mine``:
one round trip, the fence made to fail when it matches no row).

    .venv/bin/python -m bench.step_send [--saves 1000] [--rounds 3] [--delay-ms 0.25]

Both send what a round trip sends (an ``INSERT`` of a row of about 300 bytes, the turn's fenced
``UPDATE``, the step's ``SET LOCAL synchronous_commit TO OFF``) on one psycopg 3 connection with
client-side binding (Django's default), to scratch tables in the local PostgreSQL's ``postgres``
database (dropped at the end). With ``--delay-ms``, also through ``bench.latency_proxy`` adding that
much each way: a database on another host. Prints the median and mean milliseconds per save.
"""

import argparse
import os
import statistics
import time

from bench import latency_proxy
from bench.common import machine

INSERT = "INSERT INTO bench_step_message (content) VALUES (%s) RETURNING id"
UPDATE = "UPDATE bench_step_turn SET model_calls = model_calls + 1 WHERE id = 1 AND job_id = %s"
ASYNC = "SET LOCAL synchronous_commit TO OFF"


def in_transaction(connection):
    with connection.transaction(), connection.cursor() as cursor:
        cursor.execute(f"{INSERT}; {UPDATE}; {ASYNC}", ["x" * 300, "job"])


def fenced(sql):
    """``sql`` made to fail when it matches no row, as the app sends the turn's ``UPDATE``
    (``statements.or_fail``)."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    django.setup()
    from conversations.engine import statements

    return statements.or_fail(statements.Statement(None, sql, [], None)).sql


def one_string(connection, fenced_update):
    with connection.cursor() as cursor:
        cursor.execute(f"{INSERT}; {fenced_update}; {ASYNC}", ["x" * 300, "job"])


def measure(port, saves, rounds):
    import psycopg

    connection = psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=postgres", autocommit=True,
                                 cursor_factory=psycopg.ClientCursor)
    fenced_update = fenced(UPDATE)
    ways = {"in_transaction": lambda: in_transaction(connection),
            "one_string": lambda: one_string(connection, fenced_update)}
    timings = {name: [] for name in ways}
    for _ in range(rounds):
        for name, way in ways.items():
            for _ in range(saves):
                started = time.perf_counter()
                way()
                timings[name].append(time.perf_counter() - started)
    connection.close()
    return timings


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--saves", type=int, default=1000, help="saves of each way per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, the two ways alternated in each")
    parser.add_argument("--delay-ms", type=float, default=None, help="also through a proxy adding this each way")
    args = parser.parse_args()
    import psycopg

    print(machine())
    with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as setup:
        setup.execute("CREATE TABLE bench_step_message (id serial PRIMARY KEY, content text)")
        setup.execute("CREATE TABLE bench_step_turn (id int PRIMARY KEY, job_id text, model_calls int)")
        setup.execute("INSERT INTO bench_step_turn VALUES (1, 'job', 0)")
    proxy = None
    try:
        targets = [("local", 5432)]
        if args.delay_ms is not None:
            proxy, port = latency_proxy.start(args.delay_ms)
            targets.append((f"{args.delay_ms} ms each way", port))
        print("\n| database | in a transaction (3 round trips): median / mean ms | one string: median / mean ms |")
        print("|---|---|---|")
        for label, port in targets:
            result = measure(port, args.saves, args.rounds)
            cells = [f"{statistics.median(t) * 1000:.3f} / {statistics.mean(t) * 1000:.3f}"
                     for t in (result["in_transaction"], result["one_string"])]
            print(f"| {label} | {cells[0]} | {cells[1]} |")
    finally:
        if proxy is not None:
            proxy.terminate()
        with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as setup:
            setup.execute("DROP TABLE IF EXISTS bench_step_message, bench_step_turn")


if __name__ == "__main__":
    main()
