"""What a step of a ``ConcurrentWorker`` turn pays on PostgreSQL for its connection: opened again
after each wait (a connect and the step's first statement, then the close before the next wait),
against kept across the wait (the check that the server did not close it meanwhile, then the
statement), and against handed back to Django's pool before the wait and taken from it again
(PostgreSQL's ``"pool"`` option, which needs ``psycopg_pool``), in Django, alternated round by
round.

    PYTHONPATH=/tmp/pkgs .venv/bin/python -m bench.pg_connect [--rounds 500] [--database URL]

The database is PostgreSQL's own ``postgres`` on 127.0.0.1:5432 unless a URL is given; the
statement is ``SELECT 1``. Wall time per step (median and p90) and this process's CPU per step
(user + system, mean); the server's CPU (a backend process forked per connection) is not counted.
"""

import argparse
import os
import statistics
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--database", default="postgres://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()

    import dj_database_url
    from django.conf import settings

    database = dj_database_url.parse(args.database)
    pooled = {**database, "OPTIONS": {"pool": {"min_size": 1, "max_size": 2}}}
    settings.configure(DATABASES={"default": database, "pooled": pooled}, USE_TZ=True)
    import django

    django.setup()
    from django.db import connection, connections

    from conversations.infra.dbconn import _closed_by_server

    def reopened():
        connection.close()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")

    def kept():
        if _closed_by_server(connection):
            connection.close()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")

    def from_pool():
        connections["pooled"].close()
        with connections["pooled"].cursor() as cursor:
            cursor.execute("SELECT 1")

    load = os.getloadavg()[0]
    kinds = {"opened again": reopened, "kept": kept, "handed back to Django's pool and taken again": from_pool}
    walls, cpus = {name: [] for name in kinds}, {name: [] for name in kinds}
    for round_ in range(args.rounds + 20):  # the first 20 warm up
        for name, step in kinds.items():
            wall, cpu = time.perf_counter(), time.process_time()
            step()
            if round_ >= 20:
                walls[name].append((time.perf_counter() - wall) * 1000)
                cpus[name].append((time.process_time() - cpu) * 1000)
    connections.close_all()
    print(f"{args.rounds} steps of each kind, alternated; 1-minute load average {load:.2f} at start, "
          f"{os.getloadavg()[0]:.2f} at end")
    print("| step's connection | wall ms, median | wall ms, p90 | client CPU ms, mean |")
    print("|---|---|---|---|")
    for name in kinds:
        ordered = sorted(walls[name])
        print(f"| {name} | {statistics.median(ordered):.3f} | {ordered[int(len(ordered) * 0.9)]:.3f} | "
              f"{statistics.mean(cpus[name]):.3f} |")


if __name__ == "__main__":
    main()
