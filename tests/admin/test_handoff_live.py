"""The staff pages of conversations handed to a person, live: the inbox's and the answer page's
JSON (what admin-live.js polls), with their ETag and 304, their permission, and what each page
offers a staff member (only Take on a conversation no one answers; a colleague's greys out the
reply box). The pages themselves in Chromium: tests/browser/test_admin_handoff.py."""

import datetime

import pytest
from django.test import Client
from django.utils import timezone

from conversations.engine import handoff
from conversations.models import Conversation, Message
from tests.engine.test_handoff import (INBOX, act, answer_page, handoff_url, make_assistant, new_conversation,
                                       send, staff_member, waiting_for_a_person)
from tests.support.helpers import api_post, make_client

pytestmark = pytest.mark.django_db(transaction=True)

INBOX_LIVE = INBOX + "live/"


def answer_live(conversation_id, after=0):
    return f"{answer_page(conversation_id).removesuffix('change/')}live/?after={after}"


def test_the_inbox_json_shows_a_new_request_and_answers_304_while_nothing_changes():
    make_assistant()
    ana = staff_member("ana", "Ana")
    first = ana.get(INBOX_LIVE)
    assert first.status_code == 200 and first.json()["rows"] == [] and first.json()["waiting"] == 0
    assert ana.get(INBOX_LIVE, HTTP_IF_NONE_MATCH=first["ETag"]).status_code == 304

    visitor = make_client()
    conversation = new_conversation(visitor)
    send(visitor, conversation, "Where is my <b>parcel</b>?")
    api_post(visitor, handoff_url(conversation))
    changed = ana.get(INBOX_LIVE, HTTP_IF_NONE_MATCH=first["ETag"])
    assert changed.status_code == 200 and changed["ETag"] != first["ETag"]
    (row,) = changed.json()["rows"]
    assert row["url"] == answer_page(conversation) and row["waited"] == "0 min" and row["unanswered"]
    assert row["assistant"] == "Help desk" and row["taken_by"] == "—" and row["last_words"] == "Where is my <b>parcel</b>?"
    assert changed.json()["waiting"] == 1 and changed.json()["count_text"] == "1 conversation for a person"

    act(ana, conversation, "take")
    taken = ana.get(INBOX_LIVE, HTTP_IF_NONE_MATCH=changed["ETag"]).json()
    assert taken["waiting"] == 0 and taken["rows"][0]["taken_by"] == "ana" and not taken["rows"][0]["unanswered"]


def test_only_staff_allowed_to_answer_read_the_live_json():
    _visitor, conversation = waiting_for_a_person()
    outsider = staff_member("olga", "Olga", allowed=False)
    assert outsider.get(INBOX_LIVE).status_code == 403
    assert outsider.get(answer_live(conversation)).status_code == 403
    anonymous = Client().get(INBOX_LIVE)
    assert anonymous.status_code == 302 and "/admin/login/" in anonymous["Location"]
    ana = staff_member("ana", "Ana")
    assert ana.get(answer_live("not-a-uuid")).status_code == 404
    assert ana.get(answer_live(conversation) + "x").status_code == 200  # a bad "after" reads from the start


def test_the_answer_json_brings_the_visitors_new_message_as_text_and_a_colleagues_take():
    visitor, conversation = waiting_for_a_person()
    ana, ben = staff_member("ana", "Ana"), staff_member("ben", "Ben")
    act(ana, conversation, "take")
    last = max(Message.objects.filter(conversation_id=conversation).values_list("id", flat=True), default=0)
    first = ana.get(answer_live(conversation, last))
    assert first.status_code == 200 and first.json()["entries"] == [] and first.json()["can_reply"]
    assert ana.get(answer_live(conversation, last), HTTP_IF_NONE_MATCH=first["ETag"]).status_code == 304

    send(visitor, conversation, "<script>alert(1)</script> still there?")
    (entry,) = ana.get(answer_live(conversation, last), HTTP_IF_NONE_MATCH=first["ETag"]).json()["entries"]
    assert "&lt;script&gt;alert(1)&lt;/script&gt; still there?" in entry["html"] and "<script>" not in entry["html"]
    assert "written while waiting for a person" in entry["html"]

    # Ben sees it is Ana's: no reply box of his, no Take (he is no superuser).
    for_ben = ben.get(answer_live(conversation, entry["id"])).json()
    assert (for_ben["can_reply"], for_ben["can_take"], for_ben["taken_by_other"]) == (False, False, True)
    assert "ana is answering this conversation: only they may reply." in for_ben["status_html"]


def test_a_conversation_no_one_took_offers_only_take_and_its_page_says_the_visitor_was_told_no_one_is_free(
        conversations_settings):
    conversations_settings.update(HANDOFF_WAIT=60)
    _visitor, conversation = waiting_for_a_person()
    ana = staff_member("ana", "Ana")
    page = ana.get(answer_page(conversation)).content.decode()
    offered = {value for value in ("reply", "take", "hand_back", "close")
               if f'value="{value}" ' in page and f'value="{value}" data-when' in page
               and not _hidden(page, value)}
    assert offered == {"take"}
    assert "readonly" in page.split('id="handoff-content"')[1].split(">")[0]
    assert "no one is free" not in page

    Conversation.objects.filter(pk=conversation).update(
        handoff_requested_at=timezone.now() - datetime.timedelta(seconds=90))
    told = ana.get(answer_page(conversation)).content.decode()
    assert "that no one is free: they may wait, or go back to the assistant." in told
    assert "that no one is free" in ana.get(answer_live(conversation)).json()["status_html"]
    # Once taken, the visitor is no longer told so, and the page offers replying.
    taken = act(ana, conversation, "take").content.decode()
    assert "no one is free" not in taken and not _hidden(taken, "reply") and _hidden(taken, "take")


def _hidden(page, action):
    """Whether the page's button for ``action`` is hidden."""
    tag = page.split(f'value="{action}"')[1].split(">")[0]
    return " hidden" in tag


def test_the_inbox_is_titled_links_its_rows_and_shows_the_visitors_words_and_the_wait_until_taken():
    make_assistant()
    visitor = make_client()
    conversation = new_conversation(visitor)
    send(visitor, conversation, "I need a refund for order 77.")
    # The assistant hands over with its tool: its text is the last message, not the visitor's.
    Message.objects.create(conversation_id=conversation, role="tool", tool_name="hand_to_person",
                           content=handoff.HANDED_OVER)
    handoff.request(conversation, "tool", reason="refund")
    Conversation.objects.filter(pk=conversation).update(
        handoff_requested_at=timezone.now() - datetime.timedelta(minutes=7))
    ana = staff_member("ana", "Ana")

    page = ana.get(INBOX).content.decode()
    assert "<title>Conversations waiting for a person |" in page and "<h1>Conversations waiting for a person</h1>" in page
    assert page.count(f'href="{answer_page(conversation)}"') == 2  # the wait and the last message
    assert "I need a refund for order 77." in page and handoff.HANDED_OVER not in page
    assert ">7 min<" in page

    act(ana, conversation, "take")
    Conversation.objects.filter(pk=conversation).update(
        handoff_taken_at=timezone.now() - datetime.timedelta(minutes=5))
    # The wait ended at the take: 2 minutes, however long the page stays open.
    assert ">2 min<" in ana.get(INBOX).content.decode()
    assert ana.get(INBOX_LIVE).json()["rows"][0]["waited"] == "2 min"
