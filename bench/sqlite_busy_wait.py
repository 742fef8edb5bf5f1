"""How long a writer waits for SQLite's write lock after the writer holding it lets go: SQLite's
own busy handler (what Python's ``timeout`` and Django's ``OPTIONS["timeout"]`` set) against
retrying every millisecond, in the same run, alternated.

    .venv/bin/python -m bench.sqlite_busy_wait [--rounds 15] [--holds 2,5,10,20,30,45]

One connection begins an ``IMMEDIATE`` transaction (the demo's mode) and commits it ``hold`` ms
later, from another thread; a second connection, half a millisecond after the first began,
begins its own ``IMMEDIATE`` transaction, and the time that took is its wait. SQLite's default
busy handler (``sqlite3_busy_timeout``) does not wake when the lock is released: it sleeps 1, 2,
5, 10, 15, 20, 25 ms… between attempts, so it tries again 0, 1, 3, 8, 18, 33, 53, 78 ms after the
first, and a lock released at 20 ms is taken at 33, one released at 34 ms at 53. ``poll`` gives
the connection no busy timeout and tries again every millisecond itself, as a database backend
could (Python's ``sqlite3`` module does not let one set SQLite's busy handler). The machine's
load, printed, lengthens every sleep.
"""

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time


def waited(path, hold, how):
    """One wait (ms) for a lock held ``hold`` ms, the waiter retrying ``how`` ("sqlite" or "poll")."""
    holder = sqlite3.connect(path, isolation_level=None, timeout=20, check_same_thread=False)
    waiter = sqlite3.connect(path, isolation_level=None, timeout=20 if how == "sqlite" else 0)
    holder.execute("BEGIN IMMEDIATE")

    def release():
        time.sleep(hold / 1000)
        holder.execute("COMMIT")

    thread = threading.Thread(target=release)
    thread.start()
    time.sleep(0.0005)
    began = time.monotonic()
    while True:
        try:
            waiter.execute("BEGIN IMMEDIATE")
            break
        except sqlite3.OperationalError:  # "database is locked": only with no busy timeout (poll)
            time.sleep(0.001)
    took = (time.monotonic() - began) * 1000
    waiter.execute("COMMIT")
    thread.join()
    holder.close()
    waiter.close()
    return took


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--holds", default="2,5,10,20,30,45")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "busy.sqlite3")
        setup = sqlite3.connect(path, isolation_level=None)
        setup.execute("PRAGMA journal_mode=WAL")
        setup.close()
        print(f"SQLite {sqlite3.sqlite_version}; 1-min load {os.getloadavg()[0]:.2f}")
        print("| lock held after the waiter came (ms) | SQLite's busy handler: median / max (ms) "
              "| retrying every 1 ms: median / max (ms) |")
        print("|---|---|---|")
        for hold in [int(h) for h in args.holds.split(",")]:
            waits = {"sqlite": [], "poll": []}
            for _ in range(args.rounds):
                for how in ("sqlite", "poll"):  # alternated
                    waits[how].append(waited(path, hold, how))
            cells = [f"{statistics.median(w):.1f} / {max(w):.1f}" for w in (waits["sqlite"], waits["poll"])]
            print(f"| {hold} | {cells[0]} | {cells[1]} |")
        print(f"1-min load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    sys.exit(main())
