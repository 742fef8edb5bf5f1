"""CSRF is checked on every state-changing request, for anonymous visitors and logged-in users alike."""

import json

import pytest

from conversations.models import Conversation, Turn
from tests.helpers import make_client, start_turn

pytestmark = pytest.mark.django_db(transaction=True)


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
        assert "CSRF" in response.json()["detail"], name
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
