"""``manage.py repair_turns [--dry-run] [--grace SECONDS]``: repair the turns nobody will finish.

Meant for cron (every few minutes). A turn still ``queued`` more than ``QUEUE_WAIT`` seconds
after it was enqueued is ended (``lifecycle.end_unclaimed``: failed, "not available right now"),
whatever its job's state: no worker picked it up in time, so it must never run. Otherwise a
turn is a candidate when it is still ``queued`` or ``running`` and either its own deadline
(``deadline_at``) has passed, or it was enqueued (or started, without a recorded deadline)
more than ``--grace`` seconds ago. A candidate is repaired only when its RQ job can no longer
write a final state (``queue.job_problem``: the job is gone, failed, stopped, finished without
a final state, or stopped heartbeating), or when it never had a job at all: a running turn is
continued by a new job when its deadline still allows (``recovery.resume_or_fail``), else ended
(failed, or cancelled if it was asked to stop). A running job still inside its
``job_timeout`` is reported and left alone.

A turn waiting for a tool call's approval past ``APPROVAL_WAIT`` is ended ``incomplete``
(``engine.approvals.expire_due``).

Ending and repairing change a row only if it is still unfinished (queued, for
``end_unclaimed``), then publish the state with ``done: true``; running it twice changes
nothing the second time.
"""

import datetime
import logging

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Q
from django.utils import timezone
from redis.exceptions import RedisError

from conversations.engine import approvals, lifecycle
from conversations.infra import queue
from conversations.engine.recovery import resume_or_fail
from conversations.conf import get_config
from conversations.models import Turn

logger = logging.getLogger("conversations.repair")


def candidates(now, grace):
    """The unfinished turns that should have ended by ``now`` (a queryset, oldest first)."""
    old = now - datetime.timedelta(seconds=grace)
    running_late = Q(status=Turn.Status.RUNNING) & (
        Q(deadline_at__lt=now) | Q(deadline_at__isnull=True, started_at__lt=old)
        | Q(deadline_at__isnull=True, started_at__isnull=True)
    )
    queued_since = now - datetime.timedelta(seconds=min(grace, get_config()["QUEUE_WAIT"]))
    queued_long = Q(status=Turn.Status.QUEUED) & (Q(enqueued_at__lt=queued_since) | Q(enqueued_at__isnull=True))
    return (Turn.objects.filter(running_late | queued_long)
            .select_related("conversation").order_by("enqueued_at"))


def stuck_reason(turn, connection=None):
    """Why ``turn`` can never be finished by its job (a short string), or None if it still may be."""
    if not turn.job_id:
        return "no job"
    return queue.job_problem(turn, connection=connection)


class Command(BaseCommand):
    """Run by cron or a systemd timer; prints one line per overdue turn and a summary, exits 0
    (non-zero only when Redis or the database cannot be reached)."""

    help = ("Report turns stuck in queued/running past their deadline and repair those whose job cannot "
            "finish them: continued by a new job while the deadline allows, else ended (final state published "
            "with done: true). Safe to run from cron.")

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true", help="Report only; change nothing.")
        parser.add_argument("--grace", type=float, default=300.0,
                            help="Seconds a queued turn (or a running one with no deadline) may wait before "
                                 "its job is checked (default: 300). A turn still queued after "
                                 "QUEUE_WAIT is ended whatever this says.")

    def handle(self, *args, dry_run=False, grace=300.0, **options):
        if grace < 0:
            raise CommandError("--grace must be zero or more seconds.")
        now = timezone.now()
        overdue = repaired = resumed = 0
        try:
            connection = queue.get_queue().connection
            for turn in candidates(now, grace):
                status = turn.status
                if lifecycle.waited_too_long(turn, now):
                    reason = f"not picked up within QUEUE_WAIT ({get_config()['QUEUE_WAIT']}s)"
                    action = self.end_unclaimed(turn, dry_run)
                else:
                    reason = stuck_reason(turn, connection=connection)
                    action = self.act(turn, reason, dry_run)
                overdue += 1
                repaired += action in {"repaired", "resumed", "would repair"}
                resumed += action == "resumed"
                since = turn.deadline_at or turn.started_at or turn.enqueued_at
                late = f"{(now - since).total_seconds():.0f}s" if since else "?"
                # One line per turn as it is handled, so an interruption still reports what was done.
                self.stdout.write(f"{turn.id}  {status:<8}  {late:>7}  {reason or 'job still alive'}  -> {action}")
        except RedisError as exc:
            raise CommandError(f"Redis is unavailable, nothing was changed after this point: {exc}") from None
        if not dry_run:
            expired = approvals.expire_due(now)
            if expired:
                self.stdout.write(f"{expired} turn(s) waiting for an approval past APPROVAL_WAIT ended incomplete.")
        verb = "would be repaired" if dry_run else "repaired"
        continued = f" ({resumed} continued by a new job)" if resumed else ""
        self.stdout.write(f"{overdue} overdue turn(s), {repaired} {verb}{continued}, {overdue - repaired} left to "
                          "their job.")

    def end_unclaimed(self, turn, dry_run):
        """End ``turn``, which waited in the queue past ``QUEUE_WAIT``; return what was done."""
        if dry_run:
            return "would repair"
        if lifecycle.end_unclaimed(turn) is None:
            return "already done" if turn.done else "started meanwhile"
        return "repaired"

    def act(self, turn, reason, dry_run):
        """Repair ``turn`` if ``reason`` says its job cannot; return what was done, for the report."""
        if reason is None:
            return "left alone"
        if dry_run:
            return "would repair"
        if resume_or_fail(turn, reason, dead_job_id=turn.job_id) is None:
            return "already done"
        action = "resumed" if turn.status == Turn.Status.RUNNING else "repaired"
        logger.error("Turn %s %s by repair_turns: %s", turn.id, action, reason,
                     extra={"turn_id": str(turn.id), "reason": reason})
        return action
