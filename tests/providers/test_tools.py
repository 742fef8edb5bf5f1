"""``@tool``: schemas from type hints, argument validation, error results, owner scoping and
the size cap — what a developer writing a tool can rely on, and what the model gets back."""

import time
from typing import Literal, Optional

import pytest
from django.contrib.auth import get_user_model

from conversations.core.budget import TurnClock
from conversations.conf import get_config
from conversations.models import Conversation, Message, Turn
from conversations.providers import BaseProvider
from conversations.engine.runner import TurnRunner
from conversations.tools import InvalidArguments, ToolContext, load_tools, run_tool, tool, validate_arguments
from conversations.core.types import ModelReply, ToolCall


def schema(t):
    return t.parameters["properties"]


def test_name_and_description_come_from_the_function_and_its_docstring():
    @tool
    def lookup_order(number: str) -> str:
        """Find an order by its number.

        Returns its status."""
        return number

    assert lookup_order.name == "lookup_order"
    assert lookup_order.description == "Find an order by its number.\n\nReturns its status."
    assert lookup_order.parameters == {"type": "object", "properties": {"number": {"type": "string"}},
                                       "required": ["number"], "additionalProperties": False}
    assert lookup_order("A1") == "A1"  # still a plain function


def test_each_supported_annotation_has_its_json_schema():
    @tool
    def everything(text: str, count: int, ratio: float, flag: bool, size: Literal["s", "m", "l"],
                   level: Literal[1, 2, 3], tags: list[str], matrix: list[list[int]], anything: list,
                   note: str | None = None, limit: int = 5, strict: bool = False,
                   maybe: Optional[float] = None) -> str:
        """Everything at once."""

    assert schema(everything) == {
        "text": {"type": "string"},
        "count": {"type": "integer"},
        "ratio": {"type": "number"},
        "flag": {"type": "boolean"},
        "size": {"enum": ["s", "m", "l"], "type": "string"},
        "level": {"enum": [1, 2, 3], "type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "matrix": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
        "anything": {"type": "array"},
        "note": {"type": "string"},
        "limit": {"type": "integer", "default": 5},
        "strict": {"type": "boolean", "default": False},
        "maybe": {"type": "number"},
    }
    assert everything.parameters["required"] == ["text", "count", "ratio", "flag", "size", "level", "tags",
                                                 "matrix", "anything"]


def test_the_context_parameter_is_not_part_of_the_schema_and_options_are_kept():
    @tool(name="my_orders", description="The visitor's orders.", timeout=3)
    def orders(context, status: str = "open"):
        return context

    assert (orders.name, orders.description, orders.timeout, orders.takes_context) == (
        "my_orders", "The visitor's orders.", 3, True)
    assert schema(orders) == {"status": {"type": "string", "default": "open"}}


def test_an_unsupported_annotation_is_refused_when_the_tool_is_defined():
    with pytest.raises(TypeError, match="unsupported tool parameter type"):
        @tool
        def bad(when: object):
            """Bad."""


@tool
def book(room: str, nights: int, price: float = 100.0, size: Literal["single", "double"] = "single",
         guests: list[str] | None = None, breakfast: bool = False) -> str:
    """Book a room."""
    return f"{room} {nights} {price} {size} {guests} {breakfast}"


@pytest.mark.parametrize("arguments, error", [
    ({}, "missing argument(s): room, nights"),
    ({"room": "A", "nights": "two"}, "nights must be an integer"),
    ({"room": "A", "nights": 1.5}, "nights must be an integer"),
    ({"room": "A", "nights": True}, "nights must be an integer"),
    ({"room": 7, "nights": 2}, "room must be a string"),
    ({"room": "A", "nights": 2, "price": "cheap"}, "price must be a number"),
    ({"room": "A", "nights": 2, "size": "suite"}, "size must be one of ['single', 'double']"),
    ({"room": "A", "nights": 2, "guests": "Ann"}, "guests must be a list"),
    ({"room": "A", "nights": 2, "guests": ["Ann", 3]}, "guests[1] must be a string"),
    ({"room": "A", "nights": 2, "breakfast": "yes"}, "breakfast must be true or false"),
    ({"room": "A", "nights": 2, "pets": 1}, "unknown argument(s): pets"),
    ({"room": None, "nights": 2}, "missing argument(s): room"),
    ({"__invalid_json__": "{"}, "arguments must be a JSON object"),
])
def test_invalid_arguments_are_refused_with_a_reason_for_the_model(arguments, error):
    with pytest.raises(InvalidArguments) as raised:
        validate_arguments(book, arguments)
    assert str(raised.value) == error


def test_valid_arguments_are_coerced_and_null_optionals_take_their_default():
    assert validate_arguments(book, {"room": "A", "nights": 2.0, "price": 80, "guests": None}) == {
        "room": "A", "nights": 2, "price": 80.0}


def run(t, arguments, *, limit=2, max_chars=4000, context=None):
    return run_tool(t, ToolCall("call_1", getattr(t, "name", "missing"), arguments), context or ToolContext(),
                    limit, max_chars)


def test_unknown_tools_invalid_arguments_exceptions_and_timeouts_become_error_results():
    @tool
    def explode(x: int) -> str:
        """Fails."""
        raise RuntimeError(f"database down for {x}")

    @tool
    def sleepy() -> str:
        """Hangs."""
        time.sleep(5)

    missing = run_tool(None, ToolCall("c", "nope", {}), ToolContext(), 1, 100)
    invalid = run(book, {"room": "A"})
    raised = run(explode, {"x": 3})
    started = time.monotonic()
    slow = run(sleepy, {}, limit=0.2)

    assert missing.is_error and missing.output == "Error: there is no tool named 'nope'."
    assert invalid.is_error and invalid.output == "Error: invalid arguments: missing argument(s): nights."
    assert raised.is_error and raised.output == "Error: the tool explode failed."
    assert raised.detail == "RuntimeError: database down for 3"
    assert slow.is_error and slow.output == "Error: the tool sleepy timed out after 0 seconds."
    assert time.monotonic() - started < 2  # abandoned, not awaited
    assert [r.outcome for r in (missing, invalid, raised, slow)] == ["error", "error", "error", "timeout"]
    ok = run(book, {"room": "A", "nights": 2})
    assert not ok.is_error and ok.output == "A 2 100.0 single None False"


def test_results_are_capped_and_say_so():
    @tool
    def huge() -> str:
        """Too much."""
        return "x" * 10_000

    @tool
    def structured() -> dict:
        """A dict."""
        return {"rows": list(range(3))}

    result = run(huge, {}, max_chars=500)
    assert len(result.output) == 500
    assert result.output.endswith("… [cut: 9529 more characters]")
    assert result.output.count("x") == 10_000 - 9529
    assert run(structured, {}).output == '{"rows": [0, 1, 2]}'


def test_a_tool_sees_the_time_it_has_left():
    @tool
    def remaining(context) -> float:
        """How long I may take."""
        return context.remaining()

    now = [100.0]
    context = ToolContext(deadline=103.0, clock=lambda: now[0])
    assert float(run(remaining, {}, context=context).output) == 3.0
    now[0] = 104.0
    assert context.remaining() == 0.0


def test_tools_listed_in_settings_are_loaded_and_bad_lists_are_refused():
    loaded = load_tools(["chatproject.tools.current_time", "chatproject.tools.search_faq",
                         "tests.providers.test_tools.plain_function"])
    assert list(loaded) == ["current_time", "search_faq", "plain_function"]
    assert loaded["plain_function"].parameters["properties"] == {"word": {"type": "string"}}
    with pytest.raises(ValueError, match="two tools are named 'current_time'"):
        load_tools(["chatproject.tools.current_time", "chatproject.tools.current_time"])
    with pytest.raises(ImportError):
        load_tools(["chatproject.tools.no_such_tool"])


def plain_function(word: str) -> str:
    """A function listed without @tool is wrapped when loaded."""
    return word.upper()


# manage.py check reads the database's features on Django 6 (its model checks run against every
# database unless --database is given: a JSONField asks whether the database supports JSON).
@pytest.mark.django_db
def test_a_bad_tool_in_settings_fails_the_system_check(settings):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    settings.CONVERSATIONS = {**settings.CONVERSATIONS, "TOOLS": ["chatproject.tools.no_such_tool"]}
    with pytest.raises(SystemCheckError, match="conversations.E011"):
        call_command("check")


# -- owner scoping: a "my questions" tool only ever sees its owner's data -------------------


@tool
def my_questions(context, contains: str = "") -> list:
    """The questions the visitor asked earlier, in any of their conversations."""
    mine = Message.objects.filter(role="user", content__icontains=contains)
    if context.user is not None:
        mine = mine.filter(conversation__user=context.user)
    else:
        mine = mine.filter(conversation__user__isnull=True, conversation__owner_token=context.owner_token)
    return list(mine.exclude(turn=context.turn).order_by("id").values_list("content", flat=True))


class AskMyQuestions(BaseProvider):
    """A scripted provider: first asks for ``my_questions``, then answers with what it got."""

    name = "scripted"
    model = "scripted"

    def complete(self, messages, tools):
        if messages[-1].role == "tool":
            return ModelReply(text=messages[-1].content)
        return ModelReply(tool_calls=[ToolCall("call_1", "my_questions", {})], finish="tool_calls")


def ask(conversation, content):
    cfg = get_config()
    turn = Turn.objects.create(conversation=conversation)
    Message.objects.create(conversation=conversation, turn=turn, role="user", content=content)
    runner = TurnRunner(turn, clock=TurnClock(cfg["JOB_TIMEOUT"], cfg["DEADLINE_MARGIN"]), config=cfg,
                        provider=AskMyQuestions({}), tools={"my_questions": my_questions})
    runner.run()
    return Message.objects.filter(turn=turn, role="assistant").last().content


@pytest.mark.django_db(transaction=True)  # the tool runs in a thread with its own connection
def test_a_tool_only_sees_its_owners_data():
    alice = get_user_model().objects.create_user("alice")
    bob = get_user_model().objects.create_user("bob")
    alice_chat = Conversation.objects.create(user=alice)
    bob_chat = Conversation.objects.create(user=bob)
    visitor_chat = Conversation.objects.create(owner_token="visitor-1")
    other_visitor_chat = Conversation.objects.create(owner_token="visitor-2")
    for conversation, text in [(alice_chat, "alice secret"), (bob_chat, "bob secret"),
                               (visitor_chat, "visitor one secret"), (other_visitor_chat, "visitor two secret")]:
        turn = Turn.objects.create(conversation=conversation, status="completed")
        Message.objects.create(conversation=conversation, turn=turn, role="user", content=text)

    assert ask(Conversation.objects.create(user=alice), "what did I ask?") == '["alice secret"]'
    assert ask(bob_chat, "what did I ask?") == '["bob secret"]'
    assert ask(visitor_chat, "what did I ask?") == '["visitor one secret"]'
    assert ask(Conversation.objects.create(owner_token="visitor-3"), "what did I ask?") == "[]"


def test_the_context_names_the_owner():
    assert ToolContext(user="alice-object", owner_token="").owner == "alice-object"
    assert ToolContext(user=None, owner_token="tok").owner == "tok"
