"""The jobs' public paths: every turn job queued in Redis names ``conversations.jobs.perform_turn``,
including jobs queued before the engine moved to ``conversations.engine``; a site schedules the
retention purge as ``conversations.jobs.purge_conversations`` (docs/privacy.md). Nothing in the
app imports this module; keep it as long as such jobs may still be waiting."""

from .engine.job import perform_turn
from .engine.retention import purge_job as purge_conversations

__all__ = ["perform_turn", "purge_conversations"]
