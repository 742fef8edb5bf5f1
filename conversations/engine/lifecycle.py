"""What can happen to a turn from outside its job: it is started, stopped, finalised or repaired.

The API, the admin, the worker's parent process and ``manage.py repair_turns`` all go through
these functions, so each rule — one active turn per conversation, the visitor's message saved
before the job can run, a turn that could not be enqueued ends failed, only an unfinished turn
gets a final state — is written once. RQ's side (the queue, job ids, a job's health) is in ``infra.queue``; a turn whose job died
is continued or ended by ``recovery``.
"""

import functools
import logging

from django.db import IntegrityError, transaction
from django.dispatch import Signal
from django.utils import timezone
from redis.exceptions import RedisError

from .. import assistants
from ..core import pricing
from ..infra import dbconn, queue, state, telemetry
from ..conf import get_config
from ..models import Conversation, Message, ToolApproval, Turn
from ..redaction import Scrubber
from ..core.sentences import not_picked_up_message, unavailable_message
from . import statements

logger = logging.getLogger("conversations.turns")

# Sent once for each turn that ends, after the commit of the write that ended it, whoever made
# that write: its job, Stop, the worker's parent, the repair, an approval that expired.
# ``sender`` is ``Turn``; ``turn`` the ended turn. A test run (``evals.runs``) goes on from it.
turn_ended = Signal()


class TurnActive(Exception):
    """``start()`` refused: another turn of the conversation is still queued or running."""


class QueueUnavailable(Exception):
    """``start()`` could not enqueue the turn (Redis unreachable); a turn it had saved has ended failed."""


def ended(turn, *, margin=None):
    """Announce that a write has just ended ``turn`` (``turn_ended``), once it commits; every
    write of a turn's final status calls it, and only when that write changed the row. A
    receiver that raises is logged: the turn has ended either way.

    It is also where the turn is counted (``conversations.turns``, with its time to done and,
    from its job's final write, ``margin``: the seconds left before RQ's job timeout), so that
    every ending is counted once, whoever wrote it, and a write rolled back is not."""
    def send():
        if telemetry.enabled():  # its label may read the assistant's row: not for a site without the extra
            telemetry.count_turn(turn.status, assistant_label(turn), margin=margin, duration=(
                (turn.finished_at - turn.enqueued_at).total_seconds()
                if turn.finished_at and turn.enqueued_at else None))
        for receiver, result in turn_ended.send_robust(sender=Turn, turn=turn):
            if isinstance(result, Exception):
                logger.error("%s failed after turn %s ended", getattr(receiver, "__qualname__", receiver), turn.pk,
                             exc_info=result)
    transaction.on_commit(send)


def ensure_idle(conversation, counts=None):
    """Raise ``TurnActive`` when a turn of ``conversation`` is still queued or running.

    Call with the conversation's row locked (``start()`` does), so that two requests cannot
    both find it idle. A turn still queued past ``QUEUE_WAIT`` is ended here (at the commit,
    its state is published) rather than refused for: the visitor is never stuck behind it.
    ``counts``: the ``limits.TurnCounts`` read under that lock, when the caller has one (then
    nothing is read when it found none active here; a turn ended here no longer counts in it).
    """
    if counts is not None and not counts.here_active:
        return
    for turn in conversation.turns.filter(status__in=Turn.ACTIVE_STATUSES):  # one query; usually none
        if not (waited_too_long(turn) and _end_unclaimed_row(turn)):
            raise TurnActive()
        if counts is not None:
            counts.ended()
        transaction.on_commit(functools.partial(_publish_quietly, turn))


def create(conversation, content, **fields):
    """Save a visitor's message and its new turn, then enqueue the turn; returns ``(turn, message)``.

    Call inside ``transaction.atomic()``: the message is saved before the job can run, and
    django-rq enqueues at the commit.
    """
    assistant = conversation.assistant  # answers every turn of the conversation (None: the site's settings)
    turn = Turn(conversation=conversation, enqueued_at=timezone.now(), assistant=assistant, **fields)
    cfg = assistants.settings_for(turn.answering_assistant())  # a test run's draft (evals) answers with its own
    turn.provider, turn.model = str(cfg["PROVIDER"]), str(cfg["MODEL"])
    job_fields(turn)
    stored = Scrubber(cfg).text(content)  # what must not be stored never is (REDACT)
    if stored != content and cfg["REDACT_ORIGINAL_TO_MODEL"]:
        state.keep_original(turn.id, content, timeout=int(turn.job_timeout or cfg["JOB_TIMEOUT"]))
    message = Message(conversation=conversation, turn=turn, role=Message.Role.USER, content=stored)
    # Both rows in one round trip where the database allows (the turn's key is made in Python, so the
    # message names it before either is sent); raw statements, as the job's (``statements``).
    statements.send(statements.insert_statement(turn), statements.insert_statement(message))
    enqueue_turn(turn, saved=True)
    return turn, message


def start(lock, content, *, admit=ensure_idle, idempotency_key=""):
    """Start a turn answering ``content``; the one way the API and the admin's re-run do it.

    In one transaction: ``lock()`` returns the conversation with its row locked
    (``select_for_update``); ``admit(conversation)`` refuses by raising (the default,
    ``ensure_idle``, raises ``TurnActive``) or returns an existing turn to answer with instead;
    then ``create()``. After the commit the turn's first state is published, unless its job has
    published one already; should that fail, the poll view rebuilds it from the database.

    Returns ``(turn, created)``. ``created`` is False for the turn ``admit`` returned, and for
    the turn another request with the same ``idempotency_key`` saved first (the unique
    constraint decides; nothing is enqueued for the loser). Raises ``QueueUnavailable`` when
    Redis is unreachable at the commit: the visitor's message is saved by then but the job may
    not be, so the turn ends failed (``end_unqueued``).
    """
    with telemetry.enqueue_span() as span:  # the job enqueued in it carries its context
        turn, message = _start(lock, content, admit, idempotency_key)
        if message is None:
            return turn, False
        telemetry.set_attributes(span, **{"conversations.turn.id": str(turn.id),
                                          "conversations.conversation.id": str(turn.conversation_id),
                                          "conversations.assistant": assistant_label(turn),
                                          "messaging.message.id": turn.job_id})
    try:
        # Only as the turn's first state: its job may have run the whole turn already (a web
        # process held up a moment after the commit, an idle worker), and a queued state landing
        # over its states would show the turn queued until QUEUE_WAIT.
        state.publish(state.state_from_db(turn, [message]), first=True)
    except RedisError:
        logger.exception("Could not publish the queued state of turn %s", turn.id)
    return turn, True


def _start(lock, content, admit, idempotency_key):
    """``start()``'s transaction: ``(turn, message)``, or ``(turn, None)`` for a turn not created here."""
    turn = None
    try:
        with transaction.atomic():
            conversation = lock()
            existing = admit(conversation)
            if existing is not None:
                return existing, None
            if not idempotency_key:
                turn, message = create(conversation, content)
            else:
                try:
                    # A savepoint, so that the losing insert leaves the outer transaction usable, and
                    # the enqueue django-rq deferred to the commit is dropped with it.
                    with transaction.atomic():
                        turn, message = create(conversation, content, idempotency_key=idempotency_key)
                except IntegrityError:
                    return conversation.turns.get(idempotency_key=idempotency_key), None
    except RedisError as exc:
        if turn is not None:
            end_unqueued(turn)
        raise QueueUnavailable() from exc
    return turn, message


def assistant_label(turn):
    """The name metrics and spans give ``turn``'s assistant: its slug, or "default" for the site's settings."""
    return turn.assistant.slug if turn.assistant_id and turn.assistant is not None else "default"


def rerun(turn, *, admit=ensure_idle):
    """Start a new turn in ``turn``'s conversation with its visitor message, as if the visitor
    sent it again (the admin's re-run). Returns the new turn, or None when ``turn`` has no
    visitor message; raises what ``start()`` and ``admit`` raise."""
    message = turn.messages.filter(role=Message.Role.USER).order_by("id").first()
    if message is None:
        return None
    conversation_id = turn.conversation_id
    return start(lambda: Conversation.objects.select_for_update().get(pk=conversation_id), message.content,
                 admit=admit)[0]


def stop(turn, *, end_orphaned=False):
    """Ask ``turn`` to stop; returns the turn, refreshed.

    A queued turn, or one waiting for an approval, ends ``cancelled`` at once; a running one stops before its next model or
    tool call (the runner checks the flag in the cache). With ``end_orphaned``, a running turn
    whose RQ job is gone or dead, and so would never see the request, is ended ``cancelled``
    here. The rows come first, so a queued turn ends cancelled even when Redis is unreachable;
    a ``RedisError`` is raised only when the turn is still running and cannot be asked to stop.
    """
    if turn.done:
        return turn
    Turn.objects.filter(pk=turn.pk).update(cancel_requested=True)
    updated = Turn.objects.filter(pk=turn.pk, status=Turn.Status.QUEUED).update(
        status=Turn.Status.CANCELLED, finished_at=timezone.now())
    # A turn waiting for an approval has no job to see the flag: it ends here, its calls never run.
    with transaction.atomic():
        if Turn.objects.filter(pk=turn.pk, status=Turn.Status.WAITING).update(
                status=Turn.Status.CANCELLED, finished_at=timezone.now()):
            updated = ToolApproval.objects.filter(turn=turn, status=ToolApproval.Status.PENDING).update(
                status=ToolApproval.Status.REFUSED) or 1
    turn.refresh_from_db()
    if updated:
        ended(turn)
    try:
        # Also for a turn that was queued: a work horse may have loaded it a moment before, and
        # will mark it running; the flag still stops it before its first call.
        state.request_cancel(turn.id)
        if updated:
            state.publish(state.state_from_db(turn))
    except RedisError:
        logger.exception("Could not ask turn %s to stop", turn.id)
        turn.refresh_from_db()
        if not turn.done:
            raise
        return turn
    if end_orphaned and not turn.done and _job_problem(turn) is not None:
        finalize(turn, Turn.Status.CANCELLED, "")
    return turn


def _job_problem(turn):
    try:
        return queue.job_problem(turn)
    except RedisError:
        return None  # the job cannot be looked at; it may well be alive


def unended(turn_pk, *, job_id=None):
    """The turn ``turn_pk`` while it is not done yet and, with ``job_id``, still that job's: what a
    final write updates, so that it never ends a turn twice, nor one another job continued since
    the writer read it (a continuation, or a thread the concurrent worker gave up coming back)."""
    rows = Turn.objects.filter(pk=turn_pk, status__in=Turn.ACTIVE_STATUSES)
    return rows if job_id is None else rows.filter(job_id=job_id)


def update_unended(turn_pk, values, *, job_id):
    """``unended(turn_pk, job_id=job_id).update(**values)`` as one raw statement (``statements``):
    a running turn's own writes, after each round trip and at its end. Returns whether it matched
    (False: the turn ended, or another job runs it now; nothing was written)."""
    return bool(statements.send(update_unended_statement(turn_pk, values, job_id=job_id))[0])


def update_unended_statement(turn_pk, values, *, job_id):
    """``update_unended``'s statement, to send with the other statements of its transaction
    (``statements.send``); its result is how many rows it matched (0: nothing was written)."""
    return statements.update_statement(Turn, values, pk=turn_pk, status__in=statements.ACTIVE, job_id=job_id)


def finalize(turn, status, error, *, job_id=None):
    """Write a final state for ``turn`` from outside its job (worker parent, poll view, admin, cron).

    Only a turn that is not done yet is changed, and with ``job_id`` only while that job is still
    the turn's (a continuation may have started since the caller read the row); returns the
    published state or None.
    """
    updated = unended(turn.pk, job_id=job_id).update(status=status, error=error, finished_at=timezone.now())
    turn.refresh_from_db()
    if not updated and not turn.done:
        return None
    if updated:
        keep_streamed_text(turn)
        save_cost(turn)
        ended(turn)
    return state.publish(state.state_from_db(turn))


def keep_streamed_text(turn):
    """A work horse that died while a reply streamed left that text only in the cached state,
    as its last message (``"streaming": true``): save it as the turn's assistant message, so
    the visitor keeps what they saw and the transcript has it. Returns the row, or None."""
    try:
        cached = state.read(turn.id) or {}
    except RedisError:
        return None
    last = (cached.get("messages") or [{}])[-1]
    if not (last.get("streaming") and last.get("content")):
        return None
    return Message.objects.create(conversation_id=turn.conversation_id, turn=turn, role=Message.Role.ASSISTANT,
                                  content=last["content"])


def end_unqueued(turn):
    """End ``turn`` failed because its job could not be enqueued (Redis unreachable).

    The row is what counts: the cache is most likely unreachable too, and the poll view
    rebuilds a missing state from the row. The turn gives up its ``Idempotency-Key``: the
    client was told the request failed (503), so the same request sent again must start a new
    turn, not replay this one.
    """
    Turn.objects.filter(pk=turn.pk).update(idempotency_key="")
    try:
        finalize(turn, Turn.Status.FAILED, unavailable_message())
    except RedisError:
        pass


def waited_too_long(turn, now=None):
    """Whether ``turn`` is still queued more than ``QUEUE_WAIT`` seconds after it was enqueued:
    no worker picked it up in time, so it must end, and never run."""
    if turn.status != Turn.Status.QUEUED or turn.enqueued_at is None:
        return False
    return ((now or timezone.now()) - turn.enqueued_at).total_seconds() > get_config()["QUEUE_WAIT"]


def end_unclaimed(turn):
    """End ``turn`` ``failed`` with ``not_picked_up_message()`` if it is still queued; returns the
    published state, or None when it was not queued any more (a job claimed it, or it ended).

    One conditional UPDATE on ``status = queued``, the same row ``claim()`` updates: whichever
    comes first wins, so a turn is either run by its job or ended here, never both. The state
    is published after the row; a ``RedisError`` from that is raised (the row already says it).
    """
    if not _end_unclaimed_row(turn):
        return None
    return state.publish(state.state_from_db(turn))


def _end_unclaimed_row(turn):
    updated = Turn.objects.filter(pk=turn.pk, status=Turn.Status.QUEUED).update(
        status=Turn.Status.FAILED, error=not_picked_up_message(), finished_at=timezone.now())
    turn.refresh_from_db()
    if updated:
        ended(turn)
        logger.warning("Turn %s ended: no worker picked it up within QUEUE_WAIT (%ss)", turn.id,
                       get_config()["QUEUE_WAIT"], extra={"turn_id": str(turn.id)})
    return bool(updated)


def _publish_quietly(turn):
    try:
        state.publish(state.state_from_db(turn))
    except RedisError:  # the row says it; the poll view rebuilds a state from the row
        logger.exception("Could not publish the end of turn %s", turn.id)


def claim(turn, **fields):
    """Called by the job before it runs ``turn``: mark it running, with ``fields`` (more of its
    columns: the runner's clocks) in the same UPDATE, if it is still queued. Returns whether the
    job may run it (False: it was stopped or ended while it waited, see ``end_unclaimed``)."""
    fields = {"status": Turn.Status.RUNNING, "started_at": timezone.now(), **fields}
    # Built before it is sent: where ``lone_step`` is a transaction after all (inside a caller's, or
    # on a database where the UPDATE cannot commit alone), its BEGIN may take the database's write
    # lock, held then only for the statement (``runner.TurnRunner.mine_statements``).
    update = statements.update_statement(Turn, fields, pk=turn.pk, status=Turn.Status.QUEUED)
    with dbconn.lone_step():  # one UPDATE: no BEGIN and COMMIT of its own where it commits alone
        claimed = statements.send(update)[0]
    if claimed:
        for name, value in fields.items():
            setattr(turn, name, value)
    return bool(claimed)


def job_fields(turn):
    """Set the job's id and clocks on ``turn`` (not saved). The job id is ours, not RQ's, because
    inside ``transaction.atomic()`` django-rq defers the enqueue to the commit and returns None."""
    cfg = assistants.settings_for(turn.answering_assistant())  # an assistant may set its own job timeout
    turn.job_id = queue.job_id_for(turn)
    turn.job_timeout = cfg["JOB_TIMEOUT"]
    turn.deadline_margin = cfg["DEADLINE_MARGIN"]
    return ["job_id", "job_timeout", "deadline_margin"]


def enqueue_turn(turn, *, saved=False):
    """Enqueue ``turn`` with ``job_timeout = JOB_TIMEOUT`` (its assistant's, when it sets one); returns the job id.

    ``saved``: the turn's row already holds ``job_fields()`` (``create`` inserts them).
    """
    if not saved:
        turn.save(update_fields=job_fields(turn))
    # The assistant's own JOB_TIMEOUT when it sets one (job_fields() wrote it on the turn).
    return queue.enqueue(turn, turn.job_id, job_timeout=turn.job_timeout, description=f"conversation turn {turn.id}",
                         watch=True)


def save_cost(turn):
    """Compute and store ``turn``'s cost from its row's model and tokens (for final writes made
    outside the job, where the runner did not compute it). Returns the cost or None."""
    turn.cost = pricing.turn_cost(turn.model, turn.input_tokens, turn.output_tokens, get_config()["PRICES"])
    if turn.cost is not None:
        Turn.objects.filter(pk=turn.pk).update(cost=turn.cost)
    return turn.cost
