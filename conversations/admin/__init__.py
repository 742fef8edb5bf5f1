"""The conversations admin: Django's autodiscover imports ``conversations.admin``, and these
imports register every model admin the app has."""

from . import approvals, assistants, conversations, evals, handoff, knowledge, privacy, turns  # noqa: F401
