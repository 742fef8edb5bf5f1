"""The inbox of conversations handed to a person and the page where staff answer one, in real
headless Chromium. With ``SCREENSHOTS=docs/images`` the pages are also saved there (the images
in docs/admin.md)."""

import datetime
import os
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from conversations.engine import handoff
from conversations.models import Assistant, Conversation, Message, Turn
from tests.browser.pages import admin_page
from tests.support.helpers import ROOT

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
