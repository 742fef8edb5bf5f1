"""Conversations belong to a user or an anonymous session: everyone else gets 404, on every endpoint."""

import datetime
import uuid

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from conversations.engine.limits import owner_q
from conversations.infra import state
from conversations.models import Conversation, Turn
from tests.support.helpers import api_post, make_client, poll_until_done, start_turn

pytestmark = pytest.mark.django_db(transaction=True)


def urls(started):
    conversation = started["conversation"]
    return {
        "detail": f"/api/conversations/{conversation}/",
        "turns": f"/api/conversations/{conversation}/turns/",
        "poll": started["poll_url"],
        "cancel": started["cancel_url"],
    }


def try_every_endpoint(client, started):
    """Status code of every endpoint of someone else's conversation, for ``client``."""
    u = urls(started)
    return {
        "detail": client.get(u["detail"]).status_code,
        "turns": api_post(client, u["turns"], {"content": "Let me in"}).status_code,
        "poll": client.get(u["poll"]).status_code,
        "cancel": api_post(client, u["cancel"]).status_code,
    }


def logged_in_client(username):
    user = get_user_model().objects.create_user(username, password="pw-123456789")
    client = make_client()
    client.force_login(user)
    client.get("/")  # login rotates the CSRF token
    client.csrf = client.cookies["csrftoken"].value
    return client, user


def test_ids_are_random_uuid4():
    started = start_turn(make_client())
    assert uuid.UUID(started["conversation"]).version == 4
    assert uuid.UUID(started["id"]).version == 4


def test_anonymous_stranger_gets_404_on_every_endpoint():
    owner = make_client()
    started = start_turn(owner)
    stranger = make_client()

    assert try_every_endpoint(stranger, started) == {"detail": 404, "turns": 404, "poll": 404, "cancel": 404}
    assert stranger.get("/api/conversations/").json() == []
    # Nothing the stranger did reached the owner's turn.
    turn = Turn.objects.get(pk=started["id"])
    assert turn.status == Turn.Status.QUEUED and not turn.cancel_requested
    assert Turn.objects.count() == 1


def test_logged_in_stranger_gets_404_on_every_endpoint_of_a_users_conversation():
    owner, _ = logged_in_client("owner")
    started = start_turn(owner)
    stranger, _ = logged_in_client("stranger")

    assert try_every_endpoint(stranger, started) == {"detail": 404, "turns": 404, "poll": 404, "cancel": 404}
    assert owner.get(urls(started)["detail"]).status_code == 200


def test_logged_in_stranger_gets_404_on_an_anonymous_visitors_conversation():
    started = start_turn(make_client())
    stranger, _ = logged_in_client("stranger")

    assert try_every_endpoint(stranger, started) == {"detail": 404, "turns": 404, "poll": 404, "cancel": 404}


def test_stranger_gets_404_when_the_poll_is_rebuilt_from_the_database(worker):
    owner = make_client()
    started = start_turn(owner, "Hello")
    worker()
    from django.core.cache import cache

    cache.delete(state.state_key(started["id"]))  # evicted: the poll view must check ownership in SQL
    assert make_client().get(started["poll_url"]).status_code == 404
    assert owner.get(started["poll_url"]).json()["done"] is True


def test_unknown_and_malformed_ids_get_404():
    client = make_client()
    conversation = api_post(client, "/api/conversations/").json()["id"]
    assert client.get(f"/api/conversations/{uuid.uuid4()}/").status_code == 404
    assert client.get(f"/api/conversations/{conversation}/turns/{uuid.uuid4()}/").status_code == 404
    for malformed in ("/api/conversations/1/", f"/api/conversations/{conversation}/turns/not-a-uuid/",
                      f"/api/conversations/{conversation}/turns/1/cancel/"):
        response = client.get(malformed) if not malformed.endswith("cancel/") else api_post(client, malformed)
        assert response.status_code == 404 and response["Content-Type"] == "application/json", malformed


def test_visitor_keeps_anonymous_conversation_after_logging_in(worker):
    user = get_user_model().objects.create_user("visitor", password="pw-123456789")
    client = make_client()
    started = start_turn(client, "Hello before login")
    worker()
    poll_until_done(client, started["poll_url"])

    assert client.login(username="visitor", password="pw-123456789")
    client.get("/")
    client.csrf = client.cookies["csrftoken"].value

    assert Conversation.objects.get(pk=started["conversation"]).user == user
    assert client.get(urls(started)["detail"]).status_code == 200
    assert client.get(started["poll_url"]).status_code == 200
    assert api_post(client, urls(started)["turns"], {"content": "And after"}).status_code == 202
    # The conversation is the user's now, not the browser's: another browser of theirs sees it too,
    # including the turn whose state was cached before the login.
    other = make_client()
    other.force_login(user)
    assert other.get(urls(started)["detail"]).status_code == 200
    assert other.get(started["poll_url"]).json()["id"] == started["id"]


def test_login_through_the_admin_login_view_claims_the_conversation():
    staff = get_user_model().objects.create_user("staff", password="pw-123456789", is_staff=True)
    client = make_client()
    started = start_turn(client)
    client.get("/admin/login/")
    response = client.post("/admin/login/?next=/admin/", {
        "username": "staff", "password": "pw-123456789", "csrfmiddlewaretoken": client.cookies["csrftoken"].value,
    })
    assert response.status_code == 302, response.content[:500]

    assert Conversation.objects.get(pk=started["conversation"]).user == staff
    assert client.get(urls(started)["detail"]).json()["active_turn"]["id"] == started["id"]


def test_logging_out_ends_access_to_the_conversation():
    user = get_user_model().objects.create_user("leaver", password="pw-123456789")
    client = make_client()
    started = start_turn(client)
    client.login(username="leaver", password="pw-123456789")
    assert client.get(urls(started)["detail"]).status_code == 200
    client.logout()
    assert client.get(urls(started)["detail"]).status_code == 404
    assert client.get(started["poll_url"]).status_code == 404
    assert Conversation.objects.get(pk=started["conversation"]).user == user


def test_only_recent_anonymous_conversations_follow_a_login(conversations_settings):
    """Whoever logs in on a shared browser must not take every conversation ever held on it."""
    client = make_client()
    old = start_turn(client, "Chatted this morning")
    api_post(client, f"/api/conversations/{old['conversation']}/turns/{old['id']}/cancel/")
    an_hour_ago = timezone.now() - datetime.timedelta(hours=1)
    Conversation.objects.filter(pk=old["conversation"]).update(created_at=an_hour_ago)
    Turn.objects.filter(conversation_id=old["conversation"]).update(enqueued_at=an_hour_ago)
    recent = start_turn(client, "Chatting now")
    user = get_user_model().objects.create_user("later", password="pw-123456789")

    assert client.login(username="later", password="pw-123456789")

    assert Conversation.objects.get(pk=recent["conversation"]).user == user
    assert Conversation.objects.get(pk=old["conversation"]).user is None
    # This browser still reads both (its owner token is in the session); the account only the recent one.
    assert client.get(urls(old)["detail"]).status_code == 200
    elsewhere = make_client()
    elsewhere.force_login(user)
    assert elsewhere.get(urls(old)["detail"]).status_code == 404
    assert elsewhere.get(urls(recent)["detail"]).status_code == 200


def test_claiming_can_be_switched_off(conversations_settings):
    conversations_settings.update(CLAIM_ON_LOGIN_WITHIN=0)
    client = make_client()
    started = start_turn(client)
    get_user_model().objects.create_user("nobody", password="pw-123456789")
    assert client.login(username="nobody", password="pw-123456789")
    assert Conversation.objects.get(pk=started["conversation"]).user is None
    assert client.get(urls(started)["detail"]).status_code == 200
    assert client.get(started["poll_url"]).status_code == 200


def test_the_limits_count_the_conversations_the_api_lists_for_every_kind_of_visitor(conversations_settings):
    conversations_settings.update(CLAIM_ON_LOGIN_WITHIN=0, DAILY_TOKEN_BUDGET=100, TURN_RATE_PER_OWNER="",
                                  CONVERSATION_RATE_PER_OWNER="", TURN_RATE_PER_IP="", CONVERSATION_RATE_PER_IP="")
    anonymous = make_client()
    user, _user = logged_in_client("reader")
    # A user with a session: they chatted anonymously in this browser, then logged in (nothing claimed).
    both = make_client()
    earlier = api_post(both, "/api/conversations/").json()["id"]
    get_user_model().objects.create_user("both", password="pw-123456789")
    assert both.login(username="both", password="pw-123456789")
    both.get("/")
    both.csrf = both.cookies["csrftoken"].value
    for client in (anonymous, user, both):
        for _ in range(2):
            api_post(client, "/api/conversations/")
    for client in (anonymous, user, both):
        listed = {row["id"] for row in client.get("/api/conversations/").json()}
        newest = Conversation.objects.get(pk=client.get("/api/conversations/").json()[0]["id"])
        counted = {str(pk) for pk in Conversation.objects.filter(owner_q(newest)).values_list("pk", flat=True)}
        assert counted == listed and len(listed) == (3 if client is both else 2)

    # What that means for the visitor: the tokens they spent in this browser before logging in are
    # today's too, however many conversations they start as the user.
    Turn.objects.create(conversation_id=earlier, status=Turn.Status.COMPLETED, input_tokens=80, output_tokens=20,
                        enqueued_at=timezone.now(), finished_at=timezone.now())
    newest = both.get("/api/conversations/").json()[0]["id"]
    refused = api_post(both, f"/api/conversations/{newest}/turns/", {"content": "Hello"})
    assert refused.status_code == 429
    assert refused.json() == {"detail": "You have reached today's limit for the assistant. Please come back tomorrow."}
