"""The turn-overhead benchmark's baseline: a naive django-rq job, and a naive view that enqueues it.

What a simple chat app would do for one question, with none of this app's safety nets: the
view saves the visitor's message and enqueues; the job reads the conversation's messages
(one query), makes the same three provider calls with the same growing message lists through
one ``requests`` session, saves the answer as one row, and writes one state to the cache for a
poller. It does not save the tool rows, call records or counters after each round-trip, check a
stop flag, keep a deadline or publish between calls. Kept in a module of its own with only
light imports, so that a worker importing it pays no more than for a job in any Django app.
"""

import json
import time

import requests
from django.core.cache import cache
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from conversations.models import Message

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
