"""The conversations admin: Django's autodiscover imports ``conversations.admin``, and these
imports register every model admin the app has."""

from . import assistants, conversations, evals, handoff, knowledge, turns  # noqa: F401
