"""The widget's privacy line and the visitor's own "Delete this conversation", against the live
server, a real worker and the demo model: the line says how long the chat is kept where the site
asks for it, and deleting asks first, then erases the conversation everywhere and starts afresh."""

import pytest
from playwright.sync_api import expect

from conversations.models import Conversation, Erasure, Message
from tests.support.helpers import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_widget_says_how_long_the_chat_is_kept_only_where_the_site_asks(chat_page, conversations_settings):
    conversations_settings.update(RETENTION_DAYS=30, RETENTION_FROM="last_message")
    chat = chat_page().open()
    expect(chat.locator(".cvw-retention")).to_have_count(0)

    conversations_settings.update(WIDGET_RETENTION_NOTE=True)
    chat.page.reload()
    expect(chat.locator(".cvw-retention")).to_have_text("This chat is deleted 30 days after its last message.")
    spanish = chat_page(locale="es-ES").open()
    expect(spanish.locator(".cvw-retention")).to_have_text(
        "Esta conversación se borra 30 días después de su último mensaje.")


def test_the_visitor_deletes_the_conversation_after_confirming_and_the_widget_starts_afresh(chat_page,
                                                                                           worker_process):
    worker_process(DEMO_DELAY=0.05)
    chat = chat_page().open()
    delete = chat.page.get_by_role("button", name="Delete this conversation")
    expect(delete).to_be_hidden()  # nothing to delete before the first message
    chat.send("What time is it in Tokyo?")
    expect(chat.locator(".cvw-msg-assistant")).to_contain_text("in Tokyo")
    expect(chat.locator(".cvw-stop")).to_be_hidden()

    delete.click()  # the confirmation is dismissed: nothing happens
    assert chat.dialogs == ["Delete this conversation and everything in it? This cannot be undone."]
    expect(chat.locator(".cvw-msg-assistant")).to_contain_text("in Tokyo")
    assert Conversation.objects.count() == 1

    chat.page.remove_listener("dialog", chat._on_dialog)
    chat.page.on("dialog", lambda dialog: dialog.accept())
    delete.click()

    expect(chat.locator(".cvw-status")).to_have_text("The conversation was deleted.")
    expect(chat.locator(".cvw-msg-user")).to_have_count(0)
    expect(delete).to_be_hidden()
    wait_for(lambda: not Conversation.objects.exists(), what="the conversation erased")
    assert not Message.objects.exists() and Erasure.objects.get().kind == "visitor_request"
    chat.page.reload()
    chat.locator(".cvw-input").wait_for()
    expect(chat.locator(".cvw-msg-user")).to_have_count(0)
    chat.send("Hello again")  # a new conversation starts
    expect(chat.locator(".cvw-msg-assistant")).to_have_count(1)
    wait_for(lambda: Conversation.objects.count() == 1, what="a new conversation")
