"""RQ's side of a turn, below the engine: the turns' queue, job ids, enqueueing by the job's
dotted path, and what RQ knows of a job's health. The job itself is ``engine.job``; the engine
and the providers' chain use the queue without importing the job.
"""

import datetime
import logging

import django_rq
from django.db import connection, transaction
from django.utils import timezone
from redis.exceptions import RedisError
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.registry import StartedJobRegistry
from rq.worker import Worker
from rq.worker_registration import WORKERS_BY_QUEUE_KEY

from ..cache import wait_for_connections
from ..conf import get_config
from . import lease, state, telemetry

logger = logging.getLogger("conversations.jobs")


JOB_PREFIX = "conversations-turn-"


# RQ's parent process refreshes a running job's heartbeat every 30 s (job_monitoring_interval);
# three missed beats mean no process is looking after the job any more.
HEARTBEAT_GRACE = 90


def site_key(kind, name):
    """``conversations:<kind>:<queue>:<name>``: a key of this site's on the queue's Redis, naming the
    turns' queue (``QUEUE``) as RQ's own keys and the leases do, so that two sites sharing one Redis
    database never read each other's breakers or address counts."""
    return f"conversations:{kind}:{get_config()['QUEUE']}:{name}"


def job_id_for(turn):
    return f"{JOB_PREFIX}{turn.id}"


_connections = {}


def get_queue():
    """The turns' queue, on a Redis client made once per process (and queue configuration).

    ``django_rq.get_queue()`` builds a new client, with a new connection pool, on every call,
    so every POST would open (and handshake) a fresh connection to Redis. The client's pool
    starts afresh in a forked child, as redis-py pools do, and makes a thread wait for a free
    connection rather than fail (``cache.wait_for_connections``): a ``ConcurrentWorker``'s threads share it.
    """
    from django_rq.settings import QUEUES

    name = get_config()["QUEUE"]
    key = (name, repr(sorted(QUEUES[name].items())))
    connection = _connections.get(key)
    if connection is None:
        connection = _connections[key] = wait_for_connections(django_rq.get_connection(name))
    return django_rq.get_queue(name, connection=connection)


def warn_if_unattended(turn, listening=None, queue=None):
    """Log a warning when no worker listens on the turns' queue just after ``turn`` was put on it.

    Otherwise the visitor watches "thinking" until ``QUEUE_WAIT`` ends the turn, and nothing says
    why until then. ``listening``: how many workers RQ's per-queue worker set held, as the
    enqueue's own pipeline counted them (``enqueue``); None: looked up now (one round trip).
    ``queue``: the turns' queue, where the caller has it already (else ``get_queue()``). A
    worker that died without unregistering still counts until RQ cleans it up; a Redis that
    cannot be read says nothing here (the enqueue itself would have failed first)."""
    if queue is None:  # not ``queue or``: an RQ queue's truth is its length, a round trip (and False when empty)
        queue = get_queue()
    if listening is None:
        try:
            listening = Worker.count(queue=queue)
        except RedisError:
            return
    if not listening:
        logger.warning("Turn %s was queued on %r, but no worker listens on that queue: it waits until one does, "
                       "and ends after QUEUE_WAIT (%ss). Start one: manage.py rqworker %s", turn.id, queue.name,
                       get_config()["QUEUE_WAIT"], queue.name,
                       extra={"turn_id": str(turn.id), "queue": queue.name})


def enqueue_continuation(turn, job_id, *, job_timeout, trace_context=None):
    """Enqueue job ``job_id`` continuing running ``turn`` (``recovery.continue_turn``), at the front
    of the queue: its deadline is already running. ``trace_context``: its parent span's (the resume's)."""
    return enqueue(turn, job_id, job_timeout=job_timeout, description=f"conversation turn {turn.id}, continued",
                   at_front=True, trace_context=trace_context)


# Jobs are queued by this path, not by the function: a job stores the path it names, and jobs
# queued before the engine moved into conversations.engine name this one (the jobs.py face).
TURN_JOB = "conversations.jobs.perform_turn"


def enqueue(turn, job_id, *, job_timeout, description, at_front=False, trace_context=None, watch=False):
    """Put ``turn``'s job on the queue. Its meta carries the trace context (``telemetry.META_KEY``):
    ``trace_context``, else the current span's, so that the job's span is its child. ``watch``:
    then warn when no worker listens on the queue (``warn_if_unattended``), counted in the same
    round trip as the enqueue where it is one (an ``SCARD`` of RQ's per-queue worker set: a round
    trip of its own on every POST before).

    In one Redis round trip where django-rq enqueues at the commit or at once (its ``on_db_commit``
    and ``auto`` commit modes) on a queue that runs its jobs in workers: RQ's own enqueue made two
    (the queue's name added to the set of queues, then the job), between the commit and the moment
    a worker can take the job. The same commands go in one pipeline, sent when django-rq would
    have sent them (an ``on_commit`` callback runs after the ones registered before it)."""
    cfg = get_config()
    carried = trace_context or telemetry.carrier()
    queue = get_queue()
    fields = dict(job_id=job_id, job_timeout=job_timeout, result_ttl=cfg["STATE_TTL"],
                  failure_ttl=max(cfg["STATE_TTL"], 86400), description=description, at_front=at_front,
                  meta={telemetry.META_KEY: carried} if carried else None)
    mode = getattr(queue, "_commit_mode", None)  # django-rq's DjangoRQ; another queue class enqueues as it does
    if not queue.is_async or mode not in ("on_db_commit", "auto"):
        queue.enqueue(TURN_JOB, str(turn.id), **fields)
        if watch:
            warn_if_unattended(turn, queue=queue)
        return job_id
    pipeline = queue.connection.pipeline()
    queue.enqueue(TURN_JOB, str(turn.id), pipeline=pipeline, **fields)

    def send():  # after the job's commands, which django-rq adds at the commit too
        if watch:
            pipeline.scard(WORKERS_BY_QUEUE_KEY % queue.name)
        replies = pipeline.execute()
        if watch:
            warn_if_unattended(turn, replies[-1], queue)

    if mode == "on_db_commit" and connection.in_atomic_block:  # as django-rq decides it
        transaction.on_commit(send)
    else:
        send()
    return job_id


def job_meta(job_id, connection=None):
    """The meta of job ``job_id`` (its trace context), or {} when it is gone or Redis cannot say."""
    try:
        return Job.fetch(job_id, connection=connection or get_queue().connection).meta or {}
    except (NoSuchJobError, RedisError):
        return {}


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
        if job.worker_name and worker_gone(connection, job.worker_name):
            return "its worker is gone"
    return None


def worker_gone(connection, name):
    """Whether RQ worker ``name`` is dead: its lease expired (a ``ConcurrentWorker``, within
    ``lease.TTL`` of its death; it is declared dead by this look), or, for a worker that holds no
    lease, its worker key is gone."""
    dead = lease.declare_dead(connection, name)
    if dead is not None:
        return dead
    return not connection.exists(f"{Worker.redis_worker_namespace_prefix}{name}")


def jobs_of(worker_name, connection=None):
    """The ids of the turns' jobs that RQ's started registry says worker ``worker_name`` runs."""
    queue = get_queue()
    connection = connection or queue.connection
    ids = StartedJobRegistry(queue.name, connection=connection).get_job_ids(cleanup=False)
    return [job.id for job in Job.fetch_many(ids, connection=connection)
            if job is not None and job.worker_name == worker_name]


def _aware(value):
    return value if timezone.is_aware(value) else timezone.make_aware(value, datetime.timezone.utc)


def continuation_job_id(turn, number):
    return f"{job_id_for(turn)}-r{number}"
