"""``conversations.turns`` counts a turn that ends while it waits for an approval: stopped by its
visitor, or expired past ``APPROVAL_WAIT``. No job runs then, so the count is made by the write that
ends it (``lifecycle.ended``), once. The SDK's in-memory metric reader, in this process."""

import time

import pytest

from tests.support.fakes import openai_text, openai_tool_calls
from tests.support.helpers import api_post, make_client, poll_until_done, run_worker

from .conftest import waiting_turn

otel = pytest.importorskip("tests.support.otel", reason="the otel extra is not installed")

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def telemetry():
    recorder = otel.Telemetry.get()
    recorder.start()
    yield recorder
    recorder.stop()


def test_a_turn_stopped_while_it_waits_for_an_approval_is_counted_once_cancelled(fake, telemetry):
    fake.add(openai_tool_calls(("call_1", "refund", {"order": "A1"})), openai_text("never asked"))
    client = make_client()
    started, _state = waiting_turn(client)
    assert otel.turns_counted(telemetry.metric_points()) == ({}, 0, 0)  # waiting is not an ending

    assert api_post(client, started["cancel_url"]).json()["status"] == "cancelled"
    assert api_post(client, started["cancel_url"]).json()["status"] == "cancelled"  # pressed again
    run_worker()

    assert otel.turns_counted(telemetry.metric_points()) == ({"cancelled": 1}, 1, 0)


def test_a_turn_whose_approval_expired_is_counted_once_incomplete(fake, telemetry, conversations_settings):
    conversations_settings.update(APPROVAL_WAIT=1)
    fake.add(openai_tool_calls(("call_1", "refund", {"order": "A1"})), openai_text("never asked"))
    client = make_client()
    started, _state = waiting_turn(client)
    time.sleep(1.2)

    assert poll_until_done(client, started["poll_url"])["status"] == "incomplete"
    client.get(started["poll_url"])  # polled again: already ended, nothing more written
    run_worker()

    assert otel.turns_counted(telemetry.metric_points()) == ({"incomplete": 1}, 1, 0)
