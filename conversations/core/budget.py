"""The clocks of one turn.

A turn's job runs under RQ's ``job_timeout``; the job keeps its own deadline
``DEADLINE_MARGIN`` seconds inside it, so that whatever happens it still has time for the
final write. Everything that waits (a provider call, a retry's back-off, a tool) asks the
budget how long it may take.
"""

import time


class BudgetExhausted(Exception):
    """Raised instead of starting work that could not finish before the deadline."""


class Budget:
    """A deadline on a monotonic clock.

    ``clock`` is a class attribute (``time.monotonic``) so tests can pass a fake one.
    """

    clock = staticmethod(time.monotonic)

    def __init__(self, seconds, *, clock=None):
        if clock is not None:
            self.clock = clock
        self.started = self.clock()
        self.seconds = float(seconds)
        self.deadline = self.started + self.seconds

    def elapsed(self):
        """Seconds since the budget started."""
        return self.clock() - self.started

    def remaining(self):
        """Seconds left before the deadline, never negative."""
        return max(0.0, self.deadline - self.clock())

    def call_timeout(self, cap):
        """The total time a call started now may take: ``min(cap, remaining)``."""
        return min(float(cap), self.remaining())

    def can_start(self, minimum):
        """Whether work that needs at least ``minimum`` seconds may start now."""
        return self.remaining() >= minimum

    def __repr__(self):
        return f"<Budget {self.remaining():.1f}s of {self.seconds:.1f}s left>"


class TurnClock:
    """The job's view of its two outer clocks: RQ's ``job_timeout`` and its own deadline inside it.

    ``margin_left()`` is how long remains before RQ would kill the job; the job records it at
    its final write.
    """

    def __init__(self, job_timeout, margin, *, clock=None):
        self.job_timeout = float(job_timeout)
        self.margin = float(margin)
        self.budget = Budget(self.job_timeout - self.margin, clock=clock)

    def margin_left(self):
        return self.job_timeout - self.budget.elapsed()
