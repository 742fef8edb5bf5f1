"""What a turn's timeline records for each call, as the operator reads it in the admin: every
model call under the one model name the turn shows, and each tool run's outcome from what
happened to it, never from the words of its result."""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from conversations.core.budget import TurnClock
from conversations.conf import get_config
from conversations.models import CallRecord, Conversation, Message, Turn
from conversations.providers import BaseProvider
from conversations.engine.job import perform_turn
from conversations.engine.runner import TurnRunner, deadline_message
from conversations.tools import tool
from conversations.core.types import ModelReply, ToolCall
from tests.support.helpers import FakeClock
from tests.support.fakes import FakeProvider, openai_text, openai_tool_calls

pytestmark = pytest.mark.django_db


class AskFor(BaseProvider):
    """A scripted provider: asks for ``tool_name`` once, then answers with the tool's result."""

    name = "scripted"
    model = "scripted"

    def __init__(self, tool_name):
        self.tool_name = tool_name

    def complete(self, messages, tools):
        if messages[-1].role == "tool":
            return ModelReply(text=messages[-1].content)
        return ModelReply(tool_calls=[ToolCall("call_1", self.tool_name, {})], finish="tool_calls")


def new_turn(content):
    conversation = Conversation.objects.create(owner_token="visitor")
    turn = Turn.objects.create(conversation=conversation)
    Message.objects.create(conversation=conversation, turn=turn, role="user", content=content)
    return turn


def tool_run(turn):
    (run,) = CallRecord.objects.filter(turn=turn, kind="tool")
    return run


@tool
def warehouse() -> str:
    """Stock levels, from a service that sometimes gives up."""
    raise ConnectionError("the warehouse service timed out")


def test_a_tool_that_raises_is_recorded_as_an_error_even_when_its_message_says_timed_out():
    cfg = get_config()
    turn = new_turn("Is the blue mug in stock?")
    TurnRunner(turn, clock=TurnClock(cfg["JOB_TIMEOUT"], cfg["DEADLINE_MARGIN"]), config=cfg,
               provider=AskFor("warehouse"), tools={"warehouse": warehouse}).run()

    run = tool_run(turn)
    assert (run.name, run.outcome, run.get_outcome_display()) == ("warehouse", "error", "error")
    assert run.duration < cfg["TOOL_TIMEOUT"]  # it raised at once; nothing waited for a limit
    turn.refresh_from_db()
    assert turn.status == "completed"


def test_model_attempts_and_skipped_calls_are_recorded_under_the_turns_model_name(conversations_settings):
    """No MODEL set: the provider's default model answers, and the timeline names it for the
    attempt that ran and for the call skipped when the time ran out."""
    clock = FakeClock()

    @tool
    def slow_lookup() -> str:
        """Takes the rest of the turn's time."""
        clock.advance(5.5)  # leaves 0.5 s, under MIN_CALL_BUDGET
        return "found it"

    with FakeProvider() as fake:
        fake.add(openai_tool_calls(("slow_lookup", {})))
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="sk-test", MODEL="")
        cfg = get_config()
        turn = new_turn("Find my order")
        TurnRunner(turn, clock=TurnClock(cfg["JOB_TIMEOUT"], cfg["DEADLINE_MARGIN"], clock=clock), config=cfg,
                   tools={"slow_lookup": slow_lookup}).run()

    turn.refresh_from_db()
    assert (turn.status, turn.error, turn.model) == ("incomplete", deadline_message(), "gpt-4o-mini")
    calls = CallRecord.objects.filter(turn=turn, kind="model").order_by("started_offset", "id")
    assert [(c.name, c.outcome) for c in calls] == [("gpt-4o-mini", "ok"), ("gpt-4o-mini", "skipped")]



@pytest.mark.django_db(transaction=True)  # the job closes the connection it found, as in a worker
def test_a_turn_writes_its_row_once_per_round_trip(conversations_settings):
    """A model call asking for a tool, the tool, the model's answer, run by the turn's job: the
    turn's row is written when the job claims it (with its clocks), once per round-trip before
    the last, and once by the final write, which saves the answer too: no write of its own for
    marking it running nor for the last reply."""
    with FakeProvider() as fake:
        fake.add(openai_tool_calls(("search_faq", {"query": "refunds"})), openai_text("Refunds take 30 days."))
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="sk-test-key", MODEL="gpt-test")
        turn = new_turn("How do refunds work?")
        with CaptureQueriesContext(connection) as queries:
            perform_turn(str(turn.pk))

    # Each statement (on PostgreSQL a round trip's statements are sent as one string, ``statements.send``,
    # the turn's UPDATE inside the WITH that fails when it matches no row, ``statements.or_fail``).
    writes = [sql for q in queries.captured_queries
              for sql in re.findall(r'(?:^|; )(?:WITH fenced AS \()?(UPDATE "conversations_turn")', q["sql"])]
    assert len(writes) == 4, queries.captured_queries
    turn.refresh_from_db()
    assert turn.status == "completed" and turn.model_calls == 2 and turn.tool_calls == 1
    assert turn.started_at and turn.deadline_at and turn.provider == "openai" and turn.model == "gpt-test"
    assert list(turn.messages.order_by("id").values_list("role", "content"))[-1] == ("assistant",
                                                                                      "Refunds take 30 days.")
