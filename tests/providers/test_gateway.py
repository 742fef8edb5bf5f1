"""Behind an LLM gateway (the LiteLLM proxy, for one), for both wire formats: what a gateway
sends where a vendor would answer directly (``tests/support/fake_gateway.py``), and what the visitor
reads and the operator finds in the log and the timeline."""

import logging
import re

import pytest

from conversations.models import CallRecord
from tests.support.fake_gateway import (
    REFUSAL, answers_unstreamed, empty_stream, error_under_200, gateway_error, html_error, invalid_model,
    json_as_stream, rate_limited, upstream_ignores_stream, withholds_headers, wrapped_refusal,
)
from tests.support.fake_stream import anthropic_stream, openai_stream, streaming
from tests.support.fake_wire import anthropic_error, anthropic_message, openai_error, run_turn_here
from tests.support.fakes import FakeProvider, Reply, full_accept_queue, hang, never_read, openai_text, trickle_body

pytestmark = pytest.mark.django_db(transaction=True)

ANSWER = "Refunds are paid within 30 days of the return reaching us."
SECRET = "sk-gateway-secret-0123456789"
STREAMS = {"openai": openai_stream, "anthropic": anthropic_stream}
UNSTREAMED = {"openai": openai_text, "anthropic": anthropic_message}


@pytest.fixture(params=sorted(STREAMS))
def gateway(request, conversations_settings):
    """A fake gateway speaking one wire format, with the suite's settings pointed at it: 3 s per
    call, 1 s of idle between the bytes of a stream, two attempts."""
    with FakeProvider() as fake:
        base = fake.url if request.param == "openai" else f"http://127.0.0.1:{fake.port}"
        conversations_settings.update(PROVIDER=request.param, BASE_URL=base, API_KEY=SECRET, MODEL="m",
                                      CALL_TIMEOUT=3, STREAM_IDLE_TIMEOUT=1, MAX_ATTEMPTS=2, TOOLS=[])
        fake.wire = request.param
        yield fake


def answer_of(turn):
    return list(turn.messages.filter(role="assistant").values_list("content", flat=True))


def details(turn):
    return list(CallRecord.objects.filter(turn=turn, kind="model").order_by("id").values_list("detail", flat=True))


# -- 3. before the first byte a stream waits as long as any call -----------------------------------

def test_a_stream_whose_gateway_withholds_the_headers_past_the_idle_limit_is_still_answered(gateway):
    """The gateway retries upstream for 1.8 s, past the 1 s idle limit, within the 3 s call limit."""
    gateway.add(withholds_headers(1.8, streaming(STREAMS[gateway.wire](ANSWER))))
    turn = run_turn_here("How do refunds work?")

    assert turn.status == "completed" and answer_of(turn) == [ANSWER]
    assert len(gateway.requests) == 1  # no time-out, no second request sent


def test_a_rate_limited_upstream_behind_a_gateway_reads_busy_not_too_long(gateway):
    gateway.add(withholds_headers(1.5, rate_limited(0.2)), withholds_headers(1.5, rate_limited(0.2)))
    turn = run_turn_here("How do refunds work?")

    assert turn.status == "failed"
    assert turn.error == "The AI service is busy right now. Please try again in a minute."
    assert len(gateway.requests) == 2


def test_a_retry_hint_in_the_gateways_spelling_is_honoured(gateway):
    gateway.add(rate_limited(1), streaming(STREAMS[gateway.wire](ANSWER)))
    turn = run_turn_here("How do refunds work?")

    assert turn.status == "completed" and answer_of(turn) == [ANSWER]
    first, second = gateway.requests
    assert second["at"] - first["at"] >= 0.95  # its llm_provider-retry-after, not the 0.05 s back-off


# -- 2. a time-out names its phase and the limit that ended it --------------------------------------

@pytest.fixture
def one_attempt(conversations_settings):
    conversations_settings.update(PROVIDER="openai", API_KEY=SECRET, MODEL="m", CALL_TIMEOUT=1.5,
                                  CONNECT_TIMEOUT=0.5, STREAM_IDLE_TIMEOUT=1, MAX_ATTEMPTS=1, TOOLS=[])
    return conversations_settings


@pytest.mark.parametrize("case, words", [
    # The socket's read limit and the total are both 1.5 s here: either may end it first.
    ("connected at once, then no answer", r"timed out waiting for the first byte \((call|total) limit 1\.5s\)"),
    ("stream begun, then silence", r"timed out between bytes \(idle limit 1\.0s\)"),
    ("body trickled past the total", r"timed out between bytes \(total limit 1\.5s\)"),
    ("connect never completes", r"timed out connecting \(connect limit 0\.5s\)"),
    ("upload never read", r"timed out sending the request \(connect limit 0\.5s\)"),
])
def test_a_time_out_names_its_phase_and_limit_in_the_timeline_and_the_log(one_attempt, caplog, case, words):
    caplog.set_level(logging.INFO, logger="conversations")
    content = "x" * (16 << 20) if case == "upload never read" else "Hello?"
    with FakeProvider() as fake, full_accept_queue() as nowhere:
        fake.add({
            "connected at once, then no answer": hang,
            "stream begun, then silence": streaming(openai_stream(pieces=[], done=False)[:1], then="hang"),
            "body trickled past the total": trickle_body(0.1),
            "upload never read": never_read,
        }.get(case, hang))
        one_attempt.update(BASE_URL=nowhere if case == "connect never completes" else fake.url,
                           HISTORY_MAX_CHARS=(32 << 20), STREAM=case == "stream begun, then silence")
        turn = run_turn_here(content)

    assert turn.status == "failed" and turn.error == "The AI service took too long to answer. Please try again."
    (detail,) = details(turn)
    assert re.search(words + "$", detail), detail
    attempt_lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("provider call turn=")]
    assert len(attempt_lines) == 1 and re.search(words + "$", attempt_lines[0])
    failure_lines = [r.getMessage() for r in caplog.records if "call failed (timeout)" in r.getMessage()]
    assert len(failure_lines) == 1 and re.search(words, failure_lines[0])


# -- 1. an empty reply is never a completed answer ------------------------------------------------

EMPTY_UNSTREAMED = {"openai": lambda: openai_text(""), "anthropic": lambda: anthropic_message([])}


@pytest.mark.parametrize("streamed", [True, False], ids=["empty stream", "empty JSON reply"])
def test_an_empty_reply_is_asked_for_again_and_the_second_answer_kept(gateway, conversations_settings, streamed):
    wire = gateway.wire
    conversations_settings.update(STREAM=streamed)
    gateway.add(empty_stream(wire) if streamed else EMPTY_UNSTREAMED[wire](), UNSTREAMED[wire](ANSWER))
    turn = run_turn_here("How do refunds work?")

    assert turn.status == "completed" and answer_of(turn) == [ANSWER]
    assert len(gateway.requests) == 2 and turn.model_calls == 2
    assert not gateway.requests[1]["json"].get("stream")  # asked again without a stream
    outcomes = list(CallRecord.objects.filter(turn=turn).order_by("id").values_list("outcome", "detail"))
    assert outcomes == [("bad_response", "empty reply: no text and no tool calls"), ("ok", "")]


def test_a_json_reply_passed_on_as_a_stream_is_read_as_the_answer(gateway):
    gateway.add(json_as_stream(UNSTREAMED[gateway.wire](ANSWER)))
    turn = run_turn_here("How do refunds work?")

    assert turn.status == "completed" and answer_of(turn) == [ANSWER]
    assert len(gateway.requests) == 1


def test_two_empty_replies_end_the_turn_with_a_sentence_the_visitor_reads(gateway, worker):
    from tests.support.helpers import make_client, poll_until_done, start_turn

    gateway.add(empty_stream(gateway.wire), EMPTY_UNSTREAMED[gateway.wire]())
    client = make_client()
    started = start_turn(client, "How do refunds work?")
    worker()
    final = poll_until_done(client, started["poll_url"])

    assert final["status"] == "failed"
    assert final["error"] == "The AI service sent an empty answer. Please try again, or ask in other words."
    assert [m["role"] for m in final["messages"]] == ["user"]  # no empty answer drawn
    assert len(gateway.requests) == 2
    assert list(CallRecord.objects.filter(turn_id=started["id"]).values_list("outcome", flat=True)) == \
        ["bad_response", "bad_response"]


def test_an_upstream_that_ignores_stream_behind_a_gateway_is_answered_without_a_stream(gateway):
    """The gateway's upstream (its retries spent, or its fallback) answers with plain JSON: on the
    OpenAI route the stream the app asked for arrives empty, so the app asks again unstreamed and
    reads that JSON, where it used to end 'The AI service sent an empty answer'."""
    ignores = upstream_ignores_stream(UNSTREAMED[gateway.wire](ANSWER), gateway.wire)
    gateway.add(ignores, ignores)
    turn = run_turn_here("How do refunds work?")

    assert (turn.status, turn.error) == ("completed", "")
    assert answer_of(turn) == [ANSWER]
    assert [bool(r["json"].get("stream")) for r in gateway.requests] == \
        ([True, False] if gateway.wire == "openai" else [True])
    assert set(details(turn)) <= {"empty reply: no text and no tool calls", ""}


def test_a_gateways_fallback_answering_a_stream_request_with_plain_json_is_read_as_the_answer(gateway):
    gateway.add(withholds_headers(0.3, answers_unstreamed(UNSTREAMED[gateway.wire](ANSWER))))
    turn = run_turn_here("How do refunds work?")

    assert (turn.status, turn.error) == ("completed", "")
    assert answer_of(turn) == [ANSWER] and details(turn) == [""]
    assert len(gateway.requests) == 1 and gateway.requests[0]["json"]["stream"] is True


BUSY = "litellm.RateLimitError: RateLimitError: OpenAIException - Rate limit reached"


@pytest.mark.parametrize("case, error, status, sentence, sent, words", [
    ("an upstream's 429", lambda: error_under_200(429, BUSY), "failed",
     "The AI service is busy right now. Please try again in a minute.", 2,
     "HTTP 200 429 [upstream OpenAI, via the gateway]: " + BUSY),
    ("an upstream's refusal", lambda: error_under_200(500, REFUSAL), "failed",
     "The assistant could not answer this request.", 1,
     "HTTP 200 500 [upstream OpenAI, via the gateway]: litellm.ContentPolicyViolationError"),
    ("the gateway's unknown model", lambda: error_under_200(400, "/chat/completions: Invalid model name passed in "
                                                                 "model=m. Call `/v1/models` to view available models"),
     "failed", "The assistant is not set up correctly: the AI service does not know the configured model.", 1,
     "HTTP 200 400 [the gateway's own]: /chat/completions: Invalid model name passed in model=m"),
])
@pytest.mark.parametrize("send", [answers_unstreamed, json_as_stream], ids=["application/json", "text/event-stream"])
def test_a_gateways_error_sent_as_plain_json_under_200_to_a_stream_request_reads_as_that_error(
        gateway, send, case, error, status, sentence, sent, words):
    """As plain JSON, or that JSON labelled as a stream (LiteLLM's Anthropic route passes bodies on so)."""
    gateway.add(send(error()), send(error()))
    turn = run_turn_here("How do refunds work?")

    assert (turn.status, turn.error) == (status, sentence)
    assert len(gateway.requests) == sent  # an outage is tried again, the request's own error is not
    assert all(d.startswith(words) for d in details(turn)), details(turn)


def test_an_empty_reply_is_not_asked_again_when_no_call_would_fit(gateway, conversations_settings):
    # The turn has 16 s; the first call may start within 2 s, and after its 2.5 s less than 14 s are left.
    conversations_settings.update(JOB_TIMEOUT=20, DEADLINE_MARGIN=4, MIN_CALL_BUDGET=14)
    gateway.add(withholds_headers(2.5, empty_stream(gateway.wire)))
    turn = run_turn_here("How do refunds work?")

    assert turn.status == "failed" and "empty answer" in turn.error
    assert len(gateway.requests) == 1


# -- 4. a model the service does not know, however it says so ---------------------------------------

UNKNOWN_MODEL = {
    "a gateway's Invalid model name (400)": lambda wire: invalid_model("m"),
    "OpenAI's 404 model_not_found": lambda wire: openai_error(
        404, "The model `m` does not exist or you do not have access to it.", code="model_not_found"),
    "Anthropic's 404 not_found_error": lambda wire: anthropic_error(404, "not_found_error", "model: m"),
    "a 400 in the vendor's shape saying the model is invalid": lambda wire: (
        anthropic_error(400, "invalid_request_error", "The provided model identifier is invalid.")
        if wire == "anthropic" else openai_error(400, "The provided model identifier is invalid.")),
    "a 400 of another shape naming an invalid model": lambda wire: Reply(400, {"detail": "Invalid model: m"}),
}


@pytest.mark.parametrize("case", list(UNKNOWN_MODEL))
def test_a_model_the_service_does_not_know_says_so_to_visitor_and_operator(gateway, conversations_settings,
                                                                         caplog, case):
    conversations_settings.update(MAX_ATTEMPTS=1)
    gateway.add(UNKNOWN_MODEL[case](gateway.wire))
    turn = run_turn_here("How do refunds work?")

    assert turn.status == "failed"
    assert turn.error == ("The assistant is not set up correctly: the AI service does not know the configured "
                          "model.")
    (line,) = [r.getMessage() for r in caplog.records if "call failed" in r.getMessage()]
    assert f"{gateway.wire} call failed (unknown_model)" in line
    assert "the configured model 'm' is not one the service knows" in line


# -- 5. any error body quoted for the operator; a gateway's 408 is a time-out -----------------------

def plain_text(status, text):
    def behaviour(handler):
        data = text.encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "text/plain")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
    return behaviour


@pytest.mark.parametrize("body, quoted", [
    (html_error(500), "HTTP 500: 500 Internal Server Error Internal Server Error nginx"),
    (plain_text(502, f"upstream refused the key {SECRET}\n"), "HTTP 502: upstream refused the key [API key hidden]"),
], ids=["an HTML error page", "plain text echoing the key"])
def test_an_error_body_that_is_not_json_is_quoted_short_and_redacted_in_the_log(gateway, conversations_settings,
                                                                              caplog, body, quoted):
    conversations_settings.update(MAX_ATTEMPTS=1)
    gateway.add(body)
    turn = run_turn_here("How do refunds work?")

    assert turn.status == "failed"
    assert turn.error == "The AI service is unavailable right now. Please try again in a minute."
    (line,) = [r.getMessage() for r in caplog.records if "call failed" in r.getMessage()]
    assert line == f"{gateway.wire} call failed (unavailable): {quoted}"
    assert SECRET not in caplog.text


def test_a_gateways_own_408_is_a_time_out_and_retried(gateway):
    timed_out = gateway_error(408, "litellm.Timeout: Connection timed out after 3.0 seconds.")
    gateway.add(timed_out, timed_out)
    turn = run_turn_here("How do refunds work?")

    assert turn.status == "failed" and turn.error == "The AI service took too long to answer. Please try again."
    assert len(gateway.requests) == 2


# -- a refusal the gateway wraps in an error of its own ----------------------------------------------

@pytest.mark.parametrize("streamed", [True, False], ids=["stream asked", "unstreamed"])
def test_a_refusal_a_gateway_wraps_in_a_500_reads_as_a_refusal_and_is_not_asked_again(gateway,
                                                                                    conversations_settings,
                                                                                    streamed):
    conversations_settings.update(STREAM=streamed)
    gateway.add(wrapped_refusal(), streaming(STREAMS[gateway.wire](ANSWER)))
    turn = run_turn_here("Something the filter refuses")

    assert (turn.status, turn.error) == ("failed", "The assistant could not answer this request.")
    assert len(gateway.requests) == 1  # not retried: the same request would be refused again
    (detail,) = details(turn)
    assert detail.startswith("HTTP 500") and "litellm.ContentPolicyViolationError" in detail


# -- the timeline says what the log says ---------------------------------------------------------------

@pytest.mark.parametrize("case, reply, words", [
    ("an unknown model at the gateway", lambda: invalid_model("m"), "Invalid model name passed in model=m"),
    ("an upstream's 429 through the gateway", lambda: rate_limited(0), "OpenAIException - Rate limit reached"),
    ("a proxy's HTML 500", lambda: html_error(500), "HTTP 500: 500 Internal Server Error Internal Server Error nginx"),
    ("a body echoing the key", lambda: gateway_error(500, f"upstream said no to {SECRET}"), "[API key hidden]"),
])
def test_the_timeline_carries_the_same_short_redacted_excerpt_as_the_log(gateway, conversations_settings, caplog,
                                                                        case, reply, words):
    conversations_settings.update(MAX_ATTEMPTS=1)
    gateway.add(reply())
    turn = run_turn_here("How do refunds work?")

    assert turn.status == "failed"
    (detail,) = details(turn)
    (line,) = [r.getMessage() for r in caplog.records if "call failed" in r.getMessage()]
    assert words in detail and line.endswith(detail)  # the operator reads one account of it
    assert SECRET not in detail and len(detail) <= 500


# -- the timeline says whose error it was, where the gateway tells ----------------------------------------

GATEWAY_OWN, UPSTREAM_OPENAI = "the gateway's own", "upstream OpenAI, via the gateway"


@pytest.mark.parametrize("case, reply, who, words", [
    ("the gateway's unknown model", lambda: invalid_model("m"), GATEWAY_OWN, "Invalid model name passed"),
    ("the gateway's key refused", lambda: Reply(401, {"error": {
        "message": "Authentication Error, Invalid proxy server token passed. Received API Key = sk-...6789",
        "type": "auth_error", "param": "None", "code": "401"}}), GATEWAY_OWN, "Authentication Error, Invalid"),
    ("the gateway's budget spent", lambda: Reply(400, {"error": {
        "message": "Budget has been exceeded! Key=sk-...6789 Current cost: 1.2, Max budget: 1.0",
        "type": "budget_exceeded", "param": "None", "code": "400"}}), GATEWAY_OWN, "Budget has been exceeded!"),
    ("the gateway's own time-out", lambda: gateway_error(408, "litellm.Timeout: Connection timed out after 3.0 s."),
     GATEWAY_OWN, "litellm.Timeout"),
    ("an upstream's 429 passed on", lambda: rate_limited(0), UPSTREAM_OPENAI, "OpenAIException - Rate limit"),
    ("an upstream's 400 passed on", lambda: gateway_error(
        400, "litellm.BadRequestError: AnthropicException - messages: text content blocks must be non-empty"),
     "upstream Anthropic, via the gateway", "AnthropicException - messages"),
    ("a vendor answering directly", lambda: openai_error(429, "Rate limit reached for m", code="rate_limit_exceeded"),
     "", "Rate limit reached for m"),
])
def test_the_timeline_says_whether_the_gateway_or_its_upstream_answered(gateway, conversations_settings, case,
                                                                         reply, who, words):
    conversations_settings.update(MAX_ATTEMPTS=1)
    gateway.add(reply())
    turn = run_turn_here("How do refunds work?")

    assert turn.status == "failed"
    (detail,) = details(turn)
    said = rf" \[{re.escape(who)}\]" if who else ""
    assert re.match(rf"HTTP \d+ \S+{said}: .*{re.escape(words)}", detail), detail
    assert who or ("gateway" not in detail)


def test_the_admins_turn_page_shows_whose_error_it_was(gateway, conversations_settings, client, django_user_model):
    """What the operator reads on the turn's page: the attempt's line with the gateway's own error
    told apart from its upstream's."""
    conversations_settings.update(MAX_ATTEMPTS=2)
    gateway.add(rate_limited(0), invalid_model("m"))
    turn = run_turn_here("How do refunds work?")
    client.force_login(django_user_model.objects.create_superuser("operator", "op@example.com", "pw-123456789"))

    page = client.get(f"/admin/conversations/turn/{turn.pk}/change/").content.decode()

    assert "HTTP 429 429 [upstream OpenAI, via the gateway]: litellm.RateLimitError" in page.replace("&#x27;", "'")
    assert "HTTP 400 400 [the gateway's own]: /chat/completions: Invalid model name passed in model=m" in \
        page.replace("&#x27;", "'")
