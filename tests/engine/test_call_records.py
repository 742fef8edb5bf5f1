"""What a turn's timeline records for each call, as the operator reads it in the admin: every
model call under the one model name the turn shows, and each tool run's outcome from what
happened to it, never from the words of its result."""

import pytest

from conversations.core.budget import TurnClock
from conversations.conf import get_config
from conversations.models import CallRecord, Conversation, Message, Turn
from conversations.providers import BaseProvider
from conversations.engine.runner import TurnRunner, deadline_message
from conversations.tools import tool
from conversations.core.types import ModelReply, ToolCall
from tests.support.helpers import FakeClock
from tests.support.fakes import FakeProvider, openai_tool_calls

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
