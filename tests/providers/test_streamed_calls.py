"""Streamed model calls against fake servers speaking both wire formats: the answer arrives as
it is written, every way a stream can go wrong still ends the turn with the text received so
far and a sentence (within the call's limit), and Stop shuts the call in flight."""

import json
import threading
import time

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from conversations.core.sentences import timeout_message
from conversations.models import CallRecord, Turn
from conversations.providers import BaseProvider
from conversations.engine.runner import cut_short_message
from tests.support.fake_stream import anthropic_error_event, anthropic_stream, openai_stream, refuses_streaming, streaming
from tests.support.fake_wire import run_turn_here
from tests.support.fakes import FakeProvider, openai_text, retry_after, unavailable
from tests.support.helpers import Poller, api_post, make_client, start_turn

pytestmark = pytest.mark.django_db(transaction=True)

ANSWER = "Refunds are paid within 30 days of the return reaching us."
WIRES = {
    "openai": (openai_stream, lambda fake: fake.url),
    "anthropic": (anthropic_stream, lambda fake: f"http://127.0.0.1:{fake.port}"),
}


@pytest.fixture(params=sorted(WIRES))
def wire(request, conversations_settings):
    """``(events(text, **kw), fake)`` for one wire format, with the suite's settings pointed at the fake."""
    events, base = WIRES[request.param]
    with FakeProvider() as fake:
        conversations_settings.update(PROVIDER=request.param, BASE_URL=base(fake), API_KEY="sk-test", MODEL="m",
                                      CALL_TIMEOUT=3, STREAM_IDLE_TIMEOUT=1, MAX_ATTEMPTS=2, TOOLS=[])
        fake.name = request.param
        yield events, fake


def timed_turn(content="How do refunds work?"):
    started = time.monotonic()
    turn = run_turn_here(content)
    return turn, time.monotonic() - started


def answer_of(turn):
    return list(turn.messages.filter(role="assistant").values_list("content", flat=True))


def test_the_request_asks_for_a_stream_and_the_answer_is_read_from_it(wire):
    events, fake = wire
    fake.add(streaming(events(ANSWER, calls=[("call_1", "search_faq", {"query": "refunds"})])),
             streaming(events(ANSWER)))
    turn, _ = timed_turn()

    body = fake.requests[0]["json"]
    assert body["stream"] is True
    if fake.name == "openai":
        assert body["stream_options"] == {"include_usage": True}
    assert {k.lower(): v for k, v in fake.requests[0]["headers"].items()}["accept"] == "text/event-stream"
    assert turn.status == "completed" and answer_of(turn) == [ANSWER, ANSWER]
    assert turn.tool_calls == 1 and (turn.input_tokens, turn.output_tokens) != (None, None)
    # The tool call's arguments came in 7-character fragments and were put back together.
    assert fake.requests[1]["raw"].count(b"refunds") >= 1


@pytest.mark.parametrize("fault, then, after", [
    ("stalls", "hang", 0),            # a few events, then silence: the idle limit ends it
    ("ends early", "end", 0),         # the body ends without [DONE] / message_stop
    ("resets", "reset", 0),           # the connection is reset part-way
    ("malformed", "end", 1),          # an event that is not JSON
])
def test_a_stream_that_breaks_off_keeps_the_text_received_and_says_it_was_cut_short(wire, fault, then, after):
    events, fake = wire
    pieces = ["Refunds ", "are ", "paid "]
    broken = events(pieces=pieces, done=False)[:-2]  # up to the text, without finish and usage
    if after == 1:
        broken.append(b"data: {not json\n\n")
    fake.add(streaming(broken, then=then))
    turn, elapsed = timed_turn()

    assert turn.status == "incomplete" and turn.error == cut_short_message()
    assert answer_of(turn) == ["Refunds are paid "]
    assert len(fake.requests) == 1  # never retried once text was shown
    assert elapsed < 1 + 0.25 + 1.5  # the idle limit (1 s) and generous slack for the rest of the turn
    (record,) = CallRecord.objects.filter(turn=turn)
    assert record.outcome in ("timeout", "connection_error", "bad_response")


# An error event after some text: what the service said, in each wire's words and behind a
# gateway (LiteLLM wraps the upstream's words in its own message, code "500").
ERROR_EVENTS = {
    "an outage": ("overloaded_error", "Overloaded", "server_error", "The server had an error", None,
                  "The AI service is unavailable right now. Please try again in a minute."),
    "a content filter": ("invalid_request_error", "Output blocked by content filtering policy", "content_filter",
                         "The response was filtered due to the prompt triggering Azure OpenAI's content "
                         "management policy.", "content_filter", "The assistant could not answer this request."),
    "an invalid request": ("invalid_request_error", "messages: text content blocks must be non-empty",
                           "invalid_request_error", "Invalid value for 'messages'.", None,
                           "The AI service rejected the request. Please try again or start a new conversation."),
    "a refusal wrapped by a gateway": (None, "litellm.ContentPolicyViolationError: litellm.ContentPolicyViolationError:"
                                       " AzureException - The response was filtered due to the prompt triggering "
                                       "Azure OpenAI's content management policy.", None, None, "500",
                                       "The assistant could not answer this request."),
}


@pytest.mark.parametrize("case", list(ERROR_EVENTS))
def test_an_error_event_after_some_text_keeps_the_text_and_says_what_the_service_said(wire, case):
    events, fake = wire
    anthropic_kind, message, openai_type, openai_message, code, sentence = ERROR_EVENTS[case]
    broken = events(pieces=["Refunds ", "are ", "paid "], done=False)[:-2]
    if anthropic_kind is None:  # a gateway's own error event: OpenAI's shape whatever the wire
        broken.append((None, json.dumps({"error": {"message": message, "type": None, "param": None, "code": code}})))
    elif fake.name == "anthropic":
        broken.append(anthropic_error_event(anthropic_kind, message))
    else:
        broken.append((None, json.dumps({"error": {"message": openai_message, "type": openai_type, "code": code}})))
    fake.add(streaming(broken))
    turn, _ = timed_turn()

    assert (turn.status, turn.error) == ("incomplete", sentence)
    assert answer_of(turn) == ["Refunds are paid "]
    assert len(fake.requests) == 1


def test_a_stream_that_trickles_past_the_total_limit_is_ended_there_with_its_text(wire, conversations_settings):
    events, fake = wire
    conversations_settings.update(CALL_TIMEOUT=2, STREAM_IDLE_TIMEOUT=1)
    fake.add(streaming(events(pieces=["word "] * 100), interval=0.3))  # 30 s of text, each event within idle
    turn, elapsed = timed_turn()

    assert turn.status == "incomplete" and turn.error == cut_short_message()
    assert answer_of(turn)[0].startswith("word word ")
    (record,) = CallRecord.objects.filter(turn=turn)
    assert record.outcome == "timeout" and 2 <= record.duration <= 2 + 0.25


def test_keep_alive_comments_empty_events_and_one_large_event_are_read_as_they_should(wire, conversations_settings):
    events, fake = wire
    conversations_settings.update(MAX_REPLY_CHARS=300_000)  # the event is large, the reply within its limit
    big = "x" * 200_000
    stream = events(pieces=["Hello ", big])
    stream[1:1] = [b": keep-alive\n\n", b"\n\n", b"event: ping\ndata: {\"type\": \"ping\"}\n\n"
                   if fake.name == "anthropic" else b": ping\n\n"]
    fake.add(streaming(stream))
    turn, _ = timed_turn()
    assert turn.status == "completed" and answer_of(turn) == ["Hello " + big]


def test_an_event_larger_than_a_mebibyte_ends_the_stream(wire):
    events, fake = wire
    fake.add(streaming(events(pieces=["Start ", "y" * (1024 * 1024 + 10)])))
    turn, _ = timed_turn()
    assert turn.status == "incomplete" and answer_of(turn) == ["Start "]


@pytest.mark.parametrize("refusal", [retry_after(0.2), unavailable(500)])
def test_a_429_or_500_before_the_stream_starts_is_retried_within_the_budget(wire, refusal):
    events, fake = wire
    fake.add(refusal, streaming(events(ANSWER)))
    turn, _ = timed_turn()
    assert turn.status == "completed" and answer_of(turn) == [ANSWER] and len(fake.requests) == 2


def test_an_error_event_before_any_text_is_retried_like_the_status_it_stands_for(wire):
    events, fake = wire
    overloaded = anthropic_error_event() if fake.name == "anthropic" else \
        (None, '{"error": {"message": "overloaded", "type": "server_error"}}')
    fake.add(streaming([overloaded]), streaming(events(ANSWER)))
    turn, _ = timed_turn()
    assert turn.status == "completed" and answer_of(turn) == [ANSWER] and len(fake.requests) == 2


def test_an_endpoint_that_refuses_to_stream_is_a_clear_failure(wire):
    _events, fake = wire
    fake.add(refuses_streaming())
    turn, elapsed = timed_turn()
    assert turn.status == "failed"
    assert turn.error == "The assistant is not set up correctly: the AI service would not stream its answer."
    assert elapsed < 2


def test_an_endpoint_that_answers_unstreamed_is_read_all_the_same(conversations_settings):
    with FakeProvider() as fake:
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="k", TOOLS=[])
        fake.add(openai_text(ANSWER))  # a JSON body although a stream was asked for
        turn, _ = timed_turn()
    assert turn.status == "completed" and answer_of(turn) == [ANSWER]


def test_streaming_can_be_switched_off(conversations_settings):
    with FakeProvider() as fake:
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="k", TOOLS=[], STREAM=False)
        fake.add(openai_text(ANSWER))
        turn, _ = timed_turn()
    assert "stream" not in fake.requests[0]["json"] and answer_of(turn) == [ANSWER]


# -- what the visitor sees ---------------------------------------------------------------------

def test_the_visitor_sees_the_answer_grow_then_the_saved_message(worker, conversations_settings):
    words = [f"word{n} " for n in range(12)]
    with FakeProvider() as fake:
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="k", TOOLS=[],
                                      PUBLISH_INTERVAL=0.1)
        fake.add(streaming(openai_stream(pieces=words), interval=0.1))
        client = make_client()
        started = start_turn(client, "Count for me")
        with Poller(client, started["poll_url"], interval=0.02) as poller:
            worker()

    growing = [s["messages"][-1] for s in poller.states if s["messages"][-1].get("streaming")]
    assert len(growing) >= 3
    texts = [m["content"] for m in growing]
    assert texts == sorted(texts, key=len) and all("".join(words).startswith(t) for t in texts)
    assert all(m["id"] is None and m["role"] == "assistant" for m in growing)
    final = poller.final
    assert final["done"] and final["messages"][-1]["content"] == "".join(words)
    assert isinstance(final["messages"][-1]["id"], int) and "streaming" not in final["messages"][-1]
    versions = [s["version"] for s in poller.states]
    assert versions == sorted(set(versions))


def test_the_demo_model_streams_word_by_word(worker, conversations_settings):
    conversations_settings.update(DEMO_DELAY=1.0, PUBLISH_INTERVAL=0.1)
    client = make_client()
    started = start_turn(client, "Who are you?")
    with Poller(client, started["poll_url"], interval=0.02) as poller:
        worker()
    growing = [s for s in poller.states if s["messages"][-1].get("streaming")]
    assert len(growing) >= 3 and poller.final["status"] == "completed"


# -- Stop --------------------------------------------------------------------------------------

def stop_when_streaming(fake, stop, *, events=3):
    """In a thread: once ``events`` events have left the fake (0: once its request arrived), call
    ``stop()`` and note when."""
    marks = {}

    def run():
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (len(fake.sent_at) < events if events else not fake.requests):
            time.sleep(0.005)
        marks["stopped_at"] = time.monotonic()
        stop()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, marks


def silent_until_closed(handler):
    """Read the request, answer nothing, note when the client closes the connection."""
    from tests.support.fake_stream import _client_left

    _client_left(handler, 3600)


@pytest.mark.parametrize("streamed", [True, False])
@pytest.mark.parametrize("via", ["api", "admin"])
def test_stop_closes_the_call_in_flight_within_half_a_second_and_keeps_the_text(any_worker, conversations_settings,
                                                                               streamed, via):
    with FakeProvider() as fake:
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="k", TOOLS=[],
                                      CALL_TIMEOUT=5, STREAM=streamed, PUBLISH_INTERVAL=0.05)
        fake.add(streaming(openai_stream(pieces=["Half ", "an ", "answer "] + ["more "] * 50), interval=0.1)
                 if streamed else silent_until_closed)
        client = make_client()
        started = start_turn(client, "Tell me everything")
        if via == "api":
            def stop():
                assert api_post(client, started["cancel_url"]).status_code == 202
        else:
            admin = Client()
            admin.force_login(get_user_model().objects.create_superuser("root", password="pw-123456789"))

            def stop():
                assert admin.post(reverse("admin:conversations_turn_cancel", args=[started["id"]])).status_code == 302
        thread, marks = stop_when_streaming(fake, stop, events=4 if streamed else 0)
        any_worker()
        thread.join(5)

    assert fake.closed_at is not None and fake.closed_at - marks["stopped_at"] < 0.5
    turn = Turn.objects.get(pk=started["id"])
    assert turn.status == "cancelled" and turn.model_calls == (1 if streamed else 0)
    if streamed:
        kept = answer_of(turn)[0]
        assert kept.startswith("Half an answer ") and kept != "Half an answer " + "more " * 50
    (record,) = CallRecord.objects.filter(turn=turn, kind="model")
    assert record.outcome == "cancelled" and record.duration < 5
    assert len(fake.requests) == 1  # and no further call started


def test_a_stop_during_the_wait_before_a_retry_ends_the_turn_at_once(any_worker, conversations_settings):
    with FakeProvider() as fake:
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="k", TOOLS=[],
                                      MAX_ATTEMPTS=3, JOB_TIMEOUT=30, DEADLINE_MARGIN=4)
        fake.add(retry_after(10))
        client = make_client()
        started = start_turn(client)
        thread, marks = stop_when_streaming(fake, lambda: api_post(client, started["cancel_url"]), events=0)
        began = time.monotonic()
        any_worker()
        thread.join(5)
    assert time.monotonic() - began < 5 and len(fake.requests) == 1
    assert Turn.objects.get(pk=started["id"]).status == "cancelled"


# -- the safety nets keep what the visitor saw ---------------------------------------------------

def test_a_work_horse_killed_mid_stream_keeps_the_text_shown(conversations_settings):
    import os
    import signal

    import django_rq
    from django.db import connections

    with FakeProvider() as fake:
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="k", TOOLS=[],
                                      PUBLISH_INTERVAL=0.01)
        fake.add(streaming(openai_stream(pieces=["Shown ", "before ", "the ", "kill "], done=False)[:5],
                           then="hang", interval=0.05))
        client = make_client()
        started = start_turn(client, "Go on")
        connections.close_all()
        worker = django_rq.get_worker("default")
        deadline = time.monotonic() + 10

        def kill():
            while time.monotonic() < deadline and not (len(fake.sent_at) >= 5 and worker.horse_pid):
                time.sleep(0.01)
            time.sleep(0.1)  # the last piece published
            os.kill(worker.horse_pid, signal.SIGKILL)

        killer = threading.Thread(target=kill, daemon=True)
        killer.start()
        worker.work(burst=True)
        killer.join(5)

    final = client.get(started["poll_url"]).json()
    assert final["done"] and final["status"] == "failed"
    assert final["messages"][-1]["content"] == "Shown before the kill "
    assert isinstance(final["messages"][-1]["id"], int)
    assert answer_of(Turn.objects.get(pk=started["id"])) == ["Shown before the kill "]


class TricklingProvider(BaseProvider):
    """A badly written provider: it streams forever and ignores the turn's budget."""

    name = "trickling"

    def complete(self, messages, tools, on_text=None):
        for _ in range(10_000):
            time.sleep(0.05)
            on_text("slow ")


def test_rqs_job_timeout_mid_stream_keeps_the_text_shown(worker, conversations_settings):
    conversations_settings.update(PROVIDER=f"{__name__}.TricklingProvider", TOOLS=[], JOB_TIMEOUT=3,
                                  DEADLINE_MARGIN=1, PUBLISH_INTERVAL=0.01)
    client = make_client()
    started = start_turn(client, "Take your time")
    worker()

    turn = Turn.objects.get(pk=started["id"])
    assert (turn.status, turn.error) == ("failed", timeout_message())
    (kept,) = answer_of(turn)
    assert kept.startswith("slow slow ") and len(kept) > 100
    final = client.get(started["poll_url"]).json()
    assert final["done"] and final["messages"][-1]["content"] == kept


def test_the_growing_answer_is_published_at_most_every_publish_interval(worker, conversations_settings):
    pieces = [f"w{n} " for n in range(40)]
    with FakeProvider() as fake:
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="k", TOOLS=[],
                                      PUBLISH_INTERVAL=0.25)
        fake.add(streaming(openai_stream(pieces=pieces), interval=0.02))  # 40 pieces in about 0.8 s
        client = make_client()
        started = start_turn(client, "Count for me")
        with Poller(client, started["poll_url"], interval=0.02) as poller:
            worker()

    final = poller.final
    assert final["done"] and final["messages"][-1]["content"] == "".join(pieces)
    # Every publish takes the next version: queued, running, the saved answer and the final state
    # are four; the rest are the growing answer's, at most one per PUBLISH_INTERVAL.
    streamed_for = fake.sent_at[-1] - fake.sent_at[0]
    growing = final["version"] - 4
    assert 1 <= growing <= streamed_for / 0.25 + 2  # one more for the time the request took
    assert any(s["messages"][-1].get("streaming") for s in poller.states)


def test_only_the_first_choice_of_an_openai_stream_is_the_answer(conversations_settings):
    import json

    def chunk(index, content):
        return None, json.dumps({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1,
                                 "model": "fake-model",
                                 "choices": [{"index": index, "delta": {"content": content}, "finish_reason": None}]})

    events = openai_stream(pieces=[])  # the role chunk, finish reason, usage and [DONE]
    # A server asked for several choices (n > 1) sends each choice's deltas in chunks of their own.
    events[1:1] = [chunk(0, "First "), chunk(1, "Other "), chunk(0, "choice."), chunk(2, "Third.")]
    with FakeProvider() as fake:
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="k", TOOLS=[])
        fake.add(streaming(events))
        turn, _ = timed_turn()
    assert turn.status == "completed" and answer_of(turn) == ["First choice."]


def test_the_last_words_of_a_streamed_reply_are_shown_before_its_row_is_saved(wire):
    """A reply's last words arrive within ``PUBLISH_INTERVAL`` of the last publish; the visitor
    sees them as soon as the stream ends, not after the reply's row is written (which, with many
    turns in one worker, may wait for a pooled database connection)."""
    from conversations.conf import get_config
    from conversations.core.budget import TurnClock
    from conversations.engine.runner import TurnRunner
    from conversations.infra import state
    from conversations.models import Conversation, Message

    events, fake = wire
    fake.add(streaming(events(ANSWER)))  # at once: every word lands within one PUBLISH_INTERVAL
    conversation = Conversation.objects.create(owner_token="visitor-token")
    turn = Turn.objects.create(conversation=conversation)
    Message.objects.create(conversation=conversation, turn=turn, role="user", content="How do refunds work?")
    shown = []

    def publisher(data):
        saved = Message.objects.filter(turn=turn, role="assistant").exists()
        shown.append((data["messages"][-1], saved))
        return state.publish(data)

    cfg = get_config()
    TurnRunner(turn, clock=TurnClock(cfg["JOB_TIMEOUT"], cfg["DEADLINE_MARGIN"]), config=cfg,
               publisher=publisher).run()

    whole = [(last, saved) for last, saved in shown if last["role"] == "assistant" and last["content"] == ANSWER]
    assert whole[0] == ({"id": None, "role": "assistant", "content": ANSWER, "streaming": True}, False)
    assert whole[-1][0]["id"] is not None and whole[-1][1]  # then the saved row, as before
    assert state.read(turn.id)["messages"][-1]["content"] == ANSWER
