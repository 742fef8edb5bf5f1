"""Bounds on what one model reply may make the site do, against hostile fake provider servers
on 127.0.0.1 and a real worker: a reply that streams without end, and a reply that asks for
more tool calls than a step may run."""

import json
import time
from decimal import Decimal

import pytest
from django.core.cache import cache

from conversations.core.sentences import deadline_message, length_message
from conversations.models import CallRecord, Message, Turn
from conversations.tools import tool
from tests.support.fake_stream import anthropic_stream, endless, openai_stream, streaming
from tests.support.fake_wire import run_turn_here
from tests.support.fakes import FakeProvider, openai_text, openai_tool_calls
from tests.support.helpers import api_post, make_client, poll_until_done, redis_values, start_turn
from tests.providers.test_streamed_calls import silent_until_closed, stop_when_streaming

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


@pytest.mark.parametrize("what", ["text", "tool call"])
def test_an_unstreamed_reply_past_the_limit_is_cut_there_too(hostile, conversations_settings, what):
    conversations_settings.update(STREAM=False, TOOLS=["chatproject.tools.current_time"])
    hostile.add(openai_text("y" * 50_000) if what == "text" else
                openai_tool_calls(("current_time", {"city": "T" * 50_000})))
    turn = run_turn_here("Tell me everything.")

    assert (turn.status, turn.error, turn.tool_calls) == ("incomplete", length_message(), 0)
    (row,) = turn.messages.filter(role="assistant")
    assert row.content == ("y" * LIMIT if what == "text" else "") and row.tool_calls == []


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


# -- tool calls per reply (issue 22, item 4) ----------------------------------------------

@tool
def send_voucher(email: str) -> str:
    """A tool with a side effect, counting its runs in the shared cache (the work horse is forked)."""
    try:
        cache.incr("test:vouchers")
    except ValueError:
        cache.set("test:vouchers", 1)
    return "sent"


@tool
def slow_lookup(query: str) -> str:
    """A tool that takes a while."""
    time.sleep(0.7)
    return "found"


def test_a_reply_asking_for_hundreds_of_tool_calls_runs_only_the_limit_and_the_model_hears_of_the_rest(
        hostile, conversations_settings, worker):
    conversations_settings.update(TOOLS=["tests.security.test_security_bounds.send_voucher"], MAX_TOOL_CALLS_PER_STEP=40,
                                  STREAM=False, PUBLISH_INTERVAL=1)
    hostile.add(openai_tool_calls(*[("send_voucher", {"email": f"a{n}@example.com"}) for n in range(300)]),
                openai_text("Done."))
    client = make_client()
    started = start_turn(client, "Send everyone a voucher.")
    worker()
    final = poll_until_done(client, started["poll_url"])

    assert final["status"] == "completed" and cache.get("test:vouchers") == 40
    turn = started["id"]
    assert Message.objects.filter(turn_id=turn, role="tool").count() == 40
    records = list(CallRecord.objects.filter(turn_id=turn, kind="tool").values_list("name", "outcome", "detail"))
    assert len(records) == 41 and records[-1][:2] == ("260 tool calls", "skipped")
    assert records[-1][2].startswith("not run, over the limit of 40 tool calls per reply: send_voucher, send_voucher")
    # The model is told of every call it asked for: 40 results, then an error result for each other.
    results = [m for m in hostile.requests[1]["json"]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in results[:40]] == ["sent"] * 40 and len(results) == 300
    assert set(m["content"] for m in results[40:]) == {
        "Error: this tool call was not run: one reply may ask for at most 40 tool calls. Ask again for what is "
        "still needed."}
    # A handful of publishes, not one per call: the start, the batch (at most every second), the answer, the end.
    assert final["version"] <= 12


def test_tools_that_outlast_the_turn_stop_it_with_one_record_of_what_was_not_run(hostile, conversations_settings,
                                                                                 worker):
    conversations_settings.update(TOOLS=["tests.security.test_security_bounds.slow_lookup"], MAX_TOOL_CALLS_PER_STEP=0,
                                  STREAM=False, JOB_TIMEOUT=8, DEADLINE_MARGIN=3, TOOL_RESERVE=1)
    hostile.add(openai_tool_calls(*[("slow_lookup", {"query": f"q{n}"}) for n in range(40)]))
    client = make_client()
    started = start_turn(client, "Look everything up.")
    worker()
    final = poll_until_done(client, started["poll_url"])

    assert (final["status"], final["error"]) == ("incomplete", deadline_message())
    turn = started["id"]
    ran = Message.objects.filter(turn_id=turn, role="tool").count()
    assert 3 <= ran <= 6
    records = list(CallRecord.objects.filter(turn_id=turn, kind="tool").values_list("name", "outcome", "detail"))
    # Each call that started had a row (the last may have been cut to the time left), then one record for the rest.
    assert len(records) == ran + 1 and set(r[1] for r in records[:-1]) <= {"ok", "timeout"}
    assert records[-1][1] == "skipped"
    assert records[-1][0] == f"{40 - ran} tool calls"
    assert records[-1][2].startswith("not run, no time left for a tool: slow_lookup, slow_lookup")
    assert len(hostile.requests) == 1


# -- usage a call never reported (issue 22, item 6) ---------------------------------------

QUESTION = "Tell me everything about refunds, returns and vouchers, in detail. " * 6  # 408 characters


def test_a_turn_stopped_mid_stream_counts_an_estimate_in_the_budget_the_cost_and_the_admin(
        hostile, conversations_settings, worker, admin_client):
    # OpenAI-compatible providers send the usage only in the last chunk: a Stop never gets it.
    conversations_settings.update(DAILY_TOKEN_BUDGET=100, TURN_TOKEN_RESERVE=0, PUBLISH_INTERVAL=0.05,
                                  PRICES={"m": {"input": "1", "output": "2"}})
    hostile.add(streaming(openai_stream(pieces=["Half ", "an ", "answer "] + ["more "] * 50), interval=0.1))
    client = make_client()
    started = start_turn(client, QUESTION)
    thread, _marks = stop_when_streaming(hostile, lambda: api_post(client, started["cancel_url"]), events=4)
    worker()
    thread.join(5)

    turn = Turn.objects.get(pk=started["id"])
    assert turn.status == "cancelled" and turn.usage_estimated
    assert turn.input_tokens >= len(QUESTION) // 4 and turn.output_tokens >= len("Half an answer ") // 4
    assert turn.cost == Decimal(turn.input_tokens * 1 + turn.output_tokens * 2) / 1_000_000
    # The daily budget counted it: the same visitor's next turn is refused.
    conversation = api_post(client, "/api/conversations/").json()
    refused = api_post(client, f"/api/conversations/{conversation['id']}/turns/", {"content": "And again?"})
    assert refused.status_code == 429
    # The admin says the figure is an estimate.
    page = admin_client.get("/admin/conversations/turn/").content.decode()
    assert f"{turn.input_tokens} / {turn.output_tokens} (estimated)" in page


def test_a_turn_stopped_before_any_text_counts_an_estimate_of_its_prompt(hostile, worker):
    hostile.add(silent_until_closed)
    client = make_client()
    started = start_turn(client, QUESTION)
    thread, _marks = stop_when_streaming(hostile, lambda: api_post(client, started["cancel_url"]), events=0)
    worker()
    thread.join(5)

    turn = Turn.objects.get(pk=started["id"])
    assert turn.status == "cancelled" and turn.usage_estimated
    assert turn.input_tokens >= len(QUESTION) // 4 and turn.output_tokens == 0


def test_a_turn_whose_job_is_killed_mid_stream_counts_an_estimate_of_what_it_showed(worker, conversations_settings):
    conversations_settings.update(PROVIDER="tests.providers.test_streamed_calls.TricklingProvider", TOOLS=[], JOB_TIMEOUT=3,
                                  DEADLINE_MARGIN=1, PUBLISH_INTERVAL=0.01)
    client = make_client()
    started = start_turn(client, QUESTION)
    worker()  # RQ's job timeout interrupts the stream; the final write keeps the text shown

    turn = Turn.objects.get(pk=started["id"])
    (kept,) = turn.messages.filter(role="assistant").values_list("content", flat=True)
    assert turn.status == "failed" and turn.usage_estimated and len(kept) > 100
    assert turn.input_tokens >= len(QUESTION) // 4 and turn.output_tokens == -(-len(kept) // 4)


@pytest.mark.parametrize("then", ["end", "hang"])
def test_a_stream_cut_off_or_timed_out_before_its_usage_counts_an_estimate(hostile, conversations_settings, then):
    conversations_settings.update(STREAM_IDLE_TIMEOUT=1)
    hostile.add(streaming(openai_stream(pieces=["Refunds ", "are ", "paid "], done=False)[:-2], then=then))
    turn = run_turn_here(QUESTION)

    assert turn.status == "incomplete" and turn.usage_estimated
    assert turn.input_tokens >= len(QUESTION) // 4 and turn.output_tokens == 5  # "Refunds are paid ": 17 characters


def test_a_call_that_reports_its_usage_is_counted_as_reported(hostile):
    hostile.add(streaming(openai_stream("Refunds are paid within 30 days.", prompt_tokens=123, completion_tokens=9)))
    turn = run_turn_here(QUESTION)
    assert (turn.status, turn.input_tokens, turn.output_tokens, turn.usage_estimated) == ("completed", 123, 9, False)
