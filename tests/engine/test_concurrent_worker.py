"""Many turns in one worker process (``conversations.worker.ConcurrentWorker``): they run side by
side in its threads, each under its own clocks, and every safety net of the forking worker holds
for all of them at once — a turn stuck past its job timeout, SIGTERM, SIGKILL of the process.
Real Redis, real RQ workers (in burst mode and as ``manage.py rqworker`` processes), a fake
provider that proves the calls overlapped."""

import datetime
import io
import os
import signal
import threading
import time

import django_rq
import pytest
from django.core.management import call_command
from django.db import connections
from rq import Worker as RQWorker
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry, StartedJobRegistry

from conversations.core.sentences import timeout_message
from conversations.engine.worker import WORKER_KEY_TTL, stuck_threads
from conversations.infra import lease, state
from conversations.models import CallRecord, Turn
from conversations.providers.demo import DemoProvider
from tests.support.fakes import FakeProvider, hang, openai_text, together
from tests.support.helpers import (CONCURRENT, api_post, make_client, make_worker, poll_until_done, run_worker,
                                   start_turn, wait_for, wait_for_exit)

pytestmark = pytest.mark.django_db(transaction=True)



@pytest.fixture
def provider(conversations_settings):
    with FakeProvider() as fake:
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="k", MODEL="m", STREAM=False,
                                      MAX_ATTEMPTS=1, JOB_TIMEOUT=20, DEADLINE_MARGIN=4, CALL_TIMEOUT=10)
        yield fake




def test_n_turns_at_once_in_one_process_all_complete(provider, conversations_settings):
    conversations_settings.update(WORKER_THREADS=8)
    provider.add(*[together(6, "Side by side.")] * 6)  # a reply only when all six calls are in flight
    posted = [(client, start_turn(client, f"Question {n}")) for n, client in enumerate(make_client() for _ in range(6))]

    worker = run_worker(CONCURRENT)

    for client, body in posted:
        final = poll_until_done(client, body["poll_url"], timeout=5)
        assert (final["status"], final["messages"][-1]["content"]) == ("completed", "Side by side.")
    connection = django_rq.get_connection()
    jobs = [Job.fetch(Turn.objects.get(pk=body["id"]).job_id, connection=connection) for _, body in posted]
    assert {job.get_status() for job in jobs} == {JobStatus.FINISHED}  # RQ recorded each as it does
    assert {job.worker_name for job in jobs} == {worker.name}  # all six in this one process
    assert StartedJobRegistry("default", connection=connection).get_job_ids() == []
    assert worker.get_state() == "idle"  # as `rq info` shows it once no turn runs


def test_a_job_is_taken_only_when_a_thread_is_free(provider, conversations_settings):
    conversations_settings.update(WORKER_THREADS=2)
    in_flight, most = [0], [0]
    lock = threading.Lock()

    def counted(handler):
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        time.sleep(0.5)
        with lock:
            in_flight[0] -= 1
        handler.send_json(200, openai_text("One at a time-ish."))

    provider.add(*[counted] * 5)
    queue = django_rq.get_queue("default")
    posted = [(client, start_turn(client)) for client in (make_client() for _ in range(5))]
    worker = make_worker(CONCURRENT)
    seen_queued = []
    watcher = threading.Thread(target=lambda: wait_for(lambda: seen_queued.append(queue.count) or in_flight[0] == 2))
    watcher.start()
    worker.work(burst=True)
    watcher.join()
    connections.close_all()

    assert most[0] == 2  # never more than its threads
    assert 3 in seen_queued  # while two ran, the other three waited in the queue for any worker
    for client, body in posted:
        assert poll_until_done(client, body["poll_url"], timeout=5)["status"] == "completed"


def test_a_running_worker_starts_a_turn_as_it_is_enqueued_and_shows_its_end_as_it_is_written(
        provider, worker_process):
    """No fixed wait on either side of a turn in a ``ConcurrentWorker`` waiting for work: its job
    starts as it is enqueued, and the visitor's ``done`` state lands as the final write commits.
    A dequeue, a slot hand-off or a final state that waited on a timer (``WATCH_INTERVAL`` and
    ``DEQUEUE_WAIT`` are 1 s) would show here; each takes about a millisecond (docs/benchmarks.md,
    "Why a turn is 1.6× the naive job"). The second turn comes once the first gave its thread back."""
    provider.add(openai_text("First."), openai_text("Second."))
    worker_process(1, worker_class=CONCURRENT)
    connection = django_rq.get_connection()
    wait_for(lambda: [worker.get_state() for worker in RQWorker.all(connection=connection)] == ["idle"])
    for answer in ("First.", "Second."):
        time.sleep(0.3)  # the worker is back in its blocking wait for a job
        client = make_client()
        body = start_turn(client)
        final = poll_until_done(client, body["poll_url"], timeout=20)
        assert (final["status"], final["messages"][-1]["content"]) == ("completed", answer)
        turn = Turn.objects.get(pk=body["id"])
        started = Job.fetch(turn.job_id, connection=connection).started_at.replace(tzinfo=datetime.timezone.utc)
        assert (started - turn.enqueued_at).total_seconds() < 0.5
        assert state.read(turn.id)["updated_at"] - turn.finished_at.timestamp() < 0.5


class StuckProvider(DemoProvider):
    """Answers at once, except "stuck": then it sleeps inside C code (time.sleep), where RQ's
    timer cannot raise the job timeout into its thread, for longer than the job timeout."""

    def complete(self, messages, tools, on_text=None):
        if messages[-1].content == "stuck":
            time.sleep(STUCK_FOR)
        return super().complete(messages, tools, on_text)


JOB_TIMEOUT, STUCK_FOR = 4, 12


def test_a_turn_stuck_past_its_job_timeout_is_ended_and_its_thread_given_up_while_the_others_run(
        conversations_settings):
    conversations_settings.update(PROVIDER=f"{__name__}.StuckProvider", JOB_TIMEOUT=JOB_TIMEOUT, DEADLINE_MARGIN=2,
                                  DEMO_DELAY=0.05, WORKER_THREADS=4, STREAM=False)
    stuck_client, others = make_client(), [make_client() for _ in range(3)]
    stuck = start_turn(stuck_client, "stuck")
    already = stuck_threads()  # tool threads other tests gave up on may still be alive
    started = time.monotonic()
    worker = make_worker(CONCURRENT)
    others_ended = []

    def visit_meanwhile():  # the stuck turn holds one thread; the others run beside it
        try:
            wait_for(lambda: len(StartedJobRegistry("default", connection=worker.connection)) == 1)
            posted = [(client, start_turn(client, "Hello")) for client in others]
            others_ended.extend(poll_until_done(client, body["poll_url"], timeout=10)["status"]
                                for client, body in posted)
        finally:
            connections.close_all()

    visitors = threading.Thread(target=visit_meanwhile)
    visitors.start()
    worker.work(burst=True)  # returns without waiting for the given-up thread
    visitors.join(10)
    final = poll_until_done(stuck_client, stuck["poll_url"], timeout=5)
    ended_after = time.monotonic() - started

    assert others_ended == ["completed"] * 3
    assert (final["status"], final["error"]) == ("failed", timeout_message())
    assert JOB_TIMEOUT < ended_after < JOB_TIMEOUT + 5 + 3  # STUCK_GRACE after the job timeout, plus slack
    assert worker.abandoned_jobs == 1 and stuck_threads() == already + 1
    job = Job.fetch(Turn.objects.get(pk=stuck["id"]).job_id, connection=worker.connection)
    assert job.get_status() == JobStatus.FAILED and "given up" in job.latest_result().exc_string
    assert job.id in FailedJobRegistry("default", connection=worker.connection)
    assert len(StartedJobRegistry("default", connection=worker.connection)) == 0

    # The thread comes back from C code later: the turn stays as it was ended, RQ's record too.
    wait_for(lambda: stuck_threads() <= already, timeout=STUCK_FOR + 5)
    time.sleep(0.3)
    again = stuck_client.get(stuck["poll_url"]).json()
    assert (again["status"], again["error"]) == ("failed", timeout_message())
    assert len(job.results()) == 1
    connections.close_all()


def running_in(fake, count):
    wait_for(lambda: len(fake.requests) >= count)


@pytest.fixture
def resuming(provider, conversations_settings):
    conversations_settings.update(MAX_RESUMES=2, JOB_TIMEOUT=30, CALL_TIMEOUT=20)
    return provider


def test_sigterm_with_several_turns_in_flight_exits_in_seconds_and_hands_every_one_over(resuming, worker_process):
    fake = resuming
    fake.add(hang, hang, hang, openai_text("Finished elsewhere."), openai_text("Finished elsewhere."),
             openai_text("Finished elsewhere."))
    posted = [(client, start_turn(client, "Long one")) for client in (make_client() for _ in range(3))]
    (process,) = worker_process(1, worker_class=CONCURRENT)
    running_in(fake, 3)
    asked = time.monotonic()
    process.send_signal(signal.SIGTERM)  # a deploy's warm shutdown
    wait_for_exit(process, 30)
    stopped_in = time.monotonic() - asked
    run_worker(CONCURRENT)

    assert stopped_in < 5
    for client, body in posted:
        final = poll_until_done(client, body["poll_url"], timeout=10)
        assert (final["status"], final["messages"][-1]["content"]) == ("completed", "Finished elsewhere.")
        turn = Turn.objects.get(pk=body["id"])
        assert turn.resumes == 1
        assert CallRecord.objects.get(turn=turn, kind="resume").name == "its worker shut down"


def test_sigkill_of_a_process_holding_several_turns_continues_all_of_them_elsewhere(
        resuming, worker_process, conversations_settings):
    """The process is SIGKILLed (the OOM killer): nobody writes anything for its turns. Its lease,
    renewed several times a second, expires within ``lease.TTL`` of its death, and with no other
    process to reap it, the poll view takes each of its turns for dead and continues it."""
    fake = resuming
    fake.add(hang, hang, hang, *[openai_text("Finished elsewhere.")] * 3)
    posted = [(client, start_turn(client, "Long one")) for client in (make_client() for _ in range(3))]
    (process,) = worker_process(1, worker_class=CONCURRENT)
    running_in(fake, 3)
    connection = django_rq.get_connection()
    job_ids = [Turn.objects.get(pk=body["id"]).job_id for _, body in posted]
    assert sorted(StartedJobRegistry("default", connection=connection).get_job_ids()) == sorted(job_ids)
    (registered,) = RQWorker.all(connection=connection)  # one worker, holding all three, as `rq info` shows
    assert registered.get_state() == "busy" and 0 < connection.ttl(registered.key) <= WORKER_KEY_TTL
    assert list(lease.holders(connection)) == [registered.name]
    listed = worker_status()
    assert f"{registered.name}  alive  last seen" in listed and "turns: 3" in listed
    assert all(f"turn {body['id']}" in listed for _, body in posted)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(5)
    time.sleep(lease.TTL + 0.5)
    assert f"{registered.name}  dead (lease expired)" in worker_status()  # as an operator sees it

    conversations_settings.update(STALE_AFTER=0)  # every state is stale now
    for client, body in posted:  # the lease has expired: the poll view continues each turn
        assert client.get(body["poll_url"]).json()["resuming"] is True
    run_worker(CONCURRENT)

    for client, body in posted:
        final = poll_until_done(client, body["poll_url"], timeout=10)
        assert (final["status"], final["messages"][-1]["content"]) == ("completed", "Finished elsewhere.")
        assert Turn.objects.get(pk=body["id"]).resumes == 1


def worker_status():
    out = io.StringIO()
    call_command("worker_status", stdout=out)
    return out.getvalue()


def test_rqworker_pool_runs_the_concurrent_worker_with_many_turns_in_each_process(
        transactional_db, provider, conversations_settings):
    """`manage.py rqworker-pool` takes RQ["WORKER_CLASS"]: two pool workers, six turns answered
    only once all six calls are in flight, so each process held several at once."""
    import subprocess
    import sys

    from tests.support.helpers import ROOT, worker_env

    provider.add(*[together(6, "From the pool.")] * 6)
    conversations_settings.update(WORKER_THREADS=4)
    posted = [(client, start_turn(client, "Hello?")) for client in (make_client() for _ in range(6))]
    pool = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "rqworker-pool", "--num-workers", "2"],
                            env={**worker_env(), "RQ_WORKER_CLASS": CONCURRENT}, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for client, body in posted:
            final = poll_until_done(client, body["poll_url"], timeout=40)
            assert (final["status"], final["messages"][-1]["content"]) == ("completed", "From the pool.")
        connection = django_rq.get_connection()
        ran_on = {Job.fetch(Turn.objects.get(pk=body["id"]).job_id, connection=connection).worker_name
                  for _, body in posted}
        assert len(ran_on) == 2  # four threads each: neither could have held all six
    finally:
        pool.terminate()
        try:
            pool.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pool.kill()


def test_a_process_with_too_many_given_up_threads_shuts_down_to_be_restarted(worker_process, conversations_settings):
    conversations_settings.update(PROVIDER=f"{__name__}.StuckProvider", JOB_TIMEOUT=JOB_TIMEOUT, DEADLINE_MARGIN=2,
                                  DEMO_DELAY=0.05, STREAM=False)
    client = make_client()
    stuck = start_turn(client, "stuck")
    (process,) = worker_process(1, worker_class=CONCURRENT, WORKER_MAX_STUCK=1)

    final = poll_until_done(client, stuck["poll_url"], timeout=30)
    assert (final["status"], final["error"]) == ("failed", timeout_message())
    # Its supervisor (systemd, the pool) starts a fresh process: this one leaves by itself, warmly.
    assert wait_for_exit(process, 10) == 0
    assert RQWorker.all(connection=django_rq.get_connection()) == []  # unregistered, as a warm shutdown does


def test_a_turn_in_the_concurrent_worker_connects_to_the_database_once(provider, conversations_settings):
    """A turn of three model calls and two tools waits five times; with a place in the process's
    budget of idle connections (``WORKER_IDLE_CONNECTIONS``) its thread keeps its connection
    across them instead of opening a new one, at about 6 ms each on PostgreSQL, after every wait.
    A SQLite connection (no server process, only the file) is always kept."""
    from django.db.backends.signals import connection_created

    from tests.support.fakes import openai_tool_calls

    conversations_settings.update(TOOLS=["tests.engine.test_concurrent_worker.note"])
    provider.add(openai_tool_calls(("call_1", "note", {})), openai_tool_calls(("call_2", "note", {})),
                 openai_text("Noted twice."))
    opened = []

    def count(sender, connection, **kwargs):
        if threading.current_thread().name.startswith("job-"):
            opened.append(connection.alias)

    client = make_client()
    body = start_turn(client, "Note it twice")
    connection_created.connect(count)
    try:
        run_worker(CONCURRENT)
    finally:
        connection_created.disconnect(count)
    final = poll_until_done(client, body["poll_url"], timeout=5)
    assert (final["status"], final["messages"][-1]["content"]) == ("completed", "Noted twice.")
    assert opened == ["default"]


def other_backends():
    """The pids of the server processes serving this test database, but the asking thread's."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
        return {pid for (pid,) in cursor.fetchall()}


def backends_before_the_worker():
    """The pids of the server processes serving this test database now, the test's own included."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return other_backends() | {cursor.fetchone()[0]}


needs_postgresql = pytest.mark.skipif(connections["default"].vendor != "postgresql",
                                      reason="server connections: a SQLite connection holds none and is always kept")


@needs_postgresql
def test_turns_waiting_at_once_keep_no_more_connections_than_the_budget(provider, conversations_settings):
    """Six turns wait on the provider at the same moment; two keep their connection to the server
    (the budget of two), the four others hold none while they wait."""
    conversations_settings.update(WORKER_THREADS=6, WORKER_IDLE_CONNECTIONS=2)
    ours = backends_before_the_worker()
    held = []

    def look():  # in the provider, once all six calls are in flight, before any is answered
        try:
            held.append(len(other_backends() - ours))
        finally:
            connections.close_all()  # the provider thread's own

    barrier = threading.Barrier(6, action=look)

    def answer(handler):
        barrier.wait(timeout=20)
        handler.send_json(200, openai_text("Waited."))

    provider.add(*[answer] * 6)
    posted = [(client, start_turn(client, f"Question {n}")) for n, client in enumerate(make_client() for _ in range(6))]
    run_worker(CONCURRENT)

    for client, body in posted:
        final = poll_until_done(client, body["poll_url"], timeout=5)
        assert (final["status"], final["messages"][-1]["content"]) == ("completed", "Waited.")
    assert held == [2]


@needs_postgresql
def test_a_kept_connection_the_server_closed_while_the_turn_waited_is_replaced(provider, conversations_settings):
    """An administrator (or an idle timeout) ends the server process of a turn's kept connection
    while the turn waits on the model: the turn's next step connects again and it completes."""
    ours = backends_before_the_worker()
    terminated = []

    def terminate_then_answer(handler):
        try:
            with connections["default"].cursor() as cursor:
                for pid in other_backends() - ours:
                    cursor.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])  # once it has ended
                    terminated.append(cursor.fetchone()[0])
        finally:
            connections.close_all()
        handler.send_json(200, openai_text("Still here."))

    provider.add(terminate_then_answer)
    client = make_client()
    body = start_turn(client, "Are you there?")
    run_worker(CONCURRENT)

    final = poll_until_done(client, body["poll_url"], timeout=5)
    assert (final["status"], final["messages"][-1]["content"]) == ("completed", "Still here.")
    turn = Turn.objects.get(pk=body["id"])  # saved, not only shown (a failed final write still publishes it)
    assert (turn.status, turn.messages.last().content) == ("completed", "Still here.")
    assert terminated == [True]  # the turn's own, kept while it waited


@needs_postgresql
def test_a_kept_connection_numbered_past_1024_is_looked_at_after_its_wait(provider):
    """A busy worker has many sockets open (each turn's provider call, Redis): a kept connection's
    socket numbered past ``select()``'s limit of 1024 is still looked at after the wait, and the turn
    completes (``select()`` raised ValueError there, and the turn failed)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"this process may open {hard} files at most")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    held = []
    try:
        while not held or held[-1] < 1100:  # the next sockets are numbered past 1024
            held.append(os.open(os.devnull, os.O_RDONLY))
        provider.add(openai_text("Numbered high."))
        client = make_client()
        body = start_turn(client, "Are you there?")
        run_worker(CONCURRENT)
        final = poll_until_done(client, body["poll_url"], timeout=5)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert (final["status"], final["messages"][-1]["content"]) == ("completed", "Numbered high.")


from conversations.tools import tool  # noqa: E402 - the tool the test above gives the model


@tool
def note() -> str:
    """Takes a note."""
    return "noted"


def redis_calls(connection, command):
    """How many times this Redis server has run ``command`` (its INFO commandstats)."""
    return connection.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0)


def test_the_stop_flags_of_every_turn_in_flight_are_read_in_one_round_trip(conversations_settings):
    """Each streaming call's watchdog looks at its turn's stop flag every 0.1 s; in a process with
    hundreds of turns that was a Redis round trip each. The board reads them all at once, and a
    Stop (or a hand-over) still reaches the turn it was asked of, and only that one."""
    from conversations.infra.state import Stop, StopBoard, request_cancel, request_handoff

    class ManualBoard(StopBoard):
        POLL = 3600  # its thread never refreshes during the test: each refresh below is counted

    board = ManualBoard()
    board.start()
    turns = [f"00000000-0000-0000-0000-{n:012d}" for n in range(50)]
    assert [board.stop_requested(t) for t in turns] == [None] * 50  # each turn's first look: its own read
    request_cancel(turns[7])
    request_handoff(turns[8])
    connection = django_rq.get_connection()
    before = redis_calls(connection, "mget")
    board.refresh()
    assert redis_calls(connection, "mget") == before + 1
    assert [board.stop_requested(t) for t in turns] == [None] * 7 + [Stop.CANCEL, Stop.HANDOFF] + [None] * 41
    assert redis_calls(connection, "mget") == before + 1  # answered from the board


def test_a_publish_takes_two_round_trips_and_the_version_still_counts_up(conversations_settings):
    """Every streaming turn publishes its growing answer every PUBLISH_INTERVAL; a publish is the
    version counter (incremented, its TTL refreshed: one round trip) and the state (one more)."""
    from conversations.infra import state

    connection = django_rq.get_connection()
    turn_id = "00000000-0000-0000-0000-000000000001"
    counted = ("incr", "incrby", "expire", "set", "exists", "setex")
    before = {command: redis_calls(connection, command) for command in counted}
    versions = [state.publish({"id": turn_id, "done": False, "messages": []})["version"] for _ in range(3)]
    after = {command: redis_calls(connection, command) for command in counted}

    assert versions == [1, 2, 3] and state.read(turn_id)["version"] == 3
    assert after["exists"] == before["exists"]  # Django's incr asked first: a round trip of its own
    assert sum(after.values()) - sum(before.values()) == 3 * 3  # INCRBY + EXPIRE (pipelined) + SET
    from conversations.conf import get_config

    cache = state._cache()
    key = cache.make_and_validate_key(f"conversations:turn:{turn_id}:version")
    assert 0 < cache._cache.get_client(key).ttl(key) <= get_config()["STATE_TTL"]


class HeldProvider(DemoProvider):
    """Answers at once, except "stuck": then it waits on ``HeldProvider.release`` inside C code (a
    lock), where RQ's timer cannot raise the job timeout into its thread, until the test lets it go."""

    holding, release = threading.Event(), threading.Event()

    def complete(self, messages, tools, on_text=None):
        if messages[-1].content == "stuck":
            if self.streams(on_text):
                on_text("Half an answer")
            self.holding.set()
            self.release.wait(30)
        return super().complete(messages, tools, on_text)


@pytest.fixture
def quick_watch(monkeypatch, conversations_settings):
    """The worker's clocks shrunk (a given-up turn after its 3 s job timeout plus half a second, a
    worker key living 2 s), the held provider, and its threads let go whatever the test asserts."""
    from conversations.engine import worker

    monkeypatch.setattr(worker, "STUCK_GRACE", 0.5)
    monkeypatch.setattr(worker, "WATCH_INTERVAL", 0.2)
    monkeypatch.setattr(worker, "WORKER_BEAT", 0.3)
    monkeypatch.setattr(worker, "WORKER_KEY_TTL", 2)
    conversations_settings.update(PROVIDER=f"{__name__}.HeldProvider", JOB_TIMEOUT=3, DEADLINE_MARGIN=1,
                                  MIN_CALL_BUDGET=1, DEMO_DELAY=0.01, STREAM=False)
    HeldProvider.holding.clear()
    HeldProvider.release.clear()
    yield worker
    HeldProvider.release.set()


def meanwhile(check):
    """Run ``check()`` in a thread of its own (the worker needs the main thread for its signals); returns
    the thread and the list that receives what ``check`` returned (or raised)."""
    seen = []

    def run():
        try:
            seen.append(check())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            seen.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, seen


def burst_without_hanging(worker, waited):
    """Run ``worker`` in burst mode; should it still wait for a slot 10 s on, its slots are freed so
    that the test fails instead of hanging. Returns "left" when it returned by itself, else ``waited``."""
    returned = threading.Event()

    def free_it_if_it_waits():
        if returned.wait(10):
            return "left"
        with worker._changed:
            worker._slots.clear()
        return waited

    freeing, seen = meanwhile(free_it_if_it_waits)
    worker.work(burst=True)
    returned.set()
    freeing.join(15)
    return seen[0]


def test_a_give_up_waiting_on_the_database_does_not_let_the_worker_key_expire(quick_watch, conversations_settings,
                                                                              monkeypatch):
    """The final write of a given-up turn may wait (a row lock, the pool, SQLite's lock): meanwhile
    the process's key must live on, or every turn it runs counts as dead ("its worker is gone")
    and is continued elsewhere while it still runs here."""
    from conversations.infra.queue import job_problem

    conversations_settings.update(WORKER_THREADS=1)  # the main thread waits for a free thread: no beat of its own
    waiting, database_free = threading.Event(), threading.Event()
    slow_end = quick_watch._end_overdue_turn

    def end_after_a_lock_wait(job_id):
        waiting.set()
        database_free.wait(20)
        return slow_end(job_id)

    monkeypatch.setattr(quick_watch, "_end_overdue_turn", end_after_a_lock_wait)
    client = make_client()
    stuck = start_turn(client, "stuck")
    worker = make_worker(CONCURRENT)

    def look_while_the_give_up_waits():
        try:
            assert waiting.wait(15)
            time.sleep(quick_watch.WORKER_KEY_TTL + 1)  # past the key's life
            # Its turn is not taken for dead: not "its worker is gone".
            return worker.connection.exists(worker.key), job_problem(Turn.objects.get(pk=stuck["id"]))
        finally:
            database_free.set()

    looking, seen = meanwhile(look_while_the_give_up_waits)
    worker.work(burst=True)
    looking.join(15)
    connections.close_all()

    assert seen == [(1, None)]
    final = poll_until_done(client, stuck["poll_url"], timeout=5)
    assert (final["status"], final["error"]) == ("failed", timeout_message())


def test_a_given_up_turn_keeps_the_end_it_was_given_when_its_thread_comes_back(quick_watch, conversations_settings):
    """The given-up thread returns from C code later, into RQ's pending timeout: its own final write
    must not land on a turn that was ended (or continued by another job) meanwhile: no second end,
    no second copy of the words it had streamed."""
    conversations_settings.update(STREAM=True, PUBLISH_INTERVAL=0)
    already = stuck_threads()
    client = make_client()
    stuck = start_turn(client, "stuck")
    worker = make_worker(CONCURRENT)
    worker.work(burst=True)  # returns once the turn is given up
    connections.close_all()
    ended = poll_until_done(client, stuck["poll_url"], timeout=5)
    row = Turn.objects.get(pk=stuck["id"])
    assert (ended["status"], ended["error"]) == ("failed", timeout_message())
    assert [m["content"] for m in ended["messages"]] == ["stuck", "Half an answer"]  # kept, as it was shown

    HeldProvider.release.set()
    wait_for(lambda: stuck_threads() <= already, timeout=10)

    again = client.get(stuck["poll_url"]).json()
    assert again == ended  # the same state, not a second "done" one
    assert Turn.objects.get(pk=stuck["id"]).finished_at == row.finished_at
    assert list(row.messages.values_list("content", flat=True)) == ["stuck", "Half an answer"]
    connections.close_all()


def test_a_turn_given_up_before_it_could_start_is_not_started_afterwards(quick_watch, conversations_settings):
    """A job waits for its place among the turns starting at once; given up there (past its job
    timeout), it stays failed in RQ's registries when its place comes after all."""
    client = make_client()
    body = start_turn(client, "Hello")
    worker = make_worker(CONCURRENT)
    worker._starting = threading.BoundedSemaphore(1)
    worker._starting.acquire()  # every place taken, by turns that never reach their first call
    already = stuck_threads()
    worker.work(burst=True)  # returns once the turn is given up
    connections.close_all()
    assert poll_until_done(client, body["poll_url"], timeout=5)["error"] == timeout_message()

    worker._starting.release()
    wait_for(lambda: stuck_threads() <= already, timeout=10)

    job = Job.fetch(Turn.objects.get(pk=body["id"]).job_id, connection=worker.connection)
    assert job.get_status() == JobStatus.FAILED
    assert job.id in FailedJobRegistry("default", connection=worker.connection)
    assert StartedJobRegistry("default", connection=worker.connection).get_job_ids() == []
    connections.close_all()


def test_the_turns_of_a_process_share_its_redis_connections(provider, conversations_settings, monkeypatch):
    """Django's cache handler builds a cache object per thread; each turn's thread (and each call's
    watchdog) must still use the process's one pool, not a pool and a connection of its own."""
    from conversations.infra import state

    cache_of_thread, pools = state._cache, set()

    def noting_its_pool():
        cache = cache_of_thread()
        pools.add(id(cache._cache._get_connection_pool(True)))
        return cache

    monkeypatch.setattr(state, "_cache", noting_its_pool)
    turns = 20
    conversations_settings.update(WORKER_THREADS=turns)
    connection = django_rq.get_connection()
    db = connection.connection_pool.connection_kwargs.get("db", 0)

    def ours():
        return sum(1 for client in connection.client_list() if int(client["db"]) == int(db))

    barrier, seen = threading.Barrier(turns), []

    def counted(handler):  # every turn waits on its call: each has published its first state by now
        if barrier.wait(timeout=20) == 0:
            seen.append(ours())
        handler.send_json(200, openai_text("Shared."))

    provider.add(*[counted] * turns)
    posted = [(client, start_turn(client, "Hello")) for client in (make_client() for _ in range(turns))]
    before = ours()
    run_worker(CONCURRENT)

    for client, body in posted:
        assert poll_until_done(client, body["poll_url"], timeout=5)["status"] == "completed"
    assert len(pools) == 1
    # RQ's pool and the cache's, each as wide as its busiest moment: a few, not one per turn.
    assert seen[0] - before < turns // 2


def test_a_stuck_turn_the_visitor_stopped_ends_cancelled_when_it_is_given_up(quick_watch):
    """Stop cannot reach a call stuck in C code; when the worker gives the turn up, it ends as the
    visitor asked (cancelled, no error sentence), as every other path that ends a dead job's turn does."""
    client = make_client()
    stuck = start_turn(client, "stuck")
    worker = make_worker(CONCURRENT)

    def stop_while_it_is_stuck():
        assert HeldProvider.holding.wait(15)
        return api_post(client, stuck["cancel_url"]).status_code

    stopping, seen = meanwhile(stop_while_it_is_stuck)
    worker.work(burst=True)
    stopping.join(15)
    connections.close_all()

    assert seen == [202]
    final = poll_until_done(client, stuck["poll_url"], timeout=5)
    assert (final["status"], final["error"]) == ("cancelled", None)
    assert worker.abandoned_jobs == 1


def test_a_job_whose_thread_cannot_start_leaves_no_running_slot_behind(conversations_settings):
    """When the process cannot start one more thread, RQ's loop quits as for any error of its own;
    the worker must then leave (and unregister), not wait for ever for a turn that never ran."""
    class NoMoreThreads(threading.Thread):
        def start(self):
            raise RuntimeError("can't start new thread")

    start_turn(make_client(), "Hello")
    worker = make_worker(CONCURRENT)
    worker.job_thread_class = NoMoreThreads
    ended = burst_without_hanging(worker, "waited for a turn that never ran")
    connections.close_all()

    assert ended == "left"
    assert RQWorker.all(connection=worker.connection) == []


def test_a_job_dequeued_just_before_a_warm_shutdown_hands_over_too(resuming):
    """SIGTERM between RQ's dequeue and the job's thread: the job was not among the running ones
    asked to hand over, and held the stopping worker for its whole answer."""
    resuming.add(openai_text("Answered."))
    client = make_client()
    body = start_turn(client, "Long one")
    worker = make_worker(CONCURRENT)
    dequeue = worker.dequeue_job_and_maintain_ttl

    def dequeue_then_sigterm(timeout, max_idle_time=None):
        result = dequeue(timeout, max_idle_time)
        if result is not None:
            worker.request_stop(signal.SIGTERM, None)  # what RQ's signal handler runs, at this moment
        return result

    worker.dequeue_job_and_maintain_ttl = dequeue_then_sigterm
    worker.work(burst=True)
    connections.close_all()
    elsewhere = run_worker(CONCURRENT)

    final = poll_until_done(client, body["poll_url"], timeout=10)
    assert (final["status"], final["messages"][-1]["content"]) == ("completed", "Answered.")
    turn = Turn.objects.get(pk=body["id"])
    assert turn.resumes == 1 and CallRecord.objects.get(turn=turn, kind="resume").name == "its worker shut down"
    assert Job.fetch(turn.job_id, connection=elsewhere.connection).worker_name == elsewhere.name


def test_a_thread_that_fails_while_it_tidies_up_still_gives_its_slot_back(provider, conversations_settings,
                                                                           monkeypatch):
    """The job ran and RQ recorded it; then the thread's own tidying up failed (closing its database
    connection): its slot must still be freed, or the worker counts the turn as running for good
    (a thread fewer, and a warm shutdown that never ends)."""
    provider.add(openai_text("Done."))
    client = make_client()
    body = start_turn(client, "Hello")
    close_all = connections.close_all

    def failing_in_a_job_thread():
        if threading.current_thread().name.startswith("job-"):
            raise OSError("the database's socket was already gone")
        close_all()

    monkeypatch.setattr(connections, "close_all", failing_in_a_job_thread)
    monkeypatch.setattr(threading, "excepthook", lambda args: None)  # the thread's error is the point
    worker = make_worker(CONCURRENT)
    ended = burst_without_hanging(worker, "waited for a turn that had ended")
    monkeypatch.undo()
    connections.close_all()

    assert ended == "left"
    assert poll_until_done(client, body["poll_url"], timeout=5)["status"] == "completed"
    assert worker.get_state() == "idle"
