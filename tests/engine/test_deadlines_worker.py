"""Every provider fault, through the API, a real forking RQ worker and the poll view.

The suite's short clocks apply (JOB_TIMEOUT 10, DEADLINE_MARGIN 4: the job's own deadline
is 6 s after it starts). Whatever the provider does, the visitor's poll reaches ``done:
true`` before RQ's job timeout, with a status and a sentence they can read, their message is
in the database, and every attempt is on the turn's timeline.
"""

import contextlib
import json
import logging
import time

import pytest

from conversations.models import CallRecord, Message, Turn
from conversations.providers import ProviderError
from conversations.engine.runner import deadline_message, step_limit_message
from conversations.tools import ToolError, tool
from tests.support.helpers import Poller, make_client, redis_values, start_turn
from tests.support.fakes import (
    FakeProvider, SilentListener, cut_short_then_stall, full_accept_queue, hang, http_error, malformed_json,
    never_read, openai_text, openai_tool_calls, refused_url, reset_mid_body, retry_after, retry_after_ms,
    trickle_body, trickle_headers, unavailable,
)

pytestmark = pytest.mark.django_db(transaction=True)

JOB_TIMEOUT = 10
MARGIN = 4
API_KEY = "sk-live-0123456789abcdefSECRET"


def message(code):
    return str(ProviderError.MESSAGES[code])


@pytest.fixture
def openai(conversations_settings):
    """Point the suite's settings at a fake OpenAI-compatible server: ``openai(url, **overrides)``."""

    def configure(url, **overrides):
        conversations_settings.update(PROVIDER="openai", BASE_URL=url, API_KEY=API_KEY, MODEL="fake-model",
                                      **overrides)

    return configure


@pytest.fixture
def log_file(tmp_path):
    """Everything logged, by this process or a forked work horse, as text: ``log_file.read_text()``."""
    path = tmp_path / "log.txt"
    handler = logging.FileHandler(path)
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    yield path
    root.removeHandler(handler)
    handler.close()


def run_turn(worker, content="Hello?"):
    """Post a message, run the job in a forking worker while polling like the widget.

    Returns (final polled state, seconds from the job's start to the poll seeing done, turn row).
    """
    client = make_client()
    summary = start_turn(client, content)
    with Poller(client, summary["poll_url"]) as poller:
        started = time.monotonic()
        worker()
    elapsed = time.monotonic() - started
    final = poller.final
    turn = Turn.objects.get(pk=summary["id"])
    # The visitor's message was saved before the job ran, whatever happened after.
    assert Message.objects.filter(turn=turn, role="user", content=content).count() == 1
    assert final["messages"][0]["role"] == "user" and final["messages"][0]["content"] == content
    return final, elapsed, turn


def records(turn, kind="model"):
    return list(CallRecord.objects.filter(turn=turn, kind=kind).order_by("id"))


@contextlib.contextmanager
def serving(*behaviours, default=None):
    """A fake OpenAI-compatible server answering with ``behaviours`` in order; yields its base URL."""
    with FakeProvider(default=default) as fake:
        fake.add(*behaviours)
        yield fake.url


@contextlib.contextmanager
def silent():
    with SilentListener() as listener:
        yield listener.url


@contextlib.contextmanager
def refused():
    yield refused_url()


def twice(behaviour):
    return lambda: serving(behaviour, behaviour)


# Each fault: a context manager factory yielding the provider's URL, the ProviderError code
# the visitor's message comes from, and the outcome of each attempt (two at most here).
FAULTS = {
    "silent after accept": (silent, "timeout", ["timeout", "timeout"]),
    "never answers": (twice(hang), "timeout", ["timeout", "timeout"]),
    "body trickled": (twice(trickle_body(0.1)), "timeout", ["timeout", "timeout"]),
    "headers trickled": (twice(trickle_headers(0.1)), "timeout", ["timeout", "timeout"]),
    "body cut short then stall": (twice(cut_short_then_stall), "timeout", ["timeout", "timeout"]),
    "upload never read": (twice(never_read), "timeout", ["timeout", "timeout"]),
    "connect never completes": (full_accept_queue, "timeout", ["timeout", "timeout"]),
    "connection refused": (refused, "connection", ["connection_error", "connection_error"]),
    "reset mid-body": (twice(reset_mid_body), "connection", ["connection_error", "connection_error"]),
    "malformed JSON": (twice(malformed_json), "bad_response", ["bad_response"]),
    "503 every time": (twice(unavailable()), "unavailable", ["http_error", "http_error"]),
    "429 beyond the budget": (twice(retry_after(60)), "rate_limited", ["http_error"]),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_every_fault_ends_the_turn_failed_with_a_readable_message_before_the_job_timeout(fault, worker, openai):
    serve, code, outcomes = FAULTS[fault]
    # A 16 MiB request, so that a server that never reads it blocks the upload.
    prompt = "x" * (16 << 20) if fault == "upload never read" else "Answer briefly."
    with serve() as url:
        # Two attempts of 1.5 s each keep the suite fast; bench/deadlines.py runs full budgets.
        openai(url, CALL_TIMEOUT=1.5, MAX_ATTEMPTS=2, SYSTEM_PROMPT=prompt)
        final, elapsed, turn = run_turn(worker)

    assert final["done"] is True and final["status"] == "failed"
    assert final["error"] == message(code)
    assert elapsed < JOB_TIMEOUT
    assert (turn.status, turn.error) == ("failed", message(code))
    assert turn.finished_at is not None and turn.margin_left >= MARGIN - 1
    calls = records(turn)
    assert [c.outcome for c in calls] == outcomes
    assert [c.attempt for c in calls] == list(range(1, len(outcomes) + 1))
    for call in calls:
        assert call.timeout == pytest.approx(1.5, abs=0.01)
        assert call.duration <= call.timeout + 1
        assert 0 < call.remaining_before <= JOB_TIMEOUT - MARGIN


@pytest.mark.parametrize("first", [retry_after(1), retry_after_ms(300), unavailable()],
                         ids=["429 Retry-After 1", "429 retry-after-ms 300", "503 then ok"])
def test_a_retry_inside_the_budget_completes_the_turn(first, worker, openai):
    with serving(first, openai_text("Hello from the second attempt.")) as url:
        openai(url)
        final, elapsed, turn = run_turn(worker)

    assert (final["status"], final["error"]) == ("completed", None)
    assert final["messages"][-1]["content"] == "Hello from the second attempt."
    failed, ok = records(turn)
    assert (failed.outcome, failed.attempt, ok.outcome, ok.attempt, ok.status_code) == (
        "http_error", 1, "ok", 2, 200)
    assert failed.status_code == first.status
    wait = ok.started_offset - (failed.started_offset + failed.duration)
    assert wait >= {429: 0.3, 503: 0.025}[first.status]
    # Each attempt was given min(CALL_TIMEOUT, what was left).
    assert failed.timeout == pytest.approx(min(5, failed.remaining_before), abs=0.01)
    assert ok.timeout == pytest.approx(min(5, ok.remaining_before), abs=0.01)
    assert ok.remaining_before < failed.remaining_before


@tool
def explode(reason: str) -> str:
    """A tool that always raises, with internals in its message (as a database error would)."""
    raise RuntimeError(f"connection to db.internal:5432 failed: {reason}")


@tool
def refuse(date: str) -> str:
    """A tool that explains to the visitor why it cannot help."""
    raise ToolError(f"No booking was found for {date}.")


@tool
def stall() -> str:
    """A tool that takes far longer than any limit."""
    time.sleep(30)
    return "too late"


@tool
def nap() -> str:
    """A tool that takes a second."""
    time.sleep(1)
    return "rested"


TEST_TOOLS = [f"{__name__}.{name}" for name in ("explode", "refuse", "stall", "nap")]


def test_a_tool_that_raises_gives_the_model_an_error_result_and_the_turn_goes_on(worker, openai, log_file):
    with FakeProvider() as fake:
        fake.add(openai_tool_calls(("explode", {"reason": "disk full"})), openai_text("Sorry, that tool failed."))
        openai(fake.url, TOOLS=TEST_TOOLS)
        final, elapsed, turn = run_turn(worker)

    assert (final["status"], final["error"]) == ("completed", None)
    result = final["messages"][2]
    assert result["role"] == "tool" and result["is_error"] is True
    # The visitor (and the model) read that the tool failed; what it said stays with the operator.
    assert result["content"] == "Error: the tool explode failed."
    sent = fake.requests[1]["json"]["messages"][-1]
    assert sent["role"] == "tool" and sent["content"] == "Error: the tool explode failed."
    assert "db.internal" not in str(final)
    (run,) = records(turn, "tool")
    assert (run.name, run.outcome) == ("explode", "error")
    # The operator reads what failed; the call's own argument ("disk full", which a visitor may have
    # written) is hidden there unless DEBUG, as a provider error's quotes are (docs/privacy.md).
    assert run.detail == "RuntimeError: connection to db.internal:5432 failed: [conversation text]"
    assert "RuntimeError: connection to db.internal:5432 failed: [conversation text]" in log_file.read_text()
    assert "disk full" not in log_file.read_text()


def test_a_tool_error_meant_for_the_visitor_is_shown_as_written(worker, openai):
    with FakeProvider() as fake:
        fake.add(openai_tool_calls(("refuse", {"date": "1 May"})), openai_text("I found no booking for that day."))
        openai(fake.url, TOOLS=TEST_TOOLS)
        final, elapsed, turn = run_turn(worker)

    assert final["messages"][2]["content"] == "Error: No booking was found for 1 May."
    assert fake.requests[1]["json"]["messages"][-1]["content"] == "Error: No booking was found for 1 May."
    (run,) = records(turn, "tool")
    assert (run.outcome, run.detail) == ("error", "ToolError: No booking was found for 1 May.")


def test_a_tool_that_hangs_is_abandoned_and_reported_as_timed_out(any_worker, openai):
    with FakeProvider() as fake:
        fake.add(openai_tool_calls(("stall", {})), openai_text("The tool took too long."))
        openai(fake.url, TOOLS=TEST_TOOLS)  # TOOL_TIMEOUT 2
        final, elapsed, turn = run_turn(any_worker)

    assert (final["status"], final["error"]) == ("completed", None)
    assert elapsed < JOB_TIMEOUT
    assert final["messages"][2]["content"] == "Error: the tool stall timed out after 2 seconds."
    assert "timed out" in fake.requests[1]["json"]["messages"][-1]["content"]
    (run,) = records(turn, "tool")
    assert (run.outcome, run.timeout) == ("timeout", 2)
    assert 2 <= run.duration <= 3


def test_a_model_that_asks_for_tools_forever_stops_at_max_steps(worker, openai):
    with serving(default=openai_tool_calls(("current_time", {"city": "Tokyo"}))) as url:
        openai(url, MAX_STEPS=3)
        final, elapsed, turn = run_turn(worker)

    assert final["done"] is True and final["status"] == "incomplete"
    assert final["error"] == step_limit_message(3)
    assert (turn.model_calls, turn.tool_calls) == (3, 3)
    assert [m["role"] for m in final["messages"]] == ["user"] + ["assistant", "tool"] * 3


def test_a_model_that_asks_for_tools_forever_stops_at_the_deadline(any_worker, openai, log_file):
    with serving(default=openai_tool_calls(("nap", {}))) as url:
        openai(url, MAX_STEPS=100, TOOLS=TEST_TOOLS)
        final, elapsed, turn = run_turn(any_worker)

    assert final["done"] is True and final["status"] == "incomplete"
    assert final["error"] == deadline_message()
    assert elapsed < JOB_TIMEOUT
    assert turn.margin_left >= MARGIN - 1
    calls = records(turn)
    assert [c.outcome for c in calls[:-1]] == ["ok"] * (len(calls) - 1)
    skipped = calls[-1]
    assert (skipped.outcome, skipped.timeout, skipped.duration) == ("skipped", 0, 0)
    assert skipped.remaining_before < 1  # MIN_CALL_BUDGET
    assert skipped.detail == "Skipped call — job budget exhausted"
    assert "ERROR conversations.http Skipped call — job budget exhausted" in log_file.read_text()


@pytest.mark.parametrize("status, code", [(400, "bad_request"), (401, "auth"), (403, "auth"),
                                          (404, "unknown_model")])
def test_client_errors_fail_at_once_and_never_show_the_api_key(status, code, worker, openai, log_file):
    # Some providers echo the key they were given; it must go no further than this server.
    with serving(http_error(status, f"Incorrect API key provided: {API_KEY}."), openai_text("never")) as url:
        openai(url)
        final, elapsed, turn = run_turn(worker)

    assert (final["status"], final["error"]) == ("failed", message(code))
    assert [c.outcome for c in records(turn)] == ["http_error"]  # not retried
    assert records(turn)[0].status_code == status
    shown = [json.dumps(final), turn.error, log_file.read_text()]
    shown += [c.detail for c in CallRecord.objects.filter(turn=turn)]
    shown += [m.content for m in Message.objects.filter(turn=turn)]
    assert all(API_KEY not in text for text in shown)
    assert [v for v in redis_values() if v and API_KEY.encode() in v] == []
    assert f"HTTP {status}" in log_file.read_text()  # the operator still learns what happened


def test_a_refused_connection_is_logged_and_recorded_with_host_port_and_reason_never_the_key(worker, openai,
                                                                                           log_file):
    url = refused_url()
    port = url.split(":")[2].split("/")[0]
    # A key in the URL's query, as some gateways take it: neither it nor the path may reach the timeline.
    # (A key in the URL's user part never gets this far: such an endpoint is refused, E016.)
    openai(url + "?api-key=sk-in-the-query", MAX_ATTEMPTS=1)
    final, _elapsed, turn = run_turn(worker)

    (call,) = records(turn)
    assert call.detail == f"ConnectionError to 127.0.0.1:{port}: connection refused"
    assert final["error"] == message("connection")
    log = log_file.read_text()
    assert f"openai call failed (connection): ConnectionError to 127.0.0.1:{port}: connection refused" in log
    assert "sk-in-the" not in call.detail + final["error"] + log
