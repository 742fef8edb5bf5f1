"""The turn-overhead benchmark's baselines: a naive django-rq job and a naive view that enqueues it;
and the seed's own loop written as plainly, with the writes and checks the design requires.

What a simple chat app would do for one question, with none of this app's safety nets: the
view saves the visitor's message and enqueues; the job reads the conversation's messages
(one query), makes the same three provider calls with the same growing message lists through
one ``requests`` session, saves the answer as one row, and writes one state to the cache for a
poller. It does not save the tool rows, call records or counters after each round-trip, check a
stop flag, keep a deadline or publish between calls. Kept in a module of its own with only
light imports, so that a worker importing it pays no more than for a job in any Django app.

``seed_job`` and ``seed_enqueue`` are the floor a turn is measured against: the loop of the design
this app comes from, written as plainly as the naive job, doing only what the design and the
project's standards require of any implementation. The view reads the visitor's session, lets
Django's CSRF middleware check the token, counts the visitor's request against a rate in the cache
(as DRF's throttles do: a read and a write), checks that the conversation is the session's, saves
the message and enqueues. The job keeps the design's deadline (``job_timeout`` - 20 s; each call
gets ``min(60, remaining)``, none is started with under 5 s left), runs the site's own tools in its
thread, and after every model or tool round trip saves that round trip's rows and publishes the
state with its ``done`` flag to the cache (five saves and five publishes for three calls and two
tools, against the naive job's one and one). No stop flag, no call records, no fallbacks, no
resume, no watchdog: whatever a turn costs beyond this is this app's own. With
``BENCH_SEED_ASYNC=1`` on PostgreSQL its commits but the last do not wait for the disk, as a turn's
round trips do not (``synchronous_commit`` off for the job's session until its answer's save).
"""

import json
import os
import time

import requests
from django.core.cache import cache
from django.db import connection
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from conversations.models import Conversation, Message

SYSTEM = "You are a helpful assistant embedded in a website. Answer briefly."


def naive_calls(session, url, messages):
    """The naive job's three provider calls through ``session`` (``Session.post`` each), ``messages``
    growing with each reply and a stock result for each tool call; returns the last reply's message."""
    for _ in range(3):
        reply = session.post(url + "/chat/completions", data=json.dumps({"model": "bench", "messages": messages}),
                             headers={"Content-Type": "application/json", "Authorization": "Bearer bench"},
                             timeout=(10, 60))
        message = reply.json()["choices"][0]["message"]
        messages.append(message)
        for call in message.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "result"})
    return message


def bare_job(url, key, conversation_id, turn_id):
    """Read the conversation, three provider calls, save the answer, write a state, then the end time."""
    from rq import get_current_job

    messages = [{"role": "system", "content": SYSTEM}]
    messages += [{"role": m.role, "content": m.content} for m in Message.objects.filter(
        conversation_id=conversation_id).order_by("id")]
    message = naive_calls(requests.Session(), url, messages)
    answer = Message.objects.create(conversation_id=conversation_id, turn_id=turn_id,
                                    role=Message.Role.ASSISTANT, content=message.get("content") or "")
    cache.set(f"bench:bare-state:{turn_id}", {"done": True, "messages": [{"id": answer.id, "role": answer.role,
                                                                          "content": answer.content}]}, 600)
    get_current_job().connection.set(key, repr(time.time()), ex=600)


@csrf_exempt
@require_POST
def bare_enqueue(request):
    """A naive view: read the JSON body, save the visitor's message, enqueue ``bare_job``, answer 202.
    No session, no ownership check, no limits. ``queue`` in the body: the queue to enqueue on
    (``bare``: the one a stock django-rq worker serves in ``bench.turn_overhead``); the turns' by default."""
    import django_rq

    from conversations.infra.queue import get_queue

    body = json.loads(request.body)
    Message.objects.create(conversation_id=body["conversation"], turn_id=body["turn"], role=Message.Role.USER,
                           content=body["content"])
    queue = django_rq.get_queue(body["queue"]) if body.get("queue") else get_queue()
    job = queue.enqueue(bare_job, body["url"], body["key"], body["conversation"], body["turn"],
                              job_timeout=120)
    return JsonResponse({"job": job.id}, status=202)


JOB_TIMEOUT = 120


def seed_job(url, key, conversation_id, turn_id):
    """The design's loop: read the conversation; three calls within the job's deadline; after each
    model or tool round trip, save its rows and publish the state; then the end time."""
    from rq import get_current_job

    from chatproject import tools

    deadline = time.monotonic() + JOB_TIMEOUT - 20
    rows = list(Message.objects.filter(conversation_id=conversation_id).order_by("id"))
    history = [{"id": m.id, "role": m.role, "content": m.content} for m in rows]
    messages = [{"role": "system", "content": SYSTEM}] + [{"role": m.role, "content": m.content} for m in rows]
    session = requests.Session()

    def publish(done):
        cache.set(f"bench:seed-state:{turn_id}", {"done": done, "messages": history}, 600)

    def save(role, content, **fields):
        row = Message.objects.create(conversation_id=conversation_id, turn_id=turn_id, role=role, content=content,
                                     **fields)
        history.append({"id": row.id, "role": row.role, "content": row.content})

    def wait_for_disk(wait):  # BENCH_SEED_ASYNC: whether this session's commits wait for the disk
        with connection.cursor() as cursor:
            cursor.execute("RESET synchronous_commit" if wait else "SET synchronous_commit = off")

    asynchronous = os.environ.get("BENCH_SEED_ASYNC") == "1" and connection.vendor == "postgresql"
    if asynchronous:
        wait_for_disk(False)
    try:
        for _ in range(3):
            remaining = deadline - time.monotonic()
            if remaining < 5:
                break
            reply = session.post(url + "/chat/completions",
                                 data=json.dumps({"model": "bench", "messages": messages}),
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer bench"},
                                 timeout=(10, min(60, remaining)))
            message = reply.json()["choices"][0]["message"]
            messages.append(message)
            calls = message.get("tool_calls") or []
            if asynchronous and not calls:  # the answer's save, the last, waits for the disk
                wait_for_disk(True)
                asynchronous = False
            save(Message.Role.ASSISTANT, message.get("content") or "", tool_calls=[
                {"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                for c in calls])
            publish(done=not calls)
            if not calls:
                break
            for call in calls:
                function = getattr(tools, call["function"]["name"]).function
                result = function(**json.loads(call["function"]["arguments"]))
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
                save(Message.Role.TOOL, result, tool_call_id=call["id"], tool_name=call["function"]["name"])
            publish(done=False)
        get_current_job().connection.set(key, repr(time.time()), ex=600)
    finally:
        if asynchronous:  # ended before its answer: the pooled connection given back as it was lent
            wait_for_disk(True)


@require_POST
def seed_enqueue(request):
    """The design's view, plainly: the session's visitor, the CSRF middleware's check, a rate
    counted in the cache, the conversation checked to be the visitor's; the message saved and
    ``seed_job`` enqueued."""
    from conversations.infra.queue import get_queue
    from conversations.owners import SESSION_KEY

    token = request.session.get(SESSION_KEY, "")
    rate_key = f"bench:seed-rate:{token}"
    history = [moment for moment in cache.get(rate_key, []) if moment > time.time() - 60]
    if len(history) >= 10_000:
        return JsonResponse({"detail": "slow down"}, status=429)
    cache.set(rate_key, [time.time(), *history], 60)
    body = json.loads(request.body)
    if not token or not Conversation.objects.filter(pk=body["conversation"], owner_token=token).exists():
        return JsonResponse({"detail": "not found"}, status=404)
    Message.objects.create(conversation_id=body["conversation"], turn_id=body["turn"], role=Message.Role.USER,
                           content=body["content"])
    job = get_queue().enqueue(seed_job, body["url"], body["key"], body["conversation"], body["turn"],
                              job_timeout=JOB_TIMEOUT)
    return JsonResponse({"job": job.id}, status=202)
