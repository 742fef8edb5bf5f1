"""One turn at a time per conversation, and Idempotency-Key: a retried POST never pays twice."""

import pytest

from conversations.models import Turn
from tests.support.helpers import api_post, at_once, make_client, poll_until_done, start_turn
from tests.support.fakes import FakeProvider, openai_text

pytestmark = pytest.mark.django_db(transaction=True)


def new_conversation(client):
    return api_post(client, "/api/conversations/").json()["id"]


def send(client, conversation, content="Hello", key=None):
    extra = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    return api_post(client, f"/api/conversations/{conversation}/turns/", {"content": content}, **extra)


def test_a_second_message_while_one_is_answered_gets_409_then_goes_through(worker):
    client = make_client()
    conversation = new_conversation(client)
    first = send(client, conversation, "First")
    assert first.status_code == 202

    busy = send(client, conversation, "Second")
    assert busy.status_code == 409
    assert busy.json()["detail"] == ("The assistant is still answering your previous message. "
                                     "Wait for it to finish or stop it first.")
    worker()
    poll_until_done(client, first.json()["poll_url"])
    assert send(client, conversation, "Second").status_code == 202


def test_a_cancelled_turn_frees_the_conversation():
    client = make_client()
    conversation = new_conversation(client)
    first = send(client, conversation).json()
    api_post(client, first["cancel_url"])
    assert send(client, conversation, "Again").status_code == 202


def test_a_retried_post_with_the_same_key_returns_the_same_turn_and_runs_once(conversations_settings, worker):
    with FakeProvider() as fake:
        fake.add(openai_text("Only once."))
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="k")
        client = make_client()
        conversation = new_conversation(client)

        first = send(client, conversation, key="retry-abc-1")
        again = send(client, conversation, key="retry-abc-1")  # e.g. the first response was lost
        assert first.status_code == 202
        assert again.status_code == 200 and again["Idempotent-Replayed"] == "true"
        assert again.json() == first.json()

        worker()
        final = poll_until_done(client, first.json()["poll_url"])
        after = send(client, conversation, key="retry-abc-1")  # even once it is done
        assert after.status_code == 200 and after.json()["id"] == first.json()["id"]

    assert final["status"] == "completed"
    assert len(fake.requests) == 1
    assert Turn.objects.count() == 1


def test_the_same_key_with_another_message_is_refused_with_422():
    client = make_client()
    conversation = new_conversation(client)
    assert send(client, conversation, "Hello", key="k-1").status_code == 202
    response = send(client, conversation, "Something else", key="k-1")
    assert response.status_code == 422
    assert response.json()["detail"] == "This Idempotency-Key was already used for a different message."


def test_keys_are_scoped_to_their_conversation():
    client = make_client()
    one, two = new_conversation(client), new_conversation(client)
    first = send(client, one, key="same").json()
    second = send(client, two, key="same").json()
    assert first["id"] != second["id"]


@pytest.mark.parametrize("key", ["", "has space", "x" * 201, "tab\there"])
def test_a_malformed_key_gets_a_clear_400(key):
    client = make_client()
    response = send(client, new_conversation(client), key=key)
    assert response.status_code == 400
    assert "Idempotency-Key" in response.json()["detail"]
    assert Turn.objects.count() == 0


def test_concurrent_retries_with_one_key_create_one_turn():
    client = make_client()
    conversation = new_conversation(client)
    results = at_once(*[lambda: send(client, conversation, "Same", key="race-1")] * 4)

    assert sorted(r.status_code for r in results) == [200, 200, 200, 202]
    assert len({r.json()["id"] for r in results}) == 1
    assert Turn.objects.count() == 1


def test_a_request_that_loses_the_race_to_the_unique_constraint_gets_the_winners_turn():
    """What a request that passed the replay check just before another committed the same key meets."""
    from django.db import transaction

    from conversations.engine import lifecycle as turns
    from conversations.infra.queue import get_queue
    from conversations.models import Conversation

    client = make_client()
    conversation_id = new_conversation(client)
    winner = send(client, conversation_id, "Same", key="race-2").json()
    queued = get_queue().count

    with transaction.atomic():
        turn, created = turns.start(lambda: Conversation.objects.select_for_update().get(pk=conversation_id), "Same",
                                    admit=lambda conversation: None,  # as if its replay check ran just before
                                    idempotency_key="race-2")
        # The outer transaction is still usable after the losing insert.
        assert Conversation.objects.get(pk=conversation_id).turns.count() == 1

    assert (str(turn.id), created) == (winner["id"], False)
    assert Turn.objects.count() == 1
    assert get_queue().count == queued  # no second job


def test_the_queue_dashboard_is_for_superusers_only():
    """Any staff user could empty the turns' queue through django-rq (leaving visitors' turns
    queued with no job), though the admin's own stop and re-run need change_turn."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    from conversations.infra.queue import get_queue

    started = start_turn(make_client())
    staff = get_user_model().objects.create_user("staff", password="pw-123456789", is_staff=True)
    root = get_user_model().objects.create_superuser("root", password="pw-123456789")
    pages = ["/django-rq/", "/django-rq/queues/0/", f"/django-rq/queues/0/{Turn.objects.get().job_id}/"]
    actions = ["/django-rq/queues/0/empty/", f"/django-rq/queues/0/{Turn.objects.get().job_id}/delete/"]

    client = Client()
    client.force_login(staff)
    assert [client.get(url).status_code for url in pages + actions] == [403] * 5
    assert [client.post(url).status_code for url in actions] == [403] * 2
    assert get_queue().job_ids == [Turn.objects.get().job_id]  # still queued
    assert Client().get(pages[0]).status_code == 302  # anonymous: to the login page

    client.force_login(root)
    assert [client.get(url).status_code for url in pages] == [200] * 3
    assert started["status"] == "queued"


def test_the_queue_statistics_are_for_superusers_and_the_api_token_only(settings):
    """django-rq answers stats.json (Redis host, port, database) to any staff session."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    settings.RQ_API_TOKEN = "rqTokenForMonitoring"
    staff = get_user_model().objects.create_user("staff", password="pw-123456789", is_staff=True)
    root = get_user_model().objects.create_superuser("root", password="pw-123456789")
    client = Client()
    client.force_login(staff)
    for url in ("/django-rq/stats.json", "/django-rq/stats.json/"):
        refused = client.get(url)
        assert refused.status_code == 401 and "queues" not in refused.json()
    assert client.get("/django-rq/stats.json", HTTP_AUTHORIZATION="Bearer guessed").status_code == 401
    # The monitoring token still works, from a staff session or none; a superuser's session too.
    assert client.get("/django-rq/stats.json/rqTokenForMonitoring/").status_code == 200
    assert Client().get("/django-rq/stats.json", HTTP_AUTHORIZATION="Bearer rqTokenForMonitoring").status_code == 200
    client.force_login(root)
    assert "queues" in client.get("/django-rq/stats.json").json()
