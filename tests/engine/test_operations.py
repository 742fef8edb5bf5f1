"""`manage.py repair_turns`, the cron job for stuck turns, as an operator and a visitor see it.

Each test puts a turn in the state a real failure leaves behind (a worker machine that died
and whose job record was lost, a job still running inside its margin, a backlog) with the real
Redis and RQ job records, then runs the command.
"""

import datetime
import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone
from rq.job import Job

from conversations.infra import queue
from conversations.infra import state
from conversations.models import Turn
from tests.support.fakes import FakeProvider, openai_text
from tests.support.helpers import make_client, start_turn
from conversations.core.sentences import crashed_message

pytestmark = pytest.mark.django_db(transaction=True)


def repair(*args):
    out = io.StringIO()
    call_command("repair_turns", *args, stdout=out)
    return out.getvalue()


def queued_turn():
    """A visitor's turn, queued with its real RQ job; returns (client, 202 body, Turn, Job)."""
    client = make_client()
    body = start_turn(client, "Hello?")
    turn = Turn.objects.get(pk=body["id"])
    return client, body, turn, Job.fetch(turn.job_id, connection=queue.get_queue().connection)


def mark_running(turn, *, deadline_ago):
    """Write what ``TurnRunner.start`` writes, as if a worker had started the turn a while ago."""
    now = timezone.now()
    Turn.objects.filter(pk=turn.pk).update(
        status=Turn.Status.RUNNING, started_at=now - datetime.timedelta(seconds=deadline_ago + 6),
        deadline_at=now - datetime.timedelta(seconds=deadline_ago))


def age(turn, seconds):
    Turn.objects.filter(pk=turn.pk).update(enqueued_at=timezone.now() - datetime.timedelta(seconds=seconds))


def test_running_turn_whose_job_is_gone_is_ended_and_the_visitor_sees_why():
    client, body, turn, job = queued_turn()
    mark_running(turn, deadline_ago=120)
    job.delete()  # the worker's machine died and the job's record is lost

    out = repair()

    assert f"{turn.id}  running" in out and "job gone  -> repaired" in out
    assert "1 overdue turn(s), 1 repaired" in out
    turn.refresh_from_db()
    assert turn.status == "failed" and turn.finished_at is not None
    assert turn.error == crashed_message()
    final = client.get(body["poll_url"]).json()
    assert final["done"] is True and final["status"] == "failed" and final["error"] == crashed_message()
    assert final["messages"][0]["content"] == "Hello?"


def test_running_turn_whose_job_is_alive_is_left_alone():
    client, body, turn, job = queued_turn()
    # A worker on another machine has started the job and is heartbeating; the turn is past
    # its own deadline, i.e. inside its margin, writing its final state.
    connection = queue.get_queue().connection
    with connection.pipeline() as pipeline:
        job.prepare_for_execution("worker-on-another-host", pipeline)
        pipeline.hset("rq:worker:worker-on-another-host", "state", "busy")  # a living worker's key
        pipeline.execute()
    mark_running(turn, deadline_ago=2)
    before = state.read(turn.id)

    out = repair()

    assert "job still alive  -> left alone" in out and "1 overdue turn(s), 0 repaired" in out
    turn.refresh_from_db()
    assert turn.status == "running" and turn.error == "" and turn.finished_at is None
    assert state.read(turn.id) == before
    assert client.get(body["poll_url"]).json()["done"] is False


def test_queued_turn_whose_job_vanished_is_ended():
    client, body, turn, job = queued_turn()
    age(turn, 20)  # past the grace below, within QUEUE_WAIT (30 s)
    job.delete()  # e.g. Redis restarted without persistence

    out = repair("--grace", "10")

    assert f"{turn.id}  queued" in out and "job gone  -> repaired" in out
    turn.refresh_from_db()
    assert turn.status == "failed" and turn.finished_at is not None
    final = client.get(body["poll_url"]).json()
    assert final["done"] is True and final["status"] == "failed"


def test_queued_turn_waiting_behind_a_backlog_within_queue_wait_is_left_alone():
    client, body, turn, job = queued_turn()
    age(turn, 20)  # past the grace, but its job is still in the queue and QUEUE_WAIT (30 s) is not over

    out = repair("--grace", "10")

    assert "left alone" in out
    turn.refresh_from_db()
    assert turn.status == "queued"
    assert queue.get_queue().job_ids == [turn.job_id]


def test_queued_turn_no_worker_picked_up_within_queue_wait_is_ended_and_never_runs(worker, conversations_settings):
    with FakeProvider(default=openai_text("Hello!")) as fake:
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="sk-test")
        client, body, turn, job = queued_turn()
        age(turn, 31)  # no worker running, and nobody polling

        out = repair()

        assert f"{turn.id}  queued" in out and "not picked up within QUEUE_WAIT (30s)  -> repaired" in out
        assert "1 overdue turn(s), 1 repaired" in out
        final = client.get(body["poll_url"]).json()
        assert final["done"] is True and final["status"] == "failed"
        assert final["error"] == "The assistant is not available right now. Please try again later."
        worker()  # a worker that starts afterwards takes the job, and leaves the turn as it ended
        assert fake.requests == []
    turn.refresh_from_db()
    assert turn.status == "failed" and turn.started_at is None and turn.model_calls == 0
    assert client.get(body["poll_url"]).json() == final
    assert "0 overdue turn(s)" in repair()


def test_recent_queued_turn_is_not_even_checked():
    client, body, turn, job = queued_turn()
    job.delete()  # just enqueued: inside the grace period nothing is reported

    assert "0 overdue turn(s)" in repair()
    turn.refresh_from_db()
    assert turn.status == "queued"


def test_dry_run_changes_nothing_and_a_second_run_finds_nothing():
    client, body, turn, job = queued_turn()
    mark_running(turn, deadline_ago=120)
    job.delete()
    before = state.read(turn.id)

    out = repair("--dry-run")

    assert "job gone  -> would repair" in out and "1 would be repaired" in out
    turn.refresh_from_db()
    assert turn.status == "running" and turn.finished_at is None
    assert state.read(turn.id) == before

    assert "1 repaired" in repair()
    version = state.read(turn.id)["version"]
    assert "0 overdue turn(s)" in repair()  # idempotent: cron may run it again and again
    assert state.read(turn.id)["version"] == version


def test_with_redis_unreachable_it_says_so_and_changes_nothing(unreachable_queue):
    _, _, turn, _ = queued_turn()
    mark_running(turn, deadline_ago=60)
    unreachable_queue()

    with pytest.raises(CommandError, match="Redis is unavailable, nothing was changed after this point"):
        repair()

    assert Turn.objects.get(pk=turn.pk).status == "running"


def test_grace_must_not_be_negative():
    with pytest.raises(CommandError, match="--grace must be zero or more"):
        repair("--grace", "-1")


def test_each_provider_call_logs_a_json_line_an_operator_can_filter(caplog):
    """The production JSON formatter (conversations.log) turns every provider call and every
    skipped call into one JSON object carrying the turn id, attempt, timeout, time left and outcome."""
    import json

    from conversations.core.budget import Budget, BudgetExhausted
    from conversations.conf import get_config
    from conversations.infra.http import BudgetedHTTP
    from conversations.log import JsonFormatter
    from tests.support.fakes import FakeProvider, Reply, openai_text

    formatter = JsonFormatter()
    with FakeProvider() as fake, caplog.at_level("INFO", logger="conversations.http"):
        fake.add(Reply(503, {"error": "busy"}, {"Retry-After": "0"}), openai_text("hi"))
        http = BudgetedHTTP(Budget(6), get_config(), name="openai", turn_id="turn-42")
        http.post_json(fake.url + "/chat/completions", {"messages": []}, {"Authorization": "Bearer sk-secret"})
        with pytest.raises(BudgetExhausted):
            BudgetedHTTP(Budget(0.5), get_config(), name="openai", turn_id="turn-43").post_json(
                fake.url + "/chat/completions", {}, {})

    lines = [json.loads(formatter.format(record)) for record in caplog.records if record.name == "conversations.http"]
    calls = [line for line in lines if line["message"].startswith("provider call")]
    assert [(c["turn_id"], c["attempt"], c["outcome"]) for c in calls] == [("turn-42", 1, "http_error"),
                                                                           ("turn-42", 2, "ok")]
    assert all(0 < c["timeout"] <= 5 and 0 < c["remaining"] <= 6 and c["duration"] >= 0 for c in calls)
    skipped = [line for line in lines if line["message"] == "Skipped call — job budget exhausted"]
    assert skipped == [{**skipped[0], "level": "ERROR", "turn_id": "turn-43", "attempt": 1}]
    assert "sk-secret" not in json.dumps(lines)
