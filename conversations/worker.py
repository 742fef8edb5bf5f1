"""An RQ worker that never leaves a turn without a final state.

When a work horse dies abruptly (SIGKILL, the OOM killer, ``os._exit``) RQ marks the job
failed in the parent process but calls no failure callback, so the job's own ``finally``
and ``except`` blocks never run. ``handle_work_horse_killed`` runs in the parent on exactly
that path; it writes ``done: true, status: failed``. Set it with
``RQ = {"WORKER_CLASS": "conversations.worker.Worker"}``.
"""

import logging

import rq
from django.db import close_old_connections, connections

logger = logging.getLogger("conversations.worker")


class Worker(rq.Worker):
    """RQ's forking worker, warmed up before its first job, plus a final write for a turn whose
    work horse died abruptly."""

    def work(self, *args, **kwargs):
        """RQ's loop, after ``jobs.warm_up()``: every work horse forks from this process."""
        from .jobs import warm_up

        warm_up()
        return super().work(*args, **kwargs)

    def execute_job(self, job, queue):
        """Called in the parent for each job, before it forks the work horse; returns what RQ's does."""
        # The parent may have opened database connections (see below); a forked child must
        # never share one with it.
        connections.close_all()
        return super().execute_job(job, queue)

    def handle_work_horse_killed(self, job, retpid, ret_val, rusage):
        """Called by RQ in the parent when the horse ended by a signal or a non-zero ``os._exit``.

        Ends the job's turn ``failed`` (database row, then the cached ``done: true`` state)
        unless it already has a final state. Returns None; never raises.
        """
        super().handle_work_horse_killed(job, retpid, ret_val, rusage)
        from .jobs import turn_id_from_job
        from .models import Turn
        from .turns import crashed_message, finalize

        turn_id = turn_id_from_job(job)
        if turn_id is None:
            return
        close_old_connections()
        try:
            turn = Turn.objects.select_related("conversation").get(pk=turn_id)
            if finalize(turn, Turn.Status.FAILED, crashed_message()) is not None:
                logger.error("Turn %s: work horse died (ret_val=%s); final state written", turn_id, ret_val)
        except Exception:  # noqa: BLE001 - the worker itself must keep running
            logger.exception("Could not finalise turn %s after its work horse died", turn_id)
        finally:
            connections.close_all()
