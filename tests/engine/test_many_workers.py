"""Several worker processes at once: separate `manage.py rqworker`s, and one `manage.py rqworker-pool`.

The workers are separate processes that share nothing with the web side but Redis and the
database, as on separate machines. The fake provider holds each request until three have
arrived at once, so a passing test proves three turns really ran side by side.
"""

import subprocess
import sys
import time

import pytest
from rq import Worker
from rq.command import send_kill_horse_command
from rq.job import Job
from rq.registry import FailedJobRegistry

from conversations.engine import job as jobs
from conversations.infra import queue
from conversations.models import Turn
from tests.support.helpers import ROOT, make_client, poll_until_done, start_turn, worker_env
from tests.support.fakes import FakeProvider, hang, together
from conversations.core.sentences import crashed_message

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# Generous clocks: a request may wait at the gate for the slowest of three workers.
CLOCKS = {"JOB_TIMEOUT": 30, "DEADLINE_MARGIN": 5, "CALL_TIMEOUT": 15, "MAX_ATTEMPTS": 2}



def wait_for_workers(count, timeout=60):
    """Block until ``count`` RQ workers have registered in Redis; return them."""
    connection = queue.get_queue().connection
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = Worker.all(connection=connection)
        if len(workers) >= count:
            return workers
        time.sleep(0.1)
    raise AssertionError(f"only {len(Worker.all(connection=connection))} of {count} workers registered")


def wait_for_started(job_ids, timeout=30):
    """Block until every job has been picked up; return {job id: worker name}."""
    connection = queue.get_queue().connection
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        names = {job_id: Job.fetch(job_id, connection=connection).worker_name for job_id in job_ids}
        if all(names.values()):
            return names
        time.sleep(0.05)
    raise AssertionError(f"jobs not all started: {names}")


def openai_settings(conversations_settings, fake):
    conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="sk-test", MODEL="fake-model",
                                  TOOLS=[], **CLOCKS)


def test_three_rqworker_processes_run_turns_side_by_side_and_lose_none(worker_process, conversations_settings):
    turns = 6
    gate = together(3, "Answered.")
    with FakeProvider() as fake:
        fake.repeat(gate, turns)
        openai_settings(conversations_settings, fake)
        worker_process(n=3)
        wait_for_workers(3)

        clients = [make_client() for _ in range(turns)]
        posted = [(client, start_turn(client, f"Question {n}")) for n, client in enumerate(clients)]
        finals = [poll_until_done(client, body["poll_url"], timeout=60) for client, body in posted]

    assert [f["status"] for f in finals] == ["completed"] * turns
    assert all(f["messages"][-1]["content"] == "Answered." for f in finals)
    assert len(fake.requests) == turns  # one call per turn: no turn ran twice, none was dropped
    connection = queue.get_queue().connection
    rows = Turn.objects.filter(pk__in=[body["id"] for _, body in posted])
    assert sorted(r.status for r in rows) == ["completed"] * turns
    ran_on = {Job.fetch(r.job_id, connection=connection).worker_name for r in rows}
    assert len(ran_on) == 3, ran_on  # three requests were in flight at once: one per worker
    assert queue.get_queue().count == 0
    assert FailedJobRegistry(queue=queue.get_queue()).count == 0


def test_rqworker_pool_runs_our_worker_class(transactional_db, conversations_settings):
    """`manage.py rqworker-pool` takes RQ["WORKER_CLASS"]: a work horse killed mid-turn is finalised
    by our Worker in seconds (plain RQ would leave it to the poll view's stale check)."""
    with FakeProvider() as fake:
        fake.add(hang, hang, hang)
        openai_settings(conversations_settings, fake)
        pool = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "rqworker-pool", "--num-workers", "3"],
                                env=worker_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for_workers(3)
            posted = [(client, start_turn(client, "Hello?")) for client in (make_client() for _ in range(3))]
            job_ids = [Turn.objects.get(pk=body["id"]).job_id for _, body in posted]
            ran_on = wait_for_started(job_ids)
            assert len(set(ran_on.values())) == 3  # all three hang at once: one per pool worker

            # An operator (or the OOM killer) kills one work horse.
            (client, body), job_id = posted[0], job_ids[0]
            send_kill_horse_command(queue.get_queue().connection, ran_on[job_id])
            started = time.monotonic()
            final = poll_until_done(client, body["poll_url"], timeout=30)
            assert time.monotonic() - started < 10  # finalised by the worker, well before the poll gives up
            assert final["status"] == "failed" and final["error"] == crashed_message()

            # The other two are still in the hands of their horses.
            for client, body in posted[1:]:
                assert client.get(body["poll_url"]).json()["done"] is False
        finally:
            fake.stop_event.set()  # let the hung calls go, so the pool's warm shutdown is quick
            pool.terminate()
            try:
                pool.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pool.kill()


def test_a_worker_whose_warm_up_fails_still_starts_and_shares_no_database_connection(conversations_settings,
                                                                                     caplog):
    from django.db import connections

    conversations_settings.update(TOOLS=["no.such.tool"])

    jobs.warm_up()  # what Worker.work() does once, before the first fork

    assert "Could not warm up the worker" in caplog.text
    assert all(connection.connection is None for connection in connections.all())


def test_a_forking_workers_parent_looks_up_its_providers_proxies_so_that_no_horse_scans_the_environment(
        conversations_settings, monkeypatch):
    """A work horse inherits what its parent looked up: the proxies the environment sets for the
    provider's origin (requests scans the whole environment for them, milliseconds a horse)."""
    import requests

    from conversations.infra import watchdog

    conversations_settings.update(PROVIDER="openai", BASE_URL="http://127.0.0.1:9/v1", API_KEY="k", MODEL="m")
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    watchdog._environment_for.cache_clear()
    jobs.warm_up(forking=True)
    scans = []
    merge = requests.Session.merge_environment_settings
    monkeypatch.setattr(requests.Session, "merge_environment_settings", lambda *args: scans.append(args) or merge(*args))

    found = watchdog.environment_settings("http://127.0.0.1:9/v1/chat/completions")

    assert scans == []
    assert found["proxies"]["http"] == "http://proxy.invalid:3128"
    watchdog._environment_for.cache_clear()  # the environment of the next tests is their own
