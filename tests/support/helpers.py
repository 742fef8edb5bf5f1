"""Helpers the tests share: clients that behave like the widget's browser, a real forking worker,
pollers, and a look at everything in the test Redis. Fixtures live in conftest.py."""

import json
import os
import signal
import subprocess
import threading
import time
import weakref
import zlib
from collections.abc import Mapping
from pathlib import Path

import pytest
from django.core.cache import cache
from django.db import connection, connections
from django.db.backends.signals import connection_created
from django.test import Client

ROOT = Path(__file__).resolve().parents[2]

# Short clocks for the whole suite; tests that need others use `conversations_settings`.
FAST = {
    "JOB_TIMEOUT": 10,
    "DEADLINE_MARGIN": 4,
    "CALL_TIMEOUT": 5,
    "CONNECT_TIMEOUT": 2,
    "MIN_CALL_BUDGET": 1,
    "TOOL_TIMEOUT": 2,
    "TOOL_RESERVE": 1,
    "BACKOFF_BASE": 0.05,
    "BACKOFF_MAX": 0.2,
    "STATE_TTL": 60,
    "DEMO_DELAY": 0.05,
    # A dead job ends its turn, as the safety-net tests expect; tests/engine/test_resume.py turns resuming on.
    "MAX_RESUMES": 0,
    # Every test client is 127.0.0.1, so this limit would count the whole suite as one visitor;
    # tests/engine/test_limits.py turns it on where it is the subject.
    "MAX_ACTIVE_TURNS_PER_ADDRESS": 0,
    # The fake providers are on 127.0.0.1: this site lets its admin point assistants there.
    # tests/security/test_security_endpoints.py takes it away.
    "ALLOWED_ENDPOINTS": ["http://127.0.0.1:*"],
}


def at_once(*calls, timeout=30):
    """Run each of ``calls`` in its own thread, all released at the same moment (a barrier), as
    concurrent requests or workers would; return their results in order. Each thread closes its
    database connections."""
    barrier, results = threading.Barrier(len(calls)), [None] * len(calls)

    def run(index):
        try:
            barrier.wait()
            results[index] = calls[index]()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    return results


# A Redis URL where nothing listens.
NOWHERE = "redis://127.0.0.1:9/0"


class FakeClock:
    """A monotonic clock that moves only when told to (from any thread): pass it as a budget's clock."""

    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


def redis_values():
    """Every key and value in the test Redis as raw bytes, plus the zlib-decompressed form of
    compressed ones (RQ jobs)."""
    client = cache._cache.get_client(write=True)
    for key in client.scan_iter():
        yield key
        kind = client.type(key).decode()
        if kind == "string":
            values = [client.get(key)]
        elif kind == "hash":
            values = [v for pair in client.hgetall(key).items() for v in pair]
        elif kind == "list":
            values = client.lrange(key, 0, -1)
        elif kind == "set":
            values = list(client.smembers(key))
        elif kind == "zset":
            values = client.zrange(key, 0, -1)
        elif kind == "stream":
            values = [repr(entry).encode() for entry in client.xrange(key)]
        else:
            values = []
        for value in values:
            yield value
            try:
                yield zlib.decompress(value)
            except (zlib.error, TypeError):
                pass


# Both worker classes sites may run; worker-level tests that matter run against each.
FORKING, CONCURRENT = "conversations.worker.Worker", "conversations.worker.ConcurrentWorker"
WORKER_CLASSES = [FORKING, CONCURRENT]


# Every SQLite connection Django opens in this process, for as long as it lives, and the thread that
# opened it (``close_stray_connections``; a thread's ident is reused by the next one, its object is not).
_SQLITE_CONNECTIONS = weakref.WeakKeyDictionary()


def _note_sqlite_connection(sender, connection, **kwargs):
    if connection.vendor == "sqlite":
        _SQLITE_CONNECTIONS[connection] = threading.current_thread()


connection_created.connect(_note_sqlite_connection, weak=False, dispatch_uid="tests-sqlite-connections")


def close_stray_connections():
    """Close the SQLite connections that threads of this process left open when they ended (Django's
    wrapper of each is in a reference cycle: only the garbage collector closes it, some time later).

    A work horse forked while one is open inherits SQLite's bookkeeping of its locks and then takes
    none of its own on the database file; that connection closed here while the horse runs, this
    process, finding no other connection open, checkpointed and deleted the write-ahead log under
    the horse, and the horse's later commits were lost: the turn's row still "running" after its
    job had logged its final write (tests/engine/test_turn_flow.py). A worker's own process never
    has one: its threads close theirs, and the forking ``Worker`` closes its own before each fork."""
    for wrapper, thread in list(_SQLITE_CONNECTIONS.items()):
        if wrapper.connection is not None and not thread.is_alive():
            wrapper.connection.close()
            wrapper.connection = None


def make_worker(worker_class=None):
    """A worker on the turns' queue, of ``worker_class`` (a dotted path; default RQ["WORKER_CLASS"])."""
    from django_rq import get_worker

    connections.close_all()  # a forked work horse must not share the test's database socket
    close_stray_connections()
    return get_worker("default", worker_class=worker_class)


def run_worker(worker_class=None):
    """Run every queued job in a real worker (burst mode), as production does: by default the
    forking one of RQ["WORKER_CLASS"], or ``worker_class``."""
    worker = make_worker(worker_class)
    worker.work(burst=True)
    connections.close_all()  # a concurrent worker's threads had their own; this one is the test's
    return worker


def make_client():
    client = Client(enforce_csrf_checks=True)
    client.get("/")  # sets the csrftoken cookie, as the demo page does
    client.csrf = client.cookies["csrftoken"].value
    return client


def logged_in_client(username="visitor", password="pw-123456789"):
    """A client logged in as a new user ``username`` (CSRF token refreshed after the login)."""
    from django.contrib.auth import get_user_model

    client = make_client()
    client.user = get_user_model().objects.create_user(username, password=password)
    client.force_login(client.user)
    client.get("/")  # login rotates the CSRF token
    client.csrf = client.cookies["csrftoken"].value
    return client


def api_post(client, url, data=None, **extra):
    return client.post(url, data=json.dumps(data if data is not None else {}), content_type="application/json",
                       HTTP_X_CSRFTOKEN=client.csrf, **extra)


def start_turn(client, content="What time is it in Tokyo?", **extra):
    """Create a conversation and post one message (``extra``: request headers for both, such as
    ``REMOTE_ADDR``); return the 202 body."""
    conversation = api_post(client, "/api/conversations/", **extra).json()
    response = api_post(client, f"/api/conversations/{conversation['id']}/turns/", {"content": content}, **extra)
    assert response.status_code == 202, response.content
    return response.json()


class Poller:
    """Polls a turn from a background thread, as the widget does, recording every distinct state."""

    def __init__(self, client, url, interval=0.02):
        self.client, self.url, self.interval = client, url, interval
        self.states = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        try:
            while not self._stop.is_set():
                response = self.client.get(self.url)
                if response.status_code == 200:
                    data = response.json()
                    if not self.states or self.states[-1]["version"] != data["version"]:
                        self.states.append(data)
                    if data["done"]:
                        return
                time.sleep(self.interval)
        finally:
            connections.close_all()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._thread.join(timeout=30)
        self._stop.set()

    @property
    def final(self):
        return self.states[-1] if self.states else None


def poll_until_done(client, url, timeout=30):
    """Poll like the widget until ``done``; return the final state (fails the test on timeout)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        data = client.get(url).json()
        if data["done"]:
            return data
        time.sleep(0.05)
    raise AssertionError(f"turn never reached done within {timeout}s: {data}")


def wait_for_exit(process, timeout):
    """``process.wait(timeout)`` for a worker started by the ``worker_process`` fixture; its exit
    status. One still running after ``timeout`` fails the test with what it was doing: SIGABRT makes
    it write every thread's stack (``PYTHONFAULTHANDLER``), shown with the end of its log."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    process.send_signal(signal.SIGABRT)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
    shown = Path(process.log_path).read_text(errors="replace")[-20000:]
    pytest.fail(f"worker {process.pid} still ran {timeout}s after it was asked to stop; its log and the "
                f"stacks of its threads:\n{shown}", pytrace=False)


def worker_env(**conversations):
    """Environment for a separate `manage.py rqworker` process that sees this test's database and settings."""
    from django.conf import settings

    from conversations.conf import get_config

    env = dict(os.environ)
    env["RQ_WORKER_CLASS"] = settings.RQ["WORKER_CLASS"]  # the test's, unless a command line names another
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        env["DATABASE_URL"] = f"sqlite:///{db['NAME']}"
    else:
        env["DATABASE_URL"] = f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    for key, value in {**get_config(), **conversations}.items():
        if key in ("TOOLS", "ALLOWED_ENDPOINTS", "ALLOWED_PROVIDERS", "ALLOWED_ORIGINS", "HANDOFF_EMAILS", "REDACT"):
            value = ",".join(value)
        elif key == "REDACT_PATTERNS":
            value = json.dumps([item if isinstance(item, str) else dict(item) for item in value])
        elif key == "FALLBACKS":
            value = json.dumps([dict(entry) for entry in value])
        elif isinstance(value, Mapping):  # CREDENTIALS, PRICES: JSON, as conf reads them from the environment
            value = json.dumps(dict(value), default=dict)
        env[f"CONVERSATIONS_{key}"] = str(value)
    return env


def local_key(key):
    """A ``CREDENTIALS`` entry whose key may go to the fake providers on 127.0.0.1 (any port)."""
    return {"KEY": key, "ORIGINS": ["http://127.0.0.1:*"]}


# Each operation of the API: its name in test messages, and its path and method in the schema.
OPERATIONS = {
    "list conversations": ("/api/conversations/", "get"),
    "start a conversation": ("/api/conversations/", "post"),
    "read a conversation": ("/api/conversations/{conversation_id}/", "get"),
    "send a message": ("/api/conversations/{conversation_id}/turns/", "post"),
    "poll": ("/api/conversations/{conversation_id}/turns/{turn_id}/", "get"),
    "stop": ("/api/conversations/{conversation_id}/turns/{turn_id}/cancel/", "post"),
    "rate an answer": ("/api/conversations/{conversation_id}/turns/{turn_id}/rating/", "post"),
    "get a widget token": ("/api/widget-token/", "post"),
    "poll a handoff": ("/api/conversations/{conversation_id}/handoff/", "get"),
    "go back to the assistant": ("/api/conversations/{conversation_id}/handoff/back/", "post"),
    "ask for a person": ("/api/conversations/{conversation_id}/handoff/", "post"),
    "approve a tool call": ("/api/conversations/{conversation_id}/turns/{turn_id}/approval/", "post"),
    "delete a conversation": ("/api/conversations/{conversation_id}/", "delete"),
}


def call_every_endpoint(client, turn, content="Hello?", **message_headers):
    """One request to each operation of the API, as the widget makes them, about ``turn`` (a
    ``start_turn`` answer); ``{name in OPERATIONS: response}``."""
    conversation = turn["conversation"]
    return {
        "list conversations": client.get("/api/conversations/"),
        "start a conversation": api_post(client, "/api/conversations/"),
        "read a conversation": client.get(f"/api/conversations/{conversation}/"),
        "send a message": api_post(client, f"/api/conversations/{conversation}/turns/", {"content": content},
                                   **message_headers),
        "poll": client.get(turn["poll_url"]),
        "stop": api_post(client, turn["cancel_url"]),
        "rate an answer": api_post(client, turn["cancel_url"].replace("/cancel/", "/rating/"), {"value": "up"}),
        "get a widget token": api_post(client, "/api/widget-token/", {"visitor": "a-widgets-visitor-id-0001"}),
        "poll a handoff": client.get(f"/api/conversations/{conversation}/handoff/"),
        "go back to the assistant": api_post(client, f"/api/conversations/{conversation}/handoff/back/"),
        "ask for a person": api_post(client, f"/api/conversations/{conversation}/handoff/"),
        "approve a tool call": api_post(client, turn["approval_url"], {"call_id": "call_1", "decision": "approve",
                                                                       "arguments_sha256": "0" * 64}),
        # Last: it erases the conversation the others are about.
        "delete a conversation": client.delete(f"/api/conversations/{conversation}/", HTTP_X_CSRFTOKEN=client.csrf),
    }


def wait_for(condition, timeout=20, what="the condition"):
    """Until ``condition()`` is true (polled every 20 ms); an AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} was not met within {timeout} s"
        time.sleep(0.02)
    return True


def staff(username, *codenames, superuser=False):
    """A client signed in as a new staff member holding the permissions ``codenames`` (or a
    superuser); its ``user`` attribute is that member."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    user = get_user_model().objects.create_user(username, is_staff=True, is_superuser=superuser)
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    client.user = user
    return client
