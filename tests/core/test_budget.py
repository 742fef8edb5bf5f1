"""The turn's clocks on a fake clock: what each call may take, and what is left of the margin."""

from conversations.core.budget import TurnClock
from tests.support.helpers import FakeClock


def test_early_call_gets_the_cap_and_a_late_one_what_is_left():
    clock = FakeClock()
    budget = TurnClock(120, 20, clock=clock).budget
    assert budget.seconds == 100
    assert budget.call_timeout(60) == 60
    clock.advance(70)
    assert budget.call_timeout(60) == 30
    clock.advance(27)
    assert budget.call_timeout(60) == 3
    assert not budget.can_start(5)
    clock.advance(10)
    assert budget.remaining() == 0 and budget.call_timeout(60) == 0


def test_margin_left_counts_down_to_the_job_timeout():
    clock = FakeClock()
    turn_clock = TurnClock(120, 20, clock=clock)
    clock.advance(100)
    assert turn_clock.budget.remaining() == 0
    assert turn_clock.margin_left() == 20
    clock.advance(25)
    assert turn_clock.margin_left() == -5
