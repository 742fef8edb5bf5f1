"""The widget on someone else's page (issue 14): the launcher mode, several widgets with their own
conversations, theming, the sign-in link of a site for signed-in visitors, Stop while queued."""

import re

import pytest
from playwright.sync_api import expect

from conversations.models import Turn
from tests.browser.pages import open_host_page, plain_page
from tests.browser.scripted import QUESTION, ScriptedApi

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LAUNCHER = '<a href="#before">Before</a>{% chat_widget mode="launcher" %}<a href="#after">After</a>'


def test_the_launcher_opens_the_panel_and_escape_closes_it_giving_focus_back(chat_page):
    chat = chat_page()
    ScriptedApi(chat.page)
    open_host_page(chat, LAUNCHER)
    launcher = chat.page.get_by_role("button", name="Assistant")
    panel = chat.page.get_by_role("dialog", name="Chat with the assistant")
    expect(panel).to_be_hidden()
    expect(launcher).to_have_attribute("aria-expanded", "false")

    launcher.click()
    expect(panel).to_be_visible()
    expect(launcher).to_have_attribute("aria-expanded", "true")
    expect(chat.locator(".cvw-input")).to_be_focused()
    chat.page.keyboard.press("Escape")
    expect(panel).to_be_hidden()
    expect(launcher).to_be_focused()

    chat.page.keyboard.press("Enter")
    expect(panel).to_be_visible()
    chat.page.get_by_role("button", name="Close").click()
    expect(panel).to_be_hidden()
    expect(launcher).to_be_focused()


def test_the_launcher_panel_fills_a_narrow_window(chat_page):
    chat = chat_page()
    chat.page.set_viewport_size({"width": 360, "height": 640})
    ScriptedApi(chat.page)
    open_host_page(chat, LAUNCHER)
    chat.page.get_by_role("button", name="Assistant").click()
    box = chat.locator(".cvw-panel").bounding_box()
    assert box == {"x": 0, "y": 0, "width": 360, "height": 640}
    expect(chat.locator(".cvw-input")).to_be_in_viewport()


def test_two_widgets_on_one_page_each_keep_their_own_conversation(chat_page, worker_process):
    worker_process(DEMO_DELAY=0.05)
    chat = chat_page()
    page = plain_page({"key": "sales"}, {"key": "support", "mode": "launcher"})
    chat.page.route("**/two-widgets/", lambda route: route.fulfill(content_type="text/html", body=page))
    chat.page.goto(chat.base_url + "/two-widgets/")
    sales, support = chat.locator("conversations-widget").nth(0), chat.locator("conversations-widget").nth(1)
    sales.locator(".cvw-input").fill("How do refunds work?")
    sales.locator(".cvw-input").press("Enter")
    expect(sales.locator(".cvw-msg-assistant")).to_contain_text("refund")
    support.locator(".cvw-launcher").click()
    support.locator(".cvw-input").fill(QUESTION)
    support.locator(".cvw-input").press("Enter")
    expect(support.locator(".cvw-msg-assistant")).to_contain_text("in Tokyo")

    chat.page.reload()
    expect(sales.locator(".cvw-msg-user")).to_have_text("How do refunds work?")
    support.locator(".cvw-launcher").click()
    expect(support.locator(".cvw-msg-user")).to_have_text(QUESTION)
    # Each shows its own exchange only.
    expect(sales.locator(".cvw-msg-user")).to_have_count(1)
    expect(support.locator(".cvw-msg-user")).to_have_count(1)
    expect(sales.locator(".cvw-log")).not_to_contain_text("Tokyo")
    assert Turn.objects.values("conversation").distinct().count() == 2


def test_a_theme_set_on_the_host_element_reaches_in_and_host_rules_do_not(chat_page):
    chat = chat_page()
    ScriptedApi(chat.page)
    open_host_page(chat, "{% chat_widget %}", style="""
        conversations-widget { --cvw-accent: rgb(11, 90, 60); --cvw-radius: 0px; }
        .cvw-header, .cvw-send { background: red !important; }""")
    expect(chat.locator(".cvw-header")).to_have_css("background-color", "rgb(11, 90, 60)")
    expect(chat.locator(".cvw-send")).to_have_css("background-color", "rgb(11, 90, 60)")
    expect(chat.locator(".cvw-panel")).to_have_css("border-top-left-radius", "0px")


def test_stop_is_there_while_the_turn_waits_in_the_queue_and_stops_it(chat_page):
    chat = chat_page().open()  # no worker: the turn stays queued
    chat.send(QUESTION)
    expect(chat.locator(".cvw-status")).to_have_text("The assistant is thinking…")
    chat.locator(".cvw-stop").click()
    expect(chat.locator(".cvw-notice")).to_have_text("You stopped this answer.")
    expect(chat.locator(".cvw-send")).to_be_enabled()
    assert Turn.objects.get().status == "cancelled"


def test_a_refusal_with_403_is_shown_as_the_servers_sentence(chat_page):
    chat = chat_page()
    api = ScriptedApi(chat.page)
    chat.open()
    api.refusal = (403, {"detail": "Sign in to use the assistant."})
    chat.send(QUESTION)
    expect(chat.locator(".cvw-status")).to_have_text("Sign in to use the assistant.")
    expect(chat.locator(".cvw-sr")).to_have_text("Sign in to use the assistant.")
    expect(chat.locator(".cvw-input")).to_have_value(QUESTION)


@pytest.mark.parametrize("locale, text", [("en-US", "Sign in to chat with the assistant."),
                                          ("es-ES", "Inicia sesión para hablar con el asistente.")])
def test_a_site_for_signed_in_visitors_shows_an_anonymous_one_a_sign_in_link(chat_page, conversations_settings,
                                                                              locale, text):
    conversations_settings.update(LOGIN_REQUIRED=True)
    chat = chat_page(locale=locale)
    chat.page.goto(chat.base_url + "/?topic=refunds")
    link = chat.page.get_by_role("link", name=text)
    expect(link).to_have_attribute("href", "/accounts/login/?next=/%3Ftopic%3Drefunds")
    expect(chat.locator(".cvw-input")).to_have_count(0)
    expect(chat.locator(".cvw-send")).to_have_count(0)
    link.click()
    expect(chat.page).to_have_url(re.compile(r"/accounts/login/\?next=/%3Ftopic%3Drefunds$"))
