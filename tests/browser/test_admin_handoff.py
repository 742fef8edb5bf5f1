"""The inbox of conversations handed to a person and the page where staff answer one, in real
headless Chromium. With ``SCREENSHOTS=docs/images`` the pages are also saved there (the images
in docs/admin.md)."""

import datetime
import os
import re
import time
from pathlib import Path

import pytest
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import expect
from django.contrib.auth.models import User
from django.utils import timezone

from conversations.engine import handoff
from conversations.models import Assistant, Conversation, Message, Turn
from tests.browser.pages import admin_page
from tests.support.helpers import ROOT, api_post, make_client

pytestmark = pytest.mark.django_db(transaction=True)


def shoot(page, name):
    target = os.environ.get("SCREENSHOTS")
    if target:
        page.screenshot(path=str(Path(ROOT, target, name)), full_page=True)


def waiting(assistant, minutes, words, answered=None):
    """A conversation that has waited ``minutes`` for a person, after one assistant turn (``answered``)."""
    conversation = Conversation.objects.create(owner_token=f"visitor-{minutes}", assistant=assistant)
    if answered:
        now = timezone.now()
        turn = Turn.objects.create(conversation=conversation, assistant=assistant, status="completed",
                                   enqueued_at=now, started_at=now, finished_at=now)
        for role, content in answered:
            Message.objects.create(conversation=conversation, turn=turn, role=role, content=content)
    handoff.request(conversation.pk, "button")
    for text in words:
        Message.objects.create(conversation=conversation, role="user", content=text)
    Conversation.objects.filter(pk=conversation.pk).update(
        handoff_requested_at=timezone.now() - datetime.timedelta(minutes=minutes))
    return conversation


def test_staff_see_the_inbox_oldest_first_take_one_and_reply(browser, live_server):
    support = Assistant.objects.create(slug="support", name="Help desk", provider="demo", system_prompt="Help.",
                                       handoff=Assistant.HandoffWays.BOTH)
    shop = Assistant.objects.create(slug="shop", name="Shop assistant", provider="demo", system_prompt="Sell.",
                                    handoff=Assistant.HandoffWays.BUTTON)
    refund = waiting(support, 12, ["I was charged twice for order 1234.", "Can someone look at it?"], answered=[
        ("user", "I want a refund for a double charge."),
        ("assistant", "I cannot change payments myself. Shall I ask a person from our team?")])
    waiting(shop, 3, ["Do you have the blue one in size 40?"])
    waiting(support, 31, ["Hello? My parcel never arrived."])

    with admin_page(browser, live_server) as page:
        User.objects.filter(username="admin").update(first_name="Ana")
        page.goto(f"{live_server.url}/admin/conversations/waitingconversation/")
        waits = page.locator("#result_list tbody tr td.field-assistant")
        assert [waits.nth(i).inner_text() for i in range(3)] == ["Help desk", "Help desk", "Shop assistant"]
        assert page.locator("#result_list tbody tr").first.locator("th").inner_text() == "31 min"
        shoot(page, "admin-handoff-inbox.png")

        page.goto(f"{live_server.url}/admin/conversations/waitingconversation/{refund.pk}/change/")
        page.get_by_role("button", name="Take this conversation").click()
        assert page.locator(".messagelist").inner_text() == "You are answering this conversation."
        page.get_by_label("Your reply").fill("I see the two charges: I have refunded the second one. It is back on your card within 5 days.")
        page.get_by_role("button", name="Send reply").click()
        assert page.locator(".messagelist").inner_text() == "Your reply was sent."
        assert page.get_by_role("button", name="Take this conversation").count() == 0
        assert "Your reply (the visitor reads it from “Ana from support”)" in page.locator("label").inner_text()
        staff = page.locator(".transcript-staff")
        assert "I have refunded the second one." in staff.inner_text()
        shoot(page, "admin-handoff-answer.png")
    assert Conversation.objects.get(pk=refund.pk).handoff == "taken"


# -- live pages: what staff see change without reloading ----------------------------------------

def audit(page, selector):
    """axe-core's violations inside ``selector`` (WCAG 2.x A and AA, best practices), as the widget's audit runs it."""
    tags = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa", "best-practice"]
    results = Axe().run(page, context={"include": [[selector]]},
                        options={"runOnly": {"type": "tag", "values": tags}, "resultTypes": ["violations"]})
    return [(v["id"], v["impact"], len(v["nodes"])) for v in results.response["violations"]]


def visitor_asks(assistant_slug="support", words="Is anyone there? I need a person."):
    """A visitor (through the API, as the widget does) who writes and asks for a person; their client and conversation."""
    visitor = make_client()
    conversation = api_post(visitor, "/api/conversations/", {"assistant": assistant_slug}).json()["id"]
    api_post(visitor, f"/api/conversations/{conversation}/handoff/")
    api_post(visitor, f"/api/conversations/{conversation}/turns/", {"content": words})
    return visitor, conversation


def support_desk():
    return Assistant.objects.create(slug="support", name="Help desk", provider="demo", system_prompt="Help.",
                                    handoff=Assistant.HandoffWays.BOTH)


def test_a_new_request_appears_in_the_open_inbox_within_2_seconds_with_the_count_in_the_title(browser, live_server):
    support = support_desk()
    waiting(support, 4, ["Where is my parcel?"])
    with admin_page(browser, live_server) as page:
        page.goto(f"{live_server.url}/admin/conversations/waitingconversation/")
        rows = page.locator("#result_list tbody tr")
        expect(rows).to_have_count(1)
        expect(page).to_have_title(re.compile(r"^\(1 waiting\) Conversations waiting for a person"))
        assert audit(page, "#content") == []
        # The sound is the staff member's choice, off until they tick it, and kept across reloads.
        sound = page.get_by_label("Play a sound when a visitor asks for a person")
        expect(sound).not_to_be_checked()
        sound.press("Space")
        page.reload()
        expect(sound).to_be_checked()

        asked = time.monotonic()
        _visitor, conversation = visitor_asks(words="My order never came.")
        expect(rows).to_have_count(2, timeout=2000)
        shown_after = time.monotonic() - asked
        new = rows.nth(1)
        expect(new.locator("td.field-last_words")).to_have_text("My order never came.")
        expect(page).to_have_title(re.compile(r"^\(2 waiting\) "))
        expect(page.locator(".handoff-live-status")).to_have_text("A visitor is waiting for a person.")
        expect(page.locator("#changelist .paginator")).to_contain_text("2 conversations for a person")
        print(f"\nnew request shown in the inbox after {shown_after:.2f} s")
        shoot(page, "admin-handoff-inbox-live.png")

        # A colleague takes it: the row says so, the count in the title drops; no reload.
        handoff.take(conversation, User.objects.create_user("ben", is_staff=True))
        expect(new.locator("td.field-taken_by")).to_have_text("ben")
        expect(page).to_have_title(re.compile(r"^\(1 waiting\) "))
        assert audit(page, "#content") == []

        # Keyboard: the row's link is reached with Tab and opened with Enter.
        link = new.locator("th a")
        link.focus()
        page.keyboard.press("Enter")
        expect(page).to_have_url(re.compile(rf"/{conversation}/change/$"))


def test_the_open_answer_page_shows_the_visitors_messages_keeps_the_draft_and_greys_out_at_a_colleagues_take(
        browser, live_server):
    support_desk()
    with admin_page(browser, live_server) as page:
        visitor, conversation = visitor_asks(words="Hello, I was charged twice.")
        page.goto(f"{live_server.url}/admin/conversations/waitingconversation/{conversation}/change/")
        # No one answers it: Take is all it offers.
        assert [b.inner_text() for b in page.locator("#handoff-form button:visible").all()] == ["Take this conversation"]
        page.get_by_role("button", name="Take this conversation").click()
        box = page.get_by_label("Your reply")
        box.fill("Let me look at your payments")
        box.press("End")

        api_post(visitor, f"/api/conversations/{conversation}/turns/", {"content": "<b>Order 1234</b>, paid by card."})
        entries = page.locator("#transcript-entries .transcript-entry")
        expect(entries.last).to_contain_text("<b>Order 1234</b>, paid by card.")  # as text
        expect(entries.last).to_contain_text("written while waiting for a person")
        api_post(visitor, f"/api/conversations/{conversation}/turns/", {"content": "Are you still there?"})
        expect(entries.last).to_contain_text("Are you still there?")
        # The draft, the caret and the focus are where the staff member left them.
        page.keyboard.type(", one moment.")
        expect(box).to_have_value("Let me look at your payments, one moment.")
        assert page.evaluate("document.activeElement.id") == "handoff-content"
        assert audit(page, "#content-main") == []
        shoot(page, "admin-handoff-answer-live.png")

        # A colleague (a superuser) takes it over: the box greys out with the draft still in it.
        boss = User.objects.create_superuser("dora", first_name="Dora")
        handoff.take(conversation, boss, holder=User.objects.get(username="admin").pk)
        expect(page.locator(".errornote")).to_have_text("dora is answering this conversation: only they may reply.")
        expect(box).not_to_be_editable()
        expect(box).to_have_value("Let me look at your payments, one moment.")
        expect(page.get_by_role("button", name="Send reply")).to_be_hidden()
        assert audit(page, "#content-main") == []
    assert not Message.objects.filter(conversation_id=conversation, role="staff").exists()
