"""The Anthropic provider against a fake Messages API server: what it sends, field by field,
and what the visitor and the operator see for every reply and error."""

import logging

import pytest

from conversations.models import CallRecord, Conversation, Message, Turn
from tests.support.helpers import make_client, poll_until_done, start_turn
from tests.support.fake_wire import (
    anthropic_error, anthropic_message, anthropic_tool_use, run_error_cases, run_turn_here,
)
from tests.support.fakes import FakeProvider, Reply, malformed_json

KEY = "sk-ant-api03-test0123456789SECRET"

SEARCH_FAQ_TOOL = {
    "name": "search_faq",
    "description": "Search the site's frequently asked questions; returns the best matching answers.",
    "input_schema": {"type": "object",
                     "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "default": 2}},
                     "required": ["query"], "additionalProperties": False},
}


@pytest.fixture
def fake(conversations_settings):
    with FakeProvider() as server:
        # The API root without /v1, as the official client takes it.
        conversations_settings.update(PROVIDER="anthropic", BASE_URL=f"http://127.0.0.1:{server.port}",
                                      API_KEY=KEY, MODEL="claude-test", SYSTEM_PROMPT="Be brief.", MAX_TOKENS=321,
                                      # One attempt, so that each test sees the reply it scripted, not a retry's.
                                      MAX_ATTEMPTS=1,
                                      # The unstreamed wire format; tests/providers/test_streamed_calls.py has the streamed one.
                                      STREAM=False)
        yield server


@pytest.mark.django_db(transaction=True)
def test_multi_step_tool_turn_in_the_worker_sends_tool_use_and_tool_result_blocks(fake, worker):
    fake.add(anthropic_tool_use(("toolu_a", "search_faq", {"query": "refunds"}), text="Let me look that up.",
                                input_tokens=100, output_tokens=10, cache_read_input_tokens=50),
             anthropic_tool_use(("toolu_b", "current_time", {"city": "Tokyo"}), input_tokens=200, output_tokens=20),
             anthropic_message("Refunds take 30 days; it is evening in Tokyo.", input_tokens=300, output_tokens=30))
    client = make_client()
    turn = start_turn(client, "How do refunds work, and what time is it in Tokyo?")
    worker()
    final = poll_until_done(client, turn["poll_url"])

    assert final["status"] == "completed" and final["error"] is None
    assert final["messages"][1]["content"] == "Let me look that up."
    assert final["messages"][-1]["content"] == "Refunds take 30 days; it is evening in Tokyo."

    first, second, third = fake.requests
    assert first["path"] == "/v1/messages"
    headers = {k.lower(): v for k, v in first["headers"].items()}
    assert headers["x-api-key"] == KEY and headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in headers
    assert KEY not in first["raw"].decode()
    body = first["json"]
    assert set(body) == {"model", "max_tokens", "system", "messages", "tools"}
    assert (body["model"], body["max_tokens"], body["system"]) == ("claude-test", 321, "Be brief.")
    assert body["messages"] == [{"role": "user", "content": "How do refunds work, and what time is it in Tokyo?"}]
    assert SEARCH_FAQ_TOOL in body["tools"]
    assert [t["name"] for t in body["tools"]] == ["current_time", "search_faq", "search_site", "email_answer"]

    sent = second["json"]["messages"]
    assert sent[1] == {"role": "assistant", "content": [
        {"type": "text", "text": "Let me look that up."},
        {"type": "tool_use", "id": "toolu_a", "name": "search_faq", "input": {"query": "refunds"}}]}
    assert sent[2]["role"] == "user" and len(sent[2]["content"]) == 1
    result = sent[2]["content"][0]
    assert (result["type"], result["tool_use_id"]) == ("tool_result", "toolu_a")
    assert "30 days of delivery" in result["content"] and "is_error" not in result
    assert second["json"]["system"] == "Be brief."
    assert [m["role"] for m in third["json"]["messages"]] == ["user", "assistant", "user", "assistant", "user"]
    assert third["json"]["messages"][4]["content"][0]["tool_use_id"] == "toolu_b"

    saved = Turn.objects.get(pk=turn["id"])
    # input_tokens plus prompt-cache reads: all the input the turn paid for.
    assert (saved.input_tokens, saved.output_tokens) == (650, 60)
    assert (saved.model_calls, saved.tool_calls, saved.provider) == (3, 2, "anthropic")


@pytest.mark.django_db
def test_parallel_tool_uses_get_their_results_in_one_user_message(fake):
    fake.add(anthropic_tool_use(("toolu_1", "current_time", {"city": "Tokyo"}),
                                ("toolu_2", "current_time", {"city": "Atlantis"}),
                                ("toolu_3", "search_faq", {"query": "shipping"})),
             anthropic_message("Done."))
    turn = run_turn_here("Time in Tokyo and Atlantis, and shipping?")

    assert turn.status == "completed" and turn.tool_calls == 3
    messages = fake.requests[1]["json"]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    results = messages[2]["content"]
    assert [(b["type"], b["tool_use_id"]) for b in results] == [
        ("tool_result", "toolu_1"), ("tool_result", "toolu_2"), ("tool_result", "toolu_3")]
    assert results[1]["is_error"] is True and "unknown city" in results[1]["content"]
    assert "is_error" not in results[0] and "Orders ship" in results[2]["content"]


@pytest.mark.django_db
def test_max_tokens_keeps_the_partial_answer_and_says_it_was_cut(fake):
    fake.add(anthropic_message("Refunds are possible within thirty", stop_reason="max_tokens"))
    turn = run_turn_here("How do refunds work?")

    assert turn.status == "incomplete"
    assert turn.error == "The answer was cut short because it reached the length limit."
    assert Message.objects.get(turn=turn, role="assistant").content == "Refunds are possible within thirty"


@pytest.mark.django_db
def test_a_refusal_stop_reason_ends_the_turn_with_the_refusal_message(fake):
    fake.add(anthropic_message([], stop_reason="refusal"))
    turn = run_turn_here("Something not allowed")

    assert turn.status == "incomplete" and turn.error == "The assistant could not answer this request."


ERRORS = {
    # The reply quotes the key, so that the test sees it redacted.
    "bad key": (anthropic_error(401, "authentication_error", f"invalid x-api-key {KEY}"),
                "the AI service rejected its credentials"),
    "unknown model": (anthropic_error(404, "not_found_error", "model: claude-test"),
                      "does not know the configured model"),
    "context too long": (anthropic_error(400, "invalid_request_error",
                                         "prompt is too long: 208310 tokens > 200000 maximum"), "grown too long"),
    "request too large": (anthropic_error(413, "request_too_large", "Request exceeds the maximum allowed size."),
                          "grown too long"),
    "overloaded": (anthropic_error(529, "overloaded_error", "Overloaded"), "unavailable right now"),
    "malformed JSON": (Reply(200, b"<html>upstream error</html>"), "could not read"),
    "truncated JSON": (malformed_json, "could not read"),
    "no content": (Reply(200, {"id": "msg_x", "type": "message", "role": "assistant"}), "could not read"),
}


@pytest.mark.django_db
def test_each_provider_error_is_a_clear_distinct_message_without_the_key(fake, caplog):
    caplog.set_level(logging.INFO)
    seen = run_error_cases(fake, ERRORS, secret=KEY)
    assert len({seen[c] for c in ("bad key", "unknown model", "context too long", "overloaded",
                                  "malformed JSON")}) == 5
    logged = caplog.text
    assert "anthropic call failed (auth): HTTP 401 authentication_error: invalid x-api-key" in logged
    assert "anthropic call failed (unknown_model): HTTP 404 not_found_error: model: claude-test" in logged
    assert "(context_length)" in logged and "(bad_response)" in logged
    assert KEY not in logged


@pytest.mark.django_db
def test_base_url_ending_in_v1_is_accepted_too(fake, conversations_settings):
    conversations_settings.update(BASE_URL=fake.url + "/")
    fake.add(anthropic_message("Hello."))
    assert run_turn_here("hi").status == "completed"
    assert fake.requests[0]["path"] == "/v1/messages"


@pytest.mark.django_db
def test_a_follow_up_turn_sends_the_earlier_exchange_starting_with_the_user(fake):
    fake.add(anthropic_tool_use(("toolu_1", "current_time", {"city": "Tokyo"})), anthropic_message("It is 9pm."),
             anthropic_message("You are welcome."))
    conversation = Conversation.objects.create(owner_token="visitor")
    run_turn_here("Time in Tokyo?", conversation=conversation)
    run_turn_here("Thanks!", conversation=conversation)

    messages = fake.requests[2]["json"]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert messages[2]["content"][0]["tool_use_id"] == "toolu_1"
    assert messages[3] == {"role": "assistant", "content": "It is 9pm."}
    assert messages[4] == {"role": "user", "content": "Thanks!"}


@pytest.mark.django_db
def test_a_question_after_a_failed_turn_is_merged_into_one_user_message(fake):
    fake.add(anthropic_error(400, "invalid_request_error", "Bad request"), anthropic_message("Hi again."))
    conversation = Conversation.objects.create(owner_token="visitor")
    assert run_turn_here("First try", conversation=conversation).status == "failed"
    assert run_turn_here("Second try", conversation=conversation).status == "completed"

    assert fake.requests[-1]["json"]["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "First try"}, {"type": "text", "text": "Second try"}]}]


@pytest.mark.django_db
def test_overloaded_529_is_retried_within_the_budget(fake, conversations_settings):
    conversations_settings.update(MAX_ATTEMPTS=3)
    fake.add(anthropic_error(529, "overloaded_error", "Overloaded"), anthropic_message("Here I am."))
    turn = run_turn_here("Are you there?")

    assert turn.status == "completed"
    outcomes = list(CallRecord.objects.filter(turn=turn).order_by("attempt").values_list("attempt", "status_code"))
    assert outcomes == [(1, 529), (2, 200)]
