"""Bounds on what one model reply may make the site do, against hostile fake provider servers
on 127.0.0.1 and a real worker: a reply that streams without end, and a reply that asks for
more tool calls than a step may run."""

import json

import pytest

from conversations.endings import length_message
from conversations.models import CallRecord, Message, Turn
from tests.fake_stream import anthropic_stream, endless, openai_stream, streaming
from tests.fake_wire import run_turn_here
from tests.fakes import FakeProvider
from tests.helpers import make_client, poll_until_done, redis_values, start_turn

pytestmark = pytest.mark.django_db(transaction=True)

LIMIT = 3000
PIECE = "x" * 500


@pytest.fixture
def hostile(conversations_settings):
    with FakeProvider() as fake:
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="sk-test", MODEL="m", TOOLS=[],
                                      MAX_REPLY_CHARS=LIMIT, CALL_TIMEOUT=5, STREAM_IDLE_TIMEOUT=2, MAX_ATTEMPTS=1)
        yield fake


def test_a_reply_streaming_without_end_is_cut_at_the_limit_and_what_is_saved_and_served_stays_bounded(
        hostile, worker):
    text = openai_stream(pieces=[PIECE])
    hostile.add(streaming(endless(text[:1], text[1])))
    client = make_client()
    started = start_turn(client, "Tell me everything.")
    worker()
    poll = client.get(started["poll_url"])
    final = poll.json()

    assert (final["status"], final["error"]) == ("incomplete", length_message())
    assert final["messages"][-1]["content"] == "x" * LIMIT
    assert len(poll.content) < LIMIT + 4000
    assert max(len(value) for value in redis_values()) < 3 * LIMIT + 4000
    (row,) = Message.objects.filter(turn_id=started["id"], role="assistant")
    assert row.content == "x" * LIMIT
    (record,) = CallRecord.objects.filter(turn_id=started["id"])
    assert record.detail == f"the reply's text passed {LIMIT} characters"
    assert hostile.closed_at is not None  # the worker hung up on it


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_a_tool_call_whose_arguments_never_end_is_cut_at_the_limit_and_never_run(hostile, conversations_settings,
                                                                                 wire):
    conversations_settings.update(PROVIDER=wire, TOOLS=["chatproject.tools.current_time"])
    if wire == "anthropic":
        conversations_settings.update(BASE_URL=f"http://127.0.0.1:{hostile.port}")
        events = anthropic_stream(calls=[("toolu_1", "current_time", {"city": "Tokyo"})], done=False)
        start = events[:3]  # message_start, ping, the tool block's start
        again = ("content_block_delta", json.dumps({"type": "content_block_delta", "index": 0, "delta": {
            "type": "input_json_delta", "partial_json": PIECE}}))
    else:
        events = openai_stream(calls=[("call_1", "current_time", {"city": "Tokyo"})])
        start = events[:2]  # the role, the call's id and name
        again = (None, json.dumps({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": PIECE}}]}}]}))
    hostile.add(streaming(endless(start, again)))
    turn = run_turn_here("What time is it?")

    assert (turn.status, turn.error, turn.tool_calls) == ("incomplete", length_message(), 0)
    assert not turn.messages.filter(role="tool").exists()
    assert all(len(json.dumps(m.tool_calls)) < LIMIT for m in turn.messages.all())
    (record,) = CallRecord.objects.filter(turn=turn)
    assert record.detail == f"a tool call's arguments passed {LIMIT} characters"
    assert len(hostile.requests) == 1  # not asked again
