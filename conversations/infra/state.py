"""The live state of a turn, in the Django cache: what the poll view serves and the widget draws.

Shape (JSON-ready)::

    {"id", "conversation", "owner": {"user": id|None, "token": str, "assistant": id|None}, "status", "done",
     "messages": [...], "error": None|str, "version": int, "updated_at": epoch seconds,
     "started_at", "job_id"}

``version`` comes from an atomic Redis counter, so every writer (the job, the worker's
parent, the poll view's repair) produces a strictly newer state.
"""

import json
import logging
import os
import pickle
import threading
import time
from enum import StrEnum
from functools import lru_cache
from importlib import import_module
from typing import NamedTuple

from django.conf import settings
from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache, RedisSerializer
from django.core.signals import setting_changed
from django.dispatch import receiver

from ..conf import get_config
from ..owners import auth_stamp_key
from . import lease

logger = logging.getLogger("conversations.state")


def _cache():
    return caches[get_config()["CACHE_ALIAS"]]


def state_key(turn_id):
    return f"conversations:turn:{turn_id}"


def _version_key(turn_id):
    return f"conversations:turn:{turn_id}:version"


def cancel_key(turn_id):
    return f"conversations:turn:{turn_id}:cancel"


def owner_key(conversation_id):
    return f"conversations:conversation:{conversation_id}:owner"


def read(turn_id):
    """The cached state of a turn, or None."""
    return _cache().get(state_key(turn_id))


_CACHE_SESSIONS = "django.contrib.sessions.backends.cache"


def read_with_session(turn_id, request):
    """The cached state of a turn (or None) and the caller's session data, for the poll view.

    When sessions live in this same cache (``SESSION_ENGINE`` ``cache``), both come back in one
    round trip (``get_many``) instead of two; otherwise the session is read as usual.
    """
    cookie = _session_cookie()
    session_key = request.COOKIES.get(cookie) if cookie is not None else None
    if not session_key:
        return read(turn_id), request.session
    # The request's own session (SessionMiddleware's, not loaded yet), else one made here.
    store = getattr(request, "session", None)
    if store is None or store.session_key != session_key:
        store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    if store.session_key is None:  # a malformed cookie: no session
        return read(turn_id), {}
    cache = _cache()
    if not isinstance(cache, RedisCache):
        found = cache.get_many([state_key(turn_id), store.cache_key])
        turn_state, data = found.get(state_key(turn_id)), found.get(store.cache_key)
    else:  # the MGET get_many makes, with less Python around it: every widget polls here
        turn_state, data = _mget(cache, state_key(turn_id), store.cache_key)
    if data is not None and store is getattr(request, "session", None) and not store.accessed:
        store._session_cache = data  # what it would load: a later read of the session asks Redis no more
    return turn_state, data or {}


def _mget(cache, own_key, session_key):
    """The values of the app's ``own_key`` and the session's ``session_key`` (None for a missing
    one) in one ``MGET`` on Django's own client, as ``get_many`` sends it but without what the
    poll does not need: ``get_many``'s per-key mapping, redis-py's ``mget`` wrapper (its argument
    juggling and client-side-cache options: the command is sent as is) and the memcached key
    warnings for ``own_key``, which the app makes from a UUID (the session's key comes from a
    cookie: it is checked, as Django's session backend checks it)."""
    keys = cache.make_key(own_key), cache.make_and_validate_key(session_key)
    values = cache._cache.get_client(keys[0], write=True).execute_command("MGET", *keys)
    loads = _loads(cache._cache._serializer)
    return [None if value is None else loads(value) for value in values]


@lru_cache(maxsize=None)
def _session_cookie():
    """The session cookie's name when sessions live in this app's cache (``SESSION_ENGINE`` ``cache``,
    ``SESSION_CACHE_ALIAS`` the app's ``CACHE_ALIAS``), else None. Read from the settings once, as
    every poll asks, and again after they change (``setting_changed``)."""
    if settings.SESSION_ENGINE != _CACHE_SESSIONS or settings.SESSION_CACHE_ALIAS != get_config()["CACHE_ALIAS"]:
        return None
    return settings.SESSION_COOKIE_NAME


@receiver(setting_changed)
def _forget_session_cookie(*, setting, **kwargs):
    if setting in {"SESSION_ENGINE", "SESSION_CACHE_ALIAS", "SESSION_COOKIE_NAME", "CONVERSATIONS"}:
        _session_cookie.cache_clear()


def _loads(serializer):
    """``serializer.loads``, or for Django's own (``RedisSerializer``) ``_unpickled``, its equal."""
    return _unpickled if type(serializer) is RedisSerializer else serializer.loads


def _unpickled(value):
    """What Django's ``RedisSerializer.loads`` reads in ``value``, a pickle unpickled at once: Django's
    first tries every value as an integer (which it stores unpickled), and the ``ValueError`` that
    raises for a pickle spells out the repr of the whole value. A pickle (protocol 2 and later)
    starts with PROTO, b"\\x80", which no integer's digits do."""
    return pickle.loads(value) if value[:1] == b"\x80" else _DJANGO_SERIALIZER.loads(value)


_DJANGO_SERIALIZER = RedisSerializer()


def read_auth_stamp(user_id):
    """The auth hash last verified for user ``user_id`` (see ``owners``), or None."""
    return _cache().get(auth_stamp_key(user_id))


def write_auth_stamp(user):
    """Remember ``user``'s current auth hash, verified by Django for the request being answered."""
    _cache().set(auth_stamp_key(user.pk), user.get_session_auth_hash(), timeout=get_config()["STATE_TTL"])


def forget_auth_stamp(user_id):
    _cache().delete(auth_stamp_key(user_id))


def publish(state, *, first=False):
    """Write ``state`` (a dict with at least ``id``) with the next version; return the written dict.
    ``first``: only if the turn has no state yet (the POST's queued state, which its job may have
    overtaken); the dict is returned either way.

    A state names its conversation's owner as the cache last heard of it (``owners_changed``), not
    as its writer loaded it: a visitor who logs in while the turn runs makes the conversation
    theirs, and the job's later states must say so, or the user's other sessions are refused.
    A growing answer of the same turn that this process's ``publish_board`` holds is dropped first,
    or waited for if it is being written: it never lands after this newer state."""
    publish_board.withdraw(state["id"])
    return _write([state], first=first)[0]


def _write(states, *, first=False):
    """Write each of ``states`` (of different turns) with its turn's next version and recorded
    owner; return the written dicts. On Django's Redis backend in two round trips however many
    there are: the versions and owners (``_next_versions``), then the states."""
    if not lease.fence():  # this process was taken for dead: another job publishes these turns now
        logger.warning("Not published: this worker lost its lease (turns %s)", ", ".join(str(d["id"]) for d in states))
        return [{**data, "version": None, "updated_at": time.time()} for data in states]
    cache, ttl = _cache(), get_config()["STATE_TTL"]
    written = []
    for data, (version, owner) in zip(states, _next_versions(cache, ttl, states)):
        data = {**data, "version": version, "updated_at": time.time()}
        if owner is not None:
            data["owner"] = owner
        written.append(data)
    raw = _redis(cache, ttl, *(state_key(data["id"]) for data in written))
    if raw is None:
        for data in written:
            (cache.add if first else cache.set)(state_key(data["id"]), data, timeout=ttl)
        return written
    client, keys = raw
    with client.pipeline(transaction=False) as pipeline:
        for key, data in zip(keys, written):
            pipeline.set(key, cache._cache._serializer.dumps(data), ex=ttl, nx=first)
        pipeline.execute()
    return written


class Published(NamedTuple):
    """What ``publish_step`` wrote and read: the state as written, the ``Stop`` its turn's job is
    asked for as read in the same round trip, and its conversation's recorded owner as stored
    (bytes, or None when none is recorded), which the next ``publish_step`` of the turn compares."""

    state: dict
    stop: "Stop | None"
    owner: bytes | None


# KEYS: the turn's version counter, its conversation's recorded owner, its cancel and handoff
# flags, its state; ARGV: the TTL, the recorded owner the state was serialised with ("" for none),
# then pairs of a version and the state serialised with it. The state is written only if one of
# the pairs names the version the counter gives it and the owner is still the one recorded: then
# the publish took one round trip; else the caller writes it again with the version and owner
# returned (the version is taken either way: versions only ever grow).
_PUBLISH_STEP = """
local version = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[1])
local owner = redis.call('GET', KEYS[2])
local written = 0
if (owner or '') == ARGV[2] then
  for i = 3, #ARGV, 2 do
    if version == tonumber(ARGV[i]) then
      redis.call('SET', KEYS[5], ARGV[i + 1], 'EX', ARGV[1])
      written = 1
      break
    end
  end
end
return {written, version, owner, redis.call('GET', KEYS[3]), redis.call('GET', KEYS[4])}
"""

# The versions a job's first publish of its turn is serialised with, not knowing the counter yet:
# 2 after the queued state its POST published (``lifecycle.start``), 1 when the job got there first.
FIRST_VERSIONS = (2, 1)


def publish_step(data, last=None):
    """``publish`` for a running turn's job, which publishes after every round-trip, and reads the
    turn's stop flags (``stop_requested``) in the same round trip; returns a ``Published``.

    The write is one round trip (a Lua script: the counter's next version, the owner, the flags,
    and the write if both are as expected): given ``last``, what this job's previous
    ``publish_step`` of the turn returned, the state is serialised with the next version and the
    owner recorded then; without it (the job's first publish), with each of ``FIRST_VERSIONS`` and
    no recorded owner. Two round trips when another writer took a version meanwhile (a growing
    answer, the poll view's repair), the conversation changed hands, or a first publish guessed
    wrong (a continuation's). On a cache backend other than Redis: ``publish`` and
    ``stop_requested``."""
    publish_board.withdraw(data["id"])
    if not lease.fence():
        return Published(_write([data])[0], None, None)  # (not written: see ``_write``)
    turn_id = data["id"]
    cache, ttl = _cache(), get_config()["STATE_TTL"]
    raw = _redis(cache, ttl, _version_key(turn_id), owner_key(data.get("conversation")), cancel_key(turn_id),
                 handoff_key(turn_id), state_key(turn_id))
    if raw is None:
        return Published(_write([data])[0], stop_requested(turn_id), None)
    client, keys = raw
    serializer = cache._cache._serializer
    if last is not None and last.state.get("version") is not None:
        versions, recorded = (last.state["version"] + 1,), last.owner
    else:
        versions, recorded = FIRST_VERSIONS, None
    candidates = {version: _stamped(data, version, recorded, serializer) for version in versions}
    pairs = [item for version, written in candidates.items() for item in (version, serializer.dumps(written))]
    landed, version, owner, cancel, handoff = client.eval(_PUBLISH_STEP, 5, *keys, ttl, recorded or "", *pairs)
    if landed:
        written = candidates[version]
    else:
        written = _stamped(data, version, owner, serializer)
        client.set(keys[4], serializer.dumps(written), ex=ttl)
    stop = Stop.CANCEL if cancel and serializer.loads(cancel) else (
        Stop.HANDOFF if handoff and serializer.loads(handoff) else None)
    return Published(written, stop, owner)


def _stamped(data, version, owner, serializer):
    """``data`` as written with ``version`` and the recorded ``owner`` (stored bytes, or None: the
    state's own)."""
    stamped = {**data, "version": version, "updated_at": time.time()}
    if owner is not None:
        stamped["owner"] = serializer.loads(owner)
    return stamped


def owners_changed(conversations):
    """Record the new owner (``owner_dict``) of each of ``conversations`` for every state published
    from now on (``publish``), including those of a job that loaded the old one; one round trip.
    Ownership only ever widens (a login claims an anonymous visitor's conversation), so a state
    that still names the old owner in the meantime refuses nobody it should serve."""
    owners = {owner_key(conversation.pk): owner_dict(conversation) for conversation in conversations}
    if owners:
        _cache().set_many(owners, timeout=get_config()["STATE_TTL"])


def _redis(cache, ttl, *keys):
    """Django's own Redis client (the one its cache methods use) and ``keys`` as it stores them,
    for what the cache API does in several round trips or not atomically; None on another
    backend, or for a TTL that is not whole seconds (then the cache API it is)."""
    if not (isinstance(cache, RedisCache) and isinstance(ttl, int) and ttl > 0):
        return None
    made = [cache.make_and_validate_key(key) for key in keys]
    return cache._cache.get_client(made[0], write=True), made


def _next_versions(cache, ttl, states):
    """``[(version, owner)]`` for each of ``states``: its turn's next version, the counter's TTL
    refreshed (a turn can wait in the queue longer than the TTL), and the owner recorded for its
    conversation (``owners_changed``) or None. On Django's Redis backend in one round trip for
    all of them: INCR creates a missing counter at 1, as ``add(0)`` then ``incr`` do, and Django
    stores integers unpickled, so ``get`` reads it back; through the cache API it takes five a
    state (``incr`` asks whether the key exists first). A streaming turn publishes every
    ``PUBLISH_INTERVAL``, so with hundreds of turns in one process these round trips are much of
    its work."""
    keys = [key for data in states for key in (_version_key(data["id"]), owner_key(data.get("conversation")))]
    raw = _redis(cache, ttl, *keys)
    if raw is not None:
        client, made = raw
        with client.pipeline(transaction=False) as pipeline:
            for vkey, okey in zip(made[::2], made[1::2]):
                pipeline.incr(vkey)
                pipeline.expire(vkey, ttl)
                pipeline.get(okey)
            replies = pipeline.execute()
        loads = cache._cache._serializer.loads
        return [(version, None if owner is None else loads(owner))
                for version, owner in zip(replies[::3], replies[2::3])]
    return [_next_version(cache, ttl, vkey, okey) for vkey, okey in zip(keys[::2], keys[1::2])]


def _next_version(cache, ttl, vkey, okey):
    """``_next_versions`` for one state, through the cache API (a backend other than Redis)."""
    try:
        version = cache.incr(vkey)
    except ValueError:  # the first publish of this turn (or its counter expired)
        cache.add(vkey, 0, timeout=ttl)
        version = cache.incr(vkey)
    cache.touch(vkey, ttl)
    return version, cache.get(okey)


def original_key(turn_id):
    return f"conversations:turn:{turn_id}:original"


def keep_original(turn_id, content, *, timeout):
    """Keep what the visitor wrote, before redaction, for the model of this turn only
    (``REDACT_ORIGINAL_TO_MODEL``): for ``timeout`` seconds at most, and forgotten when the turn ends."""
    _cache().set(original_key(turn_id), content, timeout=timeout)


def read_original(turn_id):
    """What ``keep_original`` kept for ``turn_id``, or None."""
    return _cache().get(original_key(turn_id))


def forget_original(turn_id):
    _cache().delete(original_key(turn_id))


def request_cancel(turn_id):
    _cache().set(cancel_key(turn_id), True, timeout=get_config()["STATE_TTL"])


def handoff_key(turn_id):
    return f"conversations:turn:{turn_id}:handoff"


def request_handoff(turn_id):
    """Ask the job running ``turn_id`` to stop at its next step and let another worker go on
    (its worker is shutting down)."""
    _cache().set(handoff_key(turn_id), True, timeout=get_config()["STATE_TTL"])


class Stop(StrEnum):
    """What a running turn's job is asked to do instead of going on."""

    CANCEL = "cancel"  # the visitor or an operator stopped it
    HANDOFF = "handoff"  # its worker is shutting down: let another job go on


def stop_requested(turn_id):
    """The ``Stop`` the turn's job is asked for, read in one round trip, or None."""
    found = _cache().get_many([cancel_key(turn_id), handoff_key(turn_id)])
    return _stop_from(found, turn_id)


def mark_enqueueing(turn_id, job_id, seconds=10):
    """Note that job ``job_id`` of the turn is about to be enqueued (the row names it first), so
    that a look at the queue meanwhile does not take it for a job that vanished."""
    _cache().set(f"conversations:turn:{turn_id}:enqueueing:{job_id}", True, timeout=seconds)


def is_enqueueing(turn_id, job_id):
    return bool(_cache().get(f"conversations:turn:{turn_id}:enqueueing:{job_id}"))


def clear_handoff(turn_id):
    _cache().delete(handoff_key(turn_id))


def _stop_from(found, turn_id):
    if found.get(cancel_key(turn_id)):
        return Stop.CANCEL
    return Stop.HANDOFF if found.get(handoff_key(turn_id)) else None


class _Board:
    """What both boards share: one thread of this process serves the board once ``start()`` was
    called (its ``_run``), under ``_lock``. A process forked from one whose board runs (a work
    horse of a test's or a pool's parent) has no such thread: it starts without a board (each
    board's methods then do their work themselves)."""

    thread_name = ""

    def __init__(self):
        self._forget()
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self):
        """Set the board's state as new (and not started); a subclass adds its own to it."""
        self._thread = None

    def start(self):
        """Serve the board from now on in one thread of this process (idempotent)."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
                self._thread.start()


class StopBoard(_Board):
    """The stop flags of every turn whose call is in flight in this process, read for all of them
    in one round trip every ``POLL`` seconds by one thread, once ``start()`` was called.

    Each call's watchdog looks at its turn's flag every 0.1 s; with hundreds of turns streaming in
    one process (a ``ConcurrentWorker``) one Redis round trip per look each was thousands a second
    under one GIL, and delayed every stream's words. ``stop_requested()`` answers a turn's first
    look with a read of its own, later ones from the board: a Stop lands at most ``POLL`` later
    than it would. A turn not asked about for ``IDLE`` seconds leaves the board. Not started, it
    reads each flag itself (one turn per work horse gains nothing from a board).
    """

    POLL = 0.1
    IDLE = 2.0
    thread_name = "conversations-stop-board"

    def _forget(self):
        super()._forget()
        self._lock = threading.Lock()
        self._flags = {}  # turn id -> [its Stop or None, when last asked (time.monotonic)]

    def stop_requested(self, turn_id):
        """The ``Stop`` asked of ``turn_id``'s job, as ``stop_requested`` (at most ``POLL`` old)."""
        turn_id = str(turn_id)
        if self._thread is None:
            return stop_requested(turn_id)
        now = time.monotonic()
        with self._lock:
            entry = self._flags.get(turn_id)
            if entry is not None:
                entry[1] = now
                return entry[0]
        asked = stop_requested(turn_id)
        with self._lock:
            self._flags.setdefault(turn_id, [asked, now])
        return asked

    def _run(self):
        while True:
            time.sleep(self.POLL)
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - e.g. Redis down: the flags keep their last value
                logger.warning("Could not read the stop flags of the turns in flight", exc_info=True)

    def refresh(self):
        """Read every flag on the board in one round trip; forget turns no longer asked about."""
        now = time.monotonic()
        with self._lock:
            for turn_id in [t for t, (_, asked_at) in self._flags.items() if now - asked_at > self.IDLE]:
                del self._flags[turn_id]
            turn_ids = list(self._flags)
        if not turn_ids:
            return
        found = _cache().get_many([key for t in turn_ids for key in (cancel_key(t), handoff_key(t))])
        with self._lock:
            for turn_id in turn_ids:
                if turn_id in self._flags:
                    self._flags[turn_id][0] = _stop_from(found, turn_id)


stop_board = StopBoard()


class PublishBoard(_Board):
    """The growing answers of the turns streaming in this process, written together by one thread
    of it, once ``start()`` was called.

    A streaming turn publishes its growing answer every ``PUBLISH_INTERVAL``. With hundreds of
    turns streaming in one process (a ``ConcurrentWorker``), each publish's own two Redis round
    trips, and the GIL its thread had to win back after each, held back every stream's words by
    seconds. ``offer()`` only hands the state over; the board's thread writes all that was offered
    meanwhile (the newest state of each turn) in two round trips (``_write``), and what is offered
    while it writes goes in the next batch. ``publish()`` of a turn (its rows saved, its final
    state) first takes back what that turn offered, or waits for it to land if it is being
    written (at most ``WAIT`` seconds), so that an older growing answer never lands after it. Not
    started, ``offer()`` publishes at once (one turn per work horse gains nothing from a board).
    """

    WAIT = 5.0
    thread_name = "conversations-publish-board"

    def _forget(self):
        super()._forget()
        self._lock = threading.Condition()
        self._offered = {}  # turn id -> the newest state it offered that is not being written yet
        self._writing = set()  # the turn ids of the batch being written now

    def offer(self, data):
        """Publish ``data``, a turn's growing answer, soon (not started: now, as ``publish``, which
        may raise ``RedisError``). Returns at once; a newer offer of the same turn replaces it."""
        if self._thread is None:
            return publish(data)
        with self._lock:
            self._offered[str(data["id"])] = data
            self._lock.notify_all()
        return None

    def withdraw(self, turn_id):
        """Drop the growing answer ``turn_id`` offered, and wait while one of it is being written."""
        if self._thread is None:
            return
        turn_id = str(turn_id)
        deadline = time.monotonic() + self.WAIT
        with self._lock:
            self._offered.pop(turn_id, None)
            while turn_id in self._writing and (left := deadline - time.monotonic()) > 0:
                self._lock.wait(left)

    def _run(self):
        while True:
            with self._lock:
                while not self._offered:
                    self._lock.wait()
                batch, self._offered = self._offered, {}
                self._writing = set(batch)
            try:
                _write(list(batch.values()))
            except Exception:  # noqa: BLE001 - e.g. Redis down: each turn's next growing answer replaces these
                logger.warning("Could not publish the growing answers of %d turns", len(batch), exc_info=True)
            finally:
                with self._lock:
                    self._writing = set()
                    self._lock.notify_all()


publish_board = PublishBoard()


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
    """Who owns a state: the conversation's user, owner token and assistant (which a visitor token
    must name, ``owners.owner_matches``)."""
    return {"user": conversation.user_id, "token": conversation.owner_token, "assistant": conversation.assistant_id}


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
        "approvals": approvals_list(turn),
    }


# The status of a turn whose tool call waits for a person (``Turn.Status.WAITING``).
WAITING = "waiting_approval"


def approvals_list(turn):
    """The tool calls ``turn`` waits for a person to approve (none unless it is waiting): what the
    widget shows as text, with what an approval must send back (the call id and the arguments' hash)."""
    if turn.status != WAITING:
        return []
    return [{"call_id": a.call_id, "tool": a.tool_name, "summary": a.summary,
             "arguments": json.dumps(a.arguments, ensure_ascii=False, sort_keys=True, indent=1, default=str),
             "arguments_sha256": a.arguments_sha256, "approver": a.approver,
             "expires_at": a.expires_at.timestamp()}
            for a in turn.approvals.filter(status="pending").order_by("id")]


# -- a conversation handed to a person (engine/handoff.py) ---------------------------------
# One state per conversation, beside its turns' own: what the widget polls while staff hold it.
# (Not the worker's hand-over of a running turn above: that is another job going on with it.)


def person_key(conversation_id):
    return f"conversations:conversation:{conversation_id}:handoff"


def read_person(conversation_id):
    """The cached handoff state of a conversation, or None."""
    return _cache().get(person_key(conversation_id))


# KEYS: the state, its version; ARGV: the version, the state (serialised), the TTL in seconds.
_WRITE_IF_NEWER = """
if tonumber(ARGV[1]) <= tonumber(redis.call('GET', KEYS[2]) or '-1') then return 0 end
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[3])
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
return 1
"""


def publish_person(data):
    """Write ``data`` (with ``conversation`` and its ``version``, which the database counts) as the
    conversation's handoff state, unless the cache holds that version or a newer one; return
    ``data`` with ``updated_at``.

    Each publish reads the database, then writes here: two of them can land in the other order,
    and the older read must not replace the newer (a staff reply would stay unseen for
    ``STATE_TTL``). On Redis the comparison and the write are one Lua script, through Django's own
    client; on another cache backend (none the app is deployed on) they are two steps."""
    cache, ttl = _cache(), get_config()["STATE_TTL"]
    data = {**data, "updated_at": time.time()}
    # Not ":version", the name of the counter the versions came from before (its keys, still in a
    # Redis upgraded from it, would hold higher numbers and refuse every write until they expire).
    key, vkey = person_key(data["conversation"]), person_key(data["conversation"]) + ":written"
    raw = _redis(cache, ttl, key, vkey)
    if raw is not None:
        client, keys = raw
        client.eval(_WRITE_IF_NEWER, 2, *keys, data["version"], cache._cache._serializer.dumps(data), ttl)
    else:
        stored = cache.get(vkey)
        if stored is None or data["version"] > stored:
            cache.set_many({vkey: data["version"], key: data}, timeout=ttl)
    return data


def _kept_key(conversation_id, idempotency_key):
    return f"conversations:conversation:{conversation_id}:kept:{idempotency_key}"


def kept_message(conversation_id, idempotency_key):
    """The id of the message an ``Idempotency-Key`` already kept for staff in this conversation, or None."""
    return _cache().get(_kept_key(conversation_id, idempotency_key))


def remember_kept(conversation_id, idempotency_key, message_id):
    """Remember (for ``STATE_TTL``) which message ``idempotency_key`` kept for staff: a retry of
    the same POST gets it back instead of saving it twice (a kept message has no turn, whose
    unique constraint does this for a turn)."""
    _cache().set(_kept_key(conversation_id, idempotency_key), message_id, timeout=get_config()["STATE_TTL"])

