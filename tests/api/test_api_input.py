"""Bad input gets a clear 4xx, never a 500, and nothing is enqueued for it."""

import json
import uuid

import pytest

from conversations.models import Message, Turn
from tests.support.helpers import api_post, make_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def conversation(owner_client):
    return api_post(owner_client, "/api/conversations/").json()["id"]


def turns_url(conversation_id):
    return f"/api/conversations/{conversation_id}/turns/"


def assert_nothing_enqueued():
    # turns.create saves the Turn right before enqueueing its job, so no Turn means no job. (The queue
    # itself cannot tell: here, outside a real transaction, django-rq defers the enqueue to an
    # on_commit that never fires.)
    assert not Turn.objects.exists()
    assert Message.objects.count() == 0


@pytest.mark.parametrize("body, field_message", [
    ({"content": ""}, "Write a message first."),
    ({"content": "   \n\t "}, "Write a message first."),
    ({"content": "\x00\x07"}, "Write a message first."),
    ({}, "Write a message first."),
    ({"content": None}, "Write a message first."),
    ({"content": "x" * 4001}, "The message is too long: 4001 characters, at most 4000 allowed."),
])
def test_bad_content_is_refused_with_a_clear_message(owner_client, conversation, body, field_message):
    response = api_post(owner_client, turns_url(conversation), body)
    assert response.status_code == 400
    assert response.json() == {"content": [field_message]}
    assert_nothing_enqueued()


def test_body_that_is_not_json_is_refused(owner_client, conversation):
    response = owner_client.post(turns_url(conversation), data="content=hi", content_type="application/json",
                                 HTTP_X_CSRFTOKEN=owner_client.csrf)
    assert response.status_code == 400
    assert response.json()["detail"].startswith("JSON parse error")
    assert_nothing_enqueued()


@pytest.mark.parametrize("body", [
    "[" * 30000 + "]" * 30000,
    # 30,000 levels: past the parser's recursion limit on every supported Python (3.13's json
    # goes deeper than 3.11's before it gives up), and within MAX_REQUEST_BYTES.
    '{"content": ' + "[" * 30000 + "]" * 30000 + "}",
    '{"content": "hi", "x": ' + "[" * 30000 + "]" * 30000 + "}",
])
def test_json_nested_too_deeply_is_refused_with_a_sentence(owner_client, conversation, body):
    response = owner_client.post(turns_url(conversation), data=body, content_type="application/json",
                                 HTTP_X_CSRFTOKEN=owner_client.csrf)
    assert response.status_code == 400
    assert response.json() == {"detail": "The request body is nested too deeply to be read."}
    assert_nothing_enqueued()


def test_json_that_is_not_an_object_is_refused(owner_client, conversation):
    response = owner_client.post(turns_url(conversation), data=json.dumps(["hi"]), content_type="application/json",
                                 HTTP_X_CSRFTOKEN=owner_client.csrf)
    assert response.status_code == 400
    assert_nothing_enqueued()


def test_unknown_conversation_is_404(owner_client):
    response = api_post(owner_client, turns_url(uuid.uuid4()), {"content": "hi"})
    assert response.status_code == 404
    assert response.json() == {"detail": GONE}
    assert_nothing_enqueued()


def test_someone_elses_conversation_is_404(owner_client, conversation):
    stranger = make_client()
    for response in (
        api_post(stranger, turns_url(conversation), {"content": "hi"}),
        stranger.get(f"/api/conversations/{conversation}/"),
    ):
        assert response.status_code == 404
    assert_nothing_enqueued()


def test_post_without_csrf_token_is_refused(owner_client, conversation):
    response = owner_client.post(turns_url(conversation), data=json.dumps({"content": "hi"}),
                                 content_type="application/json")
    assert response.status_code == 403
    assert response.json()["detail"] == ("This page has expired, so the message could not be accepted. Please reload "
                                         "the page and try again.")
    assert_nothing_enqueued()


def test_control_characters_are_stripped_and_the_message_kept(owner_client, conversation):
    response = api_post(owner_client, turns_url(conversation), {"content": "hel\x00lo\r\nworld\x1b"})
    assert response.status_code == 202
    assert Message.objects.get().content == "hello\nworld"


GONE = "This conversation is no longer available. It may have expired; please start a new one."


def test_every_not_found_reads_as_the_apps_own_sentence_in_the_visitors_language(owner_client):
    missing = uuid.uuid4()
    urls = [f"/api/conversations/{missing}/", f"/api/conversations/{missing}/turns/{uuid.uuid4()}/",
            "/api/conversations/not-a-uuid/"]
    for url in urls:
        response = owner_client.get(url)
        assert (response.status_code, response.json()) == (404, {"detail": GONE}), url
        spanish = owner_client.get(url, HTTP_ACCEPT_LANGUAGE="es")
        assert spanish.json()["detail"] == "Esta conversación ya no está disponible. Puede que haya caducado; " \
                                           "empieza una nueva.", url
    cancel = api_post(owner_client, f"/api/conversations/{missing}/turns/{uuid.uuid4()}/cancel/")
    assert (cancel.status_code, cancel.json()) == (404, {"detail": GONE})
