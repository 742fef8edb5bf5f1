"""An approval survives a dead worker, and the wait for one costs no worker: a work horse SIGKILLed
between the approval and the run still runs the call exactly once (the resume machinery continues
the turn, and the run is claimed once); fifty turns waiting at once leave the queue and its
registries empty, and a new turn runs at once. Real forking RQ workers, real Redis."""

import os
import signal
import threading
import time

import django_rq
import pytest
from django.core.cache import cache
from django.db import connections
from rq.registry import StartedJobRegistry

from conversations.engine import approvals
from conversations.models import CallRecord, ToolApproval, Turn
from tests.support.fakes import openai_text, openai_tool_calls
from tests.support.helpers import make_client, poll_until_done, run_worker, start_turn

from .conftest import answer, waiting_turn
from .tools import runs

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_worker_killed_between_the_approval_and_the_run_still_runs_the_call_exactly_once(fake, monkeypatch):
    fake.add(openai_tool_calls(("call_1", "refund", {"order": "A1"})), openai_text("Refunded."))
    client = make_client()
    started, state = waiting_turn(client)
    assert answer(client, started, state["approvals"][0]).status_code == 200

    claim = approvals.start_run

    def stalled_once(approval):
        # In the work horse (forked from this process): the first job stops here, approved but not run.
        if cache.get_or_set("test:claims", 0) == 0:
            cache.incr("test:claims")
            time.sleep(60)
        return claim(approval)

    monkeypatch.setattr(approvals, "start_run", stalled_once)
    connections.close_all()
    worker = django_rq.get_worker("default")
    killed = threading.Event()

    def kill():
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (cache.get("test:claims") and worker.horse_pid):
            time.sleep(0.01)
        os.kill(worker.horse_pid, signal.SIGKILL)
        killed.set()

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    worker.work(burst=True)  # the parent sees its horse die and continues the turn in a new job
    thread.join(5)
    assert killed.is_set()

    final = poll_until_done(client, started["poll_url"])
    assert (final["status"], final["error"]) == ("completed", None)
    assert runs() == 1
    assert [m["content"] for m in final["messages"] if m["role"] == "tool"] == ["Order A1 refunded."]
    turn = Turn.objects.get(pk=started["id"])
    assert turn.resumes == 1
    assert CallRecord.objects.filter(turn=turn, kind="resume").count() == 1
    assert ToolApproval.objects.get(turn=turn).result == "Order A1 refunded."


def test_a_worker_killed_while_the_approved_call_runs_does_not_run_it_again(fake, monkeypatch):
    """Killed after the run was claimed, the call may have had its effect: it is not run twice, and
    the model is told it was interrupted (the tool is not idempotent)."""
    fake.add(openai_tool_calls(("call_1", "refund", {"order": "A1"})), openai_text("Sorry, it was interrupted."))
    client = make_client()
    started, state = waiting_turn(client)
    answer(client, started, state["approvals"][0])
    claim = approvals.start_run

    def claimed_then_stalled(approval):
        won = claim(approval)
        if won:
            cache.set("test:claimed", True)
            time.sleep(60)
        return won

    monkeypatch.setattr(approvals, "start_run", claimed_then_stalled)
    connections.close_all()
    worker = django_rq.get_worker("default")

    def kill():
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (cache.get("test:claimed") and worker.horse_pid):
            time.sleep(0.01)
        os.kill(worker.horse_pid, signal.SIGKILL)

    threading.Thread(target=kill, daemon=True).start()
    worker.work(burst=True)
    final = poll_until_done(client, started["poll_url"])
    assert final["status"] == "completed" and runs() == 0
    tool = [m for m in final["messages"] if m["role"] == "tool"][0]
    assert tool["is_error"] and "was interrupted" in tool["content"]


def test_fifty_turns_waiting_for_an_approval_hold_no_job_slot(fake, conversations_settings):
    conversations_settings.update(TURN_RATE_PER_IP="", TURN_RATE_PER_OWNER="", CONVERSATION_RATE_PER_IP="",
                                  CONVERSATION_RATE_PER_OWNER="", MAX_ACTIVE_TURNS_PER_ADDRESS=0)
    fake.repeat(openai_tool_calls(("call_1", "refund", {"order": "A1"})), 50)
    clients = [make_client() for _ in range(50)]
    turns = [start_turn(client, "Refund A1.") for client in clients]
    run_worker()

    assert Turn.objects.filter(status="waiting_approval").count() == 50
    queue = django_rq.get_queue("default")
    assert queue.count == 0
    assert StartedJobRegistry(queue=queue).count == 0
    assert all(client.get(t["poll_url"]).json()["status"] == "waiting_approval" for client, t in zip(clients, turns))
    assert runs() == 0

    fake.add(openai_text("Hello there."))
    newcomer = make_client()
    new = start_turn(newcomer, "Hello?")
    began = time.monotonic()
    run_worker()
    final = poll_until_done(newcomer, new["poll_url"])
    assert (final["status"], final["messages"][-1]["content"]) == ("completed", "Hello there.")
    assert time.monotonic() - began < 10
    # And one of the fifty, approved now, goes on.
    fake.add(openai_text("Refunded."))
    state = clients[7].get(turns[7]["poll_url"]).json()
    assert answer(clients[7], turns[7], state["approvals"][0]).status_code == 200
    run_worker()
    assert poll_until_done(clients[7], turns[7]["poll_url"])["status"] == "completed" and runs() == 1
    assert Turn.objects.filter(status="waiting_approval").count() == 49


def test_a_worker_found_dead_after_its_job_paused_the_turn_leaves_the_wait_alone(fake):
    """The reaper, the worker's parent and repair_turns see a dead job and continue or end its
    turn; a turn that job paused for an approval needs no job, and keeps waiting."""
    from conversations.engine.recovery import end_for_dead_job, resume_or_fail

    fake.add(openai_tool_calls(("call_1", "refund", {"order": "A1"})), openai_text("Refunded."))
    client = make_client()
    started, state = waiting_turn(client)
    turn = Turn.objects.get(pk=started["id"])
    assert resume_or_fail(turn, "its worker process died", dead_job_id=turn.job_id) is None
    assert end_for_dead_job(turn, "crashed", dead_job_id=turn.job_id) is None
    assert Turn.objects.get(pk=turn.pk).status == "waiting_approval"
    assert answer(client, started, state["approvals"][0]).status_code == 200
    run_worker()
    assert poll_until_done(client, started["poll_url"])["status"] == "completed" and runs() == 1
