"""Conversations handed to a person: how soon a staff reply reaches the widget, and that nothing
is lost or reordered.

    .venv/bin/python -m bench.handoff [--waiting 100] [--replies 300] [--handoffs 200] [--staff-pages 3]
                                      [--database sqlite]

1. ``--waiting`` conversations wait for a person at once, each polled over HTTP by a thread that
   imitates the widget's ``ConversationPoller``: GET …/handoff/ with its ETag, the next look
   0.5 s after a change, then 1.5 times later each time nothing changed, up to 1 s (widget.js's
   HANDOFF_FIRST_DELAY, GROWTH, HANDOFF_MAX_DELAY; 100 browsers would measure Chromium, not the
   app). First a rest: nothing changes for ``REST`` seconds, and the polls per visitor per
   second are counted. Then staff replies are saved with ``engine.handoff.reply`` (what the
   admin's reply box calls) to random conversations, one every 1/(replies per second); the
   latency is from the reply's commit to the first poll answer that holds it. Meanwhile
   ``--staff-pages`` open inboxes poll the inbox's JSON as admin-live.js does (every second,
   with its ETag), signed in as a staff member, and a new request is made once a second: its
   latency is from the request's commit to the first inbox answer that counts it. Baselines in
   the same run: the schedule before (backing off up to 2 s) and a fixed 0.5 s, the delay the
   back-off starts from (the lowest latency the schedule can give, at the most requests).
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

FIRST, GROWTH, MAX_DELAY = 0.5, 1.5, 1.0
BEFORE_MAX_DELAY = 2.0  # the widget's back-off before it stopped at 1 s
STAFF_INTERVAL = 1.0  # admin/handoff.py's POLL_INTERVAL_MS
REST = 10.0  # seconds with nothing changing, to count the polls at rest


def setup_waiting(count):
    """``count`` conversations waiting for a person, each owned by an anonymous session; returns
    [(conversation id, session cookie)] and the staff member."""
    from django.conf import settings
    from django.contrib.auth.models import Permission, User
    from django.contrib.sessions.backends.cache import SessionStore

    from conversations import owners
    from conversations.engine import handoff
    from conversations.models import Assistant, Conversation

    assistant, _ = Assistant.objects.get_or_create(slug="support", defaults={
        "name": "Support", "system_prompt": "Help.", "provider": "demo", "handoff": Assistant.HandoffWays.BOTH})
    staff, _ = User.objects.get_or_create(username="ana", defaults={"first_name": "Ana", "is_staff": True})
    staff.user_permissions.add(Permission.objects.get(codename="answer_handoff"))
    made = []
    for n in range(count):
        session = SessionStore()
        session[owners.SESSION_KEY] = f"bench-token-{n}-{random.random()}"
        session.create()
        conversation = Conversation.objects.create(owner_token=session[owners.SESSION_KEY], assistant=assistant)
        handoff.request(conversation.pk, "button")
        made.append((str(conversation.pk), f"{settings.SESSION_COOKIE_NAME}={session.session_key}"))
    return made, staff


def staff_cookie(staff):
    """A session cookie of ``staff`` signed in (as the admin's login leaves it)."""
    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.sessions.backends.cache import SessionStore

    session = SessionStore()
    session.update({SESSION_KEY: str(staff.pk), BACKEND_SESSION_KEY: "django.contrib.auth.backends.ModelBackend",
                    HASH_SESSION_KEY: staff.get_session_auth_hash()})
    session.create()
    return f"{settings.SESSION_COOKIE_NAME}={session.session_key}"


class InboxPoller(threading.Thread):
    """One open inbox, polling its JSON as admin-live.js does: records when each count of the
    conversations staff hold was first seen (a new request counts one more)."""

    def __init__(self, base, cookie, stop):
        super().__init__(daemon=True)
        self.url, self.cookie, self.stop = f"{base}/admin/conversations/waitingconversation/live/", cookie, stop
        self.seen, self.requests, self.not_modified = {}, 0, 0

    def run(self):
        http, etag = requests.Session(), None
        while not self.stop.is_set():
            response = http.get(self.url, headers={"Cookie": self.cookie, **({"If-None-Match": etag} if etag else {})},
                                timeout=15)
            now = time.monotonic()
            self.requests += 1
            if response.status_code == 304:
                self.not_modified += 1
            else:
                assert response.status_code == 200, response.status_code
                etag = response.headers["ETag"]
                # Two requests between two looks: the count seen holds both.
                count = response.json()["count"]
                for each in range(min(self.seen, default=count), count + 1):
                    self.seen.setdefault(each, now)
            self.stop.wait(STAFF_INTERVAL)


class WidgetPoller(threading.Thread):
    """One widget's handoff poll: records when each staff message id was first seen."""

    def __init__(self, base, conversation, cookie, stop, fixed=None, max_delay=MAX_DELAY):
        super().__init__(daemon=True)
        self.url = f"{base}/api/conversations/{conversation}/handoff/"
        self.cookie, self.stop, self.fixed, self.max_delay = cookie, stop, fixed, max_delay
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
                delay = min(delay * GROWTH, self.max_delay)
            else:
                assert response.status_code == 200, response.status_code
                etag = response.headers["ETag"]
                for message in response.json()["messages"]:
                    self.seen.setdefault(message["id"], now)
                delay = FIRST
            self.stop.wait(self.fixed or delay)


def latency_run(base, waiting, staff, replies, rate, fixed=None, max_delay=MAX_DELAY, staff_pages=3):
    """Pollers on every waiting conversation and ``staff_pages`` open inboxes; a rest, then
    ``replies`` staff replies at ``rate`` per second and a new request every second. Returns a
    dict: the replies' latencies (s) and how many were never seen, widget polls per visitor per
    second at rest, the share of 304s, the new requests' latencies in the inboxes, and inbox polls
    per page per second at rest."""
    from conversations.engine import handoff

    stop = threading.Event()
    pollers = {c: WidgetPoller(base, c, cookie, stop, fixed, max_delay) for c, cookie in waiting}
    inboxes = [InboxPoller(base, staff_cookie(staff), stop) for _ in range(staff_pages)]
    for poller in [*pollers.values(), *inboxes]:
        poller.start()
    time.sleep(max_delay * 3)  # every poller backed off to its slowest, as a conversation nobody answers
    counted = [sum(p.requests for p in pollers.values()), sum(p.requests for p in inboxes)]
    time.sleep(REST)
    at_rest = [(sum(p.requests for p in pollers.values()) - counted[0]) / REST / len(pollers),
               (sum(p.requests for p in inboxes) - counted[1]) / REST / max(1, len(inboxes))]
    waiting_now = len(waiting) + len(requested_so_far)
    saved, asked, started, next_request = [], [], time.monotonic(), time.monotonic()
    for n in range(replies):
        conversation = random.choice(waiting)[0]
        message = handoff.reply(conversation, staff, f"Reply {n}")
        saved.append((conversation, message.id, time.monotonic()))
        if time.monotonic() >= next_request:
            requested_so_far.append(new_request())
            waiting_now += 1
            asked.append((waiting_now, time.monotonic()))
            next_request += 1.0
        time.sleep(random.expovariate(rate))
    time.sleep(max_delay * 2 + STAFF_INTERVAL)
    stop.set()
    for poller in [*pollers.values(), *inboxes]:
        poller.join()
    latencies = [pollers[c].seen[m] - at for c, m, at in saved if m in pollers[c].seen]
    total = sum(p.requests for p in pollers.values())
    inbox_latencies = [inbox.seen[count] - at for inbox in inboxes for count, at in asked if count in inbox.seen]
    return {"latencies": latencies, "missing": len(saved) - len(latencies), "rest": at_rest[0],
            "share": sum(p.not_modified for p in pollers.values()) / max(1, total),
            "inbox": inbox_latencies, "inbox_missing": len(asked) * len(inboxes) - len(inbox_latencies),
            "inbox_rest": at_rest[1]}


# Conversations asked for a person during the runs (each stays waiting: the next run counts them).
requested_so_far = []


def new_request():
    """A new conversation waiting for a person (as the widget's button makes one); returns its id."""
    from conversations.engine import handoff
    from conversations.models import Assistant, Conversation

    conversation = Conversation.objects.create(owner_token=f"bench-new-{random.random()}",
                                               assistant=Assistant.objects.get(slug="support"))
    handoff.request(conversation.pk, "button")
    return str(conversation.pk)


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
    parser.add_argument("--staff-pages", type=int, default=3, help="open inboxes polling their JSON")
    parser.add_argument("--database", default="postgres", help='"postgres", "sqlite" or a DATABASE_URL')
    args = parser.parse_args()
    print(machine())
    # The benchmark is one address starting hundreds of conversations ("0": the limit is off; an
    # empty environment variable would be ignored by the demo project's settings).
    with Stack(database=args.database, conversations={"CONVERSATION_RATE_PER_IP": "0",
                                                      "CONVERSATION_RATE_PER_OWNER": "0"}) as stack:
        base = stack.gunicorn(args.web_workers)
        waiting, staff = setup_waiting(args.waiting)
        rows, staff_rows = [], []
        for label, fixed, max_delay in (("widget schedule (0.5 s, x1.5, up to 1 s)", None, MAX_DELAY),
                                        ("before: 0.5 s, x1.5, up to 2 s", None, BEFORE_MAX_DELAY),
                                        ("baseline: fixed 0.5 s", FIRST, FIRST)):
            run = latency_run(base, waiting, staff, args.replies, args.rate, fixed, max_delay, args.staff_pages)
            latencies = run["latencies"]
            rows.append([label, len(latencies), run["missing"], f"{percentile(latencies, 0.5):.2f}",
                         f"{percentile(latencies, 0.95):.2f}", f"{max(latencies, default=float('nan')):.2f}", f"{run['rest']:.2f}",
                         f"{run['share']:.0%}"])
            inbox = run["inbox"]
            staff_rows.append([label, len(inbox), run["inbox_missing"], f"{percentile(inbox, 0.5):.2f}",
                               f"{percentile(inbox, 0.95):.2f}", f"{max(inbox, default=float('nan')):.2f}", f"{run['inbox_rest']:.2f}"])
        print(f"\n{args.waiting} conversations waiting, {args.replies} staff replies at {args.rate}/s, gunicorn "
              f"{args.web_workers} sync workers, {stack.database_label}\n")
        table(["widget pollers", "replies seen", "never seen", "p50 s", "p95 s", "max s",
               "polls/s per visitor at rest", "304s"], rows)
        print(f"\n{args.staff_pages} open inboxes (every {STAFF_INTERVAL:g} s), a new request a second, "
              "in the same runs\n")
        table(["widget pollers meanwhile", "new requests seen", "never seen", "p50 s", "p95 s", "max s",
               "polls/s per page at rest"], staff_rows)
        sent, lost, disordered = interleaved(base, args.handoffs, staff)
        print(f"\n{args.handoffs} handoffs, 5 visitor (HTTP) and 5 staff messages each, interleaved:\n")
        table(["messages sent", "lost", "conversations out of order"], [[sent, lost, disordered]])


if __name__ == "__main__":
    main()
