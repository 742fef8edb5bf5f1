"""The fake provider servers are faithful: the official ``openai`` and ``anthropic`` clients
parse what they send (text, tool calls, usage, errors), so the provider tests that use them
exercise the real wire formats."""

import anthropic
import openai
import pytest

from tests.support.fake_wire import anthropic_error, anthropic_message, anthropic_tool_use, openai_error
from tests.support.fakes import FakeProvider, openai_text, openai_tool_calls


@pytest.fixture
def fake():
    with FakeProvider() as server:
        yield server


def openai_client(fake):
    return openai.OpenAI(base_url=fake.url, api_key="sk-test", max_retries=0, timeout=5)


def anthropic_client(fake):
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{fake.port}", api_key="sk-ant-test", max_retries=0,
                               timeout=5)


def test_openai_client_reads_a_text_reply_and_its_usage(fake):
    fake.add(openai_text("Hello there.", prompt_tokens=12, completion_tokens=3))
    completion = openai_client(fake).chat.completions.create(
        model="gpt-test", messages=[{"role": "user", "content": "hi"}])

    assert completion.choices[0].message.content == "Hello there."
    assert completion.choices[0].finish_reason == "stop"
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (12, 3)
    assert fake.requests[0]["path"] == "/v1/chat/completions"


def test_openai_client_reads_parallel_tool_calls(fake):
    fake.add(openai_tool_calls(("call_a", "current_time", {"city": "Tokyo"}),
                               ("call_b", "search_faq", {"query": "x"})))
    completion = openai_client(fake).chat.completions.create(
        model="gpt-test", messages=[{"role": "user", "content": "hi"}])

    calls = completion.choices[0].message.tool_calls
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        ("call_a", "current_time", '{"city": "Tokyo"}'), ("call_b", "search_faq", '{"query": "x"}')]
    assert completion.choices[0].finish_reason == "tool_calls"


def test_openai_client_reads_the_error_bodies(fake):
    fake.add(openai_error(401, "Incorrect API key provided.", code="invalid_api_key"),
             openai_error(400, "maximum context length exceeded", code="context_length_exceeded"))
    client = openai_client(fake)
    with pytest.raises(openai.AuthenticationError) as auth:
        client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError) as too_long:
        client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "hi"}])

    assert auth.value.code == "invalid_api_key"
    assert too_long.value.code == "context_length_exceeded"


def test_anthropic_client_reads_a_text_reply_and_its_usage(fake):
    fake.add(anthropic_message("Hello there.", input_tokens=12, output_tokens=3))
    message = anthropic_client(fake).messages.create(
        model="claude-test", max_tokens=100, messages=[{"role": "user", "content": "hi"}])

    assert [(b.type, b.text) for b in message.content] == [("text", "Hello there.")]
    assert message.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (12, 3)
    assert fake.requests[0]["path"] == "/v1/messages"


def test_anthropic_client_reads_parallel_tool_uses(fake):
    fake.add(anthropic_tool_use(("toolu_1", "current_time", {"city": "Tokyo"}),
                                ("toolu_2", "search_faq", {"query": "x"}), text="Checking."))
    message = anthropic_client(fake).messages.create(
        model="claude-test", max_tokens=100, messages=[{"role": "user", "content": "hi"}])

    assert message.stop_reason == "tool_use"
    assert message.content[0].text == "Checking."
    assert [(b.type, b.id, b.name, b.input) for b in message.content[1:]] == [
        ("tool_use", "toolu_1", "current_time", {"city": "Tokyo"}),
        ("tool_use", "toolu_2", "search_faq", {"query": "x"})]


def test_anthropic_client_reads_the_error_bodies(fake):
    fake.add(anthropic_error(401, "authentication_error", "invalid x-api-key"),
             anthropic_error(404, "not_found_error", "model: claude-nope"))
    client = anthropic_client(fake)
    with pytest.raises(anthropic.AuthenticationError) as auth:
        client.messages.create(model="claude-test", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="claude-nope", max_tokens=10, messages=[{"role": "user", "content": "hi"}])

    assert auth.value.body["error"]["type"] == "authentication_error"
    assert missing.value.body["error"]["message"] == "model: claude-nope"


def test_the_official_clients_post_where_our_providers_post(fake):
    fake.add(openai_text("a"), anthropic_message("b"))
    openai_client(fake).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    anthropic_client(fake).messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])

    first, second = fake.requests
    assert (first["path"], second["path"]) == ("/v1/chat/completions", "/v1/messages")
    assert {k.lower(): v for k, v in first["headers"].items()}["authorization"] == "Bearer sk-test"
    assert second["json"] == {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    assert "anthropic-version" in {k.lower() for k in second["headers"]}
