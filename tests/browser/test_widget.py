"""The widget in real headless Chromium, against the live server, real RQ worker processes and Redis."""

import time

import pytest
from playwright.sync_api import expect

from conversations.models import Turn
from tests.fakes import FakeProvider, openai_text

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

QUESTION = "What time is it in Tokyo?"


def wait_for_turn(status, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        turn = Turn.objects.filter(status=status).first()
        if turn is not None:
            return turn
        time.sleep(0.05)
    raise AssertionError(f"no turn reached {status!r} within {timeout}s")


def test_tool_step_appears_before_the_final_answer(chat_page, worker_process):
    worker_process(DEMO_DELAY=0.8)
    chat = chat_page().open()
    chat.send(QUESTION)
    # The visitor's message is there at once, before the POST has answered.
    expect(chat.locator(".cvw-msg-user")).to_have_text(QUESTION, timeout=1000)
    expect(chat.locator(".cvw-step")).to_contain_text("Using current_time (Tokyo)…")
    answer = chat.locator(".cvw-msg-assistant")
    expect(answer).to_contain_text("in Tokyo")
    expect(chat.locator(".cvw-step .cvw-result")).to_contain_text("current_time: ")
    expect(chat.locator(".cvw-stop")).to_be_hidden()

    batches = chat.batches()
    step_batch = next(i for i, b in enumerate(batches) if any("cvw-step" in c for c in b))
    answer_batch = next(i for i, b in enumerate(batches) if any("cvw-msg-assistant" in c for c in b))
    assert step_batch < answer_batch, batches  # the step was drawn by an earlier poll than the answer
    assert chat.locator(".cvw-msg-user").count() == 1  # the optimistic bubble became the saved message
    # The finished answer (only) is announced; the log itself is not read out at each poll.
    expect(chat.locator(".cvw-sr")).to_contain_text("in Tokyo")
    assert chat.locator(".cvw-log").get_attribute("role") == "log"
    # Polls after the first carry the last ETag, and unchanged states came back as 304.
    assert any("if-none-match" in headers for _, headers in chat.polls)
    assert 304 in {status for _, status in chat.responses}
    assert Turn.objects.get().status == "completed"
