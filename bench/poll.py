"""Poll endpoint throughput: the poll view beside a bare Django view serving the same cached bytes.

    .venv/bin/python -m bench.poll [--connections 50] [--duration 5] [--rounds 6] [--web-workers 2]
    .venv/bin/python -m bench.poll --in-process [--requests 500] [--rounds 6]

One finished turn (a realistic tool-using transcript) is published to the cache; a visitor's
session owns it. gunicorn (sync workers, a fixed count) serves both views; ``wrk`` (Debian
package) drives each in turn with 50 keep-alive connections on loopback, round-robin for
``--rounds`` rounds so that drift in the machine's load hits all three alike:

- ``bare``: ``bench.urls.bare_poll`` - cache read + the same JSON bytes, nothing else;
- ``bare + session``: the same, after reading the visitor's session (a second Redis read),
  to show what the poll view's gap is made of;
- ``poll 200``: the real poll view (session, ownership from the cached state, ETag);
- ``poll 304``: the real poll view with ``If-None-Match`` set to the current ETag.

``--in-process`` times the same four through Django's WSGI handler in the bench's own process
instead (no gunicorn, no wrk): on a machine whose other work shifts wrk's figures by half from
one round to the next, what the views themselves cost. ``--profile`` then profiles each target
alone (cProfile on the thread's CPU clock) and prints where its time goes, the functions with
the most time of their own first.
"""

import argparse
import re
import shutil
import subprocess

import requests

from bench.common import Stack, machine, median, table


def publish_finished_turn():
    """Create a finished tool-using turn owned by a new anonymous session; return (poll path, bare path, cookie)."""
    from django.conf import settings
    from django.contrib.sessions.backends.cache import SessionStore
    from django.utils import timezone

    from conversations import owners
    from conversations.infra import state
    from conversations.models import Conversation, Message, Turn

    token = "bench-owner-token-0123456789abcdef"
    conversation = Conversation.objects.create(owner_token=token)
    now = timezone.now()
    turn = Turn.objects.create(conversation=conversation, status=Turn.Status.COMPLETED, enqueued_at=now,
                               started_at=now, finished_at=now, provider="openai", model="bench")
    rows = [
        dict(role="user", content="What time is it in Tokyo, and how do refunds work?"),
        dict(role="assistant", content="", tool_calls=[
            {"id": "call_1", "name": "current_time", "arguments": {"city": "Tokyo"}},
            {"id": "call_2", "name": "search_faq", "arguments": {"query": "refunds", "limit": 2}}]),
        dict(role="tool", content="21:04 on Monday 30 November in Tokyo", tool_call_id="call_1",
             tool_name="current_time"),
        dict(role="tool", content="Refunds: you can return any item within 30 days of delivery for a full "
                                  "refund. The money goes back to the original payment method within 5 business "
                                  "days of the return arriving at our warehouse. " * 2,
             tool_call_id="call_2", tool_name="search_faq"),
        dict(role="assistant", content="It is 21:04 in Tokyo. Refunds: return any item within 30 days of "
                                       "delivery; the money is back on your card within 5 business days."),
    ]
    for row in rows:
        Message.objects.create(conversation=conversation, turn=turn, **row)
    state.publish(state.state_from_db(turn))

    session = SessionStore()
    session[owners.SESSION_KEY] = token
    session.create()
    cookie = f"{settings.SESSION_COOKIE_NAME}={session.session_key}"
    poll = f"/api/conversations/{conversation.id}/turns/{turn.id}/"
    return poll, f"/bench/bare/{turn.id}/", cookie


def check(base, poll, bare, cookie):
    """The three targets answer as claimed, with identical bytes; returns the ETag."""
    real = requests.get(base + poll, headers={"Cookie": cookie})
    plain = requests.get(base + bare)
    assert real.status_code == 200 and plain.status_code == 200, (real.status_code, plain.status_code)
    assert real.content == plain.content, "the bare view must serve the same bytes"
    etag = real.headers["ETag"]
    not_modified = requests.get(base + poll, headers={"Cookie": cookie, "If-None-Match": etag})
    assert not_modified.status_code == 304
    stranger = requests.get(base + poll)
    assert stranger.status_code == 404  # ownership really is checked on this path
    return etag, len(real.content)


UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def wrk(url, headers, *, connections, duration, threads=2):
    """Run wrk; return (requests/s, p50 ms, p99 ms, errors)."""
    command = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{duration}s", "--latency"]
    for name, value in headers.items():
        command += ["-H", f"{name}: {value}"]
    out = subprocess.run(command + [url], capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))

    def latency(label):
        value, unit = re.search(rf"^\s+{label}\s+([\d.]+)(us|ms|s)\s*$", out, re.M).groups()
        return float(value) * UNITS[unit]

    errors = 0
    for pattern in (r"Non-2xx or 3xx responses: (\d+)", r"Socket errors: connect (\d+), read (\d+), write (\d+), "
                    r"timeout (\d+)"):
        match = re.search(pattern, out)
        if match:
            errors += sum(int(g) for g in match.groups())
    return rps, latency("50%"), latency("99%"), errors


def in_process(targets, *, requests_per_round, rounds):
    """Time each target through Django's WSGI handler in this process (no HTTP server, no load
    generator sharing the cores), ``requests_per_round`` requests at a time, the targets
    alternated ``rounds`` times; returns ``{name: [(wall µs, CPU µs) per request, per round]}``.
    The CPU time (this process's) is what a busy machine disturbs least: the waits on Redis,
    one round trip for each view, are not in it."""
    import time

    call = _caller()
    for path, headers in targets.values():  # warm up
        for _ in range(50):
            call(path, headers)
    timings = {name: [] for name in targets}
    for _ in range(rounds):
        for name, (path, headers) in targets.items():
            started, cpu = time.perf_counter(), time.process_time()
            for _ in range(requests_per_round):
                call(path, headers)
            timings[name].append(((time.perf_counter() - started) / requests_per_round * 1e6,
                                  (time.process_time() - cpu) / requests_per_round * 1e6))
    return timings


def profile(targets, *, requests_per_round, top=25):
    """Profile ``requests_per_round`` requests of each target through Django's WSGI handler (cProfile,
    the thread's CPU clock) and print each target's functions with the most time of their own."""
    import cProfile
    import pstats
    import time

    call = _caller()
    for name, (path, headers) in targets.items():
        for _ in range(50):
            call(path, headers)
        profiler = cProfile.Profile(time.thread_time)
        profiler.enable()
        for _ in range(requests_per_round):
            call(path, headers)
        profiler.disable()
        stats = pstats.Stats(profiler)
        print(f"\n## {name}: {stats.total_tt / requests_per_round * 1e6:.0f} µs per request under the profiler\n")
        stats.sort_stats("tottime").print_stats(top)


def _caller():
    """A function ``call(path, headers)`` making one GET through Django's WSGI handler and reading its body."""
    import io
    import sys

    from django.core.handlers.wsgi import WSGIHandler

    app = WSGIHandler()

    def environ(path, headers):
        env = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": "", "SERVER_NAME": "127.0.0.1",
               "SERVER_PORT": "8000", "HTTP_HOST": "127.0.0.1", "REMOTE_ADDR": "127.0.0.1",
               "SERVER_PROTOCOL": "HTTP/1.1", "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(),
               "wsgi.errors": sys.stderr}
        env.update({"HTTP_" + name.upper().replace("-", "_"): value for name, value in headers.items()})
        return env

    def call(path, headers):
        response = app(environ(path, headers), lambda status, response_headers: None)
        b"".join(response)
        response.close()

    return call


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--duration", type=int, default=5, help="seconds per target per round")
    # Many short rounds: on a shared machine, load drifts; interleaving finely spreads it evenly.
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--web-workers", type=int, default=2, help="gunicorn sync workers")
    parser.add_argument("--database", default="postgres", help='"postgres", "sqlite" or a DATABASE_URL')
    parser.add_argument("--in-process", action="store_true",
                        help="time the views through Django's WSGI handler in this process instead of gunicorn + wrk")
    parser.add_argument("--requests", type=int, default=500, help="requests per target per round (--in-process)")
    parser.add_argument("--profile", action="store_true",
                        help="with --in-process: profile each target instead of timing them (--requests each)")
    args = parser.parse_args()
    if args.in_process:
        return main_in_process(args)
    if not shutil.which("wrk"):
        raise SystemExit("wrk is not installed: apt-get install -y wrk")

    print(machine())
    with Stack(database=args.database) as stack:
        poll, bare, cookie = publish_finished_turn()
        base = stack.gunicorn(args.web_workers)
        etag, size = check(base, poll, bare, cookie)
        targets = {
            "bare view (same cached bytes)": (bare, {}),
            "bare view + session read": (bare.replace("/bare/", "/bare-session/"), {"Cookie": cookie}),
            "poll view, 200": (poll, {"Cookie": cookie}),
            "poll view, 304 (If-None-Match)": (poll, {"Cookie": cookie, "If-None-Match": etag}),
        }
        for path, headers in targets.values():  # warm up every worker on every path, unmeasured
            wrk(base + path, headers, connections=args.connections, duration=2)
        results = {name: [] for name in targets}
        for _ in range(args.rounds):
            for name, (path, headers) in targets.items():
                results[name].append(wrk(base + path, headers, connections=args.connections, duration=args.duration))
        print(f"\n{args.connections} connections, {args.duration}s x {args.rounds} rounds per target, "
              f"gunicorn {args.web_workers} sync workers, {stack.database_label}, body {size} bytes\n")
        bare_runs = results["bare view (same cached bytes)"]
        bare_rps = median([r[0] for r in bare_runs])
        rows = []
        for name, runs in results.items():
            rps = median([r[0] for r in runs])
            # Each round's ratio to the bare view's rate in the same round: a shared machine's load
            # drifts over minutes, less within one round's few seconds.
            paired = median([r[0] / b[0] for r, b in zip(runs, bare_runs)])
            rows.append([name, f"{rps:.0f}", " / ".join(f"{r[0]:.0f}" for r in runs),
                         f"{median([r[1] for r in runs]):.1f}", f"{median([r[2] for r in runs]):.1f}",
                         sum(r[3] for r in runs), f"{rps / bare_rps:.2f}", f"{paired:.2f}"])
        table(["target", "req/s (median)", "req/s per round", "p50 ms", "p99 ms", "errors", "vs bare",
               "vs bare, round by round (median)"], rows)


def main_in_process(args):
    from django.db import connections

    print(machine())
    with Stack(database=args.database) as stack:
        poll, bare, cookie = publish_finished_turn()
        connections.close_all()
        from django.test import Client

        etag = Client(HTTP_HOST="127.0.0.1").get(poll, HTTP_COOKIE=cookie).headers["ETag"]
        targets = {
            "bare view (same cached bytes)": (bare, {}),
            "bare view + session read": (bare.replace("/bare/", "/bare-session/"), {"Cookie": cookie}),
            "poll view, 200": (poll, {"Cookie": cookie}),
            "poll view, 304 (If-None-Match)": (poll, {"Cookie": cookie, "If-None-Match": etag}),
        }
        if args.profile:
            return profile(targets, requests_per_round=args.requests)
        timings = in_process(targets, requests_per_round=args.requests, rounds=args.rounds)
        print(f"\nIn process, {args.requests} requests x {args.rounds} rounds per target, alternated, "
              f"{stack.database_label}\n")
        bare_runs = timings["bare view (same cached bytes)"]
        rows = []
        for name, runs in timings.items():
            wall, cpu = [r[0] for r in runs], [r[1] for r in runs]
            rows.append([name, f"{median(wall):.0f}", f"{median([b[0] / r[0] for r, b in zip(runs, bare_runs)]):.2f}",
                         f"{median(cpu):.0f}", " / ".join(f"{t:.0f}" for t in cpu),
                         f"{median([b[1] / r[1] for r, b in zip(runs, bare_runs)]):.2f}"])
        table(["target", "wall µs per request (median)", "wall: vs bare, round by round (median)",
               "CPU µs per request (median)", "CPU µs per round", "CPU: vs bare, round by round (median)"], rows)


if __name__ == "__main__":
    main()
