"""Turn overhead: what a three-round-trip tool turn costs beside a naive job making the same
three HTTP calls, run by the same worker class, and what each costs in CPU.

    .venv/bin/python -m bench.turn_overhead [--turns 30] [--database postgres|sqlite|URL] [--telemetry]

Each worker class the app ships (``ConcurrentWorker``, ``Worker``) runs in a ``manage.py rqworker``
of its own, on a queue of its own, with a gunicorn (2 sync workers) of its own whose turns go to
that queue. Against the same instant OpenAI-compatible server, one run at a time, each once every
worker is idle again, in rounds that alternate all the kinds below (the first 3 rounds warm up and
are not counted), so that drift in the machine's load hits all:

- ``turn``: ``POST …/turns/`` through gunicorn (session, CSRF, rows, enqueue at commit) →
  job → model asks for ``current_time`` → tool runs → model asks for ``search_faq`` → tool
  runs → model answers → final write. Ends at the ``updated_at`` of the ``done: true`` state.
- ``naive job``: a naive app's turn (``bench.bare``), run by the same worker class: a POST
  through the same gunicorn to a view that saves the visitor's message and enqueues
  ``bench.bare.bare_job`` → job reads the conversation's messages → the same three POSTs with
  the same growing message lists through one ``requests`` session → saves the answer as a row →
  writes a state to the cache, then ``time.time()`` to Redis.
- ``seed loop``: the floor, run by the same worker class: the loop of the design this app comes
  from, written as plainly as the naive job but doing what the design and the project's standards
  require of any implementation (``bench.bare.seed_job``): a POST with the visitor's session and
  CSRF token to a view that counts a rate in the cache, checks the conversation is the visitor's,
  saves the message and enqueues; a job that keeps the deadline, runs the site's tools, and saves
  and publishes after each of the five model and tool round trips. What a turn costs beyond it is
  this app's own (stop, call records, fallbacks, resume, the watchdog, limits, the dead-job net).
- ``naive job, bare RQ``: the same POST and job, served by RQ's own non-forking worker
  (``manage.py rqworker simple --worker-class rq.SimpleWorker``): what the job costs with none of
  this app's worker around it.
- ``naive job, stock django-rq worker``: the same, served by ``rq.Worker`` (django-rq's default, a
  work horse forked per job, no connection pool): what a naive django-rq app pays.

With ``--telemetry`` (the ``otel`` extra installed), each worker class also runs ``turn, <class>,
traced``: a gunicorn and a worker of their own, on a queue of their own, with ``TELEMETRY="otlp"``
exporting every span and metric over OTLP/HTTP to a receiver in this process that decodes them;
the last table compares each with the same class untraced, in the same rounds.

Overhead = end - start - the time the provider spent answering (measured in the server). CPU per
run = the user + system time the web (that gunicorn, master and workers) and the worker process
(its work horses included) used from the start of the run until every worker was idle again
(the mean over the runs: the kernel counts in 10 ms ticks per process). Page faults per run: the
worker process's minor faults over the same span, its horses included: in a forking worker,
mostly the copies on write of pages a horse shares with its parent.
"""

import argparse
import contextlib
import datetime
import time

import requests

from bench.common import (PYTHON, ROOT, ScriptedProvider, Stack, cpu_seconds, machine, median, minor_faults, percentile,
                          table, visitor)

RESULT_KEY = "bench:bare:{}"


def wait_idle(queue):
    """Wait until the worker has finished with the last job (RQ's own bookkeeping after the job
    function returns, the work horse reaped), so that no run pays for the one before it."""
    from rq import Worker

    deadline = time.monotonic() + 60
    while any(worker.get_state() != "idle" for worker in Worker.all(connection=queue.connection)):
        if time.monotonic() > deadline:
            raise RuntimeError("the worker is still busy after 60s")
        time.sleep(0.002)


def job_started(queue, job_id):
    """The wall-clock time RQ started ``job_id`` (on any queue): stamped by the worker after its
    own preparation (after the fork in a forking worker), just before the job function is called."""
    from rq.job import Job

    job = Job.fetch(job_id, connection=queue.connection)
    return job.started_at.replace(tzinfo=datetime.timezone.utc).timestamp()


def run_turn(base, provider, queue, meter):
    """One real turn, its visitor's session and conversation made first (untimed, outside
    ``meter``); returns its timings in seconds."""
    from conversations.infra import state
    from conversations.models import Turn

    session = visitor(base)
    conversation = session.post(base + "/api/conversations/", json={}).json()["id"]
    meter.start()
    started = time.time()
    response = session.post(f"{base}/api/conversations/{conversation}/turns/",
                            json={"content": "What time is it in Tokyo, and how do refunds work?"})
    answered = time.time()
    assert response.status_code == 202, response.text
    turn_id = response.json()["id"]
    deadline = time.monotonic() + 60
    while True:
        data = state.read(turn_id)
        if data and data["done"]:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"turn {turn_id} not done after 60s: {data}")
        time.sleep(0.002)
    assert data["status"] == "completed", data
    assert [m["role"] for m in data["messages"]] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    ended = data["updated_at"]
    turn = Turn.objects.get(pk=turn_id)
    calls = list(turn.calls.all())
    model = sum(c.duration for c in calls if c.kind == "model")
    tools = sum(c.duration for c in calls if c.kind == "tool")
    running = turn.started_at.timestamp()
    return {"total": ended - started, "provider": provider.time_between(started, ended),
            "answered": answered - started, "job start": job_started(queue, turn.job_id) - started,
            "running": running - started, "model calls": model, "tools": tools,
            "rows and states": ended - running - model - tools}


def run_job(queue, provider, key, meter, post):
    """One baseline job (``bench.bare``), timed from ``post()`` (its POST, returning the response)
    to the end time the job wrote to ``key``; returns its timings in seconds."""
    meter.start()
    started = time.time()
    response = post()
    assert response.status_code == 202, response.text
    job_id = response.json()["job"]
    answered = time.time()
    deadline = time.monotonic() + 60
    while (value := queue.connection.get(key)) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job_id} not done after 60s")
        time.sleep(0.002)
    ended = float(value)
    return {"total": ended - started, "provider": provider.time_between(started, ended),
            "answered": answered - started, "job start": job_started(queue, job_id) - started}


def run_bare(queue, provider, number, base, on, meter):
    """One naive job (``bench.bare``): a POST to the naive view, which enqueues it on the queue
    named ``on``. Its conversation and turn rows are made first, untimed, as the turn's
    conversation is."""
    from conversations.models import Conversation, Message, Turn

    conversation = Conversation.objects.create()
    turn = Turn.objects.create(conversation=conversation, status=Turn.Status.COMPLETED)
    key = RESULT_KEY.format(number)
    result = run_job(queue, provider, key, meter, lambda: requests.post(base + "/bench/bare-job/", json={
        "url": provider.url, "key": key, "conversation": str(conversation.pk), "turn": str(turn.pk),
        "content": "What time is it in Tokyo, and how do refunds work?", "queue": on}))
    assert Message.objects.filter(turn=turn, role=Message.Role.ASSISTANT).exists()
    return result


def run_seed(base, provider, queue, number, meter):
    """One turn of the design's loop written plainly (``bench.bare.seed_job``): a POST with the
    visitor's session and CSRF token to ``seed_enqueue``, which enqueues it on the turns' queue of
    that gunicorn. Its visitor's session, conversation and turn row are made first, untimed."""
    from conversations.models import Message, Turn

    session = visitor(base)
    conversation = session.post(base + "/api/conversations/", json={}).json()["id"]
    turn = Turn.objects.create(conversation_id=conversation, status=Turn.Status.COMPLETED)
    key = RESULT_KEY.format(number)
    result = run_job(queue, provider, key, meter, lambda: session.post(base + "/bench/seed-job/", json={
        "url": provider.url, "key": key, "conversation": conversation, "turn": str(turn.pk),
        "content": "What time is it in Tokyo, and how do refunds work?"}))
    assert list(Message.objects.filter(turn=turn).values_list("role", flat=True)) == [
        "user", "assistant", "tool", "assistant", "tool", "assistant"]
    return result


# The app's worker classes, each with its own queue (and gunicorn enqueueing its turns there).
CLASSES = {"ConcurrentWorker": ("conversations.worker.ConcurrentWorker", "default"),
           "Worker": ("conversations.worker.Worker", "forking")}
# RQ's own workers for the naive job: (label, worker class, queue).
PLAIN = [("naive job, bare RQ (rq.SimpleWorker)", "rq.SimpleWorker", "simple"),
         ("naive job, stock django-rq worker (rq.Worker)", "rq.Worker", "bare")]


class CpuMeter:
    """The CPU seconds the ``web`` and ``worker`` processes (and their children) use from
    ``start()`` (called by a run when its timed part begins) until ``stop()``."""

    def __init__(self, web, worker):
        self.web, self.worker = web, worker

    def start(self):
        self.before = cpu_seconds(self.web), cpu_seconds(self.worker), minor_faults(self.worker)

    def stop(self):
        return {"cpu web": cpu_seconds(self.web) - self.before[0],
                "cpu worker": cpu_seconds(self.worker) - self.before[1],
                "faults worker": minor_faults(self.worker) - self.before[2]}


def measured(run, queue, web, worker):
    """``run(meter)``'s timings, with the CPU its web and worker processes used from the start of
    its timed part until every worker was idle again."""
    meter = CpuMeter(web, worker)
    result = run(meter)
    wait_idle(queue)
    return {**result, **meter.stop()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=30, help="runs of each kind (after 3 warm-up rounds)")
    parser.add_argument("--database", default="postgres", help='"postgres", "sqlite" or a DATABASE_URL')
    parser.add_argument("--telemetry", action="store_true", help="also run each worker class with OTLP tracing on")
    args = parser.parse_args()

    print(machine())
    receiver = contextlib.nullcontext()
    if args.telemetry:
        from tests.support.otel import OtlpReceiver  # the otel extra: only for this option

        receiver = OtlpReceiver()
    with ScriptedProvider(calls=3) as provider, receiver:
        conversations = {"PROVIDER": "openai", "BASE_URL": provider.url, "API_KEY": "bench", "MODEL": "bench"}
        with Stack(database=args.database, conversations=conversations) as stack:
            from conversations.infra.queue import get_queue

            manage = [PYTHON, str(ROOT / "manage.py"), "rqworker"]
            queue = get_queue()
            manage = [PYTHON, str(ROOT / "manage.py"), "rqworker"]
            kinds = {}  # label -> (run(number), web pid, worker pid)
            for name, (path, queue_name) in CLASSES.items():
                env = {"RQ_WORKER_CLASS": path, "CONVERSATIONS_QUEUE": queue_name}
                base = stack.gunicorn(2, env=env)
                web = stack.processes[-1].pid
                worker = stack.spawn(*manage, queue_name, env=env).pid
                kinds[f"turn, {name}"] = (lambda number, meter, base=base: run_turn(base, provider, queue, meter), web,
                                          worker)
                kinds[f"naive job, {name}"] = (
                    lambda number, meter, base=base, on=queue_name: run_bare(queue, provider, number, base, on, meter),
                    web, worker)
                kinds[f"seed loop, {name}"] = (
                    lambda number, meter, base=base: run_seed(base, provider, queue, number, meter), web, worker)
                if args.telemetry:
                    traced = {**env, "CONVERSATIONS_QUEUE": f"{queue_name}-traced", "CONVERSATIONS_TELEMETRY": "otlp",
                              "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_SERVICE_NAME": "bench"}
                    base_traced = stack.gunicorn(2, env=traced)
                    web_traced = stack.processes[-1].pid
                    worker_traced = stack.spawn(*manage, f"{queue_name}-traced", env=traced).pid
                    kinds[f"turn, {name}, traced"] = (
                        lambda number, meter, base=base_traced: run_turn(base, provider, queue, meter),
                        web_traced, worker_traced)
            # RQ's own workers take the naive job from the last gunicorn started above.
            for label, path, queue_name in PLAIN:
                worker = stack.spawn(*manage, queue_name, "--worker-class", path, env={"RQ_WORKER_CLASS": path}).pid
                kinds[label] = (lambda number, meter, base=base, on=queue_name:
                                run_bare(queue, provider, number, base, on, meter), web, worker)
            stack.wait_for_workers(len(CLASSES) * (2 if args.telemetry else 1) + len(PLAIN))
            results = {label: [] for label in kinds}
            for number in range(args.turns + 3):
                for index, (label, (run, web, worker)) in enumerate(kinds.items()):
                    wait_idle(queue)
                    result = measured(lambda meter: run(len(kinds) * number + index, meter),  # noqa: B023
                                      queue, web, worker)
                    if number >= 3:  # the first rounds warm up imports, connections, caches
                        results[label].append(result)

    report(args, stack, results)
    if args.telemetry:
        report_telemetry(results, receiver)


def report_telemetry(results, receiver):
    """Each worker class traced against the same class untraced, and what the receiver got."""
    print("\nTracing on (OTLP/HTTP to a receiver on loopback) against off, same rounds (medians in ms)\n")
    rows = []
    for name in CLASSES:
        off, on = results[f"turn, {name}"], results[f"turn, {name}, traced"]
        off_overhead = median([r["total"] - r["provider"] for r in off])
        on_overhead = median([r["total"] - r["provider"] for r in on])
        rows.append([name, f"{median([r['total'] for r in off]) * 1000:.1f}",
                     f"{median([r['total'] for r in on]) * 1000:.1f}", f"{off_overhead * 1000:.1f}",
                     f"{on_overhead * 1000:.1f}", f"{(on_overhead / off_overhead - 1) * 100:+.1f} %",
                     f"{(median([r['total'] for r in on]) / median([r['total'] for r in off]) - 1) * 100:+.1f} %",
                     f"{sum(r['cpu'] for r in on) / len(on) * 1000:.1f} vs "
                     f"{sum(r['cpu'] for r in off) / len(off) * 1000:.1f}",
                     f"{median([r['faults worker'] for r in on]):.0f} vs "
                     f"{median([r['faults worker'] for r in off]):.0f}"])
    table(["worker class", "start to done, off", "start to done, on", "overhead, off", "overhead, on",
           "overhead change", "start to done change", "CPU ms per turn, on vs off",
           "worker's page faults per turn, on vs off"], rows)
    print(f"\nThe receiver decoded {len(receiver.spans)} spans in {receiver.requests} OTLP requests.")


def report(args, stack, results):
    ms = lambda runs, key: f"{median([r[key] for r in runs]) * 1000:.1f}"  # noqa: E731
    mean_ms = lambda runs, key: f"{sum(r[key] for r in runs) / len(runs) * 1000:.1f}"  # noqa: E731
    print(f"\n{args.turns} runs of each kind, alternated; gunicorn 2 sync workers per worker class, "
          f"{stack.database_label}; medians in ms (CPU: means)\n")
    overhead = {name: [r["total"] - r["provider"] for r in runs] for name, runs in results.items()}
    bare = median(overhead[PLAIN[0][0]])
    rows = []
    for name, runs in results.items():
        for r in runs:
            r["after job start"] = r["total"] - r["job start"]
            r["cpu"] = r["cpu web"] + r["cpu worker"]
        worker_class = name.rsplit(", ", 1)[-1]
        same = (f"{median(overhead[name]) / median(overhead[f'naive job, {worker_class}']):.2f}"
                if worker_class in CLASSES else "-")
        seed = (f"{median(overhead[name]) / median(overhead[f'seed loop, {worker_class}']):.2f}"
                if worker_class in CLASSES else "-")
        rows.append([name, ms(runs, "total"), ms(runs, "job start"), ms(runs, "after job start"),
                     f"{median([r['provider'] for r in runs]) * 1000:.2f}", f"{median(overhead[name]) * 1000:.1f}",
                     f"{percentile(overhead[name], 0.9) / median(overhead[name]):.2f}", same, seed,
                     f"{median(overhead[name]) / bare:.2f}", mean_ms(runs, "cpu web"), mean_ms(runs, "cpu worker"),
                     mean_ms(runs, "cpu"), f"{median([r['faults worker'] for r in runs]):.0f}"])
    table(["path", "start to done", "until RQ starts the job", "job start to done", "in provider",
           "overhead (median)", "overhead p90/p50", "vs naive job, same worker class",
           "vs seed loop, same worker class", "vs naive job, bare RQ",
           "CPU web", "CPU worker", "CPU total", "worker's page faults (median)"], rows)

    print("\nWhat a turn costs beyond the naive job in the same worker class (medians of each kind, in ms): "
          "the ratio is this extra over the naive job's overhead\n")
    rows = []
    for name in CLASSES:
        turns, naive = results[f"turn, {name}"], results[f"naive job, {name}"]
        extra = median(overhead[f"turn, {name}"]) - median(overhead[f"naive job, {name}"])
        before = median([r["job start"] for r in turns]) - median([r["job start"] for r in naive])
        rows.append([name, f"{median(overhead[f'naive job, {name}']) * 1000:.1f}",
                     f"{median(overhead[f'turn, {name}']) * 1000:.1f}", f"{extra * 1000:.1f}",
                     f"{before * 1000:.1f}", f"{(extra - before) * 1000:.1f}",
                     f"{median(overhead[f'turn, {name}']) / median(overhead[f'naive job, {name}']):.2f}"])
    table(["worker class", "naive job's overhead", "turn's overhead", "turn - naive job",
           "of which until RQ starts the job (the POST, the enqueue)", "of which after", "turn / naive job"], rows)

    print("\nThe floor: the design's loop written plainly (the seed loop: session, CSRF, a rate, ownership; "
          "the deadline; a save and a publish after each of the 5 round trips) against the naive job, and the "
          "turn against it, in the same worker class (medians of overhead, in ms)\n")
    rows = []
    for name in CLASSES:
        naive, seed, turn = (median(overhead[f"{kind}, {name}"]) for kind in ("naive job", "seed loop", "turn"))
        rows.append([name, f"{naive * 1000:.1f}", f"{seed * 1000:.1f}", f"{turn * 1000:.1f}", f"{seed / naive:.2f}",
                     f"{turn / seed:.2f}", f"{turn / naive:.2f}"])
    table(["worker class", "naive job", "seed loop", "turn", "seed loop / naive job", "turn / seed loop",
           "turn / naive job"], rows)

    print("\nWhere a turn's time goes, from the start of the POST (medians in ms; from its row and call records)\n")
    phases, labels = [], [label for label in results if label.startswith("turn, ")]
    for label in labels:
        turns = results[label]
        for r in turns:
            r["start to running"] = r["running"] - r["job start"]
            r["queued"] = r["job start"] - r["answered"]
        phases.append(turns)
    table(["phase"] + labels, [
        [label] + [ms(turns, key) for turns in phases] for label, key in [
            ("POST answered (202)", "answered"),
            ("then until RQ starts the job (a fork included)", "queued"),
            ("then DB connection, turn and transcript loaded, marked running", "start to running"),
            ("model calls (client side, provider included)", "model calls"),
            ("tools", "tools"),
            ("rows saved and states published (the rest)", "rows and states"),
            ("start to done", "total")]])


if __name__ == "__main__":
    main()
