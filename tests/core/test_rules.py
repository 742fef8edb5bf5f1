"""Rules a configuration follows, each written once and read by the checks, the API and the admin."""

import pytest

from conversations.core.rules import rate_is_on


@pytest.mark.parametrize("rate, on", [("10/min", True), (" 5/hour ", True), ("", False), ("0", False),
                                      (" 0 ", False), (None, False), (0, False)])
def test_a_rate_switches_its_limit_on_unless_it_is_empty_or_zero(rate, on):
    assert rate_is_on(rate) is on
