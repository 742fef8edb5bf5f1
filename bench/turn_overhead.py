"""Turn overhead: what a three-round-trip tool turn costs beyond the provider's own time,
beside a bare RQ job that makes the same three HTTP calls.

    .venv/bin/python -m bench.turn_overhead [--turns 30] [--database postgres|sqlite|URL]

All but the stock one run in the same ``manage.py rqworker`` (the demo's worker class), against the same instant
OpenAI-compatible server, one at a time, in turn (each once the worker is idle again), so
drift in the machine's load hits all:

- ``turn``: ``POST …/turns/`` through gunicorn (session, CSRF, rows, enqueue at commit) →
  job → model asks for ``current_time`` → tool runs → model asks for ``search_faq`` → tool
  runs → model answers → final write. Ends at the ``updated_at`` of the ``done: true`` state.
- ``bare job, POSTed to a bare view`` (the baseline): a naive app's turn (``bench.bare``): a POST
  through the same gunicorn to a view that saves the visitor's message and enqueues
  ``bench.bare.bare_job`` → job reads the conversation's messages → the same three POSTs with
  the same growing message lists through one ``requests`` session → saves the answer as a row →
  writes a state to the cache, then ``time.time()`` to Redis.
- ``bare job, POSTed, in a stock django-rq worker``: the same POST and job, on a queue of its own
  served by a second process, ``manage.py rqworker bare --worker-class rq.Worker`` without a
  connection pool: RQ's own worker as django-rq runs it by default, a work horse forked per
  job. This is what a naive django-rq app pays for a job.
- ``bare job, enqueued in-process``: the same job, its message saved and the job enqueued by
  this process (no web request).

Overhead = end - start - the time the provider spent answering (measured in the server).
"""

import argparse
import datetime
import time

import requests

from bench.common import PYTHON, ROOT, ScriptedProvider, Stack, machine, median, percentile, table, visitor

RESULT_KEY = "bench:bare:{}"
STOCK = "bare job, POSTed, stock django-rq worker"


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


def run_turn(base, provider, queue):
    """One real turn; returns its timings in seconds (see ``PHASES``)."""
    from conversations.infra import state
    from conversations.models import Turn

    session = visitor(base)
    conversation = session.post(base + "/api/conversations/", json={}).json()["id"]
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


def run_bare(queue, provider, number, base=None, on=None):
    """One naive job (``bench.bare``), enqueued in-process, or (with ``base``) by a POST to the
    naive view, enqueued on the queue named ``on`` (the turns' by default). Its conversation and turn rows are made first, untimed, as the turn's
    conversation is."""
    from conversations.models import Conversation, Message, Turn

    conversation = Conversation.objects.create()
    turn = Turn.objects.create(conversation=conversation, status=Turn.Status.COMPLETED)
    key = RESULT_KEY.format(number)
    content = "What time is it in Tokyo, and how do refunds work?"
    started = time.time()
    if base is None:
        Message.objects.create(conversation=conversation, turn=turn, role=Message.Role.USER, content=content)
        job_id = queue.enqueue("bench.bare.bare_job", provider.url, key, str(conversation.pk), str(turn.pk),
                               job_timeout=120).id
    else:
        response = requests.post(base + "/bench/bare-job/", json={
            "url": provider.url, "key": key, "conversation": str(conversation.pk), "turn": str(turn.pk),
            "content": content, "queue": on})
        assert response.status_code == 202, response.text
        job_id = response.json()["job"]
    answered = time.time()
    deadline = time.monotonic() + 60
    while (value := queue.connection.get(key)) is None:
        if time.monotonic() > deadline:
            raise RuntimeError("bare job not done after 60s")
        time.sleep(0.002)
    ended = float(value)
    assert Message.objects.filter(turn=turn, role=Message.Role.ASSISTANT).exists()
    return {"total": ended - started, "provider": provider.time_between(started, ended),
            "answered": answered - started, "job start": job_started(queue, job_id) - started}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=30, help="runs of each kind (after 3 warm-up rounds)")
    parser.add_argument("--database", default="postgres", help='"postgres", "sqlite" or a DATABASE_URL')
    args = parser.parse_args()

    print(machine())
    with ScriptedProvider(calls=3) as provider:
        conversations = {"PROVIDER": "openai", "BASE_URL": provider.url, "API_KEY": "bench", "MODEL": "bench"}
        with Stack(database=args.database, conversations=conversations) as stack:
            from conversations.infra.queue import get_queue

            base = stack.gunicorn(2)
            stack.workers(1)
            # A stock django-rq worker for the naive job, no pool (bench.settings), as a simple app runs it.
            stack.spawn(PYTHON, str(ROOT / "manage.py"), "rqworker", "bare", "--worker-class", "rq.Worker",
                        env={"RQ_WORKER_CLASS": "rq.Worker"})
            queue = get_queue()
            stack.wait_for_workers(2)
            results = {"turn": [], "bare job, POSTed to a bare view": [], STOCK: [],
                       "bare job, enqueued in-process": []}
            for number in range(args.turns + 3):
                runs = []
                for run in (lambda: run_turn(base, provider, queue),
                            lambda: run_bare(queue, provider, 3 * number, base),
                            lambda: run_bare(queue, provider, 3 * number + 1, base, on="bare"),
                            lambda: run_bare(queue, provider, 3 * number + 2)):
                    wait_idle(queue)
                    runs.append(run())
                if number >= 3:  # the first rounds warm up imports, connections, caches
                    for name, run in zip(results, runs):
                        results[name].append(run)

    ms = lambda runs, key: f"{median([r[key] for r in runs]) * 1000:.1f}"  # noqa: E731
    from django.conf import settings

    print(f"\n{args.turns} runs of each kind, in turn; 1 rqworker ({settings.RQ['WORKER_CLASS']}) and 1 stock (rq.Worker), "
          f"gunicorn 2 sync workers, {stack.database_label}; medians in ms\n")
    overhead = {name: [r["total"] - r["provider"] for r in runs] for name, runs in results.items()}
    baseline = median(overhead["bare job, POSTed to a bare view"])
    stock = median(overhead[STOCK])
    rows = []
    for name, runs in results.items():
        for r in runs:
            r["after job start"] = r["total"] - r["job start"]
        rows.append([name, ms(runs, "total"), ms(runs, "job start"), ms(runs, "after job start"),
                     f"{median([r['provider'] for r in runs]) * 1000:.2f}", f"{median(overhead[name]) * 1000:.1f}",
                     f"{percentile(overhead[name], 0.9) * 1000:.1f}", f"{median(overhead[name]) / baseline:.2f}",
                     f"{median(overhead[name]) / stock:.2f}"])
    table(["path", "start to done", "until RQ starts the job", "job start to done", "in provider",
           "overhead (median)", "overhead p90", "vs bare job (POSTed, same worker)", "vs bare job (stock worker)"],
          rows)

    print("\nWhere the time goes, from the start of the POST (medians in ms; the turn's phases come from its "
          "row and call records)\n")
    turns, bare, stocked = results["turn"], results["bare job, POSTed to a bare view"], results[STOCK]
    for r in turns:
        r["start to running"] = r["running"] - r["job start"]
        r["job start"] -= r["answered"]
    for r in bare + stocked:
        r["job start"] -= r["answered"]
    table(["phase", "turn", "bare job (POSTed, same worker)", "bare job (stock worker)"], [
        ["POST answered (202)", ms(turns, "answered"), ms(bare, "answered"), ms(stocked, "answered")],
        ["then until RQ starts the job (a fork included)", ms(turns, "job start"), ms(bare, "job start"),
         ms(stocked, "job start")],
        ["then DB connection, turn and transcript loaded, marked running", ms(turns, "start to running"), "-", "-"],
        ["model calls (client side, provider included)", ms(turns, "model calls"), "-", "-"],
        ["tools", ms(turns, "tools"), "-", "-"],
        ["rows saved and states published (the rest)", ms(turns, "rows and states"), "-", "-"],
        ["job start to done", ms(turns, "after job start"), ms(bare, "after job start"), ms(stocked, "after job start")],
        ["start to done", ms(turns, "total"), ms(bare, "total"), ms(stocked, "total")],
    ])


if __name__ == "__main__":
    main()
