"""The final write always lands: each line of defence, tried with the ones inside it defeated.

1. the job's own deadline, ``DEADLINE_MARGIN`` inside RQ's job timeout;
2. RQ's ``JobTimeoutException``, caught by the job to write the final state, then re-raised;
3. ``conversations.worker.Worker.handle_work_horse_killed``, in the worker's parent, when the
   work horse is SIGKILLed;
4. the poll view, which ends a turn whose state is stale and whose RQ job is failed, gone or
   no longer heartbeating.

Each writes the database row as well as the cached state the poller sees.
"""

import datetime
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import django_rq
import pytest
import rq
from django.core.cache import cache
from django.db import connections
from rq.job import Job, JobStatus

import conversations.worker
from conversations.infra import state
from conversations.core.sentences import timeout_message
from conversations.models import CallRecord, Message, Turn
from conversations.providers import BaseProvider, ProviderError
from conversations.core.sentences import crashed_message
from tests.support.helpers import Poller, make_client, start_turn, wait_for
from tests.support.fakes import FakeProvider, hang

pytestmark = pytest.mark.django_db(transaction=True)

MARGIN = 4


class SleepyProvider(BaseProvider):
    """A badly written provider: it ignores the turn's budget and blocks far past the job timeout
    (in Python code, where RQ's timeout reaches it in either worker class; C code that never
    returns is tests/engine/test_concurrent_worker.py's)."""

    name = "sleepy"

    def complete(self, messages, tools):
        for _ in range(36000):
            time.sleep(0.1)




def saved(summary):
    return Turn.objects.get(pk=summary["id"])


def test_own_deadline_ends_a_hung_call_with_the_margin_left(any_worker, conversations_settings):
    """A call given the whole remaining budget (CALL_TIMEOUT far above it) still ends at the deadline."""
    with FakeProvider() as fake:
        fake.add(hang)
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="k", CALL_TIMEOUT=60)
        client = make_client()
        summary = start_turn(client, "Anyone there?")
        with Poller(client, summary["poll_url"]) as poller:
            any_worker()

    assert poller.final["done"] is True and poller.final["status"] == "failed"
    assert poller.final["error"] == str(ProviderError.MESSAGES["timeout"])
    turn = saved(summary)
    assert turn.status == "failed" and turn.error == poller.final["error"]
    # The final write landed at the job's own deadline, most of the margin still unused.
    assert MARGIN - 1 <= turn.margin_left <= MARGIN + 0.5
    (call,) = CallRecord.objects.filter(turn=turn)
    assert call.outcome == "timeout" and call.timeout == pytest.approx(call.remaining_before, abs=0.01)
    assert call.timeout < 6


def test_rq_job_timeout_is_caught_the_final_state_written_and_the_timeout_re_raised(
        any_worker, conversations_settings):
    conversations_settings.update(PROVIDER=f"{__name__}.SleepyProvider", JOB_TIMEOUT=4, DEADLINE_MARGIN=2)
    client = make_client()
    summary = start_turn(client, "Will you answer?")
    with Poller(client, summary["poll_url"]) as poller:
        started = time.monotonic()
        any_worker()
    elapsed = time.monotonic() - started

    assert poller.final["done"] is True and poller.final["status"] == "failed"
    assert poller.final["error"] == timeout_message()
    turn = saved(summary)
    assert (turn.status, turn.error) == ("failed", timeout_message())
    assert -0.5 <= turn.margin_left <= 0.5  # written right at RQ's timeout, not by a later safety net
    assert elapsed < 4 + 5
    assert Message.objects.filter(turn=turn, role="user", content="Will you answer?").exists()
    # Re-raised: RQ records the job as failed by its timeout, not as finished.
    job = Job.fetch(turn.job_id, connection=django_rq.get_connection())
    assert job.get_status() == JobStatus.FAILED
    assert "JobTimeoutException" in job.latest_result().exc_string


def kill_horse_when_called(worker, fake):
    """From a background thread: SIGKILL ``worker``'s work horse once it is inside a provider call."""

    def kill():
        wait_for(lambda: fake.requests and worker.horse_pid)
        os.kill(worker.horse_pid, signal.SIGKILL)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def test_sigkilled_work_horse_still_ends_the_turn(conversations_settings):
    with FakeProvider() as fake:
        fake.add(hang)
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="k")
        client = make_client()
        summary = start_turn(client, "Still there?")
        connections.close_all()  # the horse must not share the test's database socket
        worker = django_rq.get_worker("default")
        assert type(worker) is conversations.worker.Worker  # the class the site names in RQ["WORKER_CLASS"]
        with Poller(client, summary["poll_url"]) as poller:
            killer = kill_horse_when_called(worker, fake)
            started = time.monotonic()
            worker.work(burst=True)
            killer.join(5)
        elapsed = time.monotonic() - started

    assert poller.final["done"] is True and poller.final["status"] == "failed"
    assert poller.final["error"] == crashed_message()
    assert [s["status"] for s in poller.states if not s["done"]][-1] == "running"
    assert elapsed < 10
    turn = saved(summary)
    assert (turn.status, turn.error) == ("failed", crashed_message())
    assert turn.finished_at is not None
    assert Job.fetch(turn.job_id, connection=django_rq.get_connection()).get_status() == JobStatus.FAILED


def test_poll_view_ends_a_turn_whose_horse_died_under_a_plain_rq_worker(conversations_settings):
    """Without our worker class nobody writes the final state; the poll view notices the failed job."""
    with FakeProvider() as fake:
        fake.add(hang)
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="k")
        client = make_client()
        summary = start_turn(client, "Still there?")
        connections.close_all()
        worker = django_rq.get_worker("default", worker_class=rq.Worker)
        # RQ's own worker, with no command channel: its teardown can wait 60 s on the channel's thread
        # (redis-py 8.2 joins it; the app's worker classes do not wait, test_worker_exit), and the
        # state would be too old to be believed by the time the poll below reads it.
        worker.subscribe = lambda: None
        killer = kill_horse_when_called(worker, fake)
        worker.work(burst=True)
        killer.join(5)

    assert client.get(summary["poll_url"]).json()["status"] == "running"  # fresh enough to be believed
    assert saved(summary).status == "running"
    conversations_settings.update(STALE_AFTER=0)  # every state is stale now
    data = client.get(summary["poll_url"]).json()

    assert (data["done"], data["status"], data["error"]) == (True, "failed", crashed_message())
    assert (saved(summary).status, saved(summary).error) == ("failed", crashed_message())


def test_poll_view_ends_a_turn_whose_job_is_gone(conversations_settings):
    client = make_client()
    summary = start_turn(client, "Hello?")
    Job.fetch(saved(summary).job_id, connection=django_rq.get_connection()).delete()  # e.g. Redis lost it
    conversations_settings.update(STALE_AFTER=0)  # every state is stale now
    data = client.get(summary["poll_url"]).json()

    assert (data["done"], data["status"], data["error"]) == (True, "failed", crashed_message())
    assert saved(summary).status == "failed"


def test_poll_view_rebuilds_a_missing_state_and_ends_the_turn_if_its_job_is_gone(conversations_settings):
    client = make_client()
    summary = start_turn(client, "Hello?")
    Job.fetch(saved(summary).job_id, connection=django_rq.get_connection()).delete()
    cache.delete(state.state_key(summary["id"]))
    data = client.get(summary["poll_url"]).json()

    assert (data["done"], data["status"], data["error"]) == (True, "failed", crashed_message())
    assert saved(summary).status == "failed"


def test_poll_view_leaves_a_healthy_queued_turn_alone(conversations_settings):
    """A stale state alone is not enough: the turn waits in the queue, its job is fine."""
    client = make_client()
    summary = start_turn(client, "Hello?")
    conversations_settings.update(STALE_AFTER=0)  # every state is stale now
    data = client.get(summary["poll_url"]).json()

    assert (data["done"], data["status"]) == (False, "queued")
    assert saved(summary).status == "queued"


def horse_of(pid):
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return int(children[0]) if children else None


def test_poll_view_ends_a_turn_whose_whole_worker_died(worker_process, conversations_settings, worker_class):
    """Parent and horse SIGKILLed together (a lost machine): the job stays "started" and stops
    heartbeating. RQ's parent refreshes the heartbeat every 30 s; after 90 s without one the job
    counts as dead. That wait is simulated by moving the last heartbeat back."""
    with FakeProvider() as fake:
        fake.add(hang)
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="k")
        client = make_client()
        summary = start_turn(client, "Hello?")
        (process,) = worker_process(worker_class=worker_class)
        wait_for(lambda: fake.requests, timeout=20)
        horse = horse_of(process.pid)  # None for the concurrent worker: the turn runs in the process
        os.kill(process.pid, signal.SIGKILL)
        if horse is not None:
            os.kill(horse, signal.SIGKILL)
        process.wait(5)

    connection = django_rq.get_connection()
    job = Job.fetch(saved(summary).job_id, connection=connection)
    assert job.get_status() == JobStatus.STARTED
    conversations_settings.update(STALE_AFTER=0)  # every state is stale now
    assert client.get(summary["poll_url"]).json()["done"] is False  # a recent heartbeat: still believed

    job.heartbeat(datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=120), ttl=600)
    data = client.get(summary["poll_url"]).json()

    assert (data["done"], data["status"], data["error"]) == (True, "failed", crashed_message())
    assert saved(summary).status == "failed"


def test_a_provider_that_cannot_be_loaded_still_ends_the_turn(worker, conversations_settings):
    conversations_settings.update(PROVIDER=f"{__name__}.NoSuchProvider")
    client = make_client()
    summary = start_turn(client, "Hello?")
    worker()
    data = client.get(summary["poll_url"]).json()

    assert (data["done"], data["status"], data["error"]) == (True, "failed", crashed_message())
    assert (saved(summary).status, saved(summary).error) == ("failed", crashed_message())


def test_a_stop_asked_of_a_running_turn_is_a_hand_over_until_someone_cancels_it():
    turn_id = uuid.uuid4()
    assert state.stop_requested(turn_id) is None
    state.request_handoff(turn_id)
    assert state.stop_requested(turn_id) is state.Stop.HANDOFF
    state.request_cancel(turn_id)
    assert state.stop_requested(turn_id) is state.Stop.CANCEL
