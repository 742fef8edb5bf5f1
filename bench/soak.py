"""A soak with kills: visitors chat without pause while a worker process is SIGKILLed every few
seconds and a new one started, as a supervisor would; with each worker class.

    .venv/bin/python -m bench.soak [--database postgres|sqlite|URL] [--duration 120] [--kill-every 15]
                                    [--classes Worker,ConcurrentWorker]

``--processes`` (4) ``manage.py rqworker`` processes of one class serve ``--visitors`` (12)
visitors through gunicorn; each visitor posts a message, polls once every 0.5 s like the widget
until the turn is done, and posts the next. Answers stream from a fake OpenAI-compatible server
(``bench.crowd.ProviderProcess``), ``--words`` words, one every 0.1 s. Every ``--kill-every``
seconds one process is SIGKILLed: a ``ConcurrentWorker`` process with all its turns, or the work
horse of a forking ``Worker`` (its parent continues the turn, as RQ's own design has it); a new
``ConcurrentWorker`` process is started in its place at once. ``JOB_TIMEOUT`` is ``--job-timeout`` (20 s).

Reported per class: turns; late (ended more than the job timeout after it started), silent (not
done when the soak ended and its last turns had had a job timeout and 15 s more to end), run twice
(more than one answer saved for one message); kills, the turns they held, and the time from each
kill to each held turn's next published state (p50/p95/max); and a Stop pressed one second after
a kill, for a turn the killed process held: the seconds from the Stop to the turn's ``cancelled``.
"""

import argparse
import os
import random
import signal
import subprocess
import threading
import time

from bench.common import Stack, machine, percentile, table, visitor
from bench.crowd import CONCURRENT, FORKING, ProviderProcess, manage_rqworker, queue_connection, stop


def held_by(process, worker_class):
    """``(pid to kill, [turn ids it holds])`` for ``process`` (a ``manage.py rqworker``), or None."""
    from rq import Worker

    from conversations.infra.queue import jobs_of, turn_id_from_job_id

    connection = queue_connection()
    worker = next((w for w in Worker.all(connection=connection) if w.pid == process.pid), None)
    if worker is None:
        return None
    turns = [turn_id_from_job_id(job_id) for job_id in jobs_of(worker.name, connection)]
    if worker_class == CONCURRENT:
        return process.pid, turns
    horses = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True, text=True).stdout.split()
    return (int(horses[0]), turns) if horses and turns else None


def shut_down(processes, wait=30):
    """SIGTERM every process (a deploy's warm shutdown); one still running ``wait`` seconds later
    gets SIGABRT (with ``PYTHONFAULTHANDLER=1`` its threads' stacks go to its log), then SIGKILL.
    Returns how many had to be killed."""
    live = [p for p in processes if p.poll() is None]
    for process in live:
        os.killpg(process.pid, signal.SIGTERM)
    deadline, hung = time.monotonic() + wait, 0
    for process in live:
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            hung += 1
            process.send_signal(signal.SIGABRT)
            time.sleep(1)
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
    stop([])  # unregisters the killed ones
    return hung


def soak(stack, base, args, worker_class):
    from django.core.cache import caches

    from conversations.conf import get_config
    from conversations.infra.state import state_key
    from conversations.models import Message, Turn

    cache = caches[get_config()["CACHE_ALIAS"]]
    stack.env["RQ_WORKER_CLASS"] = worker_class
    processes = stack.workers(args.processes)
    ending = threading.Event()
    posted, lock = [], threading.Lock()

    def chat(number):
        session = visitor(base)
        conversation = session.post(base + "/api/conversations/", json={}).json()["id"]
        while not ending.is_set():
            response = session.post(f"{base}/api/conversations/{conversation}/turns/",
                                    json={"content": f"visitor {number}, {time.time()}"})
            if response.status_code != 202:
                time.sleep(1)
                continue
            body = response.json()
            with lock:
                posted.append(body["id"])
            url, deadline = base + body["poll_url"], time.monotonic() + args.job_timeout + 60
            while time.monotonic() < deadline:
                try:
                    if session.get(url, timeout=10).json()["done"]:
                        break
                except Exception:  # noqa: BLE001 - a busy gunicorn: the widget polls again
                    pass
                time.sleep(0.5)

    kills, noticed, stops = [], [], []

    def watch(turn_ids, killed):
        """Seconds from the kill to each held turn's next published state."""
        states = {t: cache.get(state_key(t)) or {} for t in turn_ids}
        before = {t: data.get("version") for t, data in states.items()}
        waiting = {t for t, data in states.items() if not data.get("done")}  # not one that ended as it was killed
        while waiting and time.time() - killed < args.job_timeout + 30:
            for turn_id in list(waiting):
                data = cache.get(state_key(turn_id)) or {}
                if data.get("version") != before[turn_id]:
                    noticed.append(time.time() - killed)
                    waiting.discard(turn_id)
            time.sleep(0.02)
        noticed.extend([float("inf")] * len(waiting))

    def stop_one(turn_id):
        from conversations.engine import lifecycle

        turn = Turn.objects.select_related("conversation").get(pk=turn_id)
        time.sleep(1)
        pressed = time.time()
        lifecycle.stop(turn, end_orphaned=True)  # what the Stop endpoint does
        while time.time() - pressed < args.job_timeout + 30:
            data = cache.get(state_key(turn_id)) or {}
            if data.get("done"):
                stops.append((time.time() - pressed, data["status"]))
                return
            time.sleep(0.02)
        stops.append((float("inf"), "not done"))

    chatters = [threading.Thread(target=chat, args=(n,), daemon=True) for n in range(args.visitors)]
    for thread in chatters:
        thread.start()
    watchers = []
    began = time.monotonic()
    while time.monotonic() - began < args.duration:
        time.sleep(args.kill_every)
        live = [p for p in processes if p.poll() is None]
        random.shuffle(live)
        held = [target for target in (held_by(p, worker_class) for p in live) if target and target[1]]
        if not held:
            continue
        target = max(held, key=lambda found: len(found[1]))  # the process holding the most turns
        pid, turn_ids = target
        os.kill(pid, signal.SIGKILL)
        killed = time.time()
        kills.append(len(turn_ids))
        watcher = threading.Thread(target=watch, args=(turn_ids, killed), daemon=True)
        watcher.start()
        watchers.append(watcher)
        if not stops and turn_ids:
            stopper = threading.Thread(target=stop_one, args=(turn_ids[0],), daemon=True)
            stopper.start()
            watchers.append(stopper)
            stops.append(None)  # one Stop per run, for the first kill
        if worker_class == CONCURRENT:
            log = os.environ.get("BENCH_WORKER_LOG")
            processes = [p for p in processes if p.pid != pid] + [
                stack.spawn(*manage_rqworker(), stderr=open(log, "a") if log else subprocess.DEVNULL)]
    ending.set()
    for thread in chatters:
        thread.join(args.job_timeout + 70)
    for thread in watchers:
        thread.join(args.job_timeout + 40)
    time.sleep(15)
    hung = shut_down(processes)

    turns = Turn.objects.filter(pk__in=posted)
    late = sum(1 for t in turns if t.started_at and t.finished_at
               and (t.finished_at - t.started_at).total_seconds() > t.job_timeout)
    silent = turns.filter(status__in=Turn.ACTIVE_STATUSES).count()
    twice = sum(1 for t in turns if Message.objects.filter(turn=t, role=Message.Role.ASSISTANT).count() > 1)
    by_status = {}
    for status in turns.values_list("status", flat=True):
        by_status[status] = by_status.get(status, 0) + 1
    stopped = [s for s in stops if s is not None]
    return {"class": worker_class.rsplit(".", 1)[1], "turns": turns.count(), "late": late, "silent": silent,
            "twice": twice, "statuses": by_status, "kills": len(kills), "held": sum(kills),
            "p50": percentile(noticed, 0.5), "p95": percentile(noticed, 0.95), "max": max(noticed, default=float("nan")),
            "stop": stopped[0] if stopped else None, "hung": hung}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", default="postgres", help='"postgres", "sqlite" or a DATABASE_URL')
    parser.add_argument("--duration", type=float, default=120, help="seconds of chatting and killing per class")
    parser.add_argument("--kill-every", type=float, default=15)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--visitors", type=int, default=12)
    parser.add_argument("--words", type=int, default=40, help="words per answer, one every 0.1 s")
    parser.add_argument("--job-timeout", type=int, default=20)
    parser.add_argument("--classes", default="Worker,ConcurrentWorker")
    args = parser.parse_args()

    print(machine())
    provider = ProviderProcess(args.words)  # before Django is set up: a plain fork
    conversations = {"PROVIDER": "openai", "BASE_URL": provider.url, "API_KEY": "bench", "MODEL": "bench",
                     "STREAM": "true", "ALLOWED_ENDPOINTS": "http://127.0.0.1:*", "JOB_TIMEOUT": args.job_timeout, "DEADLINE_MARGIN": 6,
                     "MAX_RESUMES": 2, "WORKER_THREADS": 16}
    classes = {"Worker": FORKING, "ConcurrentWorker": CONCURRENT}
    results = []
    try:
        with Stack(database=args.database, conversations=conversations) as stack:
            stack.provider = provider
            base = stack.gunicorn(2)
            for name in args.classes.split(","):
                results.append(soak(stack, base, args, classes[name]))
            label = stack.database_label
    finally:
        provider.close()
    print(f"\nSoak on {label}: {args.processes} processes, {args.visitors} visitors, {args.duration:.0f}s, "
          f"a SIGKILL every {args.kill_every:.0f}s, JOB_TIMEOUT {args.job_timeout}s, answers of {args.words} words\n")
    table(["class", "turns", "ended", "late", "silent", "run twice", "kills", "turns held",
           "kill→next state p50 s", "p95 s", "max s", "Stop after a kill: done in s"],
          [[r["class"], r["turns"], ", ".join(f"{v} {k}" for k, v in sorted(r["statuses"].items())), r["late"],
            r["silent"], r["twice"], r["kills"], r["held"], f"{r['p50']:.2f}", f"{r['p95']:.2f}", f"{r['max']:.2f}",
            f"{r['stop'][0]:.2f} ({r['stop'][1]})" if r["stop"] else "-"] for r in results])


if __name__ == "__main__":
    main()
