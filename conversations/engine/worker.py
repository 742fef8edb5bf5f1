"""An RQ worker that never leaves a turn without a final state, and hands turns over when it stops.

When a work horse dies abruptly (SIGKILL, the OOM killer, ``os._exit``) RQ marks the job
failed in the parent process but calls no failure callback, so the job's own ``finally``
and ``except`` blocks never run. ``handle_work_horse_killed`` runs in the parent on exactly
that path: the turn is continued by a new job when its deadline allows (``recovery``), else
ended ``failed``. On a warm shutdown the running turn hands over at its next step. Set it with
``RQ = {"WORKER_CLASS": "conversations.worker.Worker"}``.

``ConcurrentWorker`` runs many turns at once in threads of one process instead
(``"conversations.worker.ConcurrentWorker"``): a turn waits on a socket nearly all its time.
A SIGKILLed process writes nothing; it holds a lease of a few seconds (``infra.lease``), renewed
by a thread of its own, and once the lease has expired the other processes' reapers (within
``REAP_INTERVAL``), the poll view and a Stop continue or end its turns (``recovery.reap``).
"""

import inspect
import logging
import os
import select
import signal
import threading
import time

import redis
import rq
import rq.utils
import rq.worker
from django.db import close_old_connections, connections
from rq.exceptions import StopRequested
from rq.timeouts import TimerDeathPenalty

from ..cache import wait_for_connections
from ..conf import get_config
from ..core.sentences import timeout_message
from ..infra import dbconn, lease, state, telemetry
from ..infra.queue import turn_id_from_job_id
from ..models import Turn
from ..tools import ABANDONED_THREAD_PREFIX
from .job import warm_up
from .recovery import end_for_dead_job, reap, resume_or_fail

logger = logging.getLogger("conversations.worker")


# The longest wait of one blocking dequeue (Redis's BLMOVE): a warm shutdown of an idle worker
# takes at most this long to be noticed, since it never breaks into a dequeue (``_dequeue``).
DEQUEUE_WAIT = 1


def _dequeue(worker, dequeue, timeout, max_idle_time):
    """RQ's ``dequeue`` (a worker's ``dequeue_job_and_maintain_ttl``), which a stop never breaks into:
    raised there once Redis had moved a job out of the queue, the stop took that job with it,
    neither queued nor running, until its visitor was told the assistant is not available. The
    blocking wait for a job is made of waits of ``DEQUEUE_WAIT`` seconds instead, the stop flag looked
    at between them (RQ returns None after ``max_idle_time``); None once stopped or idle too long.
    A job dequeued after the stop came goes back to the head of its queue, untouched, for another
    worker (a stop between this and ``execute_job`` has the job run and hand over there)."""
    if timeout is None:  # burst: RQ's dequeue does not block
        return _unless_stopped(worker, dequeue(None, max_idle_time))
    idle_since = time.monotonic()
    while not worker._stop_requested:
        result = _unless_stopped(worker, dequeue(DEQUEUE_WAIT, max_idle_time=DEQUEUE_WAIT))
        if result is not None:
            return result
        if max_idle_time is not None and time.monotonic() - idle_since >= max_idle_time:
            return None
    return None


def _unless_stopped(worker, result):
    """``result`` (RQ's ``(job, queue)`` or None), or None once ``worker`` is stopping: then the job
    is put back at the head of its queue as RQ's dequeue found it (out of its intermediate queue too,
    in one transaction), not started nor counted anywhere."""
    if result is None or not worker._stop_requested:
        return result
    job, queue = result
    with worker.connection.pipeline() as pipeline:
        pipeline.lrem(queue.intermediate_queue_key, 1, job.id)  # where RQ's BLMOVE put it (one queue)
        queue.push_job_id(job.id, pipeline=pipeline, at_front=True)
        pipeline.execute()
    logger.info("Worker %s is stopping: job %s goes back to the head of its queue", worker.name, job.id)
    return None


def _unsubscribe(worker):
    """RQ's ``unsubscribe`` (called by its teardown), in an order that never waits on the thread
    listening on the worker's channel. RQ sends UNSUBSCRIBE, then stops that thread; redis-py 8.2's
    ``stop()`` joins it, and a thread that had read the reply first went back to waiting for a
    message for RQ's 60 s, so a worker's exit (a warm shutdown, the end of a burst) took a minute
    now and then on a loaded host. Here the thread is told to stop first, without waiting; the
    reply then wakes it and it ends."""
    thread = worker.pubsub_thread
    if thread is None:
        return
    worker.log.info("Worker %s: unsubscribing from channel %s", worker.name, worker.pubsub_channel_name)
    if "timeout" in inspect.signature(thread.stop).parameters:
        thread.stop(timeout=0)  # redis-py 8.2 and newer: clear the flag, do not join yet
    else:
        thread.stop()  # older redis-py: stop() only clears the flag
    worker.pubsub.unsubscribe()
    thread.join(timeout=1)
    worker.pubsub.close()


class Worker(rq.Worker):
    """RQ's forking worker, warmed up before its first job, plus a final write for a turn whose
    work horse died abruptly."""

    def work(self, *args, **kwargs):
        """RQ's loop, after ``jobs.warm_up()``: every work horse forks from this process. The
        metrics its horses handed it are exported as it exits."""
        warm_up(forking=True)
        try:
            return super().work(*args, **kwargs)
        finally:
            telemetry.from_horses(final=True)

    def dequeue_job_and_maintain_ttl(self, timeout, max_idle_time=None):
        def dequeue(timeout, max_idle_time=None):  # between jobs, and every DEQUEUE_WAIT when idle
            telemetry.from_horses()
            return super(Worker, self).dequeue_job_and_maintain_ttl(timeout, max_idle_time)

        return _dequeue(self, dequeue, timeout, max_idle_time)

    def unsubscribe(self):
        _unsubscribe(self)

    def execute_job(self, job, queue):
        """Called in the parent for each job, before it forks the work horse; returns what RQ's does."""
        # The parent may have opened database connections (see below); a forked child must
        # never share one with it.
        connections.close_all()
        if self._stop_requested:  # dequeued as the SIGTERM came (``_dequeue``): it hands over too
            _ask_to_hand_over(job.id)
        if turn_id_from_job_id(job.id) is None:
            return super().execute_job(job, queue)
        with telemetry.horse_in_flight(self.name):  # from before the fork to the horse's end, however it ends
            return super().execute_job(job, queue)

    def wait_for_horse(self):
        """RQ's wait for the work horse to end (within RQ's monitoring alarm). Where this process
        exports its horses' metrics, it exports them meanwhile too when they are due, so that the
        turn in flight is reported while it runs, not only after. SIGALRM is held back during an
        export (the SDK would swallow the exception RQ's alarm raises in it): it lands after."""
        while (due := telemetry.next_export_in()) is not None and not _ends_within(self.horse_pid, due):
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            try:
                telemetry.from_horses(horse_running=True)
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})
        return super().wait_for_horse()

    def _shutdown(self):
        """RQ's warm shutdown, which never breaks into a dequeue (``_dequeue``): the loop stops
        after the job running now, or within ``DEQUEUE_WAIT`` of an idle one."""
        self._stop_requested = True
        self.set_shutdown_requested_date()

    def handle_warm_shutdown_request(self):
        """Called by RQ in the parent on a warm shutdown (SIGTERM): ask the turn being run to hand
        over at its next step (``recovery``), so the worker exits within seconds, not JOB_TIMEOUT."""
        super().handle_warm_shutdown_request()

        job_id = self.get_current_job_id()  # the id is all it needs: no fetch of the whole job
        if job_id is not None:
            _ask_to_hand_over(job_id)

    def handle_work_horse_killed(self, job, retpid, ret_val, rusage):
        """Called by RQ in the parent when the horse ended by a signal or a non-zero ``os._exit``.

        Ends the job's turn ``failed`` (database row, then the cached ``done: true`` state)
        unless it already has a final state. Returns None; never raises.
        """
        super().handle_work_horse_killed(job, retpid, ret_val, rusage)

        turn_id = turn_id_from_job_id(job.id)
        if turn_id is None:
            return
        close_old_connections()
        try:
            turn = Turn.objects.select_related("conversation").get(pk=turn_id)
            if resume_or_fail(turn, f"its work horse died (exit status {ret_val})", dead_job_id=job.id) is not None:
                logger.error("Turn %s: work horse died (ret_val=%s); continued or ended", turn_id, ret_val)
        except Exception:  # noqa: BLE001 - the worker itself must keep running
            logger.exception("Could not finalise turn %s after its work horse died", turn_id)
        finally:
            connections.close_all()


def _ends_within(pid, seconds):
    """Whether the child process ``pid`` ends within ``seconds`` (left for RQ's wait to reap); True
    where that cannot be waited for (no ``pidfd_open``: not Linux 5.3+), so RQ's wait runs as it is."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return True
    try:
        return bool(select.select([fd], [], [], seconds)[0])
    finally:
        os.close(fd)


# Seconds a turn may run past its job timeout before its thread is given up: RQ's timer raises
# JobTimeoutException in the thread at the timeout, and a thread running Python code writes its
# final state within milliseconds of it; one that has not after this long is stuck in C code.
STUCK_GRACE = 5
# How often the watcher thread looks for overdue turns (the jobs' heartbeats keep RQ's own interval).
WATCH_INTERVAL = 1.0
# The heartbeat thread refreshes the worker's own key every WORKER_BEAT seconds, and the key lives
# WORKER_KEY_TTL: a SIGKILLed process's key is gone within that, and with it every turn it held
# counts as dead (``infra.queue.job_problem``) instead of after RQ's 90 s of missed job heartbeats.
WORKER_BEAT, WORKER_KEY_TTL = 5, 20
# How often each process looks for dead ones (an expired lease, ``infra.lease``) to reap: a SIGKILLed
# process's turns are continued lease.TTL to lease.TTL + REAP_INTERVAL after its last renewal.
REAP_INTERVAL = 0.5
# How many turns of one process may be starting at once (from RQ's start of the job to their
# first wait on a provider or a tool). A start is CPU work (RQ's bookkeeping, the rows, the first
# state: tens of milliseconds), and under one GIL a thread reading a stream waits its turn behind
# every thread that is runnable: 200 turns starting together held back the words of those already
# streaming by seconds. The others wait, already in RQ's started registry, their clocks not yet
# running; the burst takes as long, the streams flow meanwhile.
STARTING_AT_ONCE = 4


class _Slot:
    """One job running in a thread of a ``ConcurrentWorker``."""

    def __init__(self, job, queue):
        self.job, self.queue = job, queue
        self.thread = None
        self.execution = None
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.settled = False  # RQ's success/failure bookkeeping has begun: it is no longer overdue
        self.abandoned = False  # given up past its job timeout: the thread's own bookkeeping is skipped
        self.starting = None  # the worker's semaphore of turns starting, while this one holds it

    def started_waiting(self):
        """Called when its turn first waits, at its end, or when it is given up: it is no longer
        starting (a turn stuck in its start must not keep others from starting)."""
        with self.lock:
            starting, self.starting = self.starting, None
        if starting is not None:
            starting.release()


class ConcurrentWorker(rq.worker.BaseWorker):
    """An RQ worker that runs up to ``CONVERSATIONS["WORKER_THREADS"]`` turns at once, each in a thread
    of this one process, for turns that spend nearly all their time waiting on a provider's socket.

    Everything RQ does per job is RQ's own code run in the job's thread (``perform_job``): the
    started-job registry, results, failures. What a forking worker's parent does per horse is done
    here for every running job: a heartbeat thread refreshes the worker's and each job's heartbeat
    (Redis only, so that nothing slow can hold it up), and a watcher thread gives up a turn still
    running ``STUCK_GRACE`` seconds past its job timeout (RQ's ``TimerDeathPenalty`` has then
    failed to stop it: it is stuck in C code) after writing its final state; when
    ``WORKER_MAX_STUCK`` given-up threads are still alive, the worker shuts down warmly so that its
    supervisor starts a fresh process. A warm shutdown (SIGTERM) asks every running turn to hand
    over at its next step. A job is dequeued only when a thread is free.
    """

    death_penalty_class = TimerDeathPenalty  # SIGALRM reaches only the main thread
    job_thread_class = threading.Thread  # each job's thread

    def __init__(self, *args, **kwargs):
        self._local = threading.local()
        super().__init__(*args, **kwargs)
        wait_for_connections(self.connection)  # its threads share the client with its queues
        cfg = get_config()
        self.threads, self.max_stuck = cfg["WORKER_THREADS"], cfg["WORKER_MAX_STUCK"]
        self._slots = {}  # job id -> _Slot, for every job not yet finished nor given up
        self._changed = threading.Condition()
        self._interruptible = False  # the main thread waits for a free thread: a stop may break in
        self._done = threading.Event()  # set when the work loop ends: the heartbeat and watcher threads stop
        self._leaving = threading.Event()  # set once the lease is given up: the lease thread stops renewing it
        self._lease_lock = threading.Lock()  # a renewal never lands after the lease was given up
        self._starting = threading.BoundedSemaphore(STARTING_AT_ONCE)
        self._idle_connections = threading.BoundedSemaphore(cfg["WORKER_IDLE_CONNECTIONS"])
        self.abandoned_jobs = 0

    # RQ keeps the job being run in ``self.execution``; here each thread has its own.
    @property
    def execution(self):
        return getattr(self._local, "execution", None)

    @execution.setter
    def execution(self, value):
        self._local.execution = value

    def running(self):
        """The jobs this process is running now (not those given up)."""
        with self._changed:
            return [slot.job for slot in self._slots.values()]

    def work(self, *args, **kwargs):
        """RQ's loop, after ``warm_up()``, with the heartbeat and watcher threads running beside it,
        the stop flags of all its turns read together (``state.stop_board``) and their growing answers
        written together (``state.publish_board``)."""
        warm_up()
        state.stop_board.start()
        state.publish_board.start()
        lease.lost.clear()
        self._leaving.clear()
        # A client of its own: the renewal never waits for one of the pool its turns share.
        pool = self.connection.connection_pool
        self._lease_connection = redis.Redis(connection_pool=redis.ConnectionPool(
            connection_class=pool.connection_class, **pool.connection_kwargs))
        lease.renew(self._lease_connection, self.name)  # held before its first job
        helpers = [threading.Thread(target=self._keep_alive, name="conversations-heartbeat", daemon=True),
                   threading.Thread(target=self._watch, name="conversations-watcher", daemon=True),
                   threading.Thread(target=self._hold_lease, name="conversations-lease", daemon=True),
                   threading.Thread(target=self._reap, name="conversations-reaper", daemon=True)]
        self._done.clear()
        for helper in helpers:
            helper.start()
        try:
            return super().work(*args, **kwargs)
        finally:
            self._leaving.set()
            self._done.set()
            for helper in helpers:
                helper.join(WATCH_INTERVAL * 2)

    def dequeue_job_and_maintain_ttl(self, timeout, max_idle_time=None):
        """RQ's dequeue (``_dequeue``: a stop never breaks into it), once a thread is free. In burst
        mode an empty queue ends the loop only once no turn runs any more: a running turn may still
        enqueue its continuation."""
        while True:
            with self._changed:
                self._interruptible = True
                try:
                    while len(self._slots) >= self.threads and not self._stop_requested:
                        self._changed.wait(WATCH_INTERVAL)
                finally:
                    self._interruptible = False
            if self._stop_requested:
                return None
            result = _dequeue(self, super().dequeue_job_and_maintain_ttl, timeout, max_idle_time)
            if result is not None or timeout is not None:
                return result
            with self._changed:
                if not self._slots:
                    return None
                self._changed.wait(WATCH_INTERVAL)

    def execute_job(self, job, queue):
        """Start ``job`` in a thread of its own and return at once."""
        slot = _Slot(job, queue)
        slot.thread = self.job_thread_class(target=self._run, args=(slot,), name=f"job-{job.id}", daemon=True)
        with self._changed:
            self._slots[job.id] = slot  # before it starts: a job that ends at once still finds its slot
        if self._stop_requested:  # a SIGTERM after its dequeue asked only the turns running then
            _ask_to_hand_over(job.id)
        try:
            slot.thread.start()
        except BaseException:  # no thread (the process's limit): RQ's loop quits; teardown must not wait for it
            self._release(slot)
            raise

    def _run(self, slot):
        self._local.slot = slot
        try:
            # So that WORKER_THREADS idle connections are never held; and the turn's first wait ends its start.
            dbconn.release_between_steps(on_wait=slot.started_waiting, budget=self._idle_connections)
            try:
                slot.execution = self.prepare_execution(slot.job)  # in the started registry, heartbeats from now
                self._starting.acquire()
                slot.starting = self._starting
                with slot.lock:
                    if slot.abandoned:  # given up while it waited: its failure is recorded, its turn ended
                        return
                    slot.started = time.monotonic()  # the job's timeout runs from here (perform_job's timer)
                self.perform_job(slot.job, slot.queue)
            except Exception:  # noqa: BLE001 - RQ's own bookkeeping failed (Redis down): the thread ends, the worker runs on
                logger.exception("Job %s could not be run", slot.job.id)
            finally:
                slot.started_waiting()
                dbconn.close_all()  # this thread's own: the next job runs in another
        finally:
            self._release(slot)  # whatever failed above: a slot never outlives its thread

    def _release(self, slot):
        """Free ``slot``'s thread; the worker is idle again (in ``rq info``) once none runs."""
        with self._changed:
            if self._slots.get(slot.job.id) is slot:
                del self._slots[slot.job.id]
            idle = not self._slots
            self._changed.notify_all()
        if idle:
            try:
                self.set_state(rq.worker.WorkerStatus.IDLE)
            except Exception:  # noqa: BLE001 - only what rq info shows; the next dequeue sets it again
                logger.warning("Worker %s: could not record that it is idle", self.name, exc_info=True)

    def _settle(self):
        """Called in a job's thread before RQ records how its job ended: False if the job was
        given up meanwhile (its failure is already recorded)."""
        slot = getattr(self._local, "slot", None)
        if slot is None:
            return True
        with slot.lock:
            slot.settled = not slot.abandoned
            return slot.settled

    def handle_job_success(self, job, queue, started_job_registry):
        if self._settle():
            super().handle_job_success(job, queue, started_job_registry)

    def handle_job_failure(self, job, queue, started_job_registry=None, exc_string=""):
        if self._settle():
            super().handle_job_failure(job, queue, started_job_registry, exc_string)

    def handle_job_retry(self, job, queue, retry, started_job_registry, execution):
        if self._settle():
            super().handle_job_retry(job, queue, retry, started_job_registry, execution)

    def set_state(self, state, pipeline=None):
        """RQ marks the worker idle whenever it listens for a job; it is busy while any turn runs."""
        if state == rq.worker.WorkerStatus.IDLE and self._slots:
            state = rq.worker.WorkerStatus.BUSY
        super().set_state(state, pipeline=pipeline)

    def handle_warm_shutdown_request(self):
        """Called by RQ on a warm shutdown (SIGTERM): ask every running turn to hand over at its next step."""
        super().handle_warm_shutdown_request()
        for job in self.running():
            _ask_to_hand_over(job.id)

    def _shutdown(self):
        """RQ's warm shutdown: stop taking jobs. The main thread may be blocked waiting for a free
        thread; then it is broken out of that wait (nothing is lost there; never out of a dequeue,
        see ``dequeue_job_and_maintain_ttl``)."""
        self._stop_requested = True
        self.set_shutdown_requested_date()
        with self._changed:
            self._changed.notify_all()
        if self._interruptible:
            raise StopRequested()

    def teardown(self):
        """Wait for the turns still running (each hands over at its next step), then give the lease
        up and leave RQ's registry."""
        with self._changed:
            while self._slots:
                self._changed.wait(WATCH_INTERVAL)
        with self._lease_lock:
            self._leaving.set()
            if not lease.lost.is_set():
                try:
                    lease.release(self.connection, self.name)
                except Exception:  # noqa: BLE001 - it then expires, and a reaper finds nothing to do
                    logger.warning("Worker %s: could not give its lease up", self.name, exc_info=True)
        super().teardown()

    def unsubscribe(self):
        _unsubscribe(self)

    def _hold_lease(self):
        """The lease thread: renews this process's lease every ``lease.BEAT`` and does nothing else.
        Once the lease was lost (the process was frozen past ``lease.TTL`` and taken for dead), every
        turn it runs stops without writing (they go on in other jobs) and the process shuts down, to
        be restarted by its supervisor under a new name."""
        while True:
            try:
                with self._lease_lock:
                    if self._leaving.is_set():
                        return
                    renewed = lease.renew(self._lease_connection, self.name)  # False: lease.lost is set
                if not renewed:
                    logger.error("Worker %s was taken for dead (its lease expired): its turns go on elsewhere; "
                                 "it stops them and shuts down", self.name)
                    os.kill(os.getpid(), signal.SIGTERM)  # RQ's warm shutdown, run by the main thread
                    return
            except Exception:  # noqa: BLE001 - it must outlive a Redis hiccup (past TTL, the process is taken for dead)
                logger.warning("Worker %s: could not renew its lease", self.name, exc_info=True)
            if self._leaving.wait(lease.BEAT):
                return

    def _reap(self):
        """The reaper thread: every ``REAP_INTERVAL``, the turns of each other process whose lease
        expired are continued or ended (by one reaper: the others skip it)."""
        connection = self.connection
        while not self._done.wait(REAP_INTERVAL):
            try:
                others = [name for name in lease.holders(connection) if name != self.name]
                for name in lease.expired(connection, others) if others else ():
                    if lease.declare_dead(connection, name) and lease.claim_reaping(connection, name):
                        try:
                            reap(connection, name)
                        finally:
                            connections.close_all()  # this thread's own
            except Exception:  # noqa: BLE001 - the reaper must outlive a Redis or database hiccup
                logger.exception("Worker %s: could not look for dead workers", self.name)

    def heartbeat(self, timeout=None, pipeline=None):
        """RQ's worker heartbeat, with a key that outlives the process by WORKER_KEY_TTL at most."""
        super().heartbeat(WORKER_KEY_TTL, pipeline=pipeline)

    def _keep_alive(self):
        """The heartbeat thread: the worker's key and every running job's heartbeat, on Redis only.
        Nothing here may wait on the database: a give-up's final write waiting on a row lock must
        not let the key expire, or every turn of this process would count as dead."""
        beat = alive = time.monotonic()
        while not self._done.wait(min(WATCH_INTERVAL, WORKER_BEAT)):
            try:
                if time.monotonic() - alive >= WORKER_BEAT:
                    alive = time.monotonic()
                    self.heartbeat()
                if time.monotonic() - beat >= self.job_monitoring_interval:
                    beat = time.monotonic()
                    self._beat()
            except Exception:  # noqa: BLE001 - it must outlive a Redis hiccup
                logger.exception("Worker %s: could not refresh its heartbeats", self.name)

    def _watch(self):
        """The watcher thread: gives up the overdue turns (database work, with no time limit), and
        frees the slot of a thread that ended without freeing it."""
        while not self._done.wait(WATCH_INTERVAL):
            try:
                for slot in self._overdue():
                    self._give_up(slot)
                with self._changed:
                    ended = [slot for slot in self._slots.values()
                             if slot.thread.ident is not None and not slot.thread.is_alive()]
                for slot in ended:  # its thread died without freeing it (not past _run's finally)
                    logger.error("Job %s: its thread ended without freeing its slot", slot.job.id)
                    self._release(slot)
            except Exception:  # noqa: BLE001 - the watcher must outlive a Redis or database hiccup
                logger.exception("Worker %s: could not look after its running jobs", self.name)

    def _beat(self):
        """What a forking worker's parent does for its horse, for every running job: refresh the
        worker's, the execution's and the job's heartbeats."""
        with self._changed:
            slots = [slot for slot in self._slots.values() if slot.execution is not None]
        with self.connection.pipeline() as pipeline:
            for slot in slots:
                job = slot.job
                ttl = self.job_monitoring_interval + 60
                if job.timeout and job.timeout > 0:
                    ttl = int(min(job.timeout - (time.monotonic() - slot.started), self.job_monitoring_interval)) + 60
                slot.execution.heartbeat(job.started_job_registry, ttl, pipeline=pipeline)
                job.heartbeat(rq.utils.now(), ttl, pipeline=pipeline, xx=True)
            pipeline.execute()

    def _overdue(self):
        with self._changed:
            slots = list(self._slots.values())
        now = time.monotonic()
        return [slot for slot in slots if self._past_due(slot, now)]

    def _past_due(self, slot, now):
        return now - slot.started > (slot.job.timeout or self.queue_class.DEFAULT_TIMEOUT) + STUCK_GRACE

    def _give_up(self, slot):
        """End overdue ``slot``'s turn (failed with the timeout sentence, or cancelled if its visitor
        stopped it), record its job failed as RQ would, free its thread, and ask for a restart when
        too many given-up threads live on."""
        with slot.lock:
            if slot.settled or slot.abandoned or not self._past_due(slot, time.monotonic()):
                return  # ended, or started a moment ago (its clock restarted)
            slot.abandoned = True
        job = slot.job
        slot.thread.name = f"{ABANDONED_THREAD_PREFIX}{slot.thread.name}"  # counted by stuck_threads()
        self.abandoned_jobs += 1
        logger.error("Job %s still runs %ss past its job timeout (stuck outside Python code): given up",
                     job.id, STUCK_GRACE)
        slot.started_waiting()
        _end_overdue_turn(job.id)
        self.execution = slot.execution
        try:
            job.ended_at = rq.utils.now()
            self.handle_job_failure(job, slot.queue, exc_string=f"JobTimeoutException: given up {STUCK_GRACE}s after "
                                                                f"the job timeout ({job.timeout}s); its thread lives on")
        finally:
            self.execution = None
            self._release(slot)
        stuck = stuck_threads()
        if stuck >= self.max_stuck and not self._stop_requested:
            logger.error("Worker %s: %d given-up threads still alive (WORKER_MAX_STUCK %d): shutting down to be "
                         "restarted", self.name, stuck, self.max_stuck)
            os.kill(os.getpid(), signal.SIGTERM)  # RQ's warm shutdown, run by the main thread


def stuck_threads():
    """How many threads of this process were given up (a turn past its job timeout, a tool past its
    limit) and are still alive."""
    return sum(1 for thread in threading.enumerate()
               if thread.name.startswith(ABANDONED_THREAD_PREFIX) and thread.is_alive())


def _ask_to_hand_over(job_id):
    turn_id = turn_id_from_job_id(job_id)
    # A process taken for dead no longer speaks for its turns: another job runs them now.
    if turn_id is not None and not lease.lost.is_set():
        try:
            state.request_handoff(turn_id)
        except Exception:  # noqa: BLE001 - then the turn simply finishes here, as before
            logger.warning("Could not ask turn %s to hand over", turn_id, exc_info=True)


def _end_overdue_turn(job_id):
    """The final write for a turn whose job ran past its timeout without writing one (cancelled
    if the visitor stopped it, else failed with the timeout sentence). Never raises."""
    turn_id = turn_id_from_job_id(job_id)
    if turn_id is None:
        return
    close_old_connections()
    try:
        turn = Turn.objects.select_related("conversation").get(pk=turn_id)
        end_for_dead_job(turn, timeout_message(), dead_job_id=job_id)
    except Exception:  # noqa: BLE001 - the worker itself must keep running
        logger.exception("Could not finalise turn %s after its job was given up", turn_id)
    finally:
        connections.close_all()
