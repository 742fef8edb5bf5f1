"""The widget in real headless Chromium, against the live server, real RQ worker processes and Redis."""

import threading
import time

import pytest
from playwright.sync_api import expect

from conversations.models import Turn
from tests.support.fakes import FakeProvider, openai_text, openai_tool_calls

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


def test_tool_step_appears_before_the_final_answer(chat_page, worker_process, conversations_settings):
    # The model's second call is held until the step has been drawn, so the step cannot arrive
    # with the answer in one poll, however the machine's load shifts the timing.
    answer_may_come = threading.Event()

    def held_answer(handler):
        answer_may_come.wait(20)
        handler.send_json(200, openai_text("It is 09:00 in Tokyo."))

    with FakeProvider() as fake:
        fake.add(openai_tool_calls(("current_time", {"city": "Tokyo"})), held_answer)
        provider = {"PROVIDER": "openai", "BASE_URL": fake.url, "API_KEY": "sk-test", "MODEL": "fake-model"}
        conversations_settings.update(**provider)
        worker_process(**provider)
        chat = chat_page().open()
        chat.send(QUESTION)
        # The visitor's message is there at once, before the POST has answered.
        expect(chat.locator(".cvw-msg-user")).to_have_text(QUESTION, timeout=1000)
        expect(chat.locator(".cvw-step")).to_contain_text("Using current_time (Tokyo)…")
        expect(chat.locator(".cvw-step .cvw-result")).to_contain_text("current_time: ")
        # Drawn while the model is still writing: no answer yet, and Stop is offered.
        assert chat.locator(".cvw-msg-assistant").count() == 0
        expect(chat.locator(".cvw-stop")).to_be_visible()
        # While nothing changes, the polls carry the last ETag and come back 304.
        for _ in range(100):
            if 304 in {status for _, status in chat.responses}:
                break
            chat.page.wait_for_timeout(100)
        answer_may_come.set()
        answer = chat.locator(".cvw-msg-assistant")
        expect(answer).to_contain_text("in Tokyo")
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


def test_reload_mid_turn_restores_the_conversation_and_the_turn_continues(chat_page, worker_process):
    worker_process(DEMO_DELAY=2)
    chat = chat_page().open()
    chat.send(QUESTION)
    expect(chat.locator(".cvw-step")).to_be_visible()
    assert Turn.objects.get().done is False

    chat.page.reload()
    # Restored from GET /api/conversations/<id>/, and still following the running turn.
    expect(chat.locator(".cvw-msg-user")).to_have_text(QUESTION)
    expect(chat.locator(".cvw-step")).to_contain_text("current_time")
    expect(chat.locator(".cvw-stop")).to_be_visible()
    expect(chat.locator(".cvw-msg-assistant")).to_contain_text("in Tokyo")
    expect(chat.locator(".cvw-stop")).to_be_hidden()
    assert chat.locator(".cvw-msg-user").count() == 1
    assert chat.locator(".cvw-step").count() == 1
    assert chat.locator(".cvw-msg-assistant").count() == 1
    assert Turn.objects.get().status == "completed"


def test_stop_cancels_the_running_turn_and_polling_stops(chat_page, worker_process):
    worker_process(DEMO_DELAY=2)
    chat = chat_page().open()
    chat.send(QUESTION)
    wait_for_turn("running")  # the first model call is under way
    chat.locator(".cvw-stop").click()

    expect(chat.locator(".cvw-notice")).to_have_text("You stopped this answer.")
    expect(chat.locator(".cvw-stop")).to_be_hidden()
    expect(chat.locator(".cvw-send")).to_be_enabled()
    expect(chat.locator(".cvw-input")).to_be_focused()
    polls_at_end = len(chat.polls)
    chat.page.wait_for_timeout(2000)
    assert len(chat.polls) == polls_at_end  # no request after done
    turn = Turn.objects.get()
    # The job stopped before the tool call it was about to make, and made no further model call.
    assert (turn.status, turn.model_calls, turn.tool_calls) == ("cancelled", 1, 0)
    assert chat.locator(".cvw-msg-assistant").count() == 0


EVIL = (
    'Hi <img src=x onerror="window.__pwned=1;alert(1)"> there\n\n'
    '<script>window.__pwned=2</script>\n\n'
    '- [click me](javascript:window.__pwned=3)\n'
    '- [docs](https://example.com/docs) and **bold** `<b>code</b>`\n'
)


def test_html_and_script_in_a_model_reply_stay_inert_text(chat_page, worker_process, conversations_settings):
    with FakeProvider() as fake:
        fake.add(openai_text(EVIL))
        provider = {"PROVIDER": "openai", "BASE_URL": fake.url, "API_KEY": "sk-test", "MODEL": "fake-model"}
        conversations_settings.update(**provider)
        worker_process(**provider)
        chat = chat_page().open()
        chat.send("Say something nasty")
        answer = chat.locator(".cvw-msg-assistant")
        expect(answer).to_contain_text('<img src=x onerror="window.__pwned=1;alert(1)">')

    expect(answer).to_contain_text("<script>window.__pwned=2</script>")
    expect(answer).to_contain_text("[click me](javascript:window.__pwned=3)")
    chat.locator(".cvw-msg-assistant li", has_text="click me").click()
    chat.page.wait_for_timeout(300)
    assert chat.page.evaluate("window.__pwned") is None
    assert chat.dialogs == []
    log = chat.locator(".cvw-log")
    assert log.locator("img, script, iframe, b").count() == 0
    links = log.locator("a")
    assert links.count() == 1  # only the http(s) link is a link
    assert links.get_attribute("href") == "https://example.com/docs"
    assert links.get_attribute("rel") == "noopener noreferrer"
    assert links.get_attribute("target") == "_blank"
    expect(log.locator("strong")).to_have_text("bold")
    expect(log.locator("code")).to_have_text("<b>code</b>")


PLAIN_PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8">
<link rel="stylesheet" href="/static/conversations/widget.css"></head><body>
<div data-conversations-widget data-api-url="/api/conversations/" data-job-timeout="1" data-give-up-margin="1"
     data-strings='{"title": "Help desk"}'></div>
<script src="/static/conversations/widget.js"></script></body></html>"""


def test_widget_gives_up_with_a_message_when_the_server_never_says_done(chat_page):
    # No worker runs: the turn stays queued, and the server never says done.
    # The plain page is the visitor's first page of the site: no csrftoken cookie yet.
    chat = chat_page()
    chat.page.route("**/plain-page/", lambda route: route.fulfill(content_type="text/html", body=PLAIN_PAGE))
    chat.open("/plain-page/")
    expect(chat.locator(".cvw-header")).to_have_text("Help desk")
    chat.send("Anyone there?")
    expect(chat.locator(".cvw-notice")).to_have_text("The assistant did not finish in time. Please try again.")
    expect(chat.locator(".cvw-sr")).to_have_text("The assistant did not finish in time. Please try again.")
    expect(chat.locator(".cvw-send")).to_be_enabled()
    polls_at_end = len(chat.polls)
    assert polls_at_end >= 2
    chat.page.wait_for_timeout(1500)
    assert len(chat.polls) == polls_at_end
    assert Turn.objects.get().status == "queued"


def test_a_turn_the_server_no_longer_knows_ends_at_once_with_a_clear_message(chat_page):
    # No worker runs; every poll is answered 404, as when the visitor's session has expired.
    chat = chat_page()
    polls = []

    def gone(route):
        if route.request.method != "GET":
            return route.continue_()
        polls.append(route.request.url)
        route.fulfill(status=404, content_type="application/json", body='{"detail": "Not found."}')

    chat.page.route("**/turns/*/", gone)
    chat.open()
    chat.send(QUESTION)
    expect(chat.locator(".cvw-notice")).to_have_text(
        "This conversation is no longer available. Send your message again to start a new one.")
    expect(chat.locator(".cvw-send")).to_be_enabled()
    chat.page.wait_for_timeout(1500)
    assert len(polls) == 1


def test_network_errors_show_reconnecting_and_the_turn_still_finishes(chat_page, worker_process):
    worker_process(DEMO_DELAY=0.8)
    chat = chat_page()
    seen = []

    def flaky(route):
        seen.append(route.request.url)
        if len(seen) in (2, 3, 4):
            route.abort("connectionreset")
        else:
            route.continue_()

    chat.page.route("**/turns/*/", flaky)
    chat.open()
    chat.send(QUESTION)
    expect(chat.locator(".cvw-status")).to_have_text("Connection lost. Reconnecting…")
    expect(chat.locator(".cvw-msg-assistant")).to_contain_text("in Tokyo")
    expect(chat.locator(".cvw-status")).to_have_text("")
    assert Turn.objects.get().status == "completed"


def test_a_turn_waiting_for_another_worker_shows_reconnecting_then_the_answer_goes_on(chat_page, worker_process):
    """While the server says the turn is being taken over (``resuming``: its worker died), the
    status line says so; once the new worker publishes, the answer goes on."""
    worker_process(DEMO_DELAY=0.8)
    chat = chat_page()
    changed = []  # the states that changed while the turn ran, as the server sent them

    def taken_over_for_a_while(route):
        response = route.fetch()
        state = response.json() if response.status == 200 else {"done": True}
        if state["done"]:
            route.fulfill(response=response)
            return
        changed.append(state)
        if len(changed) > 2:  # the first two reach the widget "taken over" (their worker died), the rest as they are
            route.fulfill(response=response)
            return
        route.fulfill(response=response, json={**state, "resuming": True, "version": -len(changed)})

    chat.page.route("**/turns/*/", taken_over_for_a_while)
    chat.open()
    chat.send(QUESTION)
    expect(chat.locator(".cvw-status")).to_have_text("Reconnecting…")
    expect(chat.locator(".cvw-msg-assistant")).to_contain_text("in Tokyo")
    expect(chat.locator(".cvw-status")).to_have_text("")
    assert Turn.objects.get().status == "completed"


def test_a_refused_message_stays_in_the_box_with_the_servers_reason(chat_page, conversations_settings):
    conversations_settings.update(MAX_MESSAGE_LENGTH=10)
    chat = chat_page().open()
    text = "This message is longer than ten characters."
    chat.locator(".cvw-input").evaluate("(box, text) => { box.maxLength = 1000; box.value = text; }", text)
    chat.locator(".cvw-input").press("Enter")
    expect(chat.locator(".cvw-status")).to_have_text(
        "The message is too long: 43 characters, at most 10 allowed.")
    expect(chat.locator(".cvw-input")).to_have_value(text)
    expect(chat.locator(".cvw-msg-user")).to_have_count(0)
    expect(chat.locator(".cvw-send")).to_be_enabled()


def test_shift_enter_adds_a_line_and_enter_sends(chat_page, worker_process):
    worker_process(DEMO_DELAY=0.05)
    chat = chat_page().open()
    box = chat.locator(".cvw-input")
    box.focus()
    chat.page.keyboard.type("first line")
    chat.page.keyboard.press("Shift+Enter")
    chat.page.keyboard.type("second line")
    expect(box).to_have_value("first line\nsecond line")
    chat.page.keyboard.press("Enter")
    expect(chat.locator(".cvw-msg-user")).to_have_text("first line\nsecond line")
    expect(box).to_have_value("")
    expect(chat.locator(".cvw-msg-assistant")).to_be_visible()
    expect(box).to_be_focused()
    # The input is labelled, and the label is what a screen reader announces for it.
    expect(chat.page.get_by_label("Your message")).to_be_visible()


def test_polling_pauses_while_the_tab_is_hidden_and_resumes_when_shown(chat_page, worker_process):
    chat = chat_page().open()
    chat.send(QUESTION)  # no worker yet: the turn waits in the queue
    expect(chat.locator(".cvw-status")).to_have_text("The assistant is thinking…")
    chat.page.evaluate("""() => {
        Object.defineProperty(document, "hidden", {configurable: true, get: () => true});
        document.dispatchEvent(new Event("visibilitychange"));
    }""")
    chat.page.wait_for_timeout(500)  # a poll already in flight may still land
    polls_while_hidden = len(chat.polls)
    chat.page.wait_for_timeout(3500)  # longer than the longest poll delay (3 s)
    assert len(chat.polls) == polls_while_hidden  # nothing polled while hidden

    worker_process(DEMO_DELAY=0.05)
    chat.page.evaluate("""() => {
        Object.defineProperty(document, "hidden", {configurable: true, get: () => false});
        document.dispatchEvent(new Event("visibilitychange"));
    }""")
    expect(chat.locator(".cvw-msg-assistant")).to_contain_text("in Tokyo")


def test_a_widget_removed_from_the_page_stops_polling(chat_page):
    chat = chat_page().open()
    chat.send(QUESTION)  # no worker: the turn stays queued, and the widget keeps polling it
    expect(chat.locator(".cvw-status")).to_have_text("The assistant is thinking…")
    chat.page.wait_for_timeout(1000)
    assert len(chat.polls) >= 1  # it was polling
    chat.page.evaluate("() => document.querySelector('conversations-widget').remove()")
    polls_at_removal = len(chat.polls)
    # Longer than the longest poll delay (3 s), and the tab hidden and shown again: a listener
    # left on the document would look at the turn at once.
    chat.page.wait_for_timeout(3500)
    chat.page.evaluate("""() => {
        Object.defineProperty(document, "hidden", {configurable: true, get: () => true});
        document.dispatchEvent(new Event("visibilitychange"));
        Object.defineProperty(document, "hidden", {configurable: true, get: () => false});
        document.dispatchEvent(new Event("visibilitychange"));
    }""")
    chat.page.wait_for_timeout(1000)
    assert len(chat.polls) == polls_at_removal


def test_an_incomplete_ending_reads_as_a_sentence(chat_page, worker_process, conversations_settings):
    with FakeProvider() as fake:
        fake.add(openai_text("The first half of an answer", finish_reason="length"))
        provider = {"PROVIDER": "openai", "BASE_URL": fake.url, "API_KEY": "sk-test", "MODEL": "fake-model"}
        conversations_settings.update(**provider)
        worker_process(**provider)
        chat = chat_page().open()
        chat.send("Tell me a long story")
        expect(chat.locator(".cvw-notice")).to_have_text(
            "The answer was cut short because it reached the length limit.")
    expect(chat.locator(".cvw-msg-assistant")).to_have_text("The first half of an answer")
    expect(chat.locator(".cvw-sr")).to_have_text("The answer was cut short because it reached the length limit.")
    assert "incomplete" not in chat.locator(".cvw").inner_text()


def test_markdown_subset_is_built_from_elements_and_only_http_links_are_links(chat_page):
    chat = chat_page().open()
    html = chat.page.evaluate("""() => {
        const box = document.createElement("div");
        ConversationsWidget.renderMarkdown([
          "Intro with *em*, **strong** and `a < b`.", "",
          "1. one", "2. two", "",
          "- [ok](http://example.com/a?b=1&c=2)", "- [bad]( javascript:alert(1))", "- [upper](JAVASCRIPT:alert(1))",
          "- [data](data:text/html,<script>alert(1)</script>)", "- see https://example.org/x.",
          "```", "<script>alert(1)</script>", "```",
        ].join("\\n"), box);
        return box.innerHTML;
    }""")
    assert html == (
        '<p>Intro with <em>em</em>, <strong>strong</strong> and <code>a &lt; b</code>.</p>'
        '<ol><li>one</li><li>two</li></ol>'
        '<ul><li><a href="http://example.com/a?b=1&amp;c=2" target="_blank" rel="noopener noreferrer">ok</a></li>'
        '<li>[bad]( javascript:alert(1))</li>'
        '<li>[upper](JAVASCRIPT:alert(1))</li>'
        '<li>[data](data:text/html,&lt;script&gt;alert(1)&lt;/script&gt;)</li>'
        '<li>see <a href="https://example.org/x" target="_blank" rel="noopener noreferrer">https://example.org/x</a>.</li>'
        '</ul>'
        '<pre><code>&lt;script&gt;alert(1)&lt;/script&gt;</code></pre>'
    )


def test_sending_again_after_a_lost_answer_does_not_start_a_second_turn(chat_page, worker_process):
    worker_process(DEMO_DELAY=0.05)
    chat = chat_page()
    lost = []

    def lose_first_answer(route):
        if route.request.method == "POST" and not lost:
            route.fetch()  # the server saves the message and starts the turn …
            lost.append(route.request.url)
            route.abort("connectionreset")  # … but the visitor never hears back
        else:
            route.continue_()

    chat.page.route("**/turns/", lose_first_answer)
    chat.open()
    chat.send(QUESTION)
    expect(chat.locator(".cvw-status")).to_have_text(
        "Your message could not be sent. Check your connection and try again.")
    expect(chat.locator(".cvw-input")).to_have_value(QUESTION)
    chat.locator(".cvw-input").press("Enter")  # the visitor sends the same text again
    expect(chat.locator(".cvw-msg-assistant")).to_contain_text("in Tokyo")
    assert Turn.objects.count() == 1
    assert chat.locator(".cvw-msg-user").count() == 1
