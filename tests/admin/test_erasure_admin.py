"""Erasure from the admin: the conversation list's two actions exist only for staff with the
erase permission, show a confirmation page listing what will go, and erase only once confirmed;
the audit list then shows what went, when and by whom, and nothing of what it was."""

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from conversations.models import Conversation, Erasure, Message, Turn
from tests.support.helpers import staff

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:conversations_conversation_changelist")


def life(owner=None, token="a-session-owner-token", words="Quillfeather-7731"):
    conversation = Conversation.objects.create(user=owner, owner_token=token)
    turn = Turn.objects.create(conversation=conversation, status="completed", rating="down",
                               rating_comment="Thistledown")
    Message.objects.create(conversation=conversation, turn=turn, role="user", content=words)
    Message.objects.create(conversation=conversation, turn=turn, role="assistant", content="An answer.")
    return conversation


def test_the_erase_actions_are_offered_only_with_the_erase_permission():
    life()
    viewer = staff("viewer", "view_conversation")
    eraser = staff("eraser", "view_conversation", "erase_conversations")

    assert "erase_selected" not in viewer.get(CHANGELIST).content.decode()
    page = eraser.get(CHANGELIST).content.decode()
    assert "Erase the selected conversations everywhere" in page
    assert "Erase everything of the selected conversations&#x27; owners" in page
    # Posting the action without the permission erases nothing.
    viewer.post(CHANGELIST, {"action": "erase_selected", "_selected_action": [str(Conversation.objects.get().pk)],
                             "post": "yes"})
    assert Conversation.objects.count() == 1 and not Erasure.objects.exists()


def test_the_confirmation_lists_what_will_go_and_only_yes_erases():
    person = User.objects.create_user("quill", email="quill@example.com")
    first, second = life(person), life(person, words="Marzipan Lane 42")
    bystander = life(token="someone-elses-token")
    eraser = staff("eraser", "view_conversation", "erase_conversations")
    selected = {"action": "erase_owners", "_selected_action": [str(first.pk)]}

    confirm = eraser.post(CHANGELIST, selected)

    page = confirm.content.decode()
    assert confirm.status_code == 200 and "Erase these conversations everywhere?" in page
    assert "quill &lt;quill@example.com&gt;" in page
    assert "2 conversations" in page and "2 visitor messages" in page and "2 ratings" in page
    assert "Quillfeather-7731" not in page and "a-session-owner-token" not in page
    assert Conversation.objects.count() == 3  # nothing went yet

    done = eraser.post(CHANGELIST, {**selected, "post": "yes"}, follow=True)

    assert "2 conversations were erased everywhere." in done.content.decode()
    assert list(Conversation.objects.all()) == [bystander]
    entry = Erasure.objects.get()
    assert (entry.by, entry.kind, entry.counts["conversations"]) == (eraser.user, "user", 2)
    audit = eraser.get(reverse("admin:conversations_erasure_changelist"))
    assert audit.status_code == 403  # the audit list is for those who may view it
    auditor = staff("auditor", "view_erasure")
    listed = auditor.get(reverse("admin:conversations_erasure_changelist")).content.decode()
    assert "2 conversations" in listed and "eraser" in listed and "quill" not in listed
    assert not {second.pk} & set(Conversation.objects.values_list("pk", flat=True))


def test_erasing_selected_conversations_leaves_the_owners_other_conversations():
    person = User.objects.create_user("quill")
    erased, kept = life(person), life(person)
    eraser = staff("eraser", "view_conversation", "erase_conversations")

    eraser.post(CHANGELIST, {"action": "erase_selected", "_selected_action": [str(erased.pk)], "post": "yes"})

    assert list(Conversation.objects.all()) == [kept]
    assert Erasure.objects.get().kind == "conversation"
