"""A ``ConcurrentWorker`` process that dies without a word (SIGKILL) is noticed within seconds by
the other processes (its lease expires, ``infra.lease``), and each of its turns goes on in one of
them; one that was only frozen (SIGSTOP) past its lease wakes to find its turns taken and stops
them without writing a thing. Real ``manage.py rqworker`` processes, real Redis, fake provider
servers on 127.0.0.1."""

import io
import os
import signal
import subprocess
import sys
import time

import django_rq
import pytest
from django.core.cache import cache
from django.core.management import call_command
from rq import Worker as RQWorker

from conversations.engine.worker import REAP_INTERVAL
from conversations.infra import lease
from conversations.models import CallRecord, Message, Turn
from conversations.tools import tool
from tests.support.fake_stream import openai_stream, streaming
from tests.support.fakes import FakeProvider, hang, openai_text, openai_tool_calls
from tests.support.helpers import (CONCURRENT, ROOT, api_post, make_client, poll_until_done, start_turn, wait_for,
                                   worker_env)

pytestmark = pytest.mark.django_db(transaction=True)

# From the kill to the turn's next published state: the lease's life, one reaper's round, and
# generous slack for a loaded machine (the benchmark measures it: docs/benchmarks.md).
NOTICED_WITHIN = lease.TTL + REAP_INTERVAL + 4


@tool(idempotent=True)
def slow_look_up(query: str) -> str:
    """A read-only tool that runs until the test lets it answer (``test:answer``)."""
    cache.set("test:tool-started", True)
    cache.add("test:look-ups", 0)
    cache.incr("test:look-ups")
    deadline = time.monotonic() + 20
    while not cache.get("test:answer") and time.monotonic() < deadline:
        time.sleep(0.05)
    return f"found {query}"


@tool
def crunch(seconds: float) -> str:
    """A CPU-bound tool in pure Python: it holds the GIL as much as the interpreter lets it."""
    cache.set("test:tool-started", True)
    deadline, count = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        count += sum(range(1000))
    return "crunched"


@pytest.fixture
def fake(conversations_settings):
    with FakeProvider() as provider:
        conversations_settings.update(PROVIDER="openai", BASE_URL=provider.url, API_KEY="k", MODEL="m",
                                      TOOLS=[f"{__name__}.slow_look_up", f"{__name__}.crunch"], MAX_RESUMES=2, JOB_TIMEOUT=40,
                                      DEADLINE_MARGIN=4, CALL_TIMEOUT=30, TOOL_TIMEOUT=25, STREAM=False,
                                      MAX_ATTEMPTS=1)
        yield provider


def long_stream():
    return streaming(openai_stream(" ".join(f"word{n}" for n in range(400))), interval=0.05)


def holding(worker_process, client, content, until):
    """Start the victim process, post a turn, wait until ``until(state)``; then start the process that
    will survive and wait until it holds its lease. Returns ``(victim, posted)``."""
    (victim,) = worker_process(1, worker_class=CONCURRENT)
    posted = start_turn(client, content)
    wait_for(lambda: until(client.get(posted["poll_url"]).json()), timeout=30, what="the victim to hold the turn")
    worker_process(1, worker_class=CONCURRENT)
    connection = django_rq.get_connection()
    wait_for(lambda: len(lease.holders(connection)) == 2, timeout=30, what="the second process's lease")
    return victim, posted


def killed_then_resumed_in(victim, client, posted):
    """SIGKILL ``victim``; seconds until the widget reads that the turn goes on elsewhere."""
    os.kill(victim.pid, signal.SIGKILL)
    killed = time.monotonic()
    victim.wait(5)
    wait_for(lambda: client.get(posted["poll_url"]).json()["resuming"] or Turn.objects.get(pk=posted["id"]).resumes,
             timeout=30, what="the turn to be continued")
    return time.monotonic() - killed


def streaming_now(data):
    return bool(data["messages"]) and data["messages"][-1].get("streaming") and len(data["messages"][-1]["content"]) > 20


@pytest.fixture
def streaming_in_victim(fake, worker_process, conversations_settings):
    """``(client, victim, posted)``: a long answer streaming in the victim, whose continuation
    answers "Finished elsewhere."; another process running."""
    conversations_settings.update(STREAM=True)
    fake.add(long_stream(), streaming(openai_stream("Finished elsewhere.")))
    client = make_client()
    return (client, *holding(worker_process, client, "Tell me a long story", streaming_now))


def test_sigkill_mid_stream_the_turn_goes_on_in_another_process_within_seconds(streaming_in_victim):
    client, victim, posted = streaming_in_victim

    assert killed_then_resumed_in(victim, client, posted) < NOTICED_WITHIN
    final = poll_until_done(client, posted["poll_url"], timeout=30)
    assert (final["status"], final["messages"][-1]["content"]) == ("completed", "Finished elsewhere.")
    turn = Turn.objects.get(pk=posted["id"])
    assert turn.resumes == 1
    assert CallRecord.objects.get(turn=turn, kind="resume").name == "its worker process died"


def test_sigkill_mid_tool_the_tool_result_is_not_lost_and_the_turn_goes_on(fake, worker_process):
    fake.add(openai_tool_calls(("call_1", "slow_look_up", {"query": "refunds"})), openai_text("30 days."))
    client = make_client()
    victim, posted = holding(worker_process, client, "Refunds?", lambda data: cache.get("test:tool-started"))

    assert killed_then_resumed_in(victim, client, posted) < NOTICED_WITHIN
    cache.set("test:answer", True)  # the tool, run again, answers this time
    final = poll_until_done(client, posted["poll_url"], timeout=30)
    assert final["status"] == "completed"
    assert [(m["role"], m["content"]) for m in final["messages"]] == [
        ("user", "Refunds?"), ("assistant", ""), ("tool", "found refunds"), ("assistant", "30 days.")]
    assert cache.get("test:look-ups") == 2  # killed in it, run again (it is idempotent)
    assert len(fake.requests) == 2  # the model call that had finished is not made again


def test_sigkill_between_steps_finished_steps_are_not_repeated(fake, worker_process):
    """Killed after its first round trip (a tool call answered and saved) while it waits on the next."""
    fake.add(openai_tool_calls(("call_1", "slow_look_up", {"query": "x"})), hang, openai_text("Done."))
    client = make_client()
    cache.set("test:answer", True)
    victim, posted = holding(worker_process, client, "Look it up", lambda data: len(fake.requests) >= 2)

    assert killed_then_resumed_in(victim, client, posted) < NOTICED_WITHIN
    final = poll_until_done(client, posted["poll_url"], timeout=30)
    assert (final["status"], final["messages"][-1]["content"]) == ("completed", "Done.")
    assert cache.get("test:look-ups") == 1 and len(fake.requests) == 3


def test_stop_while_the_worker_is_dead_ends_the_turn_cancelled_and_nothing_runs_it_later(fake, worker_process):
    fake.add(hang, openai_text("Should never be asked."))
    client = make_client()
    victim, posted = holding(worker_process, client, "Long one", lambda data: len(fake.requests) >= 1)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(5)
    time.sleep(1)  # the visitor presses Stop a second into the outage, before the lease expires
    stopped = time.monotonic()
    api_post(client, posted["cancel_url"])

    final = poll_until_done(client, posted["poll_url"], timeout=30)
    assert time.monotonic() - stopped < NOTICED_WITHIN
    assert final["status"] == "cancelled"
    time.sleep(lease.TTL + 2 * REAP_INTERVAL)  # a continuation, had one been made, would have run by now
    assert len(fake.requests) == 1
    assert client.get(posted["poll_url"]).json()["status"] == "cancelled"


def test_a_process_frozen_past_its_lease_wakes_to_find_its_turn_taken_and_writes_nothing(streaming_in_victim):
    client, victim, posted = streaming_in_victim
    os.kill(victim.pid, signal.SIGSTOP)  # a long freeze: the host stalled, a debugger attached
    try:
        final = poll_until_done(client, posted["poll_url"], timeout=30)
        assert (final["status"], final["messages"][-1]["content"]) == ("completed", "Finished elsewhere.")
        rows = list(Message.objects.filter(turn_id=posted["id"]).values_list("id", "content"))
    finally:
        os.kill(victim.pid, signal.SIGCONT)

    victim.wait(30)  # it learns its lease was lost, stops its turn and shuts down to be restarted
    assert client.get(posted["poll_url"]).json() == final  # the first writer won: nothing landed over it
    assert list(Message.objects.filter(turn_id=posted["id"]).values_list("id", "content")) == rows
    turn = Turn.objects.get(pk=posted["id"])
    assert (turn.status, turn.resumes) == ("completed", 1)


def test_a_process_busy_with_a_cpu_bound_tool_past_its_lease_is_not_taken_for_dead(fake, worker_process):
    """Slow is not dead: a tool spinning on the CPU three lease lives long, with another process
    looking for dead ones all along, and the turn still ends in its own process, run once."""
    fake.add(openai_tool_calls(("call_1", "crunch", {"seconds": 3 * lease.TTL})), openai_text("Done."))
    client = make_client()
    victim, posted = holding(worker_process, client, "Crunch", lambda data: cache.get("test:tool-started"))

    final = poll_until_done(client, posted["poll_url"], timeout=40)
    assert (final["status"], final["messages"][-1]["content"]) == ("completed", "Done.")
    turn = Turn.objects.get(pk=posted["id"])
    assert turn.resumes == 0 and not CallRecord.objects.filter(turn=turn, kind="resume").exists()
    assert len(fake.requests) == 2 and victim.poll() is None


def test_a_site_sharing_the_redis_database_never_reaps_this_sites_dead_worker(worker_process, conversations_settings,
                                                                             settings):
    """Two sites on one Redis database, each with its own queue (``QUEUE``): the shop's process is
    SIGKILLed while the other site's ConcurrentWorker looks for dead processes twice a second. The
    other site leaves it alone: the shop's operator (and the shop's reapers, which continue its
    turns) still see it dead, and the other site's operator never sees it at all. Before leases
    named their queue, the other site's reaper took it for one of its own, found none of its jobs
    in its own queue and struck it off the list both sites shared."""
    queues = {**settings.RQ_QUEUES}

    def as_site(queue):
        conversations_settings.update(QUEUE=queue)
        settings.RQ_QUEUES = {**queues, queue: queues["default"]}

    worker_process(1, worker_class=CONCURRENT)  # the other site's, on "default"
    shop = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "rqworker", "shop", "--worker-class", CONCURRENT],
                            env=worker_env(QUEUE="shop"), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        as_site("shop")
        connection = django_rq.get_connection("shop")
        wait_for(lambda: RQWorker.all(queue=django_rq.get_queue("shop")), timeout=30, what="the shop's worker")
        (name,) = [worker.name for worker in RQWorker.all(queue=django_rq.get_queue("shop"))]
        wait_for(lambda: name in lease.holders(connection), timeout=30, what="the shop's lease")
        as_site("default")
        wait_for(lambda: set(lease.holders(connection)) - {name}, timeout=30, what="the other site's lease")
    finally:
        os.kill(shop.pid, signal.SIGKILL)
        shop.wait(5)
    time.sleep(lease.TTL + 4 * REAP_INTERVAL)  # the other site's reaper has looked several times since

    assert name not in worker_status()  # the other site's operator sees only its own process
    as_site("shop")
    assert f"{name}  dead (lease expired)" in worker_status()  # as the shop's operator sees it
    assert list(lease.holders(connection)) == [name]  # still there for the shop's reapers to continue its turns


def worker_status():
    out = io.StringIO()
    call_command("worker_status", stdout=out)
    return out.getvalue()
