"""How long a worker takes to stop (warm shutdown, SIGTERM) while it runs a turn.

    .venv/bin/python -m bench.worker_stop [--seconds 20]

A fake provider streams a ``--seconds`` answer to a turn run by one ``rqworker``; two seconds
in, the worker gets SIGTERM, as a deploy sends it. With the hand-over (``MAX_RESUMES`` > 0)
the turn stops at its next step and the worker exits; without it (``MAX_RESUMES`` 0, as
before this existed) the worker waits for the turn to end. A second worker then finishes the
turn, and the time it took in all is printed too.
"""

import argparse
import json
import signal
import subprocess
import sys
import time

from bench.common import Stack, machine, table, visitor


def stop_time(max_resumes, seconds):
    from tests.support.fake_stream import openai_stream, streaming
    from tests.support.fakes import FakeProvider, openai_text

    with FakeProvider(default=openai_text("Finished by the next worker.")) as fake:
        fake.add(streaming(openai_stream(pieces=["word "] * int(seconds * 10)), interval=0.1))
        settings = {"PROVIDER": "openai", "BASE_URL": fake.url, "API_KEY": "bench", "TOOLS": "",
                    "JOB_TIMEOUT": int(seconds + 40), "CALL_TIMEOUT": int(seconds + 10), "MAX_RESUMES": max_resumes,
                    "TURN_RATE_PER_OWNER": "", "TURN_RATE_PER_IP": ""}
        with Stack(database="sqlite", conversations=settings) as stack:
            base = stack.gunicorn(1)
            (first,) = stack.workers(1)
            session = visitor(base)
            conversation = session.post(f"{base}/api/conversations/", json={}).json()["id"]
            started = session.post(f"{base}/api/conversations/{conversation}/turns/",
                                   json={"content": "Write a lot"}).json()
            while len(fake.sent_at) < 20:
                time.sleep(0.01)
            asked = time.monotonic()
            first.send_signal(signal.SIGTERM)
            first.wait(timeout=seconds + 60)
            stopped = time.monotonic() - asked
            stack.workers(1)
            while True:
                data = session.get(base + started["poll_url"]).json()
                if data["done"]:
                    break
                time.sleep(0.05)
            return stopped, time.monotonic() - asked, data["status"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--max-resumes", type=int, help=argparse.SUPPRESS)  # one case, in a process of its own
    args = parser.parse_args()
    if args.max_resumes is not None:
        print(json.dumps(stop_time(args.max_resumes, args.seconds)))
        return
    rows = []
    for label, resumes in (("before: the worker waits for its turn (MAX_RESUMES 0)", 0),
                           ("after: the turn hands over (MAX_RESUMES 2)", 2)):
        # Each case in its own process: a Django process keeps the first Redis it was set up with.
        out = subprocess.run([sys.executable, "-m", "bench.worker_stop", "--seconds", str(args.seconds),
                              "--max-resumes", str(resumes)], capture_output=True, text=True, check=True)
        stopped, done, status = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append([label, f"{stopped:.2f}", f"{done:.2f}", status])
    print(machine())
    print(f"a {args.seconds:.0f} s streamed answer, SIGTERM 2 s in\n")
    table(["", "worker exited after (s)", "turn done after (s)", "turn"], rows)


if __name__ == "__main__":
    main()
