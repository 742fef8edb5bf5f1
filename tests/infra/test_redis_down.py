"""Redis unreachable: every API call answers JSON, a 503 with a sentence where it needs Redis,
never Django's HTML 500; and nothing the visitor wrote is lost.

Redis here is really gone: every cache alias and the queue point at a port where nothing
listens (tests/helpers.NOWHERE), with sessions in the cache (as the README recommends) and in
the database.
"""

import pytest

from conversations.models import Message, Turn
from tests.support.helpers import NOWHERE, api_post, call_every_endpoint, make_client, start_turn

pytestmark = pytest.mark.django_db(transaction=True)

UNAVAILABLE = {"detail": "The assistant is unavailable right now. Please try again in a minute."}


@pytest.fixture
def redis_down(settings):
    """Call the returned function to point every cache and the queue at a Redis that is not
    there, and again with False to bring them back."""
    caches, queues = settings.CACHES, settings.RQ_QUEUES

    def down(is_down=True):
        settings.CACHES = {alias: {**conf, "LOCATION": NOWHERE} for alias, conf in caches.items()} if is_down else caches
        settings.RQ_QUEUES = {name: {**conf, "URL": NOWHERE} for name, conf in queues.items()} if is_down else queues

    return down




def assert_unavailable(response, name):
    assert response.status_code == 503, (name, response.status_code, response.content[:300])
    assert response["Content-Type"] == "application/json", (name, response["Content-Type"])
    assert response.json() == UNAVAILABLE, name


def assert_message_can_be_sent_again(client, turn, worker):
    """Redis is back: the message the widget kept is accepted with its key, once, and answered."""
    conversation = turn["conversation"]
    again = api_post(client, f"/api/conversations/{conversation}/turns/", {"content": "Still there?"},
                     HTTP_IDEMPOTENCY_KEY="message-2")
    assert again.status_code == 202, again.content
    worker()
    transcript = client.get(f"/api/conversations/{conversation}/").json()["messages"]
    assert [m["content"] for m in transcript if m["role"] == "user"] == ["What time is it in Tokyo?", "Still there?"]
    assert transcript[-1]["role"] == "assistant"


def test_with_sessions_in_the_cache_every_endpoint_answers_503_with_a_sentence(redis_down, worker):
    client = make_client()
    turn = start_turn(client)
    worker()
    redis_down()

    answers = call_every_endpoint(client, turn, "Still there?", HTTP_IDEMPOTENCY_KEY="message-2")

    for name, response in answers.items():
        assert_unavailable(response, name)
    redis_down(False)
    assert Turn.objects.count() == 1 and Message.objects.filter(content="Still there?").count() == 0
    assert client.get(turn["poll_url"]).json()["status"] == "completed"  # the stop changed nothing
    assert_message_can_be_sent_again(client, turn, worker)


def test_with_sessions_in_the_database_what_needs_redis_answers_503_and_the_rest_still_answers(
        redis_down, worker, settings):
    settings.SESSION_ENGINE = "django.contrib.sessions.backends.db"
    client = make_client()
    turn = start_turn(client)
    worker()
    redis_down()

    answers = call_every_endpoint(client, turn, "Still there?", HTTP_IDEMPOTENCY_KEY="message-2")

    for name in ("start a conversation", "send a message", "poll"):  # throttles and states live in Redis
        assert_unavailable(answers[name], name)
    # The rest needs only the database, and answers from it as usual.
    assert answers["list conversations"].status_code == 200
    assert [c["id"] for c in answers["list conversations"].json()] == [turn["conversation"]]
    assert answers["read a conversation"].status_code == 200
    assert answers["read a conversation"].json()["messages"][0]["content"] == "What time is it in Tokyo?"
    assert answers["stop"].status_code == 202 and answers["stop"].json()["status"] == "completed"
    redis_down(False)
    assert_message_can_be_sent_again(client, turn, worker)


def test_a_new_visitors_session_that_cannot_be_saved_is_a_503_not_an_html_500(redis_down, conversations_settings):
    """With the conversation throttles off nothing in the view touches Redis: only the session,
    which SessionMiddleware would save after the view."""
    conversations_settings.update(CONVERSATION_RATE_PER_OWNER="", CONVERSATION_RATE_PER_IP="")
    client = make_client()
    redis_down()

    response = api_post(client, "/api/conversations/")

    assert_unavailable(response, "start a conversation")
    assert "sessionid" not in response.cookies
    redis_down(False)
    assert client.get("/api/conversations/").json() == []  # nothing half-made is the visitor's


def test_with_only_the_queue_down_the_poll_of_a_stale_turn_answers_503(unreachable_queue, conversations_settings):
    client = make_client()
    turn = start_turn(client)
    Turn.objects.filter(pk=turn["id"]).update(status=Turn.Status.RUNNING)
    conversations_settings.update(STALE_AFTER=0.001)  # its job must be looked at, in the queue's Redis
    unreachable_queue()

    assert_unavailable(client.get(turn["poll_url"]), "poll")

    unreachable_queue(False)
    assert client.get(turn["poll_url"]).json()["done"] is False


def test_the_503_line_names_redis_host_port_and_reason(redis_down, caplog):
    client = make_client()
    redis_down()
    with caplog.at_level("ERROR", logger="conversations"):
        response = api_post(client, "/api/conversations/")

    assert_unavailable(response, "conversations")
    (line,) = [r.getMessage() for r in caplog.records if r.name == "conversations.api"]
    assert line.startswith("Redis is unreachable; POST /api/conversations/ answered 503: ConnectionError: ")
    assert "127.0.0.1:9" in line and "Connection refused" in line
    assert "network:ConnectionError" not in line


def test_the_admin_login_html_500_with_sessions_in_redis_is_logged_with_where_and_why(redis_down, caplog):
    from django.contrib.auth.models import User
    from django.test import Client

    User.objects.create_superuser("admin", password="a long enough password")
    client = Client(raise_request_exception=False)
    redis_down()
    with caplog.at_level("ERROR", logger="conversations"):
        response = client.post("/admin/login/", {"username": "admin", "password": "a long enough password"})

    assert response.status_code == 500
    lines = [r.getMessage() for r in caplog.records if r.name == "conversations.redis"]
    assert lines and lines[0].startswith("Redis is unreachable; POST /admin/login/ answered 500: ConnectionError: ")
    assert "127.0.0.1:9" in lines[0] and "Connection refused" in lines[0]


def test_check_deploy_says_redis_is_unreachable_with_host_and_port(settings):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    settings.CACHES = {"default": {**settings.CACHES["default"], "LOCATION": "redis://:s3cret-pw@127.0.0.1:9/3"}}
    with pytest.raises(SystemCheckError) as raised:
        call_command("check", "--deploy", "--tag", "caches")
    message = str(raised.value)

    assert "(conversations.E022) Redis at 127.0.0.1:9 (database 3) is unreachable (used by the cache 'default'): " \
           "ConnectionError: Error 111 connecting to 127.0.0.1:9. Connection refused." in message
    assert "s3cret-pw" not in message


def test_plain_check_opens_no_connection_to_redis(settings):
    from django.core.management import call_command

    settings.CACHES = {"default": {**settings.CACHES["default"], "LOCATION": NOWHERE}}
    settings.RQ_QUEUES = {name: {**conf, "URL": NOWHERE} for name, conf in settings.RQ_QUEUES.items()}
    call_command("check")  # no E022: the check that connects runs with --deploy only


def test_check_deploy_passes_when_redis_answers():
    from django.core.management import call_command

    call_command("check", "--deploy", "--tag", "caches")
