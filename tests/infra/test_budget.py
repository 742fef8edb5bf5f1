"""The budget arithmetic of the HTTP calls on a fake clock: no network, no sleeping (the clocks
alone: tests/core/test_budget.py).

The last test drives the runner's loop the same way (it saves rows, so it needs the database).

``BudgetedHTTP`` is driven through a subclass whose attempts are scripted (each one advances
the fake clock by the time it "took"), so what is tested is the arithmetic of ``post_json``:
which attempt gets which limit, which call is skipped, which retry wait is taken.
"""

import datetime
import email.utils
import logging

import pytest

from conversations.core.budget import Budget, BudgetExhausted, TurnClock
from conversations.infra.http import SKIPPED_MESSAGE, BudgetedHTTP, CallFailed, Response, parse_retry_after
from conversations.models import CallRecord, Conversation, Message, Turn
from conversations.providers import BaseProvider
from conversations.engine.runner import TurnRunner, deadline_message
from conversations.core.types import ModelReply, ToolCall
from tests.support.helpers import FakeClock


PRODUCTION = {"CALL_TIMEOUT": 60, "CONNECT_TIMEOUT": 10, "MIN_CALL_BUDGET": 5, "MAX_ATTEMPTS": 3,
              "BACKOFF_BASE": 1.0, "BACKOFF_MAX": 20.0}


class ScriptedHTTP(BudgetedHTTP):
    """Each attempt takes ``seconds`` of fake time, then fails with ``failure`` or succeeds."""

    def __init__(self, clock, script, budget=100, **config):
        self.clock = clock
        self.script = list(script)
        self.limits = []
        self.sleeps = []
        self.records = []
        super().__init__(Budget(budget, clock=clock), {**PRODUCTION, **config}, recorder=self._record, name="model")

    def _record(self, **fields):
        self.records.append(fields)

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.clock.advance(seconds)

    def _attempt(self, url, body, headers, attempt, classify=None):
        self.limits.append(self.budget.call_timeout(self.config["CALL_TIMEOUT"]))
        seconds, failure = self.script.pop(0)
        self.clock.advance(seconds)
        if failure is not None:
            raise failure
        return Response(status=200, data={"ok": True})

    def post(self):
        return self.post_json("http://provider.invalid/v1/chat/completions", {}, {})


def rate_limited(retry_after):
    return CallFailed("http_error", "HTTP 429", status=429, headers={"Retry-After": str(retry_after)}, retryable=True)


def timed_out():
    return CallFailed("timeout", "no complete response", retryable=True)


def test_each_attempt_gets_min_of_cap_and_remaining():
    clock = FakeClock()
    http = ScriptedHTTP(clock, [(60, timed_out()), (30, timed_out()), (1, None)])
    http.random.seed(1)
    http.post()
    # 100 s budget: first attempt 60 s; after it and a back-off, less than 40 s is left.
    assert http.limits[0] == 60
    assert http.limits[1] == pytest.approx(40 - http.sleeps[0])
    assert http.limits[2] == pytest.approx(100 - 60 - 30 - sum(http.sleeps))


def test_no_call_under_min_call_budget(caplog):
    clock = FakeClock()
    http = ScriptedHTTP(clock, [(1, None)], budget=100)
    clock.advance(95.5)
    with caplog.at_level(logging.ERROR, logger="conversations.http"), pytest.raises(BudgetExhausted):
        http.post()

    assert http.limits == []  # no attempt was made
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("ERROR", SKIPPED_MESSAGE)]
    assert caplog.records[0].remaining == 4.5
    (record,) = http.records
    assert record == {"kind": "model", "name": "model", "attempt": 1, "started_offset": 95.5, "timeout": 0,
                      "remaining_before": 4.5, "duration": 0, "outcome": "skipped", "status_code": None,
                      "detail": SKIPPED_MESSAGE}


def test_retry_wait_inside_the_budget_is_taken():
    clock = FakeClock()
    http = ScriptedHTTP(clock, [(10, rate_limited(30)), (2, None)])
    assert http.post().data == {"ok": True}
    assert http.sleeps == [30]
    assert http.limits == [60, 60]


def test_retry_wait_that_would_overrun_is_not_taken():
    """90 s left after the first attempt; waiting 86 s would leave 4 s, under MIN_CALL_BUDGET."""
    clock = FakeClock()
    http = ScriptedHTTP(clock, [(10, rate_limited(86)), (2, None)])
    with pytest.raises(CallFailed) as raised:
        http.post()
    assert raised.value.status == 429
    assert http.sleeps == []
    assert len(http.limits) == 1


def test_backoff_that_would_overrun_is_not_taken():
    clock = FakeClock()
    http = ScriptedHTTP(clock, [(60, timed_out()), (34.6, timed_out()), (1, None)], BACKOFF_BASE=1.0)
    with pytest.raises(CallFailed) as raised:
        http.post()
    # After 60 + ~1 + 34.6 s less than 5 s is left: the second back-off is not taken.
    assert raised.value.outcome == "timeout"
    assert len(http.sleeps) == 1 and len(http.limits) == 2


def test_backoff_is_jittered_exponential_and_capped():
    http = ScriptedHTTP(FakeClock(), [], BACKOFF_BASE=1.0, BACKOFF_MAX=5.0)
    for attempt, full in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (8, 5.0)]:
        waits = [http._backoff(attempt) for _ in range(50)]
        assert all(full / 2 <= w <= full for w in waits)
        assert len(set(waits)) > 1


def test_max_attempts_bounds_the_retries():
    clock = FakeClock()
    http = ScriptedHTTP(clock, [(1, timed_out())] * 5, MAX_ATTEMPTS=3)
    with pytest.raises(CallFailed):
        http.post()
    assert len(http.limits) == 3


@pytest.mark.parametrize("headers, expected", [
    ({"Retry-After": "7"}, 7.0),
    ({"retry-after": "0.5"}, 0.5),
    ({"Retry-After": "-3"}, 0.0),
    ({"retry-after-ms": "1500"}, 1.5),
    ({"retry-after-ms": "250", "Retry-After": "9"}, 0.25),  # the finer header wins
    ({"retry-after-ms": "soon", "Retry-After": "9"}, 9.0),
    ({"Retry-After": "tomorrow"}, None),
    ({}, None),
    (None, None),
])
def test_parse_retry_after(headers, expected):
    assert parse_retry_after(headers) == expected


def test_parse_retry_after_http_date():
    now = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc).timestamp()
    later = email.utils.formatdate(now + 42, usegmt=True)
    earlier = email.utils.formatdate(now - 42, usegmt=True)
    assert parse_retry_after({"Retry-After": later}, now=now) == 42
    assert parse_retry_after({"Retry-After": earlier}, now=now) == 0


class ToolHungryModel(BaseProvider):
    """Asks for a tool on every call; each call takes ``seconds`` of fake time."""

    name = "scripted"

    def __init__(self, clock, seconds):
        super().__init__({})
        self.clock, self.seconds, self.calls = clock, seconds, 0

    def complete(self, messages, tools):
        self.calls += 1
        self.clock.advance(self.seconds)
        return ModelReply(text="", tool_calls=[ToolCall(f"c{self.calls}", "lookup", {})], finish="tool_calls")


@pytest.mark.django_db
def test_loop_stops_starting_round_trips_near_the_deadline(conversations_settings, caplog):
    from conversations.conf import get_config

    conversation = Conversation.objects.create(owner_token="t")
    turn = Turn.objects.create(conversation=conversation)
    Message.objects.create(conversation=conversation, turn=turn, role="user", content="Loop for ever?")
    clock = FakeClock()
    model = ToolHungryModel(clock, 2.5)  # JOB_TIMEOUT 10, margin 4: 6 s, MIN_CALL_BUDGET 1
    published = []
    runner = TurnRunner(turn, clock=TurnClock(10, 4, clock=clock), config={**get_config(), "MAX_STEPS": 100},
                        provider=model, tools={}, publisher=published.append)
    with caplog.at_level(logging.ERROR, logger="conversations.http"):
        runner.run()

    # Calls at 0 and 2.5 s; at 5 s only 1 s is left... which is exactly MIN_CALL_BUDGET: a third
    # call starts; at 7.5 s nothing is left and the fourth is skipped.
    assert model.calls == 3
    turn.refresh_from_db()
    assert (turn.status, turn.error) == ("incomplete", deadline_message())
    assert turn.margin_left == 10 - 7.5
    skipped = CallRecord.objects.get(turn=turn, kind="model")
    assert (skipped.outcome, skipped.started_offset, skipped.remaining_before) == ("skipped", 7.5, 0)
    assert [r.getMessage() for r in caplog.records] == [SKIPPED_MESSAGE]
    assert published[-1]["done"] is True and published[-1]["status"] == "incomplete"
    assert all(not state["done"] for state in published[:-1])
