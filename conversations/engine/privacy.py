"""Erasure of one person's data everywhere the app wrote it (docs/privacy.md has the map).

``erase(user=…)``, ``erase(visitor=…)`` or ``erase(conversation=…)`` first stops a turn of
theirs in flight, then deletes their conversations (and with them every turn, message, call
record, rating and handoff message), their turns' RQ jobs with their results, and every key of
theirs in Redis (turn and handoff states, owner records, flags, rate-limit counters), and
writes an ``Erasure`` audit entry: how many of what went, when, by whom, and the person only as
a salted hash. ``plan(…)`` says what would go, without deleting anything (the admin's
confirmation page).
"""

import dataclasses
import logging
import time
from collections import Counter

from django.db import transaction
from django.utils.crypto import salted_hmac
from redis.exceptions import RedisError
from rq.job import Job

from ..conf import get_config
from ..infra import queue
from ..models import Assistant, CallRecord, Conversation, Erasure, Message, Turn
from ..owners import visitor_owner_token
from . import lifecycle

logger = logging.getLogger("conversations.privacy")

# Seconds ``erase`` waits for a stopped turn to end before it deletes it anyway; shorter for a
# visitor's own request, which a web worker answers while it waits.
STOP_WAIT = 10.0
VISITOR_STOP_WAIT = 3.0


class Ambiguous(ValueError):
    """``erase`` or ``plan`` was not told exactly one of ``user``, ``visitor`` or ``conversation``."""


def subject_digest(kind, identifier):
    """The person as the audit entry keeps them: an HMAC of what named them with the site's
    ``SECRET_KEY``, which the site can recompute ("was this visitor erased?") but which names
    nobody by itself."""
    return salted_hmac("conversations.privacy.erasure", f"{kind}:{identifier}", algorithm="sha256").hexdigest()


def visitor_tokens(visitor, origin=None):
    """The owner tokens ``visitor`` stands for: the token itself (a session's, or a widget's
    ``v:…`` as conversations store it) or, with the page ``origin`` of an embedded widget, the
    widget's visitor id, for the site's default assistant and each of its assistants."""
    if origin is None:
        return [visitor]
    assistant_ids = [None, *Assistant.objects.values_list("pk", flat=True)]
    return [visitor_owner_token(origin, assistant_id, visitor) for assistant_id in assistant_ids]


@dataclasses.dataclass
class Plan:
    """What an erasure takes: the conversations, and how many of each kind of row they hold."""

    kind: str
    digest: str
    conversation_ids: list
    tokens: list
    user_id: object = None

    def counts(self):
        """{kind: number} of the rows that would go (the confirmation page, the audit entry)."""
        turns = Turn.objects.filter(conversation_id__in=self.conversation_ids)
        messages = Counter(Message.objects.filter(conversation_id__in=self.conversation_ids)
                           .values_list("role", flat=True))
        return {
            "conversations": len(self.conversation_ids),
            "turns": turns.count(),
            "ratings": turns.exclude(rating="").count(),
            "calls": CallRecord.objects.filter(turn__conversation_id__in=self.conversation_ids).count(),
            **{f"messages_{role}": messages.get(role, 0) for role in Message.Role.values},
        }


def plan(*, user=None, visitor=None, origin=None, conversation=None, kind=None):
    """What ``erase`` with the same arguments would take. ``user``: a user or their id;
    ``visitor``: an owner token, or a widget's visitor id with its page's ``origin``;
    ``conversation``: one conversation (or its id) or several."""
    given = [name for name, value in (("user", user), ("visitor", visitor), ("conversation", conversation))
             if value is not None]
    if len(given) != 1:
        raise Ambiguous("Name exactly one of user, visitor or conversation.")
    rows, tokens, user_id = Conversation.objects.all(), [], None
    if user is not None:
        user_id = getattr(user, "pk", user)
        rows, identifier = rows.filter(user_id=user_id), user_id
    elif visitor is not None:
        tokens = visitor_tokens(str(visitor), origin)
        rows, identifier = rows.filter(owner_token__in=tokens), visitor
    else:
        many = conversation if isinstance(conversation, (list, tuple, set)) or hasattr(conversation, "model") \
            else [conversation]
        ids = [getattr(c, "pk", c) for c in many]
        rows, identifier = rows.filter(pk__in=ids), ",".join(sorted(str(i) for i in ids))
    name = kind or given[0]
    ids = list(rows.values_list("pk", flat=True))
    return Plan(kind=name, digest=subject_digest(given[0], identifier), conversation_ids=ids, tokens=tokens,
                user_id=user_id)


def erase(*, user=None, visitor=None, origin=None, conversation=None, by=None, kind=None, wait=STOP_WAIT):
    """Erase everything of one person (see the module): returns the ``Erasure`` audit entry.

    ``by``: the staff user who asked (None: the visitor themself, or a scheduled purge);
    ``kind``: what the audit entry calls it (default: ``user``, ``visitor`` or ``conversation``);
    ``wait``: seconds to wait for a turn in flight to stop before its rows go anyway."""
    job = plan(user=user, visitor=visitor, origin=origin, conversation=conversation, kind=kind)
    counts = job.counts()
    turns = list(Turn.objects.filter(conversation_id__in=job.conversation_ids))
    _stop(turns, wait)
    counts["jobs"] = _delete_jobs(turns)
    with transaction.atomic():
        Conversation.objects.filter(pk__in=job.conversation_ids).delete()
        entry = Erasure.objects.create(by=by if getattr(by, "is_authenticated", False) else None, kind=job.kind,
                                       subject_digest=job.digest, counts=counts)
    entry.counts["cached"] = _sweep_redis(job, [t.pk for t in turns])
    Erasure.objects.filter(pk=entry.pk).update(counts=entry.counts)
    logger.info("Erasure %s: %s", entry.pk, ", ".join(f"{n} {k}" for k, n in sorted(entry.counts.items())))
    return entry


def _stop(turns, wait):
    """Ask every turn of ``turns`` still in flight to stop, and wait (up to ``wait`` s) for its job
    to end it; a turn still running then is ended cancelled here."""
    active = [turn for turn in turns if not turn.done]
    for turn in active:
        try:
            lifecycle.stop(turn, end_orphaned=True)
        except RedisError:
            logger.warning("Could not ask turn %s to stop before erasing it", turn.pk)
    deadline = time.monotonic() + wait
    pending = [turn.pk for turn in active]
    while pending and time.monotonic() < deadline:
        pending = list(Turn.objects.filter(pk__in=pending, status__in=Turn.ACTIVE_STATUSES)
                       .values_list("pk", flat=True))
        if pending:
            time.sleep(0.1)
    for turn in Turn.objects.filter(pk__in=pending):
        try:
            lifecycle.finalize(turn, Turn.Status.CANCELLED, "")
        except RedisError:
            pass


def _job_ids(turn):
    ids = {queue.job_id_for(turn), turn.job_id} - {""}
    continuations = turn.resumes + get_config()["MAX_RESUMES"] + 1
    ids |= {queue.continuation_job_id(turn, number) for number in range(1, continuations + 1)}
    return sorted(ids)


def _delete_jobs(turns):
    """Delete the RQ jobs of ``turns`` (their arguments, results, tracebacks) from the queue and
    every registry; returns how many there were."""
    if not turns:
        return 0
    try:
        connection = queue.get_queue().connection
        ids = [job_id for turn in turns for job_id in _job_ids(turn)]
        jobs = [job for job in Job.fetch_many(ids, connection=connection) if job is not None]
        for job in jobs:
            job.delete(remove_from_queue=True)
        return len(jobs)
    except RedisError:
        logger.warning("Could not delete the RQ jobs of an erasure; they expire with their TTL")
        return 0


def _needles(job, turn_ids):
    """What names the erased person's data in a Redis key or member: their turns' and
    conversations' ids, their owner tokens, their user id's own keys."""
    ids = {str(pk) for pk in (*turn_ids, *job.conversation_ids)} | {str(token) for token in job.tokens if token}
    return {needle.encode() for needle in ids}


def _ends(job):
    """Keys that end with the user's id (rate-limit counters, the auth stamp)."""
    if job.user_id is None:
        return set()
    return {f"_user-{job.user_id}".encode(), f"conversations:auth:{job.user_id}".encode()}


def _connections():
    """The Redis clients the app writes to: the cache's, and RQ's when it is another database."""
    from django.core.cache import caches

    clients = []
    cache = caches[get_config()["CACHE_ALIAS"]]
    client = getattr(getattr(cache, "_cache", None), "get_client", None)
    if client is not None:
        clients.append(client(write=True))
    try:
        clients.append(queue.get_queue().connection)
    except RedisError:
        pass
    seen, unique = set(), []
    for client in clients:
        kwargs = client.connection_pool.connection_kwargs
        where = (kwargs.get("host"), kwargs.get("port"), kwargs.get("path"), kwargs.get("db", 0))
        if where not in seen:
            seen.add(where)
            unique.append(client)
    return unique


_MEMBERS = {b"set": ("smembers", "srem"), b"zset": ("zrange", "zrem"), b"list": ("lrange", "lrem")}


def _sweep_redis(job, turn_ids):
    """Delete every key naming the person's data, and remove their job and turn ids from RQ's
    and the app's lists and sets; returns how many keys and members went. One ``SCAN`` of each
    database: erasure is rare, and the keys of a state, a job and a flag are many."""
    needles, ends, removed = _needles(job, turn_ids), _ends(job), 0
    if not needles and not ends:
        return 0
    for client in _connections():
        try:
            for key in client.scan_iter(count=1000):
                if any(needle in key for needle in needles) or any(key.endswith(end) for end in ends):
                    removed += client.delete(key)
                    continue
                if not (key.startswith(b"rq:") or b"conversations:" in key):
                    continue
                kind = client.type(key)
                if kind not in _MEMBERS:
                    continue
                read, drop = _MEMBERS[kind]
                members = getattr(client, read)(key) if kind == b"set" else getattr(client, read)(key, 0, -1)
                for member in members:
                    if any(needle in member for needle in needles):
                        removed += (client.lrem(key, 0, member) if kind == b"list"
                                    else getattr(client, drop)(key, member))
        except RedisError:
            logger.warning("Could not clear Redis for an erasure; its keys expire with their TTL")
    return removed
