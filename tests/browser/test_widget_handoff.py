"""A conversation handed to a person, through the real widget: the visitor presses "Talk to a
person", writes while waiting (no turn starts), a staff member's reply from the admin appears
within seconds and again after a reload, and once handed back the assistant (a real worker,
the demo model) answers the next message. With ``SCREENSHOTS=docs/images`` the widget with the
staff reply is saved there (docs/widget.md)."""

import os
import time
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.template import Context, Template
from django.test import Client, RequestFactory
from django.urls import reverse
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import expect

from conversations.models import Assistant, Conversation, Turn
from tests.browser.pages import settled
from tests.support.fakes import FakeProvider, openai_tool_calls
from tests.support.helpers import ROOT, local_key

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def page_with(csrf_cookie, slug):
    """The HTML of a page with the widget of assistant ``slug``, rendered by the real tag for the
    browser whose csrftoken cookie is ``csrf_cookie``."""
    request = RequestFactory().get("/help/")
    request.META["CSRF_COOKIE"] = csrf_cookie
    body = Template('{% load conversations %}{% chat_widget assistant="' + slug + '" %}').render(
        Context({"request": request}))
    return f"<!doctype html><html lang='en'><head><title>Help</title></head><body><main>{body}</main></body></html>"


def open_help_page(chat, slug="support"):
    chat.page.goto(chat.base_url + "/")  # a real page of the site first: it sets the csrftoken cookie
    cookie = next(c["value"] for c in chat.page.context.cookies() if c["name"] == "csrftoken")
    html = page_with(cookie, slug)
    chat.page.route("**/help/", lambda route: route.fulfill(body=html, content_type="text/html"))
    chat.page.goto(chat.base_url + "/help/")
    chat.page.locator(".cvw-input").wait_for()
    return chat


def staff_member():
    user = User.objects.create_user("ana", first_name="Ana", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="answer_handoff"))
    client = Client()
    client.force_login(user)
    return client


def audit(page):
    """axe-core's violations in the widget (WCAG 2.x A and AA, best practices), as test_widget_a11y.py runs it."""
    settled(page)
    tags = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa", "best-practice"]
    results = Axe().run(page, context={"include": [["[data-conversations-widget]"]]},
                        options={"runOnly": {"type": "tag", "values": tags}, "resultTypes": ["violations"]})
    return [(v["id"], v["impact"], len(v["nodes"])) for v in results.response["violations"]]


def until(condition, timeout=20):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_the_visitor_asks_for_a_person_and_reads_the_staff_reply_live_and_after_a_reload(chat_page, worker_process):
    Assistant.objects.create(slug="support", name="Support", provider="demo", system_prompt="You are Support.",
                             tools=["current_time"], handoff=Assistant.HandoffWays.BUTTON)
    worker_process(DEMO_DELAY=0.05)
    chat = open_help_page(chat_page())
    page = chat.page
    assert audit(page) == []  # with the header's button

    page.get_by_role("button", name="Talk to a person").click()
    expect(chat.locator(".cvw-handoff")).to_contain_text("A person will reply here.")
    expect(page.get_by_role("button", name="Talk to a person")).to_be_hidden()
    chat.send("My parcel never came.")
    expect(chat.locator(".cvw-msg-user.cvw-pending")).to_have_count(0)  # saved
    chat.send("Order 1234.")
    expect(chat.locator(".cvw-msg-user")).to_have_count(2)
    expect(chat.locator(".cvw-msg-user.cvw-pending")).to_have_count(0)
    conversation = Conversation.objects.get()
    until(lambda: conversation.messages.count() == 2)
    assert not Turn.objects.exists()  # kept for staff: the assistant did not answer

    ana = staff_member()
    answer = reverse("admin:conversations_waitingconversation_change", args=[conversation.pk])
    sent = ana.post(answer, {"action": "reply", "content": "Hi, I am looking at order 1234 <now>."})
    assert sent.status_code == 302
    saved = time.monotonic()
    staff = chat.locator(".cvw-msg-staff")
    expect(staff).to_contain_text("Hi, I am looking at order 1234 <now>.", timeout=10_000)
    shown_after = time.monotonic() - saved
    expect(staff.locator(".cvw-author")).to_have_text("Ana from support")
    expect(chat.locator(".cvw-handoff")).to_contain_text("Ana from support joined the conversation.")
    assert staff.locator("now").count() == 0  # text, never HTML
    assert shown_after < 8, shown_after  # the poll backs off to 1 s; generous under load
    assert audit(page) == []  # the person's line and their bubble, as every other state
    if os.environ.get("SCREENSHOTS"):
        chat.locator(".cvw-input").blur()
        chat.locator(".cvw-panel").screenshot(path=str(Path(ROOT, os.environ["SCREENSHOTS"], "widget-handoff.png")))

    page.reload()
    expect(chat.locator(".cvw-msg-staff")).to_contain_text("Hi, I am looking at order 1234 <now>.")
    expect(chat.locator(".cvw-msg-user")).to_have_count(2)
    expect(chat.locator(".cvw-handoff")).to_contain_text("Ana from support joined the conversation.")

    assert ana.post(answer, {"action": "hand_back"}).status_code == 302
    expect(chat.locator(".cvw-notice")).to_have_text("You are talking to the assistant again.", timeout=10_000)
    expect(chat.locator(".cvw-handoff")).to_be_hidden()
    chat.send("What time is it in Tokyo?")
    expect(chat.locator(".cvw-msg-assistant").last).to_contain_text("in Tokyo")
    assert Turn.objects.get().status == "completed"


def test_the_assistants_tool_hands_over_and_a_visitor_no_one_answered_goes_back(
        chat_page, worker_process, conversations_settings):
    # HANDOFF_WAIT long enough for the widget to show the waiting line first on a loaded machine (at
    # 1 s, a CI run under load showed "No one is free" before the test saw "A person will reply here.")
    conversations_settings.update(CREDENTIALS={"key": local_key("sk-test")}, HANDOFF_WAIT=5)
    with FakeProvider() as api:
        api.add(openai_tool_calls(("hand_to_person", {"reason": "Wants a human."})))
        Assistant.objects.create(slug="support", name="Support", provider="openai", base_url=api.url, credential="key",
                                 system_prompt="You are Support.", handoff=Assistant.HandoffWays.TOOL)
        worker_process(CREDENTIALS={"key": local_key("sk-test")}, HANDOFF_WAIT=5)
        chat = open_help_page(chat_page())
        assert chat.page.get_by_role("button", name="Talk to a person").count() == 0  # the tool only

        chat.send("Can I talk to a human, please?")
        # The turn ends with the tool (the model is not called again): its step says a person was asked for.
        expect(chat.locator(".cvw-step").last).to_contain_text("has been asked to join")
        line = chat.locator(".cvw-handoff")
        expect(line).to_contain_text("A person will reply here.")
        # HANDOFF_WAIT (5 s) passes with no one taking it: the visitor is told, and may go back.
        expect(line).to_contain_text("No one is free to answer right now.", timeout=20_000)
        assert audit(chat.page) == []
        chat.page.get_by_role("button", name="Back to the assistant").click()
        expect(chat.locator(".cvw-notice")).to_have_text("You are talking to the assistant again.")
        expect(line).to_be_hidden()
    assert Conversation.objects.get().handoff == "returned"


def visibility(page, hidden):
    page.evaluate("""hidden => {
        Object.defineProperty(document, "hidden", {configurable: true, get: () => hidden});
        document.dispatchEvent(new Event("visibilitychange"));
    }""", hidden)


def test_the_handoff_poll_backs_off_with_etags_and_pauses_while_the_tab_is_hidden(chat_page):
    Assistant.objects.create(slug="support", name="Support", provider="demo", system_prompt="You are Support.",
                             handoff=Assistant.HandoffWays.BUTTON)
    chat = open_help_page(chat_page())
    looks = []  # (seconds, status) of every handoff poll answer
    chat.page.on("response", lambda r: looks.append((time.monotonic(), r.status))
                 if r.request.method == "GET" and r.url.endswith("/handoff/") else None)
    chat.page.get_by_role("button", name="Talk to a person").click()
    expect(chat.locator(".cvw-handoff")).to_contain_text("A person will reply here.")
    chat.page.wait_for_timeout(5000)
    gaps = [b[0] - a[0] for a, b in zip(looks, looks[1:])]
    assert {status for _, status in looks[1:]} == {304}  # nothing changed: no body
    assert gaps[0] < gaps[-1] <= 2.0 + 0.8, gaps  # backing off, to at most 2 s (slack for load)

    visibility(chat.page, True)
    chat.page.wait_for_timeout(500)  # a look already in flight may still land
    while_hidden = len(looks)
    ana = staff_member()
    conversation = Conversation.objects.get()
    answer = reverse("admin:conversations_waitingconversation_change", args=[conversation.pk])
    assert ana.post(answer, {"action": "reply", "content": "Hello, Ana here."}).status_code == 302
    chat.page.wait_for_timeout(3000)  # longer than the longest delay
    assert len(looks) == while_hidden and chat.locator(".cvw-msg-staff").count() == 0
    visibility(chat.page, False)  # shown again: it looks at once
    expect(chat.locator(".cvw-msg-staff")).to_contain_text("Hello, Ana here.", timeout=3000)


def test_after_a_reload_with_a_cold_cache_the_widget_shows_the_newest_message(chat_page):
    """The widget's stylesheet arrives after the conversation (a cold cache): the log, drawn while
    the frame was hidden, still starts at the newest staff reply, not at the top."""
    from conversations.engine import handoff

    Assistant.objects.create(slug="support", name="Support", provider="demo", system_prompt="You are Support.",
                             handoff=Assistant.HandoffWays.BUTTON)
    chat = open_help_page(chat_page())
    page = chat.page
    page.get_by_role("button", name="Talk to a person").click()
    expect(chat.locator(".cvw-handoff")).to_contain_text("A person will reply here.")
    ana = User.objects.create_user("ana", first_name="Ana", is_staff=True)
    conversation = Conversation.objects.get()
    for n in range(1, 26):
        handoff.reply(conversation.pk, ana, f"Step {n} of the return: " + "please read this carefully. " * 4)
    expect(chat.locator(".cvw-msg-staff")).to_have_count(25)

    def stylesheet_late(route):
        time.sleep(1.5)  # the conversation's GET is answered meanwhile, and drawn in the hidden frame
        route.continue_()

    page.route("**/conversations/widget.css", stylesheet_late)  # routed requests skip the browser's cache
    page.reload()
    newest = chat.locator(".cvw-msg-staff").last
    expect(newest).to_contain_text("Step 25 of the return")
    expect(newest).to_be_in_viewport()
    log = chat.locator(".cvw-log")
    assert log.evaluate("log => log.scrollHeight - log.scrollTop - log.clientHeight") < 48
    assert log.evaluate("log => log.scrollHeight > log.clientHeight * 2")  # it had somewhere to scroll
