"""A turn survives its worker: it is continued by a new job instead of failing.

Every round-trip of a turn is saved as it lands, so when its work horse dies (SIGKILL, the
OOM killer) or its worker shuts down, what was done is in the database and the turn can go on
from there on any worker — with the same deadline, never a new, longer budget. The places
that notice a dead job (the worker's parent, the poll view's repair, ``repair_turns``) call
``resume_or_fail``; a job whose worker is shutting down calls ``continue_turn`` itself; a
``ConcurrentWorker`` ending a turn it gave up calls ``end_for_dead_job``.

``continue_turn`` lets exactly one caller win, however many notice the same death at once: a
conditional UPDATE moves the turn's ``job_id`` from the dead job to the new one.
"""

import logging
import math

from django.utils import timezone

from ..infra import lease, queue, state, telemetry
from ..conf import get_config
from ..core.types import Outcome
from ..models import CallRecord, Turn
from . import approvals
from .lifecycle import end_unclaimed, finalize, waited_too_long
from ..core.sentences import crashed_message

logger = logging.getLogger("conversations.resume")
# repair() came from lifecycle; its lines keep the logger name operators filter on.
repair_logger = logging.getLogger("conversations.turns")


def time_left(turn, now=None):
    """Seconds before the turn's own deadline (``deadline_at``), or None when it never started."""
    if turn.deadline_at is None:
        return None
    return (turn.deadline_at - (now or timezone.now())).total_seconds()


def can_hand_over(turn, cfg):
    """Whether running ``turn`` may still be continued by another job: fewer than ``MAX_RESUMES``
    so far, and its deadline leaves ``MIN_CALL_BUDGET``."""
    left = time_left(turn)
    return turn.resumes < cfg["MAX_RESUMES"] and left is not None and left >= cfg["MIN_CALL_BUDGET"]


def continue_turn(turn, cause, *, from_job_id, died=True):
    """Enqueue a new job for running ``turn`` that goes on from its saved transcript, if
    ``from_job_id`` is still its job, it may resume once more (``MAX_RESUMES``), it was not
    asked to stop, and its deadline leaves ``MIN_CALL_BUDGET``. ``died``: that job is dead (False:
    it hands the turn over itself, as its worker shuts down). Returns the new job's id, or None
    (someone else continued it, or it must end instead)."""
    cfg = get_config()
    if turn.status != Turn.Status.RUNNING or turn.cancel_requested or not can_hand_over(turn, cfg):
        return None
    left = time_left(turn)
    number = turn.resumes + 1
    job_id = queue.continuation_job_id(turn, number)
    state.mark_enqueueing(turn.id, job_id)  # until it is in the queue, nobody takes it for dead
    won = Turn.objects.filter(pk=turn.pk, status=Turn.Status.RUNNING, job_id=from_job_id, resumes=turn.resumes,
                              cancel_requested=False).update(job_id=job_id, resumes=number)
    if not won:
        return None
    turn.job_id, turn.resumes = job_id, number
    state.clear_handoff(turn.id)  # the new job must not hand over again on the old worker's word
    started = turn.started_at or timezone.now()
    CallRecord.objects.create(turn=turn, kind=CallRecord.Kind.RESUME, name=cause[:200], attempt=number,
                              started_offset=(timezone.now() - started).total_seconds(), remaining_before=left,
                              timeout=left, outcome=Outcome.OK, detail=f"continued by job {job_id}: {cause}"[:500])
    # The resume's span is the request's child, and the continuation's parent (its job's meta).
    carried = telemetry.resume_span(queue.job_meta(from_job_id) if telemetry.enabled() else None, died=died, **{
        "conversations.turn.id": str(turn.id), "conversations.resume.cause": cause[:200],
        "conversations.resume.number": number, "conversations.resume.from_job": from_job_id,
        "messaging.message.id": job_id, "conversations.resume.remaining": left})
    # What is left of the turn's own deadline, plus the margin: never a longer budget.
    queue.enqueue_continuation(turn, job_id, job_timeout=math.ceil(left + cfg["DEADLINE_MARGIN"]),
                               trace_context=carried)
    try:
        data = state.read(turn.id) or state.state_from_db(turn)
        state.publish({**data, "resuming": True, "job_id": job_id})
    except Exception:  # noqa: BLE001 - the continuation runs whether or not the widget hears of it
        logger.warning("Could not publish that turn %s resumes", turn.id, exc_info=True)
    logger.warning("Turn %s continued by a new job (%s): %s, %.1fs left", turn.id, job_id, cause, left,
                   extra={"turn_id": str(turn.id), "cause": cause, "remaining": round(left, 3)})
    return job_id


def resume_or_fail(turn, cause, *, dead_job_id=None):
    """For a turn whose job (``dead_job_id``, default its current one) can no longer finish it:
    continue a running turn (``continue_turn``) or, when it may not be continued, end it as
    before — ``cancelled`` if it was asked to stop, else ``failed``. Returns the published
    state, or None when another caller continued or ended it first."""
    turn.refresh_from_db()
    dead = dead_job_id or turn.job_id
    if turn.done or turn.job_id != dead or turn.status == Turn.Status.WAITING:
        return None  # a turn waiting for an approval needs no job: its job ended it there
    if turn.status == Turn.Status.RUNNING and continue_turn(turn, cause, from_job_id=dead):
        return state.read(turn.id)
    return end_for_dead_job(turn, crashed_message(), dead_job_id=dead)


def reap(connection, worker_name):
    """Continue (or end) every turn that dead worker ``worker_name`` held, then forget the worker
    (``lease.reaped``). Returns how many turns this call continued or ended; a turn another caller
    acted on first is left to it. Call only once ``lease.declare_dead`` said it is dead."""
    acted = 0
    for job_id in queue.jobs_of(worker_name, connection):
        turn_id = queue.turn_id_from_job_id(job_id)
        turn = Turn.objects.select_related("conversation").filter(pk=turn_id).first() if turn_id else None
        if turn is not None and resume_or_fail(turn, "its worker process died", dead_job_id=job_id) is not None:
            acted += 1
    lease.reaped(connection, worker_name)
    if acted:
        logger.error("Worker %s died: %d of its turns continued or ended", worker_name, acted,
                     extra={"worker": worker_name, "turns": acted})
    return acted


def end_for_dead_job(turn, sentence, *, dead_job_id):
    """End ``turn``, whose job ``dead_job_id`` can no longer finish it and which is not continued:
    ``cancelled`` if it was asked to stop, else ``failed`` with ``sentence``. Returns the
    published state, or None when it has ended already or another job runs it now."""
    turn.refresh_from_db()
    if turn.done or turn.job_id != dead_job_id or turn.status == Turn.Status.WAITING:
        return None  # ended, continued by another caller a moment ago, or paused for an approval
    if turn.cancel_requested:
        return finalize(turn, Turn.Status.CANCELLED, "", job_id=dead_job_id)
    return finalize(turn, Turn.Status.FAILED, sentence, job_id=dead_job_id)


def repair(turn):
    """Called by the poll view for a stale or missing state: end ``turn`` if it waited in the
    queue past ``QUEUE_WAIT`` (``end_unclaimed``), or if it is unfinished but its job can no
    longer finish it (``failed``). Returns the new state, or None."""
    if turn.done:
        return None
    if turn.status == Turn.Status.WAITING:  # no job to be dead: it waits for a person, until APPROVAL_WAIT
        return approvals.expire(turn)
    if waited_too_long(turn):
        ended = end_unclaimed(turn)
        if ended is not None:
            return ended
    problem = queue.job_problem(turn)
    if problem is None:
        return None
    repair_logger.error("Turn %s repaired: %s", turn.id, problem)
    return resume_or_fail(turn, problem, dead_job_id=turn.job_id)
