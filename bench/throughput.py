"""Throughput: 200 conversations post at once against a provider that takes 1 s per call, 8 workers.

    .venv/bin/python -m bench.throughput [--turns 200] [--workers 8] [--delay 1.0] [--pool] [--database …]

Each turn makes one model call (the provider answers in text after ``--delay`` seconds), so
the ideal total is ``turns × 1 call × delay / workers`` (200 × 1 × 1 s / 8 = 25 s). The 200
visitors' sessions and conversations are created first; then all turns are posted at once
through gunicorn (50 client threads) and the clock runs from the first POST to the last
``done: true`` state. The workers are 8 ``manage.py rqworker`` processes, or with ``--pool``
one ``manage.py rqworker-pool --num-workers 8``. Their memory (RSS and PSS from
/proc/<pid>/smaps_rollup, summed over each worker and its work horses) is sampled every 0.2 s.
"""

import argparse
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from bench.common import ScriptedProvider, Stack, machine, memory_kib, process_tree, table, visitor


class MemorySampler(threading.Thread):
    """Samples the memory of process trees until stopped; keeps the peaks."""

    def __init__(self, pids):
        super().__init__(daemon=True)
        self.pids = pids
        self.peak_rss = self.peak_pss = 0
        self.peak_one = 0
        self.stop = threading.Event()

    def run(self):
        while not self.stop.wait(0.2):
            rss = pss = 0
            for member in process_tree(*self.pids):
                one_rss, one_pss = memory_kib(member)
                rss, pss = rss + one_rss, pss + one_pss
                self.peak_one = max(self.peak_one, one_rss)
            self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--delay", type=float, default=1.0, help="seconds the provider takes per call")
    parser.add_argument("--pool", action="store_true", help="one rqworker-pool instead of N rqworker processes")
    parser.add_argument("--database", default="postgres", help='"postgres", "sqlite" or a DATABASE_URL')
    args = parser.parse_args()

    print(machine())
    with ScriptedProvider(calls=1, delay=args.delay) as provider:
        conversations = {"PROVIDER": "openai", "BASE_URL": provider.url, "API_KEY": "bench", "MODEL": "bench"}
        with Stack(database=args.database, conversations=conversations) as stack:
            from rq.registry import FailedJobRegistry

            from conversations.infra import state
            from conversations.infra.queue import get_queue
            from conversations.models import Turn

            base = stack.gunicorn(2)
            workers = stack.workers(args.workers, pool=args.pool)
            sampler = MemorySampler([p.pid for p in workers])
            sampler.start()

            def prepare(_):
                session = visitor(base)
                return session, session.post(base + "/api/conversations/", json={}).json()["id"]

            with ThreadPoolExecutor(20) as pool:
                visitors = list(pool.map(prepare, range(args.turns)))

            def post(item):
                session, conversation = item
                response = session.post(f"{base}/api/conversations/{conversation}/turns/",
                                        json={"content": "How do refunds work?"})
                return response.status_code, response.json().get("id")

            started = time.time()
            with ThreadPoolExecutor(50) as pool:
                posted = list(pool.map(post, visitors))
            posting = time.time() - started
            turn_ids = [turn_id for status, turn_id in posted if status == 202]

            deadline = time.monotonic() + max(120, 4 * args.turns * args.delay / args.workers)
            finished, pending = {}, list(turn_ids)
            while pending and time.monotonic() < deadline:
                time.sleep(0.2)
                for turn_id in pending:  # only the turns not seen done yet
                    data = state.read(turn_id)
                    if data and data["done"]:
                        finished[turn_id] = data
                pending = [turn_id for turn_id in pending if turn_id not in finished]
            sampler.stop.set()
            sampler.join()

            done = list(finished.values())
            ended = max(s["updated_at"] for s in done) if done else time.time()
            completed = Turn.objects.filter(pk__in=turn_ids, status=Turn.Status.COMPLETED).count()
            failed_jobs = FailedJobRegistry(queue=get_queue()).count
            left_in_queue = get_queue().count
            requests_served = len(provider.served)

    total = ended - started
    ideal = args.turns * 1 * args.delay / args.workers
    kind = f"1 rqworker-pool of {args.workers}" if args.pool else f"{args.workers} rqworker processes"
    print(f"\n{args.turns} turns x 1 model call x {args.delay:g}s, {kind}, gunicorn 2 sync workers, "
          f"{stack.database_label}; posting all turns took {posting:.1f}s\n")
    table(["turns posted (202)", "done", "completed", "lost", "provider calls", "failed jobs", "left in queue",
           "total s", "ideal s", "total / ideal", "peak RSS (MiB)", "peak PSS (MiB)", "largest process RSS (MiB)"],
          [[len(turn_ids), len(done), completed, args.turns - len(done), requests_served, failed_jobs, left_in_queue,
            f"{total:.1f}", f"{ideal:.1f}", f"{total / ideal:.2f}", f"{sampler.peak_rss / 1024:.0f}",
            f"{sampler.peak_pss / 1024:.0f}", f"{sampler.peak_one / 1024:.0f}"]])


if __name__ == "__main__":
    main()
