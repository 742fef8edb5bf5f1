"""The CPU a model call costs in the HTTP client: a turn's ``BudgetedHTTP.post_json`` (the
watchdog, the key's check, the call record, the log line) against the naive job's bare
``requests.Session.post`` (``bench.bare``), three calls per client as in a turn, against the same
instant OpenAI-compatible server in this process.

    .venv/bin/python -m bench.call_cpu [--turns 300] [--rounds 5]

CPU is the calling thread's (``time.thread_time``), and the whole process's (``time.process_time``:
the watchdog's two threads too, and the server's, which answer both kinds alike); the load of
other processes counts only through caches and frequency. Each
round runs ``--turns`` three-call "turns" of each kind, the kinds alternated; the first round
warms up and is not counted. Prints the median over the rounds, and the range.
"""

import argparse
import os
import time

from bench.common import ScriptedProvider, machine


def naive_turn(url):
    """The naive job's three calls (``bench.bare.bare_job``): one session, ``Session.post`` each."""
    import requests

    from bench.bare import naive_calls

    session = requests.Session()
    naive_calls(session, url, [{"role": "user", "content": "What time is it in Tokyo, and how do refunds work?"}])
    session.close()


def client_turn(url):
    """A turn's three calls through ``BudgetedHTTP`` (one client per turn, as the runner makes),
    its key bound to the server's origin as a key from settings is."""
    from conversations.core.budget import Budget
    from conversations.endpoints import bind_settings_key
    from conversations.infra.http import BudgetedHTTP

    config = {"CALL_TIMEOUT": 30, "CONNECT_TIMEOUT": 10, "MIN_CALL_BUDGET": 0.5, "MAX_ATTEMPTS": 1,
              "BACKOFF_BASE": 0.05, "BACKOFF_MAX": 0.2,
              "API_KEY": bind_settings_key({"PROVIDER": "openai", "BASE_URL": url, "API_KEY": "bench"})}
    http = BudgetedHTTP(Budget(60), config, recorder=lambda **fields: None, name="bench", turn_id="bench",
                        cancelled=lambda: False)
    messages = [{"role": "user", "content": "What time is it in Tokyo, and how do refunds work?"}]
    for _ in range(3):
        message = http.post_json(url + "/chat/completions", {"model": "bench", "messages": messages},
                                 {"Authorization": "Bearer bench"}).data["choices"][0]["message"]
        messages.append(message)
        for call in message.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "result"})
    http.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300, help="three-call turns of each kind per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds counted (after one to warm up)")
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    import django

    django.setup()
    import logging

    logging.getLogger("conversations").setLevel(logging.WARNING)  # the log line's handler is not the client's
    print(machine())
    kinds = {"naive job (requests.Session.post)": naive_turn, "turn (BudgetedHTTP.post_json)": client_turn}
    results = {label: ([], []) for label in kinds}
    with ScriptedProvider(calls=3) as provider:
        for number in range(args.rounds + 1):
            for label, turn in kinds.items():
                started, process = time.thread_time(), time.process_time()
                for _ in range(args.turns):
                    turn(provider.url)
                if number:
                    for values, spent in zip(results[label], (time.thread_time() - started,
                                                              time.process_time() - process)):
                        values.append(spent / args.turns / 3 * 1000)
    print(f"\n{args.turns} three-call turns of each kind per round, {args.rounds} rounds (after one to warm up); "
          f"CPU ms per call: median [range]\n")
    print(f"  {'':<38} {'calling thread':<22} whole process (the server's threads too)")
    for label, columns in results.items():
        cells = []
        for values in columns:
            values.sort()
            cells.append(f"{values[len(values) // 2]:.3f} [{values[0]:.3f}–{values[-1]:.3f}]")
        print(f"  {label:<38} {cells[0]:<22} {cells[1]}")
    print(f"\nload average at the end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
