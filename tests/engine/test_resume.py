"""A turn survives its worker: a killed work horse, or a worker shutting down, hands the turn to
a new job that goes on from the saved transcript under the same deadline — with real forking
workers (burst mode and ``manage.py rqworker`` processes), real Redis and a fake provider
that counts every request."""

import datetime
import os
import signal
import threading
import time

import django_rq
import pytest
from django.core.cache import cache
from django.db import connections
from rq.job import Job

from conversations.engine import recovery
from conversations.models import CallRecord, Message, Turn
from conversations.core.sentences import crashed_message
from conversations.engine.recovery import resume_or_fail
from conversations.tools import tool
from tests.support.fakes import FakeProvider, hang, openai_text, openai_tool_calls
from tests.support.helpers import (Poller, at_once, make_client, make_worker, poll_until_done, run_worker, start_turn,
                                   wait_for_exit)

pytestmark = pytest.mark.django_db(transaction=True)


@tool
def write_once(note: str) -> str:
    """A tool with an effect (not idempotent): it must not run twice for one call."""
    cache.set("test:tool-started", True)
    time.sleep(3)
    return "written"


@tool(idempotent=True)
def look_up(query: str) -> str:
    """A read-only tool."""
    cache.set("test:tool-started", True)
    try:
        cache.incr("test:look-ups")
    except ValueError:
        cache.set("test:look-ups", 1)
    time.sleep(1)
    return f"found {query}"


TOOLS = [f"{__name__}.write_once", f"{__name__}.look_up"]


@pytest.fixture
def resuming(conversations_settings):
    """A fake provider, and settings with resuming on (the suite turns it off elsewhere)."""
    with FakeProvider() as fake:
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="k", MODEL="m", TOOLS=TOOLS,
                                      MAX_RESUMES=2, JOB_TIMEOUT=20, DEADLINE_MARGIN=4, CALL_TIMEOUT=10,
                                      STREAM=False, MAX_ATTEMPTS=1)
        yield fake


def run_with_killer(client, started, until):
    """Run the queue in a real forking worker (burst), SIGKILLing the work horse once ``until()``
    is true (once); returns the worker's final state via polling."""
    connections.close_all()
    worker = django_rq.get_worker("default")
    killed = threading.Event()

    def kill():
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (until() and worker.horse_pid):
            time.sleep(0.01)
        os.kill(worker.horse_pid, signal.SIGKILL)
        killed.set()

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    with Poller(client, started["poll_url"]) as poller:
        worker.work(burst=True)
    thread.join(5)
    assert killed.is_set()
    return poller


def transcript(turn_id):
    return list(Message.objects.filter(turn_id=turn_id).order_by("id").values_list("role", "content"))


def test_killed_during_a_model_call_the_turn_goes_on_without_repeating_finished_calls(resuming):
    fake = resuming
    fake.add(openai_tool_calls(("call_1", "look_up", {"query": "refunds"})), hang,
             openai_text("Refunds take 30 days."))
    client = make_client()
    started = start_turn(client, "How do refunds work?")
    poller = run_with_killer(client, started, until=lambda: len(fake.requests) >= 2)

    final = poll_until_done(client, started["poll_url"])
    assert (final["status"], final["error"]) == ("completed", None)
    assert transcript(started["id"]) == [("user", "How do refunds work?"), ("assistant", ""),
                                         ("tool", "found refunds"), ("assistant", "Refunds take 30 days.")]
    assert len(fake.requests) == 3  # the first call once, the killed one, its replacement
    assert fake.requests[2]["json"]["messages"][-1]["content"] == "found refunds"
    turn = Turn.objects.get(pk=started["id"])
    assert turn.resumes == 1 and cache.get("test:look-ups") == 1
    (resume,) = CallRecord.objects.filter(turn=turn, kind="resume")
    assert "work horse died" in resume.name and resume.remaining_before > 5
    assert final["resuming"] is False
    # The deadline stayed the first job's: the continuation's budget ended at deadline_at.
    assert turn.finished_at <= turn.deadline_at


@pytest.mark.parametrize("name, rerun", [("look_up", True), ("write_once", False)])
def test_killed_during_a_tool_only_an_idempotent_tool_runs_again(resuming, name, rerun):
    fake = resuming
    fake.add(openai_tool_calls(("call_1", name, {"query": "x"} if name == "look_up" else {"note": "x"})),
             openai_text("Done."))
    client = make_client()
    started = start_turn(client, "Do it")
    run_with_killer(client, started, until=lambda: cache.get("test:tool-started"))

    final = poll_until_done(client, started["poll_url"])
    assert final["status"] == "completed" and len(fake.requests) == 2
    result = final["messages"][2]
    if rerun:
        assert (result["content"], result["is_error"]) == ("found x", False)
    else:
        assert result["is_error"] and "was interrupted" in result["content"]
        record = CallRecord.objects.get(turn_id=started["id"], kind="tool")
        assert record.outcome == "error" and "not idempotent" in record.detail
    assert [m["role"] for m in final["messages"]] == ["user", "assistant", "tool", "assistant"]


def test_a_turn_whose_answer_was_saved_before_the_death_is_completed_without_another_call(resuming):
    fake = resuming
    client = make_client()
    started = start_turn(client, "Hi")
    turn = Turn.objects.get(pk=started["id"])
    # The job saved the answer, then died before its final write.
    from django.utils import timezone
    Turn.objects.filter(pk=turn.pk).update(status="running", started_at=timezone.now(), model_calls=1,
                                           deadline_at=timezone.now() + timezone.timedelta(seconds=14))
    Message.objects.create(conversation_id=turn.conversation_id, turn=turn, role="assistant", content="Hello!")
    django_rq.get_queue("default").empty()  # the job is gone

    assert resume_or_fail(turn, "job gone") is not None
    connections.close_all()
    django_rq.get_worker("default").work(burst=True)
    final = poll_until_done(client, started["poll_url"])
    assert (final["status"], final["messages"][-1]["content"]) == ("completed", "Hello!")
    assert fake.requests == []


def test_killed_with_too_little_time_left_the_turn_fails_as_before(resuming, conversations_settings):
    fake = resuming
    conversations_settings.update(JOB_TIMEOUT=10, DEADLINE_MARGIN=4, MIN_CALL_BUDGET=3, CALL_TIMEOUT=5)
    fake.add(hang)
    client = make_client()
    started = start_turn(client, "Slow?")
    began = time.monotonic()
    run_with_killer(client, started, until=lambda: fake.requests and time.monotonic() - began > 3.5)
    final = poll_until_done(client, started["poll_url"])
    assert (final["status"], final["error"]) == ("failed", crashed_message())
    assert Turn.objects.get(pk=started["id"]).resumes == 0


def test_a_worker_killed_over_and_over_gives_up_after_max_resumes(resuming):
    fake = resuming
    fake.default = hang
    client = make_client()
    started = start_turn(client, "Again?")
    connections.close_all()
    worker = django_rq.get_worker("default")
    stop = threading.Event()

    def keep_killing():
        seen = 0
        while not stop.is_set():
            if len(fake.requests) > seen and worker.horse_pid:
                seen = len(fake.requests)
                os.kill(worker.horse_pid, signal.SIGKILL)
            time.sleep(0.01)

    thread = threading.Thread(target=keep_killing, daemon=True)
    thread.start()
    began = time.monotonic()
    worker.work(burst=True)
    stop.set()
    thread.join(2)
    final = poll_until_done(client, started["poll_url"])
    turn = Turn.objects.get(pk=started["id"])
    assert (final["status"], final["error"]) == ("failed", crashed_message())
    assert turn.resumes == 2 and len(fake.requests) == 3 and time.monotonic() - began < 20


def test_a_turn_stopped_while_its_worker_was_dead_is_not_resumed(resuming):
    client = make_client()
    started = start_turn(client, "Stop me")
    from django.utils import timezone
    Turn.objects.filter(pk=started["id"]).update(status="running", started_at=timezone.now(), cancel_requested=True,
                                                 deadline_at=timezone.now() + timezone.timedelta(seconds=14))
    django_rq.get_queue("default").empty()
    resume_or_fail(Turn.objects.get(pk=started["id"]), "job gone")
    assert Turn.objects.get(pk=started["id"]).status == "cancelled"
    assert django_rq.get_queue("default").count == 0


def test_two_places_noticing_one_death_start_one_continuation(resuming):
    client = make_client()
    started = start_turn(client, "Once")
    from django.utils import timezone
    Turn.objects.filter(pk=started["id"]).update(status="running", started_at=timezone.now(),
                                                 deadline_at=timezone.now() + timezone.timedelta(seconds=14))
    queue = django_rq.get_queue("default")
    queue.empty()
    at_once(*[lambda: recovery.repair(Turn.objects.get(pk=started["id"]))] * 4, timeout=10)
    turn = Turn.objects.get(pk=started["id"])
    assert turn.resumes == 1 and turn.status == "running" and queue.count == 1
    assert queue.job_ids == [turn.job_id] and turn.job_id.endswith("-r1")
    assert CallRecord.objects.filter(turn=turn, kind="resume").count() == 1
    shown = client.get(started["poll_url"]).json()  # until the new job publishes, the visitor is told
    assert shown["resuming"] is True and shown["done"] is False and shown["messages"][0]["content"] == "Once"


def test_a_continuation_that_finds_its_turn_finished_does_nothing(resuming):
    from conversations.infra.queue import enqueue_continuation

    fake = resuming
    client = make_client()
    started = start_turn(client, "Done already")
    turn = Turn.objects.get(pk=started["id"])
    Turn.objects.filter(pk=turn.pk).update(status="completed")
    enqueue_continuation(turn, f"{turn.job_id}-r1", job_timeout=10)
    connections.close_all()
    django_rq.get_worker("default").work(burst=True)
    assert fake.requests == [] and Turn.objects.get(pk=turn.pk).status == "completed"


def test_a_warm_shutdown_hands_the_turn_to_another_worker_within_seconds(resuming, worker_process, worker_class):
    from tests.support.fake_stream import openai_stream, streaming

    fake = resuming
    # The first call streams slowly for 60 s; the replacement answers at once.
    fake.add(openai_tool_calls(("call_1", "look_up", {"query": "a"})),
             streaming(openai_stream(pieces=["slow "] * 600), interval=0.1),
             openai_text("Finished elsewhere."))
    client = make_client()
    started = start_turn(client, "Long one")
    first = worker_process(1, worker_class=worker_class, STREAM=True, JOB_TIMEOUT=60, CALL_TIMEOUT=50)[0]
    deadline = time.monotonic() + 20
    while len(fake.requests) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    asked = time.monotonic()
    first.send_signal(signal.SIGTERM)  # a deploy's warm shutdown
    wait_for_exit(first, 30)
    stopped_in = time.monotonic() - asked
    worker_process(1, worker_class=worker_class)
    final = poll_until_done(client, started["poll_url"], timeout=30)

    assert stopped_in < 3
    assert (final["status"], final["messages"][-1]["content"]) == ("completed", "Finished elsewhere.")
    assert len(fake.requests) == 3 and cache.get("test:look-ups") == 1  # the finished step was not repeated
    turn = Turn.objects.get(pk=started["id"])
    assert turn.resumes == 1
    assert CallRecord.objects.get(turn=turn, kind="resume").name == "its worker shut down"


# -- which job continues, when, and on what clock ------------------------------------------------

def dead_running_turn(client, content, *, seconds_left=14):
    """A turn started through the API whose job was marked running with ``seconds_left`` before its
    deadline, then vanished from the queue (as after a worker's death); returns the 202 body."""
    from django.utils import timezone

    started = start_turn(client, content)
    now = timezone.now()
    Turn.objects.filter(pk=started["id"]).update(status="running", started_at=now,
                                                 deadline_at=now + timezone.timedelta(seconds=seconds_left))
    django_rq.get_queue("default").empty()
    return started


def test_of_two_copies_of_a_dead_turn_only_the_first_to_continue_it_starts_a_job(resuming):
    from conversations.engine.recovery import continue_turn

    started = dead_running_turn(make_client(), "Once only")
    # Two places loaded the turn before either continued it: the second must find it taken.
    first, second = Turn.objects.get(pk=started["id"]), Turn.objects.get(pk=started["id"])
    dead = first.job_id

    won = continue_turn(first, "job gone", from_job_id=dead)
    lost = continue_turn(second, "job gone", from_job_id=dead)

    assert won == f"{dead}-r1" and lost is None
    turn = Turn.objects.get(pk=started["id"])
    assert (turn.job_id, turn.resumes) == (won, 1)
    assert django_rq.get_queue("default").job_ids == [won]
    assert CallRecord.objects.filter(turn=turn, kind="resume").count() == 1


def test_a_job_that_is_no_longer_its_turns_job_does_nothing_when_it_runs(resuming):
    from django.utils import timezone

    fake = resuming
    client = make_client()
    started = start_turn(client, "Stale")  # its first job waits in the queue
    turn = Turn.objects.get(pk=started["id"])
    # Meanwhile the turn was taken up and continued by another job: the queued one is a stale duplicate.
    Turn.objects.filter(pk=turn.pk).update(status="running", started_at=timezone.now(), resumes=1,
                                           job_id=f"{turn.job_id}-r1",
                                           deadline_at=timezone.now() + timezone.timedelta(seconds=14))
    connections.close_all()
    django_rq.get_worker("default").work(burst=True)

    assert fake.requests == []
    after = Turn.objects.get(pk=turn.pk)
    assert (after.status, after.job_id, after.model_calls) == ("running", f"{turn.job_id}-r1", 0)
    assert transcript(turn.pk) == [("user", "Stale")]


def test_a_continuation_runs_on_what_is_left_of_the_turns_deadline_not_a_fresh_job_timeout(
        resuming, conversations_settings):
    import math

    from rq.job import Job

    from conversations.core.sentences import deadline_message
    from conversations.providers import ProviderError

    fake = resuming
    fake.default = hang  # every call hangs: only the clocks end the turn
    conversations_settings.update(JOB_TIMEOUT=20, DEADLINE_MARGIN=4, CALL_TIMEOUT=10, MIN_CALL_BUDGET=1)
    client = make_client()
    started = dead_running_turn(client, "Late", seconds_left=4)
    turn = Turn.objects.get(pk=started["id"])

    resume_or_fail(turn, "job gone")
    turn.refresh_from_db()
    queue = django_rq.get_queue("default")
    job = Job.fetch(turn.job_id, connection=queue.connection)
    assert job.timeout <= math.ceil(4 + 4)  # RQ's limit: what is left plus the margin, never 20 s
    connections.close_all()
    django_rq.get_worker("default").work(burst=True)

    turn.refresh_from_db()
    # The call was given what was left (or, on a slow machine, skipped for lack of it) and the turn
    # ended at its own deadline, not at RQ's limit or a later one.
    assert (turn.status, turn.error) in [("failed", str(ProviderError.MESSAGES["timeout"])),
                                         ("incomplete", deadline_message())]
    assert turn.finished_at <= turn.deadline_at + datetime.timedelta(seconds=0.5)
    assert all(call.timeout is None or call.timeout <= 4 for call in CallRecord.objects.filter(turn=turn, kind="model"))


def test_a_dead_work_horse_is_acted_on_only_for_the_job_that_died(resuming):
    fake = resuming
    fake.add(hang)
    client = make_client()
    started = start_turn(client, "Moved on")
    first_job = Turn.objects.get(pk=started["id"]).job_id
    moved = f"{first_job}-r1"
    connections.close_all()
    worker = django_rq.get_worker("default")

    def continued_elsewhere_then_killed():
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (fake.requests and worker.horse_pid):
            time.sleep(0.01)
        # Another place (the poll view's repair) continued the turn with a new job a moment ago.
        Turn.objects.filter(pk=started["id"]).update(job_id=moved, resumes=1)
        connections.close_all()
        os.kill(worker.horse_pid, signal.SIGKILL)

    thread = threading.Thread(target=continued_elsewhere_then_killed, daemon=True)
    thread.start()
    worker.work(burst=True)  # no poller: nothing else looks at the turn
    thread.join(5)

    turn = Turn.objects.get(pk=started["id"])
    assert (turn.status, turn.job_id, turn.resumes) == ("running", moved, 1)
    assert not CallRecord.objects.filter(turn=turn, kind="resume").exists()
    assert len(fake.requests) == 1


def test_a_continuation_is_run_before_turns_that_were_waiting(resuming):
    fake = resuming
    fake.repeat(openai_text("Answered."), 3)
    resumed = dead_running_turn(make_client(), "Resume me")
    waiting = [start_turn(make_client(), f"New {n}") for n in range(2)]
    resume_or_fail(Turn.objects.get(pk=resumed["id"]), "job gone")
    connections.close_all()
    django_rq.get_worker("default").work(burst=True)

    asked = [request["json"]["messages"][-1]["content"] for request in fake.requests]
    assert asked == ["Resume me", "New 0", "New 1"]
    assert set(Turn.objects.filter(pk__in=[resumed["id"], *(w["id"] for w in waiting)])
               .values_list("status", flat=True)) == {"completed"}


@pytest.mark.parametrize("burst", [True, False], ids=["burst", "blocking"])
def test_a_sigterm_while_redis_hands_over_a_job_loses_no_turn(resuming, worker_class, burst):
    """SIGTERM inside RQ's dequeue, once Redis has moved the job out of the queue: raised there,
    the stop took the job with it (neither queued nor running), and its visitor was told the
    assistant is not available when QUEUE_WAIT ran out. Now the job goes back to the head of the
    queue, and the next worker runs it from its start."""
    resuming.add(openai_text("Answered."))
    client = make_client()
    body = start_turn(client, "Long one")
    worker = make_worker(worker_class)

    class Signalled(worker.queue_class):
        @classmethod
        def dequeue_any(cls, *args, **kwargs):
            result = super().dequeue_any(*args, **kwargs)
            if result is not None:
                worker.request_stop(signal.SIGTERM, None)  # what RQ's signal handler runs, at this moment
            return result

    worker.queue_class = Signalled
    if burst:
        worker.work(burst=True)
    else:
        worker.work()  # returns once stopped: the dequeue waits in short blocking reads
    connections.close_all()
    queued = django_rq.get_queue("default").job_ids
    elsewhere = run_worker(worker_class)

    final = poll_until_done(client, body["poll_url"], timeout=10)
    assert queued == [Turn.objects.get(pk=body["id"]).job_id]
    assert (final["status"], final["messages"][-1]["content"]) == ("completed", "Answered.")
    turn = Turn.objects.get(pk=body["id"])
    assert turn.resumes == 0 and not CallRecord.objects.filter(turn=turn, kind="resume").exists()
    assert django_rq.get_queue("default").intermediate_queue.get_job_ids() == []
    assert Job.fetch(turn.job_id, connection=elsewhere.connection).worker_name == elsewhere.name


def test_a_warm_shutdown_lets_the_call_finish_when_the_turn_cannot_be_handed_over(resuming, worker_process):
    from tests.support.fake_stream import openai_stream, streaming

    fake = resuming
    pieces = ["part "] * 15
    fake.add(streaming(openai_stream(pieces=pieces), interval=0.1))  # 1.5 s of answer
    client = make_client()
    started = start_turn(client, "No hand-over")
    first = worker_process(1, STREAM=True, MAX_RESUMES=0)[0]
    deadline = time.monotonic() + 20
    while len(fake.sent_at) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    first.send_signal(signal.SIGTERM)  # a deploy's warm shutdown, mid-call
    wait_for_exit(first, 15)

    turn = Turn.objects.get(pk=started["id"])
    assert (turn.status, turn.resumes) == ("completed", 0)
    assert transcript(turn.pk)[-1] == ("assistant", "".join(pieces))
    assert len(fake.requests) == 1 and fake.closed_at is None  # the call was never shut


def test_a_dead_jobs_turn_continued_while_it_was_being_ended_is_left_to_its_new_job(resuming, monkeypatch):
    """Ending a dead job's turn reads the row, then writes it: a continuation that starts between
    the two (another worker, the poll view's repair) must keep the turn, not see it failed."""
    started = dead_running_turn(make_client(), "Keep going")
    turn = Turn.objects.get(pk=started["id"])
    dead = turn.job_id
    moved = f"{dead}-r1"

    def read_then_continued_elsewhere(**kwargs):
        Turn.refresh_from_db(turn, **kwargs)  # what the ending read: the dead job's turn, still running
        monkeypatch.undo()
        Turn.objects.filter(pk=turn.pk).update(job_id=moved, resumes=1)  # then another place continued it

    monkeypatch.setattr(turn, "refresh_from_db", read_then_continued_elsewhere)
    assert recovery.end_for_dead_job(turn, crashed_message(), dead_job_id=dead) is None

    after = Turn.objects.get(pk=turn.pk)
    assert (after.status, after.job_id, after.error) == ("running", moved, "")
