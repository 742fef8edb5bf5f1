"""Cost limits checked before a turn is created: turns per conversation, turns running at once
per owner and per client address, and tokens per owner per day.

The daily budget counts the tokens every turn of the day has used so far, running ones
included, and holds ``TURN_TOKEN_RESERVE`` back for each turn still running, so that turns
started side by side in several conversations cannot each spend the whole budget. The caller
checks these while holding the owner's lock (``api.base._lock_owned``), so two requests never
both see the same room left. Turns running at once per client address span
owners (a new owner costs only a cookie), so they are checked under a lock of their own, per
address, taken before the owner's (``AddressTurns``).

Each check returns None when the turn may go ahead, or a ``Refusal`` saying why not. The
API turns a refusal into a response: a limit that time lifts (the daily budget) answers
429 with ``Retry-After``; one that it does not (a full conversation) answers 403.
"""

import datetime
from dataclasses import dataclass

from django.db.models import Sum
from django.db.models.functions import Coalesce
from django.utils import timezone
from django.utils.translation import gettext as _
from redis.exceptions import LockError, RedisError

from ..conf import get_config
from ..owners import has_owner, owned_by
from ..infra.queue import get_queue, site_key
from ..models import Turn
from . import statements


@dataclass
class Refusal:
    """Why a new turn is refused: ``code``, a visitor-readable ``message``, and for limits that
    lift with time ``retry_after`` (seconds)."""

    code: str
    message: str
    retry_after: int | None = None


def owner_q(conversation, prefix=""):
    """A Q selecting everything owned by the visitor who owns ``conversation``: its user's and
    its session's (``owners.owned_by``, the rows the API lists for that visitor)."""
    return owned_by(conversation.user_id, conversation.owner_token, prefix)


def start_of_day(now=None):
    """Midnight today in the current time zone (the budget resets then)."""
    now = timezone.localtime(now)
    return now.replace(hour=0, minute=0, second=0, microsecond=0)


def tokens_used_today(conversation, now=None, counts=None):
    """Input plus output tokens of every turn of this conversation's owner since midnight
    (``counts``: as a ``TurnCounts`` read them already in this transaction)."""
    if counts is not None:
        return counts.tokens_today
    totals = Turn.objects.filter(owner_q(conversation, "conversation__"), enqueued_at__gte=start_of_day(now)).aggregate(
        used=Coalesce(Sum("input_tokens"), 0) + Coalesce(Sum("output_tokens"), 0))
    return totals["used"]


def check_conversation_length(conversation, counts=None):
    """Refuse a turn past ``MAX_TURNS_PER_CONVERSATION`` (0 = no limit)."""
    limit = get_config()["MAX_TURNS_PER_CONVERSATION"]
    if limit and (counts.here if counts is not None else conversation.turns.count()) >= limit:
        return Refusal("conversation_full", _(
            "This conversation has reached its limit of %(limit)d messages. Please start a new conversation."
        ) % {"limit": limit})
    return None


def active_turns(conversation, counts=None):
    """How many turns of this conversation's owner are queued or running (``counts``: as a
    ``TurnCounts`` read them already in this transaction; None: counted now)."""
    if counts is not None:
        return counts.owners_active
    return Turn.objects.filter(owner_q(conversation, "conversation__"), status__in=Turn.ACTIVE_STATUSES).count()


class TurnCounts:
    """What a new turn is admitted on, counted in one raw statement (``statements.turn_counts``)
    where ``lifecycle.ensure_idle`` and the cost checks each made their own: the conversation's
    turns (``here``), those of them queued or running (``here_active``), the owner's turns queued
    or running (``owners_active``) and their tokens since midnight (``tokens_today``). Only what
    the site's limits ask for is counted (0 for the rest), and only the turns that can count are
    read: the conversation's, and the owner's that are active or of today.

    Read it with the owner locked (``start()``'s ``lock``), once the lock is held: a
    statement's snapshot is taken when it starts, so counts folded into the locking statement
    itself would miss a turn another request committed while this one waited for the lock
    (PostgreSQL)."""

    def __init__(self, conversation, now=None):
        cfg = get_config()
        owner, owners_active, since = None, False, None
        if has_owner(conversation.user_id, conversation.owner_token):
            budget = cfg["DAILY_TOKEN_BUDGET"]
            owner = (conversation.user_id, conversation.owner_token)
            owners_active = bool(cfg["MAX_ACTIVE_TURNS_PER_OWNER"] or (budget and cfg["TURN_TOKEN_RESERVE"]))
            since = start_of_day(now) if budget else None
        self.here_active, self.here, self.owners_active, self.tokens_today = statements.turn_counts(
            conversation.pk, here=bool(cfg["MAX_TURNS_PER_CONVERSATION"]), owner=owner,
            owners_active=owners_active, since=since)

    def ended(self):
        """A turn of the conversation has just been ended (``ensure_idle``): it is no longer active."""
        self.here_active -= 1
        self.owners_active = max(0, self.owners_active - 1)


# A turn that must wait for another of the same owner asks to be retried this soon (seconds).
WAIT_FOR_ACTIVE = 5


def check_active_turns(conversation, counts=None):
    """Refuse a turn while the owner has ``MAX_ACTIVE_TURNS_PER_OWNER`` turns queued or running (0 = no limit)."""
    limit = get_config()["MAX_ACTIVE_TURNS_PER_OWNER"]
    if limit and active_turns(conversation, counts) >= limit:
        return Refusal("too_many_active", _(
            "The assistant is still answering your other messages. Please wait for an answer to finish."
        ), retry_after=WAIT_FOR_ACTIVE)
    return None


class AddressTurns:
    """The turns one client address (``api.throttling.client_key``) has queued or running, across
    every owner it speaks for, limited to ``MAX_ACTIVE_TURNS_PER_ADDRESS`` (0 = no limit), so
    that one address cannot fill every worker and keep other visitors' turns waiting.

    Use as a context manager around ``turns.start()``: it holds a Redis lock per address (one
    request of the address at a time, in every web process) while ``check()`` counts and
    ``add()`` records the new turn. Which turns belong to the address is kept in Redis only (a
    set of turn ids, expiring after a turn's longest life), never in the database; whether they
    are still queued or running is read from their rows, so a turn counts until it has ended,
    however it ends.
    """

    # Seconds a request waits for another request of the same address; the lock itself expires
    # after LOCK_TIMEOUT should its holder die.
    LOCK_WAIT = 5
    LOCK_TIMEOUT = 30

    def __init__(self, key):
        self.key = key
        self.limit = get_config()["MAX_ACTIVE_TURNS_PER_ADDRESS"]
        self._lock = None
        self._busy = False

    @property
    def _redis(self):
        return get_queue().connection  # the queue's Redis: always there, whatever the cache is

    def _set_key(self):
        return site_key("address-turns", self.key)

    def __enter__(self):
        if self.limit:
            lock = self._redis.lock(site_key("address-lock", self.key), timeout=self.LOCK_TIMEOUT,
                                    blocking_timeout=self.LOCK_WAIT)
            if lock.acquire():
                self._lock = lock
            else:
                self._busy = True
        return self

    def __exit__(self, *exc):
        if self._lock is not None:
            try:
                self._lock.release()
            except LockError:  # it expired meanwhile; nothing of ours to release
                pass
            self._lock = None

    def check(self):
        """Refuse when the address already has ``limit`` turns queued or running; None otherwise."""
        if not self.limit:
            return None
        if not self._busy:
            ids = [member.decode() for member in self._redis.smembers(self._set_key())]
            active = {str(pk) for pk in Turn.objects.filter(pk__in=ids, status__in=Turn.ACTIVE_STATUSES)
                      .values_list("pk", flat=True)}
            ended = [pk for pk in ids if pk not in active]
            if ended:
                self._redis.srem(self._set_key(), *ended)
            if len(active) < self.limit:
                return None
        return Refusal("too_many_active_address", _(
            "The assistant is answering too many messages from your network right now. Please wait for an "
            "answer to finish."), retry_after=WAIT_FOR_ACTIVE)

    def add(self, turn):
        """Count ``turn`` (just started) against the address until it ends, and remember the
        address for its jobs (``turn_address``)."""
        cfg = get_config()
        # The longest a turn can stay queued or running: its wait in the queue, then each of its jobs.
        lifetime = cfg["QUEUE_WAIT"] + (cfg["MAX_RESUMES"] + 1) * max(turn.job_timeout or 0, cfg["JOB_TIMEOUT"]) + 60
        pipe = self._redis.pipeline()
        pipe.set(_turn_address_key(turn.pk), self.key, ex=lifetime)
        if self.limit:
            pipe.sadd(self._set_key(), str(turn.pk))
            pipe.expire(self._set_key(), lifetime)
        try:
            pipe.execute()
        except RedisError:
            if self.limit:
                raise  # as before: the limit cannot be kept without it
            # Without a limit only the breakers read it, and count the turn by its owner instead.


def _turn_address_key(turn_id):
    return site_key("turn-address", turn_id)


def turn_address(turn):
    """The client address (``api.throttling.client_key``) that asked for ``turn``, kept in Redis
    only for as long as the turn may run (``AddressTurns.add``); "" when it is not known (a turn
    started otherwise, or Redis cannot be read). The breakers count failures by it."""
    try:
        value = get_queue().connection.get(_turn_address_key(turn.pk))
    except RedisError:
        return ""
    return value.decode() if value else ""


def check_daily_budget(conversation, now=None, counts=None):
    """Refuse a turn once the owner has used ``DAILY_TOKEN_BUDGET`` tokens today (0 = no limit), or
    would, counting ``TURN_TOKEN_RESERVE`` for each of their turns still running."""
    cfg = get_config()
    budget = cfg["DAILY_TOKEN_BUDGET"]
    if not budget:
        return None
    spent = tokens_used_today(conversation, now, counts)
    if spent < budget:
        running = active_turns(conversation, counts) if cfg["TURN_TOKEN_RESERVE"] else 0
        if not running or spent + running * cfg["TURN_TOKEN_RESERVE"] < budget:
            return None
        return Refusal("budget_reserved", _(
            "You are close to today's limit for the assistant: please wait for your other answer to finish."
        ), retry_after=WAIT_FOR_ACTIVE)
    now = timezone.localtime(now)
    tomorrow = start_of_day(now) + datetime.timedelta(days=1)
    return Refusal("budget_exhausted", _(
        "You have reached today's limit for the assistant. Please come back tomorrow."
    ), retry_after=max(1, int((tomorrow - now).total_seconds())))


def check_new_turn(conversation, now=None, counts=None):
    """Run every cost check; return the first ``Refusal`` or None. ``counts``: the ``TurnCounts``
    read in this transaction, if any (each check then counts from it, not with a query of its own)."""
    return (check_conversation_length(conversation, counts) or check_active_turns(conversation, counts)
            or check_daily_budget(conversation, now, counts))
