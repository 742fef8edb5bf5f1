"""The turn-overhead benchmark's baseline: a bare RQ job, and a bare view that enqueues it.

Kept in a module of its own with only light imports, so that a work horse importing it pays
no more than it would for a job function in any Django app.
"""

import json
import time

import requests
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

SYSTEM = "You are a helpful assistant embedded in a website. Answer briefly."


def bare_job(url, key, turn_number):
    """Three provider calls, each with the conversation so far, then one Redis write."""
    from rq import get_current_job

    session = requests.Session()
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"What time is it in Tokyo, and how do refunds work? ({turn_number})"}]
    for _ in range(3):
        reply = session.post(url + "/chat/completions", data=json.dumps({"model": "bench", "messages": messages}),
                             headers={"Content-Type": "application/json", "Authorization": "Bearer bench"},
                             timeout=(10, 60))
        message = reply.json()["choices"][0]["message"]
        messages.append(message)
        for call in message.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "result"})
    get_current_job().connection.set(key, repr(time.time()), ex=600)


@csrf_exempt
@require_POST
def bare_enqueue(request):
    """A bare view: read the JSON body, enqueue ``bare_job``, answer 202. No session, no rows."""
    from conversations.infra.queue import get_queue

    body = json.loads(request.body)
    job = get_queue().enqueue(bare_job, body["url"], body["key"], body["number"], job_timeout=120)
    return JsonResponse({"job": job.id}, status=202)
