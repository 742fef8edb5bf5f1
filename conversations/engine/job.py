"""The job RQ runs for a turn (``infra.queue`` enqueues it by its public path,
``conversations.jobs.perform_turn``).

Defences that make sure a turn always ends, innermost first:

1. the runner's own deadline (``JOB_TIMEOUT - DEADLINE_MARGIN``) and per-call budgets;
2. ``perform_turn`` catches RQ's ``JobTimeoutException``, writes the final state, re-raises;
3. ``conversations.worker.Worker`` (the worker's parent process) finalises a turn whose work
   horse died abruptly (SIGKILL, OOM, ``os._exit``), where RQ calls no failure callback;
4. ``recovery.repair()``, called by the poll view, finalises a turn whose job is failed, gone
   or no longer heartbeating (``job_problem()``);
5. the widget stops polling after ``JOB_TIMEOUT`` plus a margin whatever the server says.

Starting, stopping and finalising a turn are in ``lifecycle``; the queue, job ids and a job's
health in ``infra.queue``.
"""

import logging

from django.db import close_old_connections
from django.utils import timezone
from redis.exceptions import RedisError
from rq import get_current_job
from rq.timeouts import JobTimeoutException

from .. import assistants
from ..endpoints import calls_url
from ..infra import state, telemetry
from ..infra.watchdog import environment_settings
from . import configure, lifecycle, statements
from ..core.budget import TurnClock
from ..conf import get_config
from ..models import CallRecord, Turn
from .runner import TurnRunner
from ..core.types import Outcome
from .recovery import time_left
from ..providers import get_provider_class
from ..providers.chain import chain_entries
from ..tools import load_tools
from ..core.sentences import crashed_message, timeout_message

logger = logging.getLogger("conversations.jobs")

RELATED = ("conversation", "conversation__user", "assistant")  # what a job reads with its turn


def perform_turn(turn_id):
    """The RQ job: run one turn under its deadline; always end with a final write.

    A turn that waited in the queue past ``QUEUE_WAIT`` is ended instead of run, and a turn
    that is no longer queued when the job claims it (stopped, or ended by the poll view or
    ``repair_turns`` while it waited) is left as it is: nothing is ever run late.
    """
    cfg = get_config()
    job = get_current_job()
    job_timeout = job.timeout if job is not None and job.timeout and job.timeout > 0 else cfg["JOB_TIMEOUT"]
    clock = TurnClock(job_timeout, cfg["DEADLINE_MARGIN"])
    worker = (job.worker_name if job is not None else "") or ""
    try:
        with telemetry.job_span(job.meta if job is not None else None, content=cfg["TELEMETRY_CONTENT"], **{
                "conversations.turn.id": str(turn_id), "messaging.message.id": job.id if job is not None else None,
                "messaging.destination.name": cfg["QUEUE"], "conversations.worker.name": worker,
                "conversations.job.timeout": job_timeout}) as trace:
            telemetry.in_flight(1, worker)  # not in a forking Worker's horse: its parent counts it
            try:
                return _perform(turn_id, cfg, job, job_timeout, clock, trace)
            finally:
                telemetry.in_flight(-1, worker)
    finally:
        if telemetry.forked():  # a work horse ends with os._exit: what it holds is sent now
            telemetry.flush()


def _perform(turn_id, cfg, job, job_timeout, clock, trace):
    """``perform_turn``'s body, inside the job's span (``trace``: its ``JobTrace``, or None)."""
    close_old_connections()
    try:
        turn, transcript = _load(turn_id)
    except Turn.DoesNotExist:
        logger.warning("Turn %s no longer exists; nothing to do", turn_id)
        return None
    if turn.done:  # cancelled (or repaired) before a worker picked it up
        return turn.status
    if turn.status == Turn.Status.RUNNING:  # a continuation, or a job whose turn moved on
        if job is None or job.id != turn.job_id:
            return turn.status
        telemetry.set_attributes(trace and trace.span, **{"conversations.job.resuming": True})
        return _continue(turn, cfg, trace, transcript)
    if lifecycle.waited_too_long(turn):  # the visitor has been (or is now) told to try again later
        try:
            lifecycle.end_unclaimed(turn)
        except RedisError:  # the row says it; the poll view rebuilds the state from it
            logger.exception("Could not publish the end of turn %s", turn_id)
        logger.warning("Turn %s started %.0fs after it was enqueued, past QUEUE_WAIT: not run", turn_id,
                       (timezone.now() - turn.enqueued_at).total_seconds())
        return turn.status
    # The runner claims it (``lifecycle.claim``) with its clocks in one UPDATE: a turn stopped or
    # ended a moment ago, between the read above and now, is left as it is.
    return _run(turn, cfg, lambda cfg: clock, job_timeout=job_timeout, trace=trace, transcript=transcript)


def _load(turn_id):
    """``(turn, transcript)``: the turn with the rows it needs (``RELATED``) and its transcript
    (``statements.transcript``), in one send where the database allows (``statements.send``): the
    runner needs the transcript, and reading it apart was one more round trip to the database.
    Raises ``Turn.DoesNotExist``."""
    return tuple(statements.send(statements.get_statement(Turn, turn_id, related=RELATED),
                                 statements.transcript_statement(turn_id)))


def _continue(turn, cfg, trace=None, transcript=None):
    """Run the rest of ``turn`` (this job is its continuation) under what is left of its own
    deadline: the budget ends at ``deadline_at``, never later. ``transcript``: its messages, as
    ``statements.transcript`` read them (None: the runner reads them)."""
    def clock_for(cfg):
        left = max(0.0, time_left(turn) or 0.0)
        return TurnClock(left + cfg["DEADLINE_MARGIN"], cfg["DEADLINE_MARGIN"])

    return _run(turn, cfg, clock_for, resuming=True, trace=trace, transcript=transcript)


def _run(turn, cfg, clock_for, *, resuming=False, job_timeout=None, trace=None, transcript=None):
    """Run ``turn`` (claimed by its runner, or, ``resuming``, continued) with the clock ``clock_for(cfg)`` builds
    from its assistant's settings; whatever happens, end it with a final write. The one path
    both a first run and a continuation take, so neither can leave a turn ``running``.
    ``transcript``: its messages, read with it (None: the runner reads them)."""
    turn_id = turn.id
    again = " after resuming" if resuming else ""
    try:
        cfg = configure.config_for_turn(turn, cfg)
    except assistants.NotSetUp as exc:  # e.g. a tool removed from TOOLS since the assistant was saved
        logger.error("Turn %s cannot run%s: the assistant %s", turn_id, again, exc)
        # The visitor reads one sentence; what broke is for the admin's timeline (and the log).
        CallRecord.objects.create(turn=turn, kind=CallRecord.Kind.MODEL, name=turn.assistant.slug,
                                  outcome=Outcome.SKIPPED, started_offset=0.0, remaining_before=0.0,
                                  detail=f"{exc.kind}: {exc.reason}"[:CallRecord._meta.get_field("detail").max_length])
        lifecycle.finalize(turn, Turn.Status.FAILED, exc.message)
        return turn.status
    try:
        runner = TurnRunner(turn, clock=clock_for(cfg), config=cfg, trace=trace, transcript=transcript)
    except Exception:  # e.g. a PROVIDER or TOOLS path that cannot be imported: still end the turn
        logger.exception("Turn %s could not start%s", turn_id, again)
        lifecycle.finalize(turn, Turn.Status.FAILED, crashed_message())
        raise
    try:
        runner.run(resuming=resuming)
    except JobTimeoutException:
        logger.error("Turn %s hit the RQ job timeout%s%s", turn_id,
                     f" ({job_timeout}s)" if job_timeout is not None else "", again)
        runner.finish(Turn.Status.FAILED, timeout_message())
        raise
    except Exception:
        logger.exception("Turn %s crashed%s", turn_id, again)
        runner.finish(Turn.Status.FAILED, crashed_message())
        raise
    return turn.status


def warm_up(forking=False):
    """Do, once in an RQ worker's parent process, the first-time work of a turn that each work
    horse would otherwise repeat: every horse is a fresh fork of the parent and inherits only
    what the parent has already done. Imports the provider and the tools; looks up the proxies
    the environment sets for each provider's origin (``watchdog.environment_settings``); runs the turn's
    queries once (finding nothing), which builds Django's lazy model metadata and the database
    driver's adapters; reads the cache once; makes the tracer and the instruments (``forking``,
    where the app set up the SDK: neither; each work horse makes its tracer provider at its job's
    start and hands its measurements to this process, which exports them; see
    ``telemetry.warm_up``). Then
    closes the database connection, which a forked horse must not share. Never raises.
    """
    import uuid

    from django.db import connections

    cfg = get_config()
    try:
        get_provider_class(cfg["PROVIDER"])
        load_tools(cfg["TOOLS"])
        for entry in chain_entries(cfg):  # the environment's proxies for each provider's origin
            url = calls_url(entry["PROVIDER"], entry.get("BASE_URL"))
            if url:
                environment_settings(url)
        missing = uuid.uuid4()
        try:  # the raw statements' text is built once per process: a horse inherits it built
            _load(missing)
        except Turn.DoesNotExist:
            pass
        statements.transcript(missing, missing)
        state.read(missing)
        telemetry.warm_up(forking=forking)
    except Exception:  # noqa: BLE001 - a worker that cannot warm up still works, only slower
        logger.warning("Could not warm up the worker", exc_info=True)
    finally:
        connections.close_all()
