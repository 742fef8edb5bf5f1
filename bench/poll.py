"""Poll endpoint throughput: the poll view beside a bare Django view serving the same cached bytes.

    .venv/bin/python -m bench.poll [--connections 50] [--duration 5] [--rounds 6] [--web-workers 2]

One finished turn (a realistic tool-using transcript) is published to the cache; a visitor's
session owns it. gunicorn (sync workers, a fixed count) serves both views; ``wrk`` (Debian
package) drives each in turn with 50 keep-alive connections on loopback, round-robin for
``--rounds`` rounds so that drift in the machine's load hits all three alike:

- ``bare``: ``bench.urls.bare_poll`` - cache read + the same JSON bytes, nothing else;
- ``bare + session``: the same, after reading the visitor's session (a second Redis read),
  to show what the poll view's gap is made of;
- ``poll 200``: the real poll view (session, ownership from the cached state, ETag);
- ``poll 304``: the real poll view with ``If-None-Match`` set to the current ETag.
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--duration", type=int, default=5, help="seconds per target per round")
    # Many short rounds: on a shared machine, load drifts; interleaving finely spreads it evenly.
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--web-workers", type=int, default=2, help="gunicorn sync workers")
    parser.add_argument("--database", default="postgres", help='"postgres", "sqlite" or a DATABASE_URL')
    args = parser.parse_args()
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
        bare_rps = median([r[0] for r in results["bare view (same cached bytes)"]])
        rows = []
        for name, runs in results.items():
            rps = median([r[0] for r in runs])
            rows.append([name, f"{rps:.0f}", " / ".join(f"{r[0]:.0f}" for r in runs),
                         f"{median([r[1] for r in runs]):.1f}", f"{median([r[2] for r in runs]):.1f}",
                         sum(r[3] for r in runs), f"{rps / bare_rps:.2f}"])
        table(["target", "req/s (median)", "req/s per round", "p50 ms", "p99 ms", "errors", "vs bare"], rows)


if __name__ == "__main__":
    main()
