"""Turn pages in real headless Chromium, for real turns of an assistant run by a forking burst
worker against the fake Chat Completions server (``JOB_TIMEOUT=30``, ``DEADLINE_MARGIN=8``,
``CALL_TIMEOUT=8``, ``MIN_CALL_BUDGET=3``): one rate-limited once, then two tools, an attempt that
hangs until it is cut at its timeout, then the answer; one whose provider never answers. With
``SCREENSHOTS=docs/images`` the pages are also saved there (admin-turn.png and
admin-turn-deadline.png, in docs/admin.md and the README)."""

import pytest

from conversations.models import Assistant, Turn
from tests.browser.pages import admin_page
from tests.browser.test_admin_assistants import shoot
from tests.support.fakes import FakeProvider, hang, openai_text, openai_tool_calls, retry_after
from tests.support.helpers import api_post, local_key, make_client, poll_until_done, run_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def real_turn(conversations_settings, question, *replies):
    """A turn of the assistant "support" asked ``question`` by the signed-in maria, the fake
    provider answering ``replies`` in turn, run to its end by a forking burst worker."""
    from django.contrib.auth import get_user_model

    conversations_settings.update(CREDENTIALS={"key": local_key("sk-test")}, JOB_TIMEOUT=30, DEADLINE_MARGIN=8,
                                  CALL_TIMEOUT=8, MIN_CALL_BUDGET=3, TOOL_TIMEOUT=5, STREAM=False)
    with FakeProvider() as api:
        api.add(*replies)
        Assistant.objects.create(slug="support", name="Help desk", provider="openai", base_url=api.url,
                                 model="gpt-4o-mini", credential="key", tools=["current_time", "search_faq"],
                                 system_prompt="You answer questions about orders, shipping and refunds.")
        visitor = make_client()
        visitor.force_login(get_user_model().objects.create_user("maria", "maria@example.com", "pw-123456789"))
        visitor.get("/")  # login rotates the CSRF token
        visitor.csrf = visitor.cookies["csrftoken"].value
        conversation = api_post(visitor, "/api/conversations/", {"assistant": "support"}).json()["id"]
        started = api_post(visitor, f"/api/conversations/{conversation}/turns/", {"content": question}).json()
        run_worker()
        poll_until_done(visitor, started["poll_url"])
    return Turn.objects.get(pk=started["id"])


def open_turn_page(page, live_server, turn):
    """``turn``'s page, the admin's navigation sidebar folded away (as a narrow window has it):
    the timeline gets the page's width."""
    page.evaluate("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
    page.goto(f"{live_server.url}/admin/conversations/turn/{turn.pk}/change/")
    calls = page.locator(".timeline-table tr.timeline-call")
    return [(cells[0], cells[1], cells[6]) for cells in (row.split("\t") for row in calls.all_inner_texts())]


def test_a_turn_page_shows_where_the_time_went_and_offers_the_message_to_a_test_set(
        browser, live_server, conversations_settings):
    turn = real_turn(
        conversations_settings, "What time is it in Tokyo, and how do refunds work?",
        retry_after(1),
        openai_tool_calls(("call_1", "current_time", {"city": "Tokyo"}),
                          ("call_2", "search_faq", {"query": "refund <policy>"}),
                          prompt_tokens=280, completion_tokens=41),
        hang,
        openai_text("It is evening in Tokyo. Refunds: you can return items within 30 days of delivery "
                    "<b>(not HTML)</b>.", prompt_tokens=320, completion_tokens=36))
    assert turn.status == "completed"
    with admin_page(browser, live_server) as page:
        calls = open_turn_page(page, live_server, turn)
        assert calls == [("model call · gpt-4o-mini", "1", "HTTP error"), ("model call · gpt-4o-mini", "2", "ok"),
                         ("tool run · current_time", "1", "ok"), ("tool run · search_faq", "1", "ok"),
                         ("model call · gpt-4o-mini", "1", "timeout"), ("model call · gpt-4o-mini", "2", "ok")]
        tools = page.locator(".object-tools")
        assert tools.get_by_role("button", name="Re-run this message").is_visible()
        add = tools.get_by_role("link", name="Add to a test set")
        assert add.is_visible()
        assert page.locator(".transcript-assistant").last.inner_text().endswith(
            "within 30 days of delivery <b>(not HTML)</b>.")  # a model's words are text, never HTML
        shoot(page, "admin-turn.png")
        add.click()
        assert page.url.endswith(f"/turn/{turn.pk}/add-to-test-set/")
        assert page.locator(".add-to-test-set-turns li").inner_text() == f"{str(turn.pk)[:8]} · Help desk"


def test_a_turn_whose_provider_never_answered_ends_at_its_deadline(browser, live_server, conversations_settings):
    turn = real_turn(conversations_settings, "Compare every plan you sell, in detail", hang, hang, hang)
    assert turn.status == "failed" and turn.error
    with admin_page(browser, live_server) as page:
        calls = open_turn_page(page, live_server, turn)
        assert calls == [("model call · gpt-4o-mini", str(attempt), "timeout") for attempt in (1, 2, 3)]
        assert page.locator(".transcript-turn-error .transcript-content").inner_text() == turn.error
        assert page.locator(".object-tools").get_by_role("link", name="Add to a test set").is_visible()
        shoot(page, "admin-turn-deadline.png")
