"""The workers' public paths: sites set ``RQ = {"WORKER_CLASS": "conversations.worker.ConcurrentWorker"}``
(many turns per process, in threads) or ``"conversations.worker.Worker"`` (one forked work horse per turn).
The class lives in ``conversations.engine.worker``; nothing in the app imports this module."""

from .engine.worker import ConcurrentWorker, Worker

__all__ = ["ConcurrentWorker", "Worker"]
