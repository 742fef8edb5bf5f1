"""The public path of erasure: ``from conversations.privacy import erase``. The service itself is
``conversations.engine.privacy`` (docs/privacy.md); nothing in the app imports this module."""

from .engine.privacy import Ambiguous, erase, plan, subject_digest

__all__ = ["Ambiguous", "erase", "plan", "subject_digest"]
