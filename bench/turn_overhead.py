"""Turn overhead: what a three-round-trip tool turn costs beyond the provider's own time,
beside a bare RQ job that makes the same three HTTP calls.

    .venv/bin/python -m bench.turn_overhead [--turns 30] [--database postgres|sqlite|URL]

All run in the same ``manage.py rqworker`` (our Worker class), against the same instant
OpenAI-compatible server, one at a time, in turn, so drift in the machine's load hits all:

- ``turn``: ``POST …/turns/`` through gunicorn (session, CSRF, rows, enqueue at commit) →
  job → model asks for ``current_time`` → tool runs → model asks for ``search_faq`` → tool
  runs → model answers → final write. Ends at the ``updated_at`` of the ``done: true`` state.
- ``bare job, POSTed to a bare view`` (the baseline): a POST through the same gunicorn to a
  view that only enqueues ``bench.bare.bare_job`` → job → the same three POSTs with the same
  growing message lists through one ``requests`` session → writes ``time.time()`` to Redis.
- ``bare job, enqueued in-process``: the same job, enqueued by this process (no web request).

Overhead = end - start - the time the provider spent answering (measured in the server).
"""

import argparse
import datetime
import time

import requests

from bench.common import ScriptedProvider, Stack, machine, median, percentile, table, visitor

RESULT_KEY = "bench:bare:{}"


def run_turn(base, provider):
    """One real turn; returns (seconds from POST to the done state, provider seconds, seconds until
    the job started the turn)."""
    from conversations import state
    from conversations.models import Turn

    session = visitor(base)
    conversation = session.post(base + "/api/conversations/", json={}).json()["id"]
    started = time.time()
    response = session.post(f"{base}/api/conversations/{conversation}/turns/",
                            json={"content": "What time is it in Tokyo, and how do refunds work?"})
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
    turn_started = Turn.objects.get(pk=turn_id).started_at.timestamp()
    return ended - started, provider.time_between(started, ended), turn_started - started


def run_bare(queue, provider, number, base=None):
    """One bare job, enqueued in-process, or (with ``base``) by a POST to the bare view."""
    key = RESULT_KEY.format(number)
    started = time.time()
    if base is None:
        job = queue.enqueue("bench.bare.bare_job", provider.url, key, number, job_timeout=120)
    else:
        response = requests.post(base + "/bench/bare-job/", json={"url": provider.url, "key": key, "number": number})
        assert response.status_code == 202, response.text
        job = queue.fetch_job(response.json()["job"])
    deadline = time.monotonic() + 60
    while (value := queue.connection.get(key)) is None:
        if time.monotonic() > deadline:
            raise RuntimeError("bare job not done after 60s")
        time.sleep(0.002)
    ended = float(value)
    job.refresh()
    job_started = job.started_at.replace(tzinfo=datetime.timezone.utc).timestamp()
    return ended - started, provider.time_between(started, ended), job_started - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=30, help="turns of each kind (after 3 warm-up pairs)")
    parser.add_argument("--database", default="postgres", help='"postgres", "sqlite" or a DATABASE_URL')
    args = parser.parse_args()

    print(machine())
    with ScriptedProvider(calls=3) as provider:
        conversations = {"PROVIDER": "openai", "BASE_URL": provider.url, "API_KEY": "bench", "MODEL": "bench"}
        with Stack(database=args.database, conversations=conversations) as stack:
            from conversations.jobs import get_queue

            base = stack.gunicorn(2)
            stack.workers(1)
            queue = get_queue()
            results = {"turn": [], "bare job, POSTed to a bare view": [], "bare job, enqueued in-process": []}
            for number in range(args.turns + 3):
                runs = [run_turn(base, provider), run_bare(queue, provider, 2 * number, base),
                        run_bare(queue, provider, 2 * number + 1)]
                if number >= 3:  # the first rounds warm up imports, connections, caches
                    for name, run in zip(results, runs):
                        results[name].append(run)

    print(f"\n{args.turns} runs of each kind, in turn; 1 rqworker, gunicorn 2 sync workers, "
          f"{stack.database_label}; medians per turn in ms\n")
    bare_overhead = median([total - spent for total, spent, _ in results["bare job, POSTed to a bare view"]])
    rows = []
    for name, runs in results.items():
        overheads = [total - spent for total, spent, _ in runs]
        ms = lambda values: f"{median(values) * 1000:.1f}"  # noqa: E731
        rows.append([name, ms([r[0] for r in runs]), ms([r[2] for r in runs]), ms([r[0] - r[2] for r in runs]),
                     f"{median([r[1] for r in runs]) * 1000:.2f}", ms(overheads),
                     f"{percentile(overheads, 0.9) * 1000:.1f}", f"{median(overheads) / bare_overhead:.2f}"])
    table(["path", "start to done", "of which: until the job starts", "job start to done", "in provider",
           "overhead (median)", "overhead p90", "vs bare job (POSTed)"], rows)


if __name__ == "__main__":
    main()
