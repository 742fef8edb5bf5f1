"""Retention: conversations are deleted ``RETENTION_DAYS`` days after they started or after their
last message (``RETENTION_FROM``; an assistant's own values for its conversations), by
``manage.py purge_conversations`` (cron, docs/privacy.md).

The purge finds what is due in one read, then deletes it in short transactions of about
``RETENTION_BATCH`` messages each, ``RETENTION_PAUSE`` seconds apart, so that a visitor's turn
never waits long behind it: each transaction takes only the conversation rows no one holds
(``skip_locked``, on PostgreSQL), and checks again that each is still due (no new message, no
turn in flight, not held by staff). Before deleting, it can add the turns' ratings, tokens and
costs to anonymous daily totals (``RetainedTotal``); each run that deleted anything leaves one
``Erasure`` audit entry saying how many of what.
"""

import dataclasses
import datetime
import logging
import time

from django.db import connection, transaction
from django.db.models import Count, F, Q, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from .. import assistants
from ..conf import get_config
from ..models import Assistant, CallRecord, Conversation, Erasure, Message, RetainedTotal, Turn

logger = logging.getLogger("conversations.retention")


@dataclasses.dataclass(frozen=True)
class Policy:
    """How long the conversations of one assistant (None: the site's default one) are kept."""

    assistant_id: object
    days: int
    since: str

    def cutoff(self, now):
        return now - datetime.timedelta(days=self.days)


def policies():
    """The policies that delete anything: the site's, and each assistant's (its own values or
    the site's), leaving out those that keep conversations until erased (0 days)."""
    site = get_config()
    found = [Policy(None, site["RETENTION_DAYS"], site["RETENTION_FROM"])]
    for assistant in Assistant.objects.all():
        cfg = assistants.settings_for(assistant)
        found.append(Policy(assistant.pk, cfg["RETENTION_DAYS"], cfg["RETENTION_FROM"]))
    return [policy for policy in found if policy.days > 0]


def due(policy, now):
    """The conversations ``policy`` says are due at ``now``: old enough, without a turn in
    flight and not held by staff."""
    cutoff = policy.cutoff(now)
    rows = Conversation.objects.filter(created_at__lt=cutoff).exclude(handoff__in=Conversation.HELD)
    rows = rows.filter(assistant__isnull=True) if policy.assistant_id is None else rows.filter(
        assistant_id=policy.assistant_id)
    rows = rows.exclude(turns__status__in=Turn.ACTIVE_STATUSES)
    if policy.since == "last_message":
        rows = rows.exclude(messages__created_at__gte=cutoff)
    return rows


@dataclasses.dataclass
class Purge:
    """What one run did: counts per kind, the batches, and the longest transaction (seconds)."""

    counts: dict = dataclasses.field(default_factory=dict)
    batches: int = 0
    longest: float = 0.0

    def add(self, kind, number):
        self.counts[kind] = self.counts.get(kind, 0) + number


def purge(*, now=None, batch=None, pause=None, keep_totals=None, dry_run=False):
    """Delete every conversation that is due (see the module); returns a ``Purge``. With
    ``dry_run``, nothing is deleted and the counts say what would be."""
    cfg = get_config()
    now = now or timezone.now()
    batch = cfg["RETENTION_BATCH"] if batch is None else batch
    pause = cfg["RETENTION_PAUSE"] if pause is None else pause
    keep_totals = cfg["RETENTION_KEEP_TOTALS"] if keep_totals is None else keep_totals
    result = Purge()
    for policy in policies():
        candidates = list(due(policy, now).annotate(size=Count("messages")).values_list("pk", "size"))
        if dry_run:
            result.add("conversations", len(candidates))
            result.add("messages", sum(size for _pk, size in candidates))
            continue
        for chunk in _chunks(candidates, batch):
            if result.batches:
                time.sleep(pause)
            began = time.monotonic()
            _delete_batch(policy, now, chunk, keep_totals, result)
            result.longest = max(result.longest, time.monotonic() - began)
            result.batches += 1
    if result.counts.get("conversations") and not dry_run:
        Erasure.objects.create(kind=Erasure.Kind.RETENTION, counts=result.counts)
        logger.info("Retention deleted %s", ", ".join(f"{n} {k}" for k, n in sorted(result.counts.items())))
    return result


def _chunks(candidates, batch):
    """``candidates`` ((pk, messages)) in chunks of about ``batch`` messages (a bigger
    conversation goes alone)."""
    chunk, size = [], 0
    for pk, messages in candidates:
        if chunk and size + messages > batch:
            yield chunk
            chunk, size = [], 0
        chunk.append(pk)
        size += messages
    if chunk:
        yield chunk


def _delete_batch(policy, now, chunk, keep_totals, result):
    with transaction.atomic():
        rows = due(policy, now).filter(pk__in=chunk)
        if connection.features.has_select_for_update_skip_locked:
            # A conversation a visitor's turn is starting in is left for the next run.
            rows = Conversation.objects.filter(pk__in=list(rows.values_list("pk", flat=True))).select_for_update(
                skip_locked=True)
        ids = list(rows.values_list("pk", flat=True))
        if not ids:
            return
        turns = Turn.objects.filter(conversation_id__in=ids)
        if keep_totals:
            _add_totals(turns)
        result.add("ratings", turns.exclude(rating="").count())
        # Children first, each one DELETE statement: the ORM's delete() would first read every row
        # of a turn or conversation it deletes to find what cascades, which is already gone here.
        for kind, rows in (("calls", CallRecord.objects.filter(turn__conversation_id__in=ids)),
                           ("messages", Message.objects.filter(conversation_id__in=ids)),
                           ("turns", turns), ("conversations", Conversation.objects.filter(pk__in=ids))):
            result.add(kind, rows._raw_delete(rows.db))


def _add_totals(turns):
    """Add ``turns`` to the anonymous daily totals, per day and assistant."""
    groups = (turns.filter(enqueued_at__isnull=False).annotate(day=TruncDate("enqueued_at"))
              .values("day", "assistant_id").order_by()
              .annotate(turns=Count("pk"), up=Count("pk", filter=Q(rating=Turn.Rating.UP)),
                        down=Count("pk", filter=Q(rating=Turn.Rating.DOWN)), input=Sum("input_tokens"),
                        output=Sum("output_tokens"), cost=Sum("cost")))
    for group in groups:
        total = (RetainedTotal.objects.select_for_update().filter(day=group["day"], assistant_id=group["assistant_id"])
                 .first())
        if total is None:
            total = RetainedTotal.objects.create(day=group["day"], assistant_id=group["assistant_id"])
        RetainedTotal.objects.filter(pk=total.pk).update(
            turns=F("turns") + group["turns"], rated_up=F("rated_up") + group["up"],
            rated_down=F("rated_down") + group["down"], input_tokens=F("input_tokens") + (group["input"] or 0),
            output_tokens=F("output_tokens") + (group["output"] or 0), cost=F("cost") + (group["cost"] or 0))


def purge_job():
    """``purge()`` as an RQ job (``conversations.jobs.purge_conversations``, for RQ's cron):
    returns the counts. A job stopped at its timeout leaves every finished batch deleted; the
    next run goes on from there."""
    return purge().counts
