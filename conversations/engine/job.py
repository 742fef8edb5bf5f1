"""RQ's side of a turn: enqueueing it, the job that runs it, and what RQ knows of the job's health.

Defences that make sure a turn always ends, innermost first:

1. the runner's own deadline (``JOB_TIMEOUT - DEADLINE_MARGIN``) and per-call budgets;
2. ``perform_turn`` catches RQ's ``JobTimeoutException``, writes the final state, re-raises;
3. ``conversations.worker.Worker`` (the worker's parent process) finalises a turn whose work
   horse died abruptly (SIGKILL, OOM, ``os._exit``), where RQ calls no failure callback;
4. ``turns.repair()``, called by the poll view, finalises a turn whose job is failed, gone
   or no longer heartbeating (``job_problem()``);
5. the widget stops polling after ``JOB_TIMEOUT`` plus a margin whatever the server says.

Starting, stopping and finalising a turn are domain operations, in ``turns``.
"""

import datetime
import logging

import django_rq
from django.db import close_old_connections
from django.utils import timezone
from django.utils.translation import gettext as _
from redis.exceptions import RedisError
from rq import get_current_job
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.timeouts import JobTimeoutException
from rq.worker import Worker

from .. import assistants
from ..infra import state
from . import lifecycle as turns
from ..core.budget import TurnClock
from ..conf import get_config
from ..models import CallRecord, Turn
from .runner import TurnRunner
from ..core.types import Outcome

logger = logging.getLogger("conversations.jobs")

JOB_PREFIX = "conversations-turn-"

# RQ's parent process refreshes a running job's heartbeat every 30 s (job_monitoring_interval);
# three missed beats mean no process is looking after the job any more.
HEARTBEAT_GRACE = 90


def job_id_for(turn):
    return f"{JOB_PREFIX}{turn.id}"


def timeout_message():
    return _("The assistant ran out of time on this answer. Please try again.")


_connections = {}


def get_queue():
    """The turns' queue, on a Redis client made once per process (and queue configuration).

    ``django_rq.get_queue()`` builds a new client, with a new connection pool, on every call,
    so every POST would open (and handshake) a fresh connection to Redis. The client's pool
    starts afresh in a forked child, as redis-py pools do.
    """
    from django_rq.settings import QUEUES

    name = get_config()["QUEUE"]
    key = (name, repr(sorted(QUEUES[name].items())))
    connection = _connections.get(key)
    if connection is None:
        connection = _connections[key] = django_rq.get_connection(name)
    return django_rq.get_queue(name, connection=connection)


def job_fields(turn):
    """Set the job's id and clocks on ``turn`` (not saved). The job id is ours, not RQ's, because
    inside ``transaction.atomic()`` django-rq defers the enqueue to the commit and returns None."""
    cfg = assistants.settings_for(turn.assistant)  # an assistant may set its own job timeout
    turn.job_id = job_id_for(turn)
    turn.job_timeout = cfg["JOB_TIMEOUT"]
    turn.deadline_margin = cfg["DEADLINE_MARGIN"]
    return ["job_id", "job_timeout", "deadline_margin"]


def enqueue_turn(turn, *, saved=False):
    """Enqueue ``turn`` with ``job_timeout = JOB_TIMEOUT`` (its assistant's, when it sets one); returns the job id.

    ``saved``: the turn's row already holds ``job_fields()`` (``turns.create`` inserts them).
    """
    if not saved:
        turn.save(update_fields=job_fields(turn))
    # The assistant's own JOB_TIMEOUT when it sets one (job_fields() wrote it on the turn).
    return _enqueue(turn, turn.job_id, job_timeout=turn.job_timeout, description=f"conversation turn {turn.id}")


def warn_if_unattended(turn):
    """Log a warning when no worker listens on the turns' queue just after ``turn`` was put on it.

    Otherwise the visitor watches "thinking" until ``QUEUE_WAIT`` ends the turn, and nothing says
    why until then. One ``SCARD`` of RQ's per-queue worker set: cheap enough for every POST. A
    worker that died without unregistering still counts until RQ cleans it up; a Redis that
    cannot be read says nothing here (the enqueue itself would have failed first)."""
    queue = get_queue()
    try:
        listening = Worker.count(queue=queue)
    except RedisError:
        return
    if not listening:
        logger.warning("Turn %s was queued on %r, but no worker listens on that queue: it waits until one does, "
                       "and ends after QUEUE_WAIT (%ss). Start one: manage.py rqworker %s", turn.id, queue.name,
                       get_config()["QUEUE_WAIT"], queue.name,
                       extra={"turn_id": str(turn.id), "queue": queue.name})


def enqueue_continuation(turn, job_id, *, job_timeout):
    """Enqueue job ``job_id`` continuing running ``turn`` (``resume.continue_turn``), at the front
    of the queue: its deadline is already running."""
    return _enqueue(turn, job_id, job_timeout=job_timeout, description=f"conversation turn {turn.id}, continued",
                    at_front=True)


# Jobs are queued by this path, not by the function: a job stores the path it names, and jobs
# queued before the engine moved into conversations.engine name this one (the jobs.py face).
TURN_JOB = "conversations.jobs.perform_turn"


def _enqueue(turn, job_id, *, job_timeout, description, at_front=False):
    cfg = get_config()
    get_queue().enqueue(TURN_JOB, str(turn.id), job_id=job_id, job_timeout=job_timeout,
                        result_ttl=cfg["STATE_TTL"], failure_ttl=max(cfg["STATE_TTL"], 86400),
                        description=description, at_front=at_front)
    return job_id


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
    close_old_connections()
    try:
        turn = Turn.objects.select_related("conversation", "conversation__user", "assistant").get(pk=turn_id)
    except Turn.DoesNotExist:
        logger.warning("Turn %s no longer exists; nothing to do", turn_id)
        return None
    if turn.done:  # cancelled (or repaired) before a worker picked it up
        return turn.status
    if turn.status == Turn.Status.RUNNING:  # a continuation, or a job whose turn moved on
        if job is None or job.id != turn.job_id:
            return turn.status
        return _continue(turn, cfg)
    if turns.waited_too_long(turn):  # the visitor has been (or is now) told to try again later
        try:
            turns.end_unclaimed(turn)
        except RedisError:  # the row says it; the poll view rebuilds the state from it
            logger.exception("Could not publish the end of turn %s", turn_id)
        logger.warning("Turn %s started %.0fs after it was enqueued, past QUEUE_WAIT: not run", turn_id,
                       (timezone.now() - turn.enqueued_at).total_seconds())
        return turn.status
    if not turns.claim(turn):  # stopped or ended a moment ago, between the read above and now
        turn.refresh_from_db()
        return turn.status
    return _run(turn, cfg, lambda cfg: clock, job_timeout=job_timeout)


def _continue(turn, cfg):
    """Run the rest of ``turn`` (this job is its continuation) under what is left of its own
    deadline: the budget ends at ``deadline_at``, never later."""
    from .recovery import time_left

    def clock_for(cfg):
        left = max(0.0, time_left(turn) or 0.0)
        return TurnClock(left + cfg["DEADLINE_MARGIN"], cfg["DEADLINE_MARGIN"])

    return _run(turn, cfg, clock_for, resuming=True)


def _run(turn, cfg, clock_for, *, resuming=False, job_timeout=None):
    """Run claimed (or, ``resuming``, continued) ``turn`` with the clock ``clock_for(cfg)`` builds
    from its assistant's settings; whatever happens, end it with a final write. The one path
    both a first run and a continuation take, so neither can leave a turn ``running``."""
    turn_id = turn.id
    again = " after resuming" if resuming else ""
    try:
        cfg = assistants.config_for_turn(turn, cfg)
    except assistants.NotSetUp as exc:  # e.g. a tool removed from TOOLS since the assistant was saved
        logger.error("Turn %s cannot run%s: the assistant %s", turn_id, again, exc)
        # The visitor reads one sentence; what broke is for the admin's timeline (and the log).
        CallRecord.objects.create(turn=turn, kind=CallRecord.Kind.MODEL, name=turn.assistant.slug,
                                  outcome=Outcome.SKIPPED, started_offset=0.0, remaining_before=0.0,
                                  detail=f"{exc.kind}: {exc.reason}"[:CallRecord._meta.get_field("detail").max_length])
        turns.finalize(turn, Turn.Status.FAILED, exc.message)
        return turn.status
    try:
        runner = TurnRunner(turn, clock=clock_for(cfg), config=cfg)
    except Exception:  # e.g. a PROVIDER or TOOLS path that cannot be imported: still end the turn
        logger.exception("Turn %s could not start%s", turn_id, again)
        turns.finalize(turn, Turn.Status.FAILED, turns.crashed_message())
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
        runner.finish(Turn.Status.FAILED, turns.crashed_message())
        raise
    return turn.status


def warm_up():
    """Do, once in an RQ worker's parent process, the first-time work of a turn that each work
    horse would otherwise repeat: every horse is a fresh fork of the parent and inherits only
    what the parent has already done. Imports the provider and the tools; runs the turn's
    queries once (finding nothing), which builds Django's lazy model metadata and the database
    driver's adapters; reads the cache once. Then closes the database connection, which a
    forked horse must not share. Never raises.
    """
    import uuid

    from django.db import connections

    from ..models import Message
    from ..providers import get_provider_class
    from ..tools import load_tools

    cfg = get_config()
    try:
        get_provider_class(cfg["PROVIDER"])
        load_tools(cfg["TOOLS"])
        missing = uuid.uuid4()
        Turn.objects.select_related("conversation", "conversation__user").filter(pk=missing).first()
        list(Message.objects.filter(turn_id=missing).order_by("id"))
        state.read(missing)
    except Exception:  # noqa: BLE001 - a worker that cannot warm up still works, only slower
        logger.warning("Could not warm up the worker", exc_info=True)
    finally:
        connections.close_all()


def turn_id_from_job_id(job_id):
    """The turn the job ``job_id`` runs (its first job, or a continuation's ``…-rN``), or None."""
    if job_id.startswith(JOB_PREFIX):
        return job_id[len(JOB_PREFIX):].split("-r")[0]
    return None


def job_problem(turn, connection=None):
    """Why ``turn``'s RQ job can no longer write a final state, or None if it still may."""
    if not turn.job_id:
        return None
    connection = connection or get_queue().connection
    try:
        job = Job.fetch(turn.job_id, connection=connection)
    except NoSuchJobError:
        if state.is_enqueueing(turn.id, turn.job_id):  # a continuation, its row written a moment ago
            return None
        return "job gone"
    status = job.get_status(refresh=False)
    if status in (JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED):
        return f"job {status}"
    if status == JobStatus.FINISHED:
        return "job finished without a final state"
    if status == JobStatus.STARTED:
        heartbeat = job.last_heartbeat
        timeout = job.timeout if job.timeout and job.timeout > 0 else get_config()["JOB_TIMEOUT"]
        if job.started_at and (timezone.now() - _aware(job.started_at)).total_seconds() > timeout + HEARTBEAT_GRACE:
            return "job overran its timeout"
        if heartbeat and (timezone.now() - _aware(heartbeat)).total_seconds() > HEARTBEAT_GRACE:
            return "job stopped heartbeating"
    return None


def _aware(value):
    return value if timezone.is_aware(value) else timezone.make_aware(value, datetime.timezone.utc)
