"""The job's public path: every turn job queued in Redis names ``conversations.jobs.perform_turn``,
including jobs queued before the engine moved to ``conversations.engine``. Nothing in the app
imports this module; keep it as long as such jobs may still be waiting."""

from .engine.job import perform_turn

__all__ = ["perform_turn"]
