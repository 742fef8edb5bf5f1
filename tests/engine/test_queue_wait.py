"""A turn that no worker picks up: it ends within QUEUE_WAIT with a sentence, and never runs later.

No worker runs while the visitor waits; a real forking worker is started afterwards, against
a fake provider that records every request, to show that the late job calls no model.
"""

import datetime
import time

import pytest
from django.utils import timezone

from conversations.engine import lifecycle as turns
from conversations.models import Turn
from tests.support.fakes import FakeProvider, openai_text
from tests.support.helpers import api_post, make_client, poll_until_done, start_turn

pytestmark = pytest.mark.django_db(transaction=True)

NOT_AVAILABLE = "The assistant is not available right now. Please try again later."


@pytest.fixture
def provider(conversations_settings):
    """A fake OpenAI-compatible provider that answers "Hello!" to whatever reaches it."""
    with FakeProvider(default=openai_text("Hello!")) as fake:
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="sk-test", MODEL="fake-model")
        yield fake


def wait_in_queue(turn_id, seconds):
    """As if the turn had been enqueued ``seconds`` ago and no worker had taken it since."""
    Turn.objects.filter(pk=turn_id).update(enqueued_at=timezone.now() - datetime.timedelta(seconds=seconds))


def test_with_no_worker_the_poll_ends_the_turn_within_queue_wait_and_a_late_worker_never_runs_it(
        provider, conversations_settings, worker):
    conversations_settings.update(QUEUE_WAIT=1)
    client = make_client()
    started = time.monotonic()
    turn = start_turn(client, "Is anyone there?")

    final = poll_until_done(client, turn["poll_url"], timeout=20)

    waited = time.monotonic() - started
    assert final["status"] == "failed" and final["error"] == NOT_AVAILABLE
    assert [m["content"] for m in final["messages"]] == ["Is anyone there?"]
    assert 1 <= waited < 6, waited  # QUEUE_WAIT is 1 s; the stale check alone would take 10 s (STALE_AFTER)

    # The visitor is not stuck: the next message is accepted at once.
    conversations_settings.update(QUEUE_WAIT=30)
    conversation = turn["conversation"]
    second = api_post(client, f"/api/conversations/{conversation}/turns/", {"content": "Hello again"})
    assert second.status_code == 202, second.content

    # A worker starts only now: it runs the second turn and leaves the first one as it ended.
    worker()
    assert [r["json"]["messages"][-1]["content"] for r in provider.requests] == ["Hello again"]
    first = Turn.objects.get(pk=turn["id"])
    assert first.status == "failed" and first.error == NOT_AVAILABLE
    assert first.started_at is None and first.model_calls == 0
    assert [m.role for m in first.messages.order_by("id")] == ["user"]
    assert client.get(turn["poll_url"]).json() == final
    answered = client.get(second.json()["poll_url"]).json()
    assert answered["status"] == "completed" and answered["messages"][-1]["content"] == "Hello!"


def test_a_job_that_starts_after_queue_wait_ends_its_turn_without_calling_the_model(provider, any_worker):
    client = make_client()
    turn = start_turn(client, "Is anyone there?")
    wait_in_queue(turn["id"], 31)  # nobody polled meanwhile: the widget's tab was closed

    any_worker()

    assert provider.requests == []
    saved = Turn.objects.get(pk=turn["id"])
    assert saved.status == "failed" and saved.error == NOT_AVAILABLE and saved.model_calls == 0
    state = client.get(turn["poll_url"]).json()
    assert state["done"] is True and state["status"] == "failed" and state["error"] == NOT_AVAILABLE


def test_a_job_that_starts_within_queue_wait_runs_its_turn(provider, any_worker):
    client = make_client()
    turn = start_turn(client, "Is anyone there?")
    wait_in_queue(turn["id"], 29)

    any_worker()

    assert len(provider.requests) == 1
    assert client.get(turn["poll_url"]).json()["status"] == "completed"


def test_a_message_sent_after_an_unpicked_turn_is_accepted_even_if_nobody_polled_it(provider, worker):
    client = make_client()
    turn = start_turn(client, "Is anyone there?")
    wait_in_queue(turn["id"], 31)

    second = api_post(client, f"/api/conversations/{turn['conversation']}/turns/", {"content": "Hello again"})

    assert second.status_code == 202, second.content
    state = client.get(turn["poll_url"]).json()
    assert state["done"] is True and state["status"] == "failed" and state["error"] == NOT_AVAILABLE
    worker()
    assert [r["json"]["messages"][-1]["content"] for r in provider.requests] == ["Hello again"]


def test_whoever_changes_the_queued_row_first_wins(provider):
    """The job and the poll view may both find a turn queued at the same moment; the row decides."""
    client = make_client()
    turn = start_turn(client)
    seen_by_job = Turn.objects.get(pk=turn["id"])
    seen_by_poll = Turn.objects.get(pk=turn["id"])
    wait_in_queue(turn["id"], 31)

    assert turns.end_unclaimed(seen_by_poll) is not None
    assert turns.claim(seen_by_job) is False  # the job read "queued" a moment before: it must not run

    other = start_turn(client, "Again")
    seen_by_job = Turn.objects.get(pk=other["id"])
    seen_by_poll = Turn.objects.get(pk=other["id"])
    assert turns.claim(seen_by_job) is True
    assert turns.end_unclaimed(seen_by_poll) is None  # the job got there first: it runs, nothing ends it
    assert Turn.objects.get(pk=other["id"]).status == "running"
    assert client.get(other["poll_url"]).json()["done"] is False


def test_a_spanish_visitor_reads_the_sentence_in_spanish(provider, conversations_settings):
    conversations_settings.update(QUEUE_WAIT=1)
    client = make_client()
    turn = start_turn(client, "¿Hay alguien?")
    time.sleep(1.2)

    state = client.get(turn["poll_url"], HTTP_ACCEPT_LANGUAGE="es").json()

    assert state["status"] == "failed"
    assert state["error"] == "El asistente no está disponible en este momento. Vuelve a intentarlo más tarde."


def test_a_turn_queued_while_no_worker_listens_is_logged_at_once(caplog):
    with caplog.at_level("WARNING", logger="conversations"):
        turn = start_turn(make_client())
    warnings = [r for r in caplog.records if r.name == "conversations.jobs" and r.levelname == "WARNING"]
    assert len(warnings) == 1, caplog.text
    message = warnings[0].getMessage()
    assert turn["id"] in message
    assert "no worker listens" in message and "'default'" in message and "manage.py rqworker default" in message


def test_a_turn_queued_while_a_worker_listens_logs_no_warning(worker_process, caplog):
    from rq.worker import Worker

    from conversations.infra.queue import get_queue

    worker_process()
    deadline = time.monotonic() + 30
    while not Worker.count(queue=get_queue()) and time.monotonic() < deadline:
        time.sleep(0.1)
    with caplog.at_level("WARNING", logger="conversations"):
        start_turn(make_client())
    assert not [r for r in caplog.records if "no worker listens" in r.getMessage()], caplog.text


def test_the_transcript_carries_how_each_turn_ended_with_its_sentence(conversations_settings):
    client = make_client()
    stopped = start_turn(client, "First question")
    assert api_post(client, stopped["cancel_url"]).status_code == 202  # queued: it ends cancelled at once
    conversation = stopped["conversation"]
    conversations_settings.update(QUEUE_WAIT=1)
    failed = api_post(client, f"/api/conversations/{conversation}/turns/", {"content": "Second question"}).json()
    poll_until_done(client, failed["poll_url"])  # no worker: it ends failed after QUEUE_WAIT

    endings = client.get(f"/api/conversations/{conversation}/").json()["endings"]
    assert endings == {stopped["id"]: {"status": "cancelled", "error": None},
                       failed["id"]: {"status": "failed", "error": NOT_AVAILABLE}}
