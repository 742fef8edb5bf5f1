"""An RQ worker that never leaves a turn without a final state, and hands turns over when it stops.

When a work horse dies abruptly (SIGKILL, the OOM killer, ``os._exit``) RQ marks the job
failed in the parent process but calls no failure callback, so the job's own ``finally``
and ``except`` blocks never run. ``handle_work_horse_killed`` runs in the parent on exactly
that path: the turn is continued by a new job when its deadline allows (``recovery``), else
ended ``failed``. On a warm shutdown the running turn hands over at its next step. Set it with
``RQ = {"WORKER_CLASS": "conversations.worker.Worker"}``.
"""

import logging

import rq
from django.db import close_old_connections, connections
from .job import warm_up
from ..infra import state
from ..infra.queue import turn_id_from_job_id
from ..models import Turn
from .recovery import resume_or_fail

logger = logging.getLogger("conversations.worker")


class Worker(rq.Worker):
    """RQ's forking worker, warmed up before its first job, plus a final write for a turn whose
    work horse died abruptly."""

    def work(self, *args, **kwargs):
        """RQ's loop, after ``jobs.warm_up()``: every work horse forks from this process."""
        warm_up()
        return super().work(*args, **kwargs)

    def execute_job(self, job, queue):
        """Called in the parent for each job, before it forks the work horse; returns what RQ's does."""
        # The parent may have opened database connections (see below); a forked child must
        # never share one with it.
        connections.close_all()
        return super().execute_job(job, queue)

    def handle_warm_shutdown_request(self):
        """Called by RQ in the parent on a warm shutdown (SIGTERM): ask the turn being run to hand
        over at its next step (``recovery``), so the worker exits within seconds, not JOB_TIMEOUT."""
        super().handle_warm_shutdown_request()

        job_id = self.get_current_job_id()  # the id is all it needs: no fetch of the whole job
        turn_id = turn_id_from_job_id(job_id) if job_id is not None else None
        if turn_id is not None:
            try:
                state.request_handoff(turn_id)
            except Exception:  # noqa: BLE001 - then the turn simply finishes here, as before
                logger.warning("Could not ask turn %s to hand over", turn_id, exc_info=True)

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
