"""The OpenAI-compatible provider against a fake Chat Completions server: what it sends, field
by field, and what the visitor and the operator see for every reply and error."""

import json
import logging

import pytest

from conversations.infra.http import CallFailed
from conversations.models import Message, Turn
from conversations.providers import BaseProvider, ProviderError, get_provider_class
from conversations.providers.openai import OpenAIProvider
from conversations.core.types import ModelReply, Usage
from tests.support.helpers import make_client, poll_until_done, start_turn
from tests.support.fake_wire import openai_error, run_error_cases, run_turn_here
from tests.support.fakes import FakeProvider, Reply, malformed_json, openai_text, openai_tool_calls

KEY = "sk-test-0123456789abcdefSECRET"

SEARCH_FAQ_SCHEMA = {
    "type": "function",
    "function": {
        "name": "search_faq",
        "description": "Search the site's frequently asked questions; returns the best matching answers.",
        "parameters": {"type": "object",
                       "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "default": 2}},
                       "required": ["query"], "additionalProperties": False},
    },
}


@pytest.fixture
def fake(conversations_settings):
    with FakeProvider() as server:
        conversations_settings.update(PROVIDER="openai", BASE_URL=server.url, API_KEY=KEY, MODEL="gpt-test",
                                      SYSTEM_PROMPT="Be brief.",
                                      # One attempt, so that each test sees the reply it scripted, not a retry's.
                                      MAX_ATTEMPTS=1,
                                      # The unstreamed wire format; tests/providers/test_streamed_calls.py has the streamed one.
                                      STREAM=False)
        yield server


@pytest.mark.django_db(transaction=True)
def test_multi_step_tool_turn_in_the_worker_sends_each_step_back(fake, worker):
    fake.add(openai_tool_calls(("search_faq", {"query": "refunds"}), prompt_tokens=100, completion_tokens=10),
             openai_tool_calls(("call_9", "current_time", {"city": "Tokyo"}), prompt_tokens=200, completion_tokens=20),
             openai_text("Refunds take 30 days; it is evening in Tokyo.", prompt_tokens=300, completion_tokens=30))
    client = make_client()
    turn = start_turn(client, "How do refunds work, and what time is it in Tokyo?")
    worker()
    final = poll_until_done(client, turn["poll_url"])

    assert final["status"] == "completed" and final["error"] is None
    assert final["messages"][-1]["content"] == "Refunds take 30 days; it is evening in Tokyo."
    assert [m["role"] for m in final["messages"]] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]

    first, second, third = fake.requests
    assert first["path"] == "/v1/chat/completions"
    assert first["headers"]["Authorization"] == f"Bearer {KEY}"
    assert "api-key" not in {h.lower() for h in first["headers"]}
    assert KEY not in first["raw"].decode()  # the key travels in the header only
    body = first["json"]
    assert set(body) == {"model", "messages", "tools"}
    assert body["model"] == "gpt-test"
    assert body["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "How do refunds work, and what time is it in Tokyo?"}]
    assert SEARCH_FAQ_SCHEMA in body["tools"]
    assert [t["function"]["name"] for t in body["tools"]] == ["current_time", "search_faq", "search_site",
                                                              "email_answer"]

    assert second["json"]["messages"][2:] == [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "search_faq", "arguments": '{"query": "refunds"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": second["json"]["messages"][3]["content"]},
    ]
    assert "30 days of delivery" in second["json"]["messages"][3]["content"]
    assert third["json"]["messages"][4]["tool_calls"][0]["id"] == "call_9"
    assert third["json"]["messages"][5]["tool_call_id"] == "call_9"
    assert "Tokyo" in third["json"]["messages"][5]["content"]

    saved = Turn.objects.get(pk=turn["id"])
    assert (saved.input_tokens, saved.output_tokens) == (600, 60)
    assert (saved.model_calls, saved.tool_calls) == (3, 2)
    assert (saved.provider, saved.model) == ("openai", "gpt-test")


@pytest.mark.django_db
def test_parallel_tool_calls_in_one_reply_all_run_and_all_results_go_back(fake):
    fake.add(openai_tool_calls(("call_a", "current_time", {"city": "Tokyo"}),
                               ("call_b", "current_time", {"city": "Paris"}),
                               ("call_c", "search_faq", {"query": "shipping", "limit": 1})),
             openai_text("Here you go."))
    turn = run_turn_here("Time in Tokyo and Paris, and shipping?")

    assert turn.status == "completed" and turn.tool_calls == 3 and turn.model_calls == 2
    sent = fake.requests[1]["json"]["messages"]
    assert [c["id"] for c in sent[2]["tool_calls"]] == ["call_a", "call_b", "call_c"]
    results = sent[3:]
    assert [(m["role"], m["tool_call_id"]) for m in results] == [("tool", "call_a"), ("tool", "call_b"),
                                                                ("tool", "call_c")]
    assert "Tokyo" in results[0]["content"] and "Paris" in results[1]["content"]
    assert "Orders ship" in results[2]["content"]


@pytest.mark.django_db
def test_length_finish_keeps_the_partial_answer_and_says_it_was_cut(fake):
    fake.add(openai_text("Refunds are possible within thirty", finish_reason="length"))
    turn = run_turn_here("How do refunds work?")

    assert turn.status == "incomplete"
    assert turn.error == "The answer was cut short because it reached the length limit."
    answer = Message.objects.filter(turn=turn, role="assistant").get()
    assert answer.content == "Refunds are possible within thirty"


@pytest.mark.django_db
def test_a_refusal_ends_the_turn_with_the_refusal_message(fake):
    reply = openai_text(None)
    reply["choices"][0]["message"]["refusal"] = "I can't help with that."
    fake.add(reply, openai_text("filtered", finish_reason="content_filter"))
    first = run_turn_here("Something not allowed")
    second = run_turn_here("Something else not allowed")

    for turn in (first, second):
        assert turn.status == "incomplete"
        assert turn.error == "The assistant could not answer this request."
    assert Message.objects.filter(turn=first, role="assistant").get().content == "I can't help with that."


ERRORS = {
    "bad key": (openai_error(401, f"Incorrect API key provided: {KEY[:7]}***CRET. You can find your API key at "
                                  "https://platform.openai.com/account/api-keys.", code="invalid_api_key"),
                "the AI service rejected its credentials"),
    "unknown model": (openai_error(404, "The model `gpt-test` does not exist or you do not have access to it.",
                                   code="model_not_found"),
                      "does not know the configured model"),
    "context too long": (openai_error(400, "This model's maximum context length is 128000 tokens. However, your "
                                           "messages resulted in 130000 tokens.", code="context_length_exceeded"),
                         "grown too long"),
    "content refused": (openai_error(400, "The response was filtered due to the prompt triggering Azure OpenAI's "
                                          "content management policy.", code="content_filter"),
                        "could not answer this request"),
    "malformed JSON": (Reply(200, b"<html><body>Bad gateway</body></html>"), "could not read"),
    "truncated JSON": (malformed_json, "could not read"),
    "no choices": (Reply(200, {"id": "chatcmpl-x", "object": "chat.completion", "choices": []}), "could not read"),
    "unexpected shape": (Reply(200, {"choices": [{"message": {"content": "x", "tool_calls": [{"function": 7}]}}]}),
                         "could not read"),
}


@pytest.mark.django_db
def test_each_provider_error_is_a_clear_distinct_message_without_the_key(fake, caplog):
    caplog.set_level(logging.INFO)
    seen = run_error_cases(fake, ERRORS, secret=KEY)
    # Every kind of failure that needs a different action has its own message.
    assert len({seen[c] for c in ("bad key", "unknown model", "context too long", "content refused",
                                  "malformed JSON")}) == 5
    logged = caplog.text
    assert "openai call failed (auth)" in logged and "invalid_api_key" in logged
    assert "(unknown_model)" in logged and "(context_length)" in logged and "(refused)" in logged
    assert "(bad_response)" in logged
    assert KEY not in logged and KEY[:7] + "***" not in logged


@pytest.mark.django_db
def test_azure_style_base_url_keeps_api_version_and_sends_the_key_as_api_key(fake, conversations_settings):
    conversations_settings.update(BASE_URL=f"{fake.url}/openai/deployments/my-gpt?api-version=2024-10-21")
    fake.add(openai_text("Hello from Azure."))
    turn = run_turn_here("hi")

    assert turn.status == "completed"
    request = fake.requests[0]
    assert request["path"] == "/v1/openai/deployments/my-gpt/chat/completions?api-version=2024-10-21"
    assert request["headers"]["api-key"] == KEY
    assert "Authorization" not in request["headers"]


@pytest.mark.django_db
def test_a_local_server_without_a_key_gets_no_authorization_header(fake, conversations_settings):
    conversations_settings.update(API_KEY="", MODEL="llama3.2")
    fake.add(Reply(404, {"error": 'model "llama3.2" not found, try pulling it first'}))
    turn = run_turn_here("hi")

    assert "Authorization" not in fake.requests[0]["headers"]
    assert fake.requests[0]["json"]["model"] == "llama3.2"
    assert turn.status == "failed" and "does not know the configured model" in turn.error


@pytest.mark.django_db
def test_tool_arguments_that_are_not_json_become_an_error_result_for_the_model(fake):
    bad = openai_tool_calls(("current_time", {}))
    bad["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = '{"city": "Tok'
    fake.add(bad, openai_text("Sorry, let me know the city."))
    turn = run_turn_here("time?")

    assert turn.status == "completed"
    result = fake.requests[1]["json"]["messages"][-1]
    assert result["role"] == "tool" and result["content"].startswith("Error: invalid arguments")


# -- choosing and writing a provider -------------------------------------------------------


class EchoProvider(BaseProvider):
    """A provider a developer might write: it answers with the visitor's last message."""

    name = "echo"

    def complete(self, messages, tools):
        return ModelReply(text=f"You said: {messages[-1].content}", usage=Usage(3, 4))


def test_provider_is_chosen_by_short_name_or_dotted_path():
    assert get_provider_class("openai") is OpenAIProvider
    assert get_provider_class("tests.providers.test_provider_openai.EchoProvider") is EchoProvider
    assert get_provider_class("anthropic").__name__ == "AnthropicProvider"
    with pytest.raises(TypeError):
        get_provider_class("tests.support.fakes.Reply")


@pytest.mark.django_db(transaction=True)
def test_a_provider_written_by_the_developer_answers_turns_in_the_worker(conversations_settings, worker):
    conversations_settings.update(PROVIDER="tests.providers.test_provider_openai.EchoProvider")
    client = make_client()
    turn = start_turn(client, "ping")
    worker()
    final = poll_until_done(client, turn["poll_url"])

    assert final["status"] == "completed" and final["messages"][-1]["content"] == "You said: ping"
    saved = Turn.objects.get(pk=turn["id"])
    assert (saved.provider, saved.input_tokens, saved.output_tokens) == ("echo", 3, 4)


def test_provider_errors_carry_no_secret_from_the_reply():
    body = json.dumps({"error": {"message": f"Incorrect API key provided: {KEY}", "code": "invalid_api_key"}})
    failure = CallFailed("http_error", "HTTP 401", status=401, body=body)
    error = OpenAIProvider({"API_KEY": KEY, "MODEL": "m", "BASE_URL": ""}).error_from_failure(failure)

    assert isinstance(error, ProviderError) and error.code == "auth"
    assert KEY not in str(error) and KEY not in error.message and "invalid_api_key" in error.detail
