"""What a turn cost, as its row keeps it for the admin's overview: saved however the turn ended,
in its job or outside it, and never ``0`` for a priced turn whose usage the provider did not report
(the overview counts free turns in its total, and unknown costs apart)."""

import os
import signal
import threading
import time
from decimal import Decimal

import django_rq
import pytest
from django.db import connections
from django.utils import timezone

from conversations.models import Turn
from conversations.core.sentences import crashed_message
from tests.support.fakes import FakeProvider, hang, openai_text, openai_tool_calls
from tests.support.helpers import make_client, poll_until_done, start_turn

pytestmark = pytest.mark.django_db(transaction=True)

PRICES = {"m": {"input": "1.00", "output": "2.00"}}  # per million tokens


@pytest.fixture
def priced(conversations_settings):
    """A fake OpenAI-compatible provider whose model ``m`` has a price."""
    with FakeProvider() as fake:
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="k", MODEL="m", STREAM=False,
                                      MAX_ATTEMPTS=1, PRICES=PRICES)
        yield fake


def test_a_turn_ended_by_the_worker_after_its_work_horse_died_keeps_the_cost_of_its_calls(priced):
    fake = priced
    # One call counted (13 in, 5 out), then the horse dies in the second.
    fake.add(openai_tool_calls(("search_faq", {"query": "refunds"}), prompt_tokens=13, completion_tokens=5), hang)
    client = make_client()
    started = start_turn(client, "Refunds?")
    connections.close_all()
    worker = django_rq.get_worker("default")

    def kill():
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (len(fake.requests) >= 2 and worker.horse_pid):
            time.sleep(0.01)
        os.kill(worker.horse_pid, signal.SIGKILL)

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    worker.work(burst=True)
    killer.join(5)

    final = poll_until_done(client, started["poll_url"])
    turn = Turn.objects.get(pk=started["id"])
    assert (final["status"], final["error"]) == ("failed", crashed_message())
    assert (turn.input_tokens, turn.output_tokens) == (13, 5)
    assert turn.cost == Decimal("0.00002300")  # 13 × 1.00 + 5 × 2.00 per million


def test_a_turn_the_poll_view_ends_because_its_job_is_gone_keeps_its_cost(priced, conversations_settings):
    client = make_client()
    started = start_turn(client, "Gone?")
    Turn.objects.filter(pk=started["id"]).update(status="running", started_at=timezone.now(), model_calls=1,
                                                 input_tokens=1000, output_tokens=500)
    django_rq.get_queue("default").empty()  # the job is gone
    conversations_settings.update(STALE_AFTER=0)  # the poll view looks at the job at once

    final = client.get(started["poll_url"]).json()

    assert (final["done"], final["status"]) == (True, "failed")
    assert Turn.objects.get(pk=started["id"]).cost == Decimal("0.00200000")


def test_a_priced_turn_whose_provider_reports_no_usage_is_charged_an_estimate_never_nothing(priced, worker):
    fake = priced
    reply = openai_text("No usage with this one.")
    del reply["usage"]  # some OpenAI-compatible servers leave it out
    fake.add(reply)
    client = make_client()
    started = start_turn(client, "Free?")
    worker()

    final = poll_until_done(client, started["poll_url"])
    turn = Turn.objects.get(pk=started["id"])
    assert final["status"] == "completed" and turn.model == "m"
    # Counted from the prompt and the answer (about 4 characters a token) and marked so, never free.
    assert turn.usage_estimated and turn.input_tokens > 0 and turn.output_tokens > 0
    assert turn.cost == (turn.input_tokens * Decimal("1.00") + turn.output_tokens * Decimal("2.00")) \
        / 1_000_000


def test_a_priced_turn_that_counted_no_tokens_has_no_cost_not_a_free_one(priced, worker):
    """Failed before any answer, its provider reporting nothing used: its cost is unknown (no
    cost), never 0.00, which the overview would count as a free turn."""
    fake = priced
    fake.add(openai_text("", prompt_tokens=0, completion_tokens=0), openai_text("", prompt_tokens=0,
                                                                              completion_tokens=0))
    client = make_client()
    started = start_turn(client, "Anything?")
    worker()

    final = poll_until_done(client, started["poll_url"])
    turn = Turn.objects.get(pk=started["id"])
    assert final["status"] == "failed" and (turn.input_tokens, turn.output_tokens) == (0, 0)
    assert turn.cost is None
