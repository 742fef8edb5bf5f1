"""The fast tier: the pure core (conversations.core and what parses or adds up without I/O).
These tests need neither Redis nor a database, so they run alone, in seconds:

    .venv/bin/python -m pytest tests/core -q
"""

import pytest


@pytest.fixture(autouse=True)
def _clean_redis():
    """No Redis here: this replaces the suite's flush (and its check that Redis is ours)."""
    yield
