"""History within the model's window: oldest exchanges dropped first, tool calls and their
results kept together, the history starting with the visitor's message."""

import pytest

from conversations.models import Conversation
from conversations.providers.anthropic import AnthropicProvider
from conversations.core.history import trim_history
from conversations.core.types import ChatMessage, ToolCall
from tests.fake_wire import anthropic_message, run_turn_here
from tests.fakes import FakeProvider, openai_text, openai_tool_calls


def user(text):
    return ChatMessage(role="user", content=text)


def answer(text):
    return ChatMessage(role="assistant", content=text)


def calls(*ids):
    return ChatMessage(role="assistant", tool_calls=[ToolCall(i, "search_faq", {"query": "q"}) for i in ids])


def result(call_id, text="r" * 10):
    return ChatMessage(role="tool", content=text, tool_call_id=call_id, name="search_faq")


def contents(messages):
    return [(m.role, m.content or m.tool_call_id or ",".join(c.id for c in m.tool_calls)) for m in messages]


def test_everything_is_kept_when_it_fits():
    history = [user("a" * 10), calls("c1"), result("c1"), answer("b" * 10), user("next")]
    assert trim_history(history, 10_000) == history


def test_oldest_exchanges_go_first_with_their_tool_calls_and_results():
    history = [user("old " * 50), calls("c1", "c2"), result("c1", "x" * 300), result("c2", "y" * 300),
               answer("old answer"),
               user("middle"), calls("c3"), result("c3"), answer("middle answer"),
               user("now?")]
    trimmed = trim_history(history, 200)

    assert contents(trimmed) == [("user", "middle"), ("assistant", "c3"), ("tool", "r" * 10),
                                 ("assistant", "middle answer"), ("user", "now?")]


def test_the_current_exchange_is_kept_whole_even_when_it_alone_is_too_big():
    history = [user("old"), answer("old answer"),
               user("now " * 100), calls("c1"), result("c1", "z" * 5000)]
    trimmed = trim_history(history, 100)

    assert contents(trimmed) == [("user", "now " * 100), ("assistant", "c1"), ("tool", "z" * 5000)]


def test_the_history_always_starts_with_a_user_message():
    history = [answer("a greeting before any question"), calls("c0"), result("c0"), user("hi")]
    assert trim_history(history, 10_000)[0].role == "user"
    assert contents(trim_history(history, 10_000)) == [("user", "hi")]


def test_a_tool_call_left_without_its_result_gets_an_error_result_and_a_stray_result_goes():
    # A turn cancelled between the call and its result; a result whose call was lost.
    history = [user("first"), calls("c1", "c2"), result("c1"), user("second"), result("ghost"), answer("ok")]
    trimmed = trim_history(history, 10_000)

    assert [(m.role, m.tool_call_id) for m in trimmed] == [
        ("user", ""), ("assistant", ""), ("tool", "c1"), ("tool", "c2"), ("user", ""), ("assistant", "")]
    assert trimmed[3].is_error and "not run" in trimmed[3].content


def test_a_trimmed_history_is_valid_for_anthropic():
    history = [user("old " * 100), calls("c1"), result("c1"), answer("done"),
               answer("an extra note"), user("now?")]
    wire = AnthropicProvider({"MODEL": "m"}).wire_messages(trim_history(history, 50))
    assert wire == [{"role": "user", "content": "now?"}]
    wire = AnthropicProvider({"MODEL": "m"}).wire_messages(trim_history(history, 10_000))
    assert [m["role"] for m in wire] == ["user", "assistant", "user", "assistant", "user"]
    assert wire[3]["content"] == [{"type": "text", "text": "done"}, {"type": "text", "text": "an extra note"}]


@pytest.mark.django_db
def test_a_long_conversation_sends_only_what_fits_to_the_provider(conversations_settings):
    with FakeProvider() as fake:
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="k", TOOLS=[],
                                      SYSTEM_PROMPT="S" * 100, HISTORY_MAX_CHARS=400)
        fake.add(*[openai_text(f"answer {n} " + "." * 80) for n in range(5)])
        conversation = Conversation.objects.create(owner_token="visitor")
        for n in range(5):
            run_turn_here(f"question {n} " + "?" * 80, conversation=conversation)

    sent = [r["json"]["messages"] for r in fake.requests]
    assert len(sent[0]) == 2  # the system prompt and the first question
    last = sent[-1]
    assert last[0] == {"role": "system", "content": "S" * 100}
    assert last[1]["role"] == "user"
    # 100 for the prompt, ~90 for each message: the question and one earlier exchange fit.
    assert [m["content"][:10] for m in last[1:]] == ["question 3", "answer 3 .", "question 4"]
    assert sum(len(m["content"]) for m in last) <= 400 + 90


@pytest.mark.django_db
def test_anthropic_gets_a_user_message_first_after_trimming(conversations_settings):
    with FakeProvider() as fake:
        conversations_settings.update(PROVIDER="anthropic", BASE_URL=fake.url, API_KEY="k", TOOLS=[],
                                      SYSTEM_PROMPT="", HISTORY_MAX_CHARS=150)
        fake.add(*[anthropic_message("a" * 100) for _ in range(3)])
        conversation = Conversation.objects.create(owner_token="visitor")
        for n in range(3):
            run_turn_here(f"q{n}", conversation=conversation)

    body = fake.requests[-1]["json"]
    assert "system" not in body
    assert body["messages"][0] == {"role": "user", "content": "q1"}
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]


@pytest.mark.django_db
def test_the_history_is_trimmed_again_before_each_call_of_a_turn(conversations_settings):
    with FakeProvider() as fake:
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="k", SYSTEM_PROMPT="",
                                      TOOLS=["chatproject.tools.search_faq"], HISTORY_MAX_CHARS=600)
        fake.add(openai_text("earlier answer " + "." * 100),
                 openai_tool_calls(("search_faq", {"query": "refunds shipping price password support widget",
                                                   "limit": 5})),
                 openai_text("Here is everything."))
        conversation = Conversation.objects.create(owner_token="visitor")
        run_turn_here("earlier question " + "?" * 100, conversation=conversation)
        run_turn_here("Tell me everything", conversation=conversation)

    first_call, second_call = (r["json"]["messages"] for r in fake.requests[1:])
    # The earlier exchange fitted before the tool ran; the long tool result pushed it out.
    assert [m["content"][:14] for m in first_call] == ["earlier questi", "earlier answer", "Tell me everyt"]
    assert [m["role"] for m in second_call] == ["user", "assistant", "tool"]
    assert second_call[0]["content"] == "Tell me everything" and len(second_call[2]["content"]) > 600
