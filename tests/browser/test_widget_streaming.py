"""A streamed answer (issue 15) as the visitor sees it: text growing in place in one element, the
finished message taking its place, quick polls while it grows, and screen readers told only the
finished answer. The states follow the server's contract, served by a scripted API."""

import re
import statistics

import pytest
from playwright.sync_api import expect

from tests.browser.scripted import QUESTION, ScriptedApi, assistant, state, streaming, tool_call

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

FIRST = "Tokyo is nine hours ahead of **UTC**."
FULL = FIRST + "\n\nIt is 14:05 there now:\n\n- Japan has one time zone\n- no daylight saving time"

# Every poll the page starts (performance.now(), ms), and every text the live region is given.
RECORDERS = """
    window.__polls = [];
    const realFetch = window.fetch;
    window.fetch = function (url, options) {
      if (String(url).includes("/turns/") && !(options && options.method)) { window.__polls.push(performance.now()); }
      return realFetch.apply(this, arguments);
    };
"""


def heard(chat):
    """Start recording what the widget gives its live region; returns a function that reads it."""
    chat.locator(".cvw-sr").evaluate("""el => { window.__said = [];
        new MutationObserver(() => window.__said.push(el.textContent))
          .observe(el, {childList: true, characterData: true, subtree: true}); }""")
    return lambda: chat.page.evaluate("window.__said")


def test_a_streamed_answer_grows_in_place_and_the_finished_message_takes_its_place(chat_page):
    chat = chat_page()
    api = ScriptedApi(chat.page)
    chat.open()
    said = heard(chat)
    chat.send(QUESTION)
    answer = chat.locator(".cvw-msg-assistant")

    api.state = state("running", streaming("Tokyo is nine hours ahead of **UT"), version=2)
    expect(answer).to_have_text("Tokyo is nine hours ahead of **UT")  # an unclosed mark is still text
    expect(answer).to_have_class(re.compile("cvw-growing"))
    expect(answer).to_have_attribute("aria-busy", "true")
    answer.evaluate("el => { el.__first = true; }")

    api.state = state("running", streaming(FIRST + "\n\nIt is 14:05"), version=3)
    expect(answer.locator("strong")).to_have_text("UTC")  # the safe markdown, applied as text arrives
    answer.locator("p").first.evaluate("p => { p.__finished = true; }")

    api.state = state("running", streaming(FIRST + "\n\nIt is 14:05 there now:\n\n- Japan has one"), version=4)
    expect(answer.locator("li")).to_have_text(["Japan has one"])
    # The same element grew; the paragraph that was finished was not rebuilt.
    assert answer.evaluate("el => el.__first") is True
    assert answer.locator("p").first.evaluate("p => p.__finished") is True
    assert said() == []  # nothing of the partial text was read out

    api.state = state("completed", assistant(FULL, id=2), version=5)
    expect(answer).not_to_have_class(re.compile("cvw-growing"))
    expect(answer.locator("li")).to_have_text(["Japan has one time zone", "no daylight saving time"])
    expect(chat.locator(".cvw-send")).to_be_enabled()
    assert answer.evaluate("el => el.__first") is True  # the finished message reused the streamed one's element
    assert answer.get_attribute("aria-busy") is None
    assert chat.locator(".cvw-msg-assistant").count() == 1
    added = [c for batch in chat.batches() for c in batch if "cvw-msg-assistant" in c]
    assert added == ["cvw-msg cvw-msg-assistant cvw-growing"]  # drawn once, never removed and redrawn
    # Only the finished answer, once, without its markdown marks.
    assert said() == [FULL.replace("**", "")]


def test_text_shown_before_a_tool_call_stays_and_the_next_call_streams_into_a_new_message(chat_page):
    chat = chat_page()
    api = ScriptedApi(chat.page)
    chat.open()
    chat.send(QUESTION)
    api.state = state("running", streaming("Let me check the time"), version=2)
    expect(chat.locator(".cvw-msg-assistant")).to_have_text("Let me check the time")
    api.state = state("running", assistant("Let me check the time.", tool_calls=[tool_call(city="Tokyo")]),
                      streaming("It is"), version=3)
    expect(chat.locator(".cvw-msg-assistant")).to_have_text(["Let me check the time.", "It is"])
    expect(chat.locator(".cvw-step")).to_have_text("Using current_time (Tokyo)…")
    api.state = state("cancelled", assistant("Let me check the time.", tool_calls=[tool_call(city="Tokyo")]),
                      assistant("It is", id=4), version=4)
    expect(chat.locator(".cvw-notice")).to_have_text("You stopped this answer.")
    expect(chat.locator(".cvw-msg-assistant")).to_have_text(["Let me check the time.", "It is"])
    expect(chat.locator(".cvw-growing")).to_have_count(0)


def test_polls_stay_quick_while_text_streams_and_back_off_when_nothing_changes(chat_page):
    chat = chat_page()
    chat.page.add_init_script(RECORDERS)
    api = ScriptedApi(chat.page)
    chat.open()
    chat.send(QUESTION)
    api.state = state("running", streaming("Tokyo is"), version=2)
    expect(chat.locator(".cvw-msg-assistant")).to_have_text("Tokyo is")
    start = chat.page.evaluate("window.__polls.length")
    # The same streaming state again and again (304s): a stalled stream is still looked at quickly.
    chat.page.wait_for_function(f"window.__polls.length >= {start + 8}")
    api.state = state("running", assistant("", tool_calls=[tool_call(city="Tokyo")]), version=3)
    expect(chat.locator(".cvw-step")).to_be_visible()
    after = chat.page.evaluate("window.__polls.length")
    chat.page.wait_for_function(f"window.__polls.length >= {after + 5}", timeout=30_000)
    polls = chat.page.evaluate("window.__polls")
    streaming_gaps = [b - a for a, b in zip(polls[start:start + 8], polls[start + 1:start + 9])]
    backing_off = [b - a for a, b in zip(polls[after:after + 5], polls[after + 1:after + 6])]
    print(f"\ngaps while streaming: {[round(g) for g in streaming_gaps]} ms; "
          f"after: {[round(g) for g in backing_off]} ms")
    assert statistics.median(streaming_gaps) < 450  # about every 0.3 s
    assert backing_off == sorted(backing_off) and backing_off[-1] > 1000  # ×1.5 each time nothing changed
