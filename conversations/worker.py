"""The worker's public path: sites set ``RQ = {"WORKER_CLASS": "conversations.worker.Worker"}``.
The class lives in ``conversations.engine.worker``; nothing in the app imports this module."""

from .engine.worker import Worker

__all__ = ["Worker"]
