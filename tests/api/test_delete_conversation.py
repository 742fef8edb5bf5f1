"""A visitor deletes their own conversation from the widget: ``DELETE /api/conversations/<id>/``
erases it everywhere (rows and cached copies), only for its owner, only with the CSRF token (or
an embedded widget's token), a limited number of times."""

import pytest

from conversations.models import Conversation, Erasure, Message, Turn
from tests.support.helpers import api_post, make_client, poll_until_done, redis_values, start_turn

pytestmark = pytest.mark.django_db(transaction=True)


def delete(client, conversation, **extra):
    return client.delete(f"/api/conversations/{conversation}/", HTTP_X_CSRFTOKEN=client.csrf, **extra)


def test_the_owner_deletes_their_conversation_everywhere(worker):
    client = make_client()
    turn = start_turn(client, "Quillfeather asks the time")
    worker()
    poll_until_done(client, turn["poll_url"])
    kept = start_turn(client, "Another conversation")

    response = delete(client, turn["conversation"])

    assert response.status_code == 204
    assert client.get(f"/api/conversations/{turn['conversation']}/").status_code == 404
    assert client.get(turn["poll_url"]).status_code == 404
    assert [c["id"] for c in client.get("/api/conversations/").json()] == [kept["conversation"]]
    assert not Message.objects.filter(content__contains="Quillfeather").exists()
    assert not [v for v in redis_values() if isinstance(v, bytes) and (turn["id"].encode() in v
                                                                       or b"Quillfeather" in v)]
    entry = Erasure.objects.get()
    assert (entry.kind, entry.by, entry.counts["conversations"]) == ("visitor_request", None, 1)


def test_a_turn_still_running_is_stopped_and_erased_with_it():
    client = make_client()
    turn = start_turn(client, "Quillfeather asks the time")  # queued: no worker runs it

    assert delete(client, turn["conversation"]).status_code == 204
    assert not Turn.objects.exists() and not Conversation.objects.exists()


def test_nobody_else_can_delete_it_and_not_without_the_csrf_token():
    owner = make_client()
    turn = start_turn(owner, "Mine")

    assert delete(make_client(), turn["conversation"]).status_code == 404
    without_token = owner.delete(f"/api/conversations/{turn['conversation']}/")
    assert without_token.status_code == 403
    assert delete(owner, "00000000-0000-4000-8000-000000000000").status_code == 404
    assert Conversation.objects.count() == 1 and not Erasure.objects.exists()


def test_deleting_is_throttled_per_owner_with_a_sentence(conversations_settings):
    conversations_settings.update(DELETE_RATE_PER_OWNER="2/hour")
    client = make_client()
    ids = [api_post(client, "/api/conversations/").json()["id"] for _ in range(3)]

    answers = [delete(client, conversation).status_code for conversation in ids]

    assert answers == [204, 204, 429]
    refused = delete(client, ids[2])
    assert refused.json() == {"detail": "You have deleted too many conversations. Please try again later."}
    assert Conversation.objects.count() == 1
