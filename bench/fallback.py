"""Fallback benchmark: what a hop to the next provider adds to a turn.

    .venv/bin/python -m bench.fallback [--database sqlite|postgres] [--runs 10]

Two fake OpenAI-compatible servers on 127.0.0.1 answer at once; turns run on one ``rqworker``
behind gunicorn. Each turn's duration is read from its row (``finished_at - started_at``):

- the primary answers (no hop): the baseline;
- the primary fails fast (HTTP 500, one attempt): the hop costs that failed round trip;
- the primary hangs: the hop costs the primary's whole allowance, ``min(CALL_TIMEOUT,
  remaining - FALLBACK_RESERVE)`` (here ``CALL_TIMEOUT`` = 3 s).
"""

import argparse
import time

from bench.common import Stack, machine, median, table, visitor


def run_turn(base):
    session = visitor(base)
    conversation = session.post(f"{base}/api/conversations/", json={}).json()["id"]
    started = session.post(f"{base}/api/conversations/{conversation}/turns/", json={"content": "Hello"}).json()
    while not session.get(base + started["poll_url"]).json()["done"]:
        time.sleep(0.02)
    from conversations.models import Turn

    turn = Turn.objects.get(pk=started["id"])
    return (turn.finished_at - turn.started_at).total_seconds(), turn.model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", default="sqlite")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()

    import json

    from tests.support.fakes import FakeProvider, hang, openai_text, unavailable

    rows = []
    with FakeProvider() as primary, FakeProvider(default=openai_text("From the fallback.")) as fallback:
        settings = {"PROVIDER": "openai", "BASE_URL": primary.url, "API_KEY": "bench", "MODEL": "primary",
                    "FALLBACKS": json.dumps([{"PROVIDER": "openai", "BASE_URL": fallback.url, "API_KEY": "bench",
                                              "MODEL": "fallback"}]),
                    "TOOLS": "", "STREAM": "0", "MAX_ATTEMPTS": 1, "CALL_TIMEOUT": 3, "MIN_CALL_BUDGET": 2, "FALLBACK_RESERVE": 10,
                    "JOB_TIMEOUT": 60, "BREAKER_FAILURES": 10_000, "TURN_RATE_PER_OWNER": "",
                    "TURN_RATE_PER_IP": "", "MAX_ACTIVE_TURNS_PER_OWNER": 0}
        with Stack(database=args.database, conversations=settings) as stack:
            base = stack.gunicorn(1)
            stack.workers(1)
            run_turn(base)  # warm
            for label, behaviour, runs in (("primary answers (no hop)", openai_text("From the primary."), args.runs),
                                           ("primary fails fast (500)", unavailable(500), args.runs),
                                           ("primary hangs", hang, max(3, args.runs // 3))):
                durations = []
                for _ in range(runs):
                    primary.add(behaviour)
                    seconds, model = run_turn(base)
                    durations.append(seconds)
                rows.append((label, durations, model))
    baseline = median(rows[0][1])
    print(machine())
    print(f"{args.database}; MAX_ATTEMPTS 1, CALL_TIMEOUT 3 s, MIN_CALL_BUDGET 2 s, FALLBACK_RESERVE 10 s\n")
    table(["case", "answered by", "turn p50 (ms)", "max (ms)", "added by the hop (ms)", "n"], [
        [label, model, f"{median(d) * 1000:.0f}", f"{max(d) * 1000:.0f}", f"{(median(d) - baseline) * 1000:.0f}",
         str(len(d))] for label, d, model in rows])


if __name__ == "__main__":
    main()
