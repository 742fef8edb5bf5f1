"""The live state of a turn, in the Django cache: what the poll view serves and the widget draws.

Shape (JSON-ready)::

    {"id", "conversation", "owner": {"user": id|None, "token": str}, "status", "done",
     "messages": [...], "error": None|str, "version": int, "updated_at": epoch seconds,
     "started_at", "job_id"}

``version`` comes from an atomic Redis counter, so every writer (the job, the worker's
parent, the poll view's repair) produces a strictly newer state.
"""

import time

from django.core.cache import caches

from .conf import get_config


def _cache():
    return caches[get_config()["CACHE_ALIAS"]]


def state_key(turn_id):
    return f"conversations:turn:{turn_id}"


def _version_key(turn_id):
    return f"conversations:turn:{turn_id}:version"


def cancel_key(turn_id):
    return f"conversations:turn:{turn_id}:cancel"


def read(turn_id):
    """The cached state of a turn, or None."""
    return _cache().get(state_key(turn_id))


def publish(state):
    """Write ``state`` (a dict with at least ``id``) with the next version; return the written dict."""
    cache = _cache()
    ttl = get_config()["STATE_TTL"]
    vkey = _version_key(state["id"])
    cache.add(vkey, 0, timeout=ttl)
    try:
        version = cache.incr(vkey)
    except ValueError:  # expired between add and incr
        cache.set(vkey, 1, timeout=ttl)
        version = 1
    cache.touch(vkey, ttl)
    state = {**state, "version": version, "updated_at": time.time()}
    cache.set(state_key(state["id"]), state, timeout=ttl)
    return state


def request_cancel(turn_id):
    _cache().set(cancel_key(turn_id), True, timeout=get_config()["STATE_TTL"])


def cancel_requested(turn_id):
    return bool(_cache().get(cancel_key(turn_id)))


def message_dict(message):
    """The JSON form of a ``Message`` row, as the poll view and the widget see it."""
    data = {"id": message.id, "role": message.role, "content": message.content}
    if message.tool_calls:
        data["tool_calls"] = message.tool_calls
    if message.role == "tool":
        data["tool_call_id"] = message.tool_call_id
        data["name"] = message.tool_name
        data["is_error"] = message.is_error
    return data


def owner_dict(conversation):
    return {"user": conversation.user_id, "token": conversation.owner_token}


def state_from_db(turn, messages=None):
    """Build the state of ``turn`` from the database (``messages``: the turn's rows, if already loaded)."""
    if messages is None:
        messages = list(turn.messages.order_by("id"))
    return {
        "id": str(turn.id),
        "conversation": str(turn.conversation_id),
        "owner": owner_dict(turn.conversation),
        "status": turn.status,
        "done": turn.done,
        "messages": [message_dict(m) for m in messages],
        "error": turn.error or None,
        "job_id": turn.job_id,
        "started_at": turn.started_at.timestamp() if turn.started_at else None,
    }
