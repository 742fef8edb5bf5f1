"""CSRF is checked on every state-changing request, for anonymous visitors and logged-in users alike."""

import json

import pytest

from conversations.models import Conversation, Turn
from tests.support.helpers import make_client, start_turn

pytestmark = pytest.mark.django_db(transaction=True)

EXPIRED = "This page has expired, so the message could not be accepted. Please reload the page and try again."
NO_COOKIE = ("Your browser did not send this site's cookie, so the message could not be accepted. If it blocks "
             "cookies (some browsers do for a chat on another site), allow them for this site and reload the page.")


def post(client, url, data=None, **headers):
    return client.post(url, data=json.dumps(data or {}), content_type="application/json", headers=headers)


def post_endpoints(client):
    """Every POST endpoint, for a conversation and turn that ``client`` owns."""
    started = start_turn(client)
    conversation = started["conversation"]
    return {
        "conversations": ("/api/conversations/", None),
        "turns": (f"/api/conversations/{conversation}/turns/", {"content": "Hi"}),
        "cancel": (started["cancel_url"], None),
    }


def test_every_post_without_a_csrf_token_is_refused(visitor):
    endpoints = post_endpoints(visitor)
    conversations, turns = Conversation.objects.count(), Turn.objects.count()
    for name, (url, data) in endpoints.items():
        response = post(visitor, url, data)
        assert response.status_code == 403, name
        assert response.json()["detail"] == EXPIRED, name
    assert (Conversation.objects.count(), Turn.objects.count()) == (conversations, turns)
    assert not Turn.objects.get().cancel_requested


def test_every_post_with_a_wrong_csrf_token_is_refused(visitor):
    for name, (url, data) in post_endpoints(visitor).items():
        assert post(visitor, url, data, X_CSRFToken="x" * 32).status_code == 403, name


def test_every_post_from_another_origin_is_refused(visitor):
    """A page on another site that somehow got the token still fails Django's Origin check."""
    for name, (url, data) in post_endpoints(visitor).items():
        response = post(visitor, url, data, X_CSRFToken=visitor.csrf, Origin="https://evil.example")
        assert response.status_code == 403, name


def test_every_post_with_the_token_is_accepted(visitor):
    endpoints = post_endpoints(visitor)
    Turn.objects.update(status=Turn.Status.COMPLETED)  # let the next message through
    expected = {"conversations": 201, "turns": 202, "cancel": 202}
    for name, (url, data) in endpoints.items():
        assert post(visitor, url, data, X_CSRFToken=visitor.csrf).status_code == expected[name], name


def test_reads_need_no_csrf_token():
    visitor = make_client()
    started = start_turn(visitor)
    assert visitor.get(f"/api/conversations/{started['conversation']}/").status_code == 200
    assert visitor.get(started["poll_url"]).status_code == 200


def test_a_browser_that_sends_no_csrf_cookie_is_told_why_in_its_language():
    from django.test import Client

    blocked = Client(enforce_csrf_checks=True)  # never got (or never sends) the csrftoken cookie
    english = post(blocked, "/api/conversations/", X_CSRFToken="a" * 32)
    spanish = post(blocked, "/api/conversations/", X_CSRFToken="a" * 32, Accept_Language="es")

    assert english.status_code == spanish.status_code == 403
    assert english.json() == {"detail": NO_COOKIE}
    assert spanish.json()["detail"].startswith("Tu navegador no ha enviado la cookie de este sitio")
    assert Conversation.objects.count() == 0


def test_a_token_of_the_wrong_length_reads_as_an_expired_page_and_its_reason_is_logged(visitor, caplog):
    with caplog.at_level("WARNING", logger="conversations.api"):
        response = post(visitor, "/api/conversations/", X_CSRFToken="short")

    assert response.status_code == 403
    assert response.json() == {"detail": EXPIRED}
    assert "incorrect length" in caplog.text and "POST /api/conversations/" in caplog.text
