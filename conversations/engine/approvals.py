"""Tool calls that run only once a person approves them (``@tool(approval=...)``, or the tools an
assistant lists in ``approval_tools``).

The server is the only judge. When the model asks for such a call the runner saves a
``ToolApproval`` (the turn, the call id, the exact arguments and their SHA-256, who may approve,
when it expires), runs the step's other calls, then moves the turn to ``waiting_approval`` and its
job ends: the wait holds no worker and no clock. ``decide`` is the one way an approval or a decline
lands (the API for the visitor, the admin for staff): bound to the turn, the call id, the hash of the
arguments and the approver, and single-use (one conditional UPDATE from ``pending``). Once no
call of the turn waits any more, ``continue_after`` enqueues a continuation job under a fresh
deadline, which runs the approved call once (``start_run``, another conditional UPDATE) or tells the
model it was declined. Nobody answering within ``APPROVAL_WAIT`` ends the turn ``incomplete``
(``expire``: the poll view's repair and ``repair_turns`` call it).

Every refusal says why in a sentence, and is recorded in the turn's timeline (a ``CallRecord`` of
kind ``approval``); the call is not run.
"""

import hmac
import logging
import math

from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _
from redis.exceptions import RedisError

from ..conf import get_config
from ..core.types import Outcome, ToolResult
from ..infra import queue, state
from ..models import CallRecord, ToolApproval, Turn
from ..tools import InvalidArguments, arguments_hash, validate_arguments
from .lifecycle import ended, save_cost

logger = logging.getLogger("conversations.approvals")

Status = ToolApproval.Status


class Refused(Exception):
    """An approval or decline that is not taken; ``message`` says why, for the person who sent it."""

    status = 409

    def __init__(self, message, reason):
        super().__init__(message)
        self.message, self.reason = message, reason


def expired_message():
    return _("Nobody approved or declined the action in time, so it was not done. Please ask again.")


def needs_approval(tool, call, turn, cfg):
    """Whether ``call`` of ``tool`` must wait for a person: the tool asks for it (``Tool.needs_approval``,
    with the conversation's user), or the turn's assistant lists the tool in ``approval_tools``.
    A call whose arguments are invalid is not asked about: it does not run (its error goes to the model)."""
    if tool is None:
        return False
    try:
        arguments = validate_arguments(tool, call.arguments)
    except InvalidArguments:
        return False
    return tool.name in cfg.get("APPROVAL_TOOLS", ()) or tool.needs_approval(arguments, turn.conversation.user)


def request(turn, call, tool):
    """The ``ToolApproval`` of ``call`` in ``turn``, saved pending the first time it is asked for."""
    wait = get_config()["APPROVAL_WAIT"]
    approval, created = ToolApproval.objects.get_or_create(turn=turn, call_id=call.id, defaults={
        "tool_name": tool.name, "arguments": call.arguments, "arguments_sha256": arguments_hash(call.arguments),
        "summary": tool.describe(call.arguments), "approver": tool.approver,
        "expires_at": timezone.now() + timezone.timedelta(seconds=wait)})
    if created:
        record(turn, tool.name, Outcome.OK, f"asked {tool.approver} to approve call {call.id}; waits {wait} s")
    return approval


def record(turn, name, outcome, detail):
    """One line of ``turn``'s timeline about an approval (never the arguments: they are the approval's own)."""
    started = turn.started_at or timezone.now()
    CallRecord.objects.create(turn=turn, kind=CallRecord.Kind.APPROVAL, name=name[:200], outcome=outcome,
                              started_offset=max(0.0, (timezone.now() - started).total_seconds()),
                              detail=detail[:500])


def _record_refusal(turn, name, reason):
    record(turn, name, Outcome.SKIPPED, f"refused: {reason}")
    logger.warning("Approval for turn %s refused: %s", turn.id, reason, extra={"turn_id": str(turn.id)})


def _refuse(turn, name, reason, message):
    _record_refusal(turn, name, reason)
    raise Refused(message, reason)


def refuse_stranger(turn, reason):
    """Record that someone who does not own ``turn``'s conversation tried to decide one of its calls
    (the API answers them 404, as for anything they do not own)."""
    _record_refusal(turn, "approval", reason)


def decide(turn, call_id, sha256, approve, *, user=None, staff=False):
    """Approve (``approve``) or decline the call ``call_id`` of ``turn``, whose arguments' SHA-256
    the approver saw as ``sha256``; ``staff``: decided in the admin by ``user`` (who holds
    ``approve_toolcall``), else by the conversation's owner. Returns the ``ToolApproval``; raises
    ``Refused`` (recorded in the timeline, nothing run) for a call that does not exist in this turn,
    a turn stopped or ended, a call already decided (a replay), one expired, other arguments, or a
    visitor approving a call only staff may approve. Continues the turn once nothing waits.

    ``turn`` is the row as its caller just read it (the API to see who owns it, the admin with the
    approval): it is judged as read and passed along, not read again. What changed since cannot
    slip through: the decision lands only by the conditional UPDATE from ``pending``, and the turn
    goes on only by ``continue_after``'s from ``waiting_approval``, not stopped."""
    approval = ToolApproval.objects.filter(turn=turn, call_id=str(call_id)[:200]).first()
    name = approval.tool_name if approval else "approval"
    if approval is None:
        _refuse(turn, name, "no such call in this turn",
                _("No action of this answer waits for that approval; nothing was done."))
    if turn.cancel_requested or turn.status == Turn.Status.CANCELLED:
        _refuse(turn, name, "the answer was stopped", _("This answer was stopped, so the action was not done."))
    if turn.done:
        _refuse(turn, name, "the turn has ended",
                _("This answer has ended, so the action can no longer be approved or declined."))
    if approval.status != Status.PENDING:
        _refuse(turn, name, f"already {approval.status}",
                _("This action was already decided; nothing more was done."))
    if turn.status != Turn.Status.WAITING:  # asked for, but not yet shown: the job has not paused
        _refuse(turn, name, "the turn is not waiting for an approval yet",
                _("This action is not waiting for your approval; nothing was done."))
    now = timezone.now()
    if approval.expires_at <= now:
        _refuse(turn, name, "expired", _("This request has expired; the action was not done."))
    if not isinstance(sha256, str) or not hmac.compare_digest(approval.arguments_sha256, sha256):
        _refuse(turn, name, "the arguments differ from the ones asked for",
                _("These are not the details the assistant asked to use; nothing was done."))
    if approve and approval.approver == ToolApproval.Approver.STAFF and not staff:
        _refuse(turn, name, "a staff-only call approved by the visitor",
                _("Only our staff can approve this action."))
    status = Status.APPROVED if approve else Status.DECLINED
    decision = {"status": status, "decided_at": now, "decided_by": user if staff else None,
                "decided_by_visitor": not staff}
    with transaction.atomic():
        won = ToolApproval.objects.filter(pk=approval.pk, status=Status.PENDING, expires_at__gt=now).update(
            **decision)
        if won:
            who = f"staff member {user.pk}" if staff else "the visitor"
            record(turn, name, Outcome.OK, f"{status} by {who}")
    if not won:  # another request decided it a moment ago
        _refuse(turn, name, "already decided (a concurrent request)",
                _("This action was already decided; nothing more was done."))
    for field, value in decision.items():
        setattr(approval, field, value)
    if not ToolApproval.objects.filter(turn=turn, status=Status.PENDING).exists():
        continue_after(turn, approval)
    else:
        _publish(turn)
    return approval


def continue_after(turn, approval):
    """Enqueue the job that goes on with ``turn`` now that no call waits (``approval`` the last decided),
    under a fresh deadline: the wait was a person's, not the turn's. Only one caller moves the turn
    out of ``waiting_approval``; returns the job id, or None. ``turn`` is as its caller read it
    (``decide``, ``expire``); what this changes on its row is set on it too, for the state published."""
    job_id = queue.continuation_job_id(turn, f"a{approval.pk}")
    timeout = turn.job_timeout or get_config()["JOB_TIMEOUT"]
    margin = turn.deadline_margin if turn.deadline_margin is not None else get_config()["DEADLINE_MARGIN"]
    now = timezone.now()
    moved = {"status": Turn.Status.RUNNING, "job_id": job_id,
             "deadline_at": now + timezone.timedelta(seconds=timeout - margin)}
    state.mark_enqueueing(turn.id, job_id)  # until it is in the queue, nobody takes it for dead
    if not Turn.objects.filter(pk=turn.pk, status=Turn.Status.WAITING, cancel_requested=False).update(**moved):
        return None
    for name, value in moved.items():
        setattr(turn, name, value)
    record(turn, "continued", Outcome.OK, f"continued by job {job_id} after the approvals")
    queue.enqueue_continuation(turn, job_id, job_timeout=math.ceil(timeout))
    _publish(turn)
    return job_id


def _publish(turn):
    try:
        state.publish(state.state_from_db(turn))
    except RedisError:  # the row says it; the poll view rebuilds the state from it
        logger.exception("Could not publish the state of turn %s", turn.id)


def start_run(approval):
    """Claim the one run of an approved call: True for the job that may run it; False when a job
    started it before (and died): it is not run twice."""
    return bool(ToolApproval.objects.filter(pk=approval.pk, status=Status.APPROVED, run_started_at__isnull=True)
                .update(run_started_at=timezone.now()))


def refuse_pending(turn):
    """Mark the calls ``turn`` was about to wait for as refused: it was stopped before it paused."""
    ToolApproval.objects.filter(turn=turn, status=Status.PENDING).update(status=Status.REFUSED)


def save_result(approval, result):
    ToolApproval.objects.filter(pk=approval.pk).update(result=result.output[:10000])


def not_run_result(call, approval):
    """What the model reads for a call that was declined, expired or refused: it was not done."""
    if approval.status == Status.DECLINED:
        text = f"The person asked declined this call of {call.name}: it was not run. Tell them it was not done."
    else:
        text = f"This call of {call.name} was not approved in time: it was not run."
    return ToolResult(call.id, call.name, text, outcome=Outcome.SKIPPED, detail=f"not run: {approval.status}")


def mismatch_result(call):
    return ToolResult(call.id, call.name, f"Error: this call of {call.name} was not run: its arguments are not the "
                      "ones approved.", is_error=True, detail="not run: the arguments differ from the approved ones")


def expire(turn, now=None):
    """End ``turn`` ``incomplete`` if a call of it waited past ``APPROVAL_WAIT`` (its pending calls
    marked expired); returns the published state, or None. A waiting turn whose calls were all decided
    (a continuation that could not be enqueued) is continued instead."""
    now = now or timezone.now()
    if turn.status != Turn.Status.WAITING:
        return None
    pending = ToolApproval.objects.filter(turn=turn, status=Status.PENDING)
    if not pending.exists():
        last = ToolApproval.objects.filter(turn=turn).order_by("-decided_at", "-id").first()
        if last is not None and continue_after(turn, last):
            return state.read(turn.id)
        return None
    with transaction.atomic():
        # The same conditional UPDATE from pending as a decision's: of an approval landing as it
        # expires and the expiry, exactly one wins.
        if not pending.filter(expires_at__lte=now).update(status=Status.EXPIRED):
            return None
        if not Turn.objects.filter(pk=turn.pk, status=Turn.Status.WAITING).update(
                status=Turn.Status.INCOMPLETE, error=expired_message(), finished_at=now):
            return None
        pending.update(status=Status.EXPIRED)  # the turn's other calls go with it
        record(turn, "approval", Outcome.TIMEOUT, "expired: nobody decided within APPROVAL_WAIT")
    turn.refresh_from_db()
    save_cost(turn)
    ended(turn)
    logger.info("Turn %s ended: its approval expired", turn.id, extra={"turn_id": str(turn.id)})
    return state.publish(state.state_from_db(turn))


def expire_due(now=None):
    """Expire every waiting turn due (``expire``); returns how many ended. For ``repair_turns``."""
    now = now or timezone.now()
    due = (Turn.objects.filter(status=Turn.Status.WAITING, approvals__status=Status.PENDING,
                               approvals__expires_at__lte=now).select_related("conversation").distinct())
    return sum(expire(turn, now) is not None for turn in due)


def staff_waiting():
    """The calls waiting for staff approval, the oldest first (the admin's list)."""
    return (ToolApproval.objects.filter(status=Status.PENDING, approver=ToolApproval.Approver.STAFF,
                                        turn__status=Turn.Status.WAITING)
            .select_related("turn", "turn__conversation").order_by("requested_at"))


__all__ = ["Refused", "needs_approval", "request", "decide", "continue_after", "start_run", "save_result",
           "not_run_result", "mismatch_result", "refuse_pending", "expire", "expire_due", "staff_waiting", "refuse_stranger",
           "expired_message"]
