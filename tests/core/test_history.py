"""History within the model's window, on plain messages: oldest exchanges dropped first, tool
calls and their results kept together, the history starting with the visitor's message."""

from conversations.core.history import trim_history
from conversations.core.types import ChatMessage, ToolCall
from conversations.providers.anthropic import AnthropicProvider


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
