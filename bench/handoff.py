"""Conversations handed to a person: how soon a staff reply reaches the widget, and that nothing
is lost or reordered.

    .venv/bin/python -m bench.handoff [--waiting 100] [--replies 300] [--handoffs 200] [--database sqlite]

1. ``--waiting`` conversations wait for a person at once, each polled over HTTP by a thread that
   imitates the widget's ``ConversationPoller``: GET …/handoff/ with its ETag, the next look
   0.5 s after a change, then 1.5 times later each time nothing changed, up to 2 s (widget.js's
   HANDOFF_FIRST_DELAY, GROWTH, HANDOFF_MAX_DELAY; 100 browsers would measure Chromium, not the
   app). Staff replies are saved with ``engine.handoff.reply`` (what the admin's reply box
   calls) to random conversations, one every 1/(replies per second); the latency is from the
   reply's commit to the first poll answer that holds it. The baseline in the same run: the
   same pollers at a fixed 0.5 s, the delay the widget's back-off starts from (the lowest
   latency the schedule can give, at the most requests).
2. ``--handoffs`` conversations are asked for a person over HTTP, then each gets 5 visitor
   messages (HTTP POSTs, one after the other) while staff reply 5 times (``reply``) at random
   moments; at the end each conversation's rows and its polled state are checked: every
   message there, each side's in the order it was sent.
"""

import argparse
import random
import threading
import time

import requests

from bench.common import Stack, machine, percentile, table

FIRST, GROWTH, MAX_DELAY = 0.5, 1.5, 2.0


def setup_waiting(count):
    """``count`` conversations waiting for a person, each owned by an anonymous session; returns
    [(conversation id, session cookie)] and the staff member."""
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.contrib.sessions.backends.cache import SessionStore

    from conversations import owners
    from conversations.engine import handoff
    from conversations.models import Assistant, Conversation

    assistant, _ = Assistant.objects.get_or_create(slug="support", defaults={
        "name": "Support", "system_prompt": "Help.", "provider": "demo", "handoff": Assistant.HandoffWays.BOTH})
    staff, _ = User.objects.get_or_create(username="ana", defaults={"first_name": "Ana", "is_staff": True})
    made = []
    for n in range(count):
        session = SessionStore()
        session[owners.SESSION_KEY] = f"bench-token-{n}-{random.random()}"
        session.create()
        conversation = Conversation.objects.create(owner_token=session[owners.SESSION_KEY], assistant=assistant)
        handoff.request(conversation.pk, "button")
        made.append((str(conversation.pk), f"{settings.SESSION_COOKIE_NAME}={session.session_key}"))
    return made, staff


class WidgetPoller(threading.Thread):
    """One widget's handoff poll: records when each staff message id was first seen."""

    def __init__(self, base, conversation, cookie, stop, fixed=None):
        super().__init__(daemon=True)
        self.url = f"{base}/api/conversations/{conversation}/handoff/"
        self.cookie, self.stop, self.fixed = cookie, stop, fixed
        self.seen, self.requests, self.not_modified = {}, 0, 0

    def run(self):
        http, etag, delay = requests.Session(), None, FIRST
        while not self.stop.is_set():
            headers = {"Cookie": self.cookie, **({"If-None-Match": etag} if etag else {})}
            response = http.get(self.url, headers=headers, timeout=15)
            now = time.monotonic()
            self.requests += 1
            if response.status_code == 304:
                self.not_modified += 1
                delay = min(delay * GROWTH, MAX_DELAY)
            else:
                assert response.status_code == 200, response.status_code
                etag = response.headers["ETag"]
                for message in response.json()["messages"]:
                    self.seen.setdefault(message["id"], now)
                delay = FIRST
            self.stop.wait(self.fixed or delay)


def latency_run(base, waiting, staff, replies, rate, fixed=None):
    """Pollers on every waiting conversation, ``replies`` staff replies at ``rate`` per second;
    returns (latencies in seconds, poll requests per second, share of 304s)."""
    from conversations.engine import handoff

    stop = threading.Event()
    pollers = {c: WidgetPoller(base, c, cookie, stop, fixed) for c, cookie in waiting}
    for poller in pollers.values():
        poller.start()
    time.sleep(MAX_DELAY * 2)  # every poller backed off to its slowest, as a conversation nobody answers
    saved, started = [], time.monotonic()
    for n in range(replies):
        conversation = random.choice(waiting)[0]
        message = handoff.reply(conversation, staff, f"Reply {n}")
        saved.append((conversation, message.id, time.monotonic()))
        time.sleep(random.expovariate(rate))
    time.sleep(MAX_DELAY * 2)
    elapsed = time.monotonic() - started
    stop.set()
    for poller in pollers.values():
        poller.join()
    latencies = [pollers[c].seen[m] - at for c, m, at in saved if m in pollers[c].seen]
    missing = len(saved) - len(latencies)
    total = sum(p.requests for p in pollers.values())
    return latencies, missing, total / elapsed, sum(p.not_modified for p in pollers.values()) / max(1, total)


def interleaved(base, count, staff, per_side=5):
    """``count`` handoffs asked over HTTP, ``per_side`` visitor and staff messages each,
    interleaved; returns (messages sent, lost, out of order)."""
    from conversations.engine import handoff
    from conversations.models import Message

    visitors = []
    for _ in range(count):
        http = requests.Session()
        http.get(f"{base}/api/conversations/")  # the csrftoken cookie
        headers = {"X-CSRFToken": http.cookies["csrftoken"], "Content-Type": "application/json"}
        conversation = http.post(f"{base}/api/conversations/", data='{"assistant": "support"}', headers=headers,
                                 ).json()["id"]
        assert http.post(f"{base}/api/conversations/{conversation}/handoff/", headers=headers).status_code == 202
        visitors.append((conversation, http, headers))

    def visitor(conversation, http, headers):
        for n in range(per_side):
            time.sleep(random.uniform(0, 0.05))
            response = http.post(f"{base}/api/conversations/{conversation}/turns/",
                                 data=f'{{"content": "visitor {n}"}}', headers=headers)
            assert response.status_code == 202 and "handoff" in response.json(), response.text

    def staff_side(conversations):
        for n in range(per_side):
            for conversation in conversations:
                handoff.reply(conversation, staff, f"staff {n}")
                time.sleep(random.uniform(0, 0.002))

    threads = [threading.Thread(target=visitor, args=v) for v in visitors]
    ids = [v[0] for v in visitors]
    threads += [threading.Thread(target=staff_side, args=(ids[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lost = disordered = 0
    for conversation, http, _headers in visitors:
        rows = list(Message.objects.filter(conversation_id=conversation).order_by("id").values_list("role", "content"))
        polled = [(m["role"], m["content"]) for m in http.get(f"{base}/api/conversations/{conversation}/handoff/"
                                                               ).json()["messages"]]
        for role, prefix in (("user", "visitor"), ("staff", "staff")):
            mine = [content for r, content in rows if r == role]
            lost += per_side - len(mine)
            disordered += mine != [f"{prefix} {n}" for n in range(per_side)]
        disordered += polled != rows
    return count * per_side * 2, lost, disordered


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiting", type=int, default=100)
    parser.add_argument("--replies", type=int, default=300)
    parser.add_argument("--rate", type=float, default=5.0, help="staff replies per second")
    parser.add_argument("--handoffs", type=int, default=200)
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--database", default="postgres", help='"postgres", "sqlite" or a DATABASE_URL')
    args = parser.parse_args()
    print(machine())
    # The benchmark is one address starting hundreds of conversations ("0": the limit is off; an
    # empty environment variable would be ignored by the demo project's settings).
    with Stack(database=args.database, conversations={"CONVERSATION_RATE_PER_IP": "0",
                                                      "CONVERSATION_RATE_PER_OWNER": "0"}) as stack:
        base = stack.gunicorn(args.web_workers)
        waiting, staff = setup_waiting(args.waiting)
        rows = []
        for label, fixed in (("widget schedule (0.5 s, x1.5, up to 2 s)", None), ("baseline: fixed 0.5 s", FIRST)):
            latencies, missing, rps, share = latency_run(base, waiting, staff, args.replies, args.rate, fixed)
            rows.append([label, len(latencies), missing, f"{percentile(latencies, 0.5):.2f}",
                         f"{percentile(latencies, 0.95):.2f}", f"{max(latencies):.2f}", f"{rps:.0f}",
                         f"{share:.0%}"])
        print(f"\n{args.waiting} conversations waiting, {args.replies} staff replies at {args.rate}/s, gunicorn "
              f"{args.web_workers} sync workers, {stack.database_label}\n")
        table(["pollers", "replies seen", "never seen", "p50 s", "p95 s", "max s", "polls/s", "304s"], rows)
        sent, lost, disordered = interleaved(base, args.handoffs, staff)
        print(f"\n{args.handoffs} handoffs, 5 visitor (HTTP) and 5 staff messages each, interleaved:\n")
        table(["messages sent", "lost", "conversations out of order"], [[sent, lost, disordered]])


if __name__ == "__main__":
    main()
