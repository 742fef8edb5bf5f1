"""Sites where only logged-in users may chat: ``CONVERSATIONS["LOGIN_REQUIRED"]``, and Django's
``LoginRequiredMiddleware``, which must never answer the widget with a redirect to a login page."""

import pytest
from django.test import Client

from conversations.models import Conversation, Turn
from tests.support.helpers import call_every_endpoint, logged_in_client, make_client, poll_until_done, start_turn

pytestmark = pytest.mark.django_db(transaction=True)

SIGN_IN = {"detail": "Please sign in to chat with the assistant."}
LOGIN_REQUIRED_MIDDLEWARE = "django.contrib.auth.middleware.LoginRequiredMiddleware"




def client_from(page):
    """A browser that opened ``page`` of the site first (which set its csrftoken cookie)."""
    client = Client(enforce_csrf_checks=True)
    assert client.get(page).status_code == 200
    client.csrf = client.cookies["csrftoken"].value
    return client


def member_client(page):
    """A logged-in user's browser that opened ``page`` first."""
    from django.contrib.auth import get_user_model

    client = client_from(page)
    client.force_login(get_user_model().objects.create_user("member", password="pw-123456789"))
    client.get("/")  # login rotates the CSRF token
    client.csrf = client.cookies["csrftoken"].value
    return client


@pytest.fixture
def login_required_middleware(settings):
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, LOGIN_REQUIRED_MIDDLEWARE]
    settings.LOGIN_URL = "/admin/login/"


def test_anonymous_visitors_are_asked_to_sign_in_on_every_endpoint_and_nothing_changes(conversations_settings):
    client = make_client()
    turn = start_turn(client)  # started while anonymous visitors could still chat
    conversations_settings.update(LOGIN_REQUIRED=True)

    answers = call_every_endpoint(client, turn)

    for name, response in answers.items():
        assert response.status_code == 403, (name, response.status_code, response.content[:300])
        assert response["Content-Type"] == "application/json" and response.json() == SIGN_IN, name
    assert Conversation.objects.count() == 1 and Turn.objects.count() == 1
    assert Turn.objects.get().status == "queued" and not Turn.objects.get().cancel_requested


def test_the_sign_in_sentence_is_translated(conversations_settings):
    conversations_settings.update(LOGIN_REQUIRED=True)
    response = make_client().get("/api/conversations/", HTTP_ACCEPT_LANGUAGE="es")
    assert response.status_code == 403
    assert response.json() == {"detail": "Inicia sesión para hablar con el asistente."}


def test_logged_in_users_chat_as_before(conversations_settings, worker):
    conversations_settings.update(LOGIN_REQUIRED=True)
    client = logged_in_client()

    turn = start_turn(client)
    worker()

    final = poll_until_done(client, turn["poll_url"])
    assert final["status"] == "completed" and "Tokyo" in final["messages"][-1]["content"]
    assert [c["id"] for c in client.get("/api/conversations/").json()] == [turn["conversation"]]
    assert client.get(f"/api/conversations/{turn['conversation']}/").status_code == 200


def test_with_login_required_middleware_anonymous_widgets_get_json_not_a_login_redirect(
        login_required_middleware, worker):
    # The page the widget is on was exempted by the site (here the admin's login page, which is).
    client = client_from("/admin/login/")

    listed = client.get("/api/conversations/")
    turn = start_turn(client)
    worker()

    assert listed.status_code == 200 and listed["Content-Type"] == "application/json" and listed.json() == []
    assert poll_until_done(client, turn["poll_url"])["status"] == "completed"


def test_with_login_required_middleware_and_login_required_anonymous_callers_get_403_json(
        login_required_middleware, conversations_settings, worker):
    conversations_settings.update(LOGIN_REQUIRED=True)
    anonymous = client_from("/admin/login/")
    member = member_client("/admin/login/")
    turn = start_turn(member)

    answers = call_every_endpoint(anonymous, turn)

    for name, response in answers.items():
        assert response.status_code == 403 and response.json() == SIGN_IN, (name, response.status_code)
    worker()
    assert poll_until_done(member, turn["poll_url"])["status"] == "completed"
