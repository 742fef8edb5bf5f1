"""The widget on a site that is not the demo: an ending that survives a reload, a turn no worker
takes, an answer being written, and a script that never loads. Real Chromium against the live
server (and, for the status line of a streamed answer, the scripted API)."""

import pytest
from playwright.sync_api import expect

from tests.browser.scripted import QUESTION, ScriptedApi, assistant, state, streaming

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

STOPPED = "You stopped this answer."
NOT_AVAILABLE = "The assistant is not available right now. Please try again later."


def test_a_stopped_and_a_failed_turn_keep_their_sentences_after_a_reload(chat_page, conversations_settings):
    # No worker runs: the first turn is stopped while queued, the second ends failed after QUEUE_WAIT.
    chat = chat_page().open()
    chat.send("First question")
    expect(chat.locator(".cvw-stop")).to_be_visible()
    chat.locator(".cvw-stop").click()
    expect(chat.locator(".cvw-notice")).to_have_text([STOPPED])
    conversations_settings.update(QUEUE_WAIT=1)
    chat.send("Second question")
    expect(chat.locator(".cvw-notice")).to_have_text([STOPPED, NOT_AVAILABLE])
    before = chat.locator(".cvw-list > li").all_text_contents()

    chat.page.reload()
    expect(chat.locator(".cvw-notice")).to_have_text([STOPPED, NOT_AVAILABLE])
    # Each under its own turn, where it stood before the reload.
    assert chat.locator(".cvw-list > li").all_text_contents() == before == [
        "First question", STOPPED, "Second question", NOT_AVAILABLE]


def test_a_turn_no_worker_takes_says_it_waits_for_the_assistant(chat_page):
    chat = chat_page().open()
    chat.send(QUESTION)
    status = chat.locator(".cvw-status")
    expect(status).to_have_text("The assistant is thinking…")
    expect(status).to_have_text("Waiting for the assistant to start…", timeout=10_000)


def test_the_status_line_says_the_answer_is_being_written_while_it_streams(chat_page):
    chat = chat_page()
    api = ScriptedApi(chat.page)
    chat.open()
    chat.send(QUESTION)
    status = chat.locator(".cvw-status")
    expect(status).to_have_text("The assistant is thinking…")

    api.state = state("running", streaming("Tokyo is nine hours"), version=2)
    expect(chat.locator(".cvw-msg-assistant")).to_have_text("Tokyo is nine hours")
    expect(status).to_have_text("The assistant is writing…")

    api.state = state("completed", assistant("Tokyo is nine hours ahead of UTC."), version=3)
    expect(chat.locator(".cvw-msg-assistant")).to_have_text("Tokyo is nine hours ahead of UTC.")
    expect(status).to_have_text("")


def test_a_page_whose_script_never_loads_says_the_assistant_could_not_load(chat_page):
    chat = chat_page()
    chat.page.route("**/conversations/widget.js", lambda route: route.fulfill(status=404, body="Not Found"))
    chat.page.goto(chat.base_url + "/")
    expect(chat.page.get_by_text("The assistant could not load.")).to_be_visible(timeout=10_000)


def test_the_fallback_text_never_shows_where_the_script_runs(chat_page):
    chat = chat_page().open()
    chat.page.wait_for_timeout(3500)  # past the delay after which the fallback would appear
    expect(chat.page.get_by_text("The assistant could not load.")).to_be_hidden()
    expect(chat.locator(".cvw-input")).to_be_visible()


def test_the_admins_turn_list_fits_a_1280_pixel_window(browser, live_server, worker):
    from tests.browser.pages import admin_page
    from tests.support.helpers import make_client, poll_until_done, start_turn

    visitor = make_client()
    started = start_turn(visitor, "A question long enough to fill its cell, as visitors' questions do.")
    worker()
    poll_until_done(visitor, started["poll_url"])
    with admin_page(browser, live_server) as page:
        page.goto(f"{live_server.url}/admin/conversations/turn/")
        columns = page.locator("#result_list thead th").count()
        widths = page.evaluate("""() => { const results = document.querySelector('#changelist .results');
            const table = document.querySelector('#result_list');
            return {scroll: results.scrollWidth, client: results.clientWidth,
                    right: table.getBoundingClientRect().right, page: document.documentElement.scrollWidth}; }""")

    assert columns == 14
    assert widths["scroll"] <= widths["client"], widths  # nothing cut off or scrolled sideways
    assert widths["right"] <= 1280 and widths["page"] <= 1280, widths


HEADER = "header { position: fixed; top: 0; left: 0; right: 0; height: 64px; background: #333; z-index: 2147483647; }"


def test_a_host_header_above_the_widget_covers_its_full_window_panel_until_cvw_z_index_raises_it(chat_page):
    from tests.browser.pages import open_host_page

    def close_button_is_on_top(style):
        chat = chat_page(viewport={"width": 375, "height": 700})  # a phone: the panel fills the window
        open_host_page(chat, '<header>The site</header>{% chat_widget mode="launcher" %}', style=style)
        chat.locator(".cvw-launcher").click()
        box = chat.locator(".cvw-close").bounding_box()
        return chat.page.evaluate("""([x, y]) => { const hit = document.elementFromPoint(x, y);
            return hit.tagName === 'CONVERSATIONS-WIDGET' &&
                   hit.shadowRoot.elementFromPoint(x, y).classList.contains('cvw-close'); }""",
                                  [box["x"] + box["width"] / 2, box["y"] + box["height"] / 2])

    assert close_button_is_on_top(HEADER) is False  # what docs/widget.md warns about
    assert close_button_is_on_top(HEADER + " conversations-widget { --cvw-z-index: 2147483647; }") is True
