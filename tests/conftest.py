"""Shared fixtures: a real Redis (from REDIS_URL; `python3 dev.py test` starts a private one),
real forking RQ workers, the real Django cache, and pollers that watch a turn like the widget."""

import os
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest
from django.core.cache import cache
from django.db import connection, connections
from django.test import Client

ROOT = Path(__file__).resolve().parent.parent

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
}


def pytest_configure(config):
    from tests.redis_guard import ensure_empty_redis

    ensure_empty_redis()


@pytest.fixture(autouse=True)
def _clean_redis():
    """Each test starts with an empty Redis database (checked to be ours at session start)."""
    cache._cache.get_client(write=True).flushdb()
    yield


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    """Logins in tests need not resist brute force; the default hasher costs about a second per user here."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def conversations_settings(settings):
    """The merged CONVERSATIONS dict for this test; change it with ``conversations_settings.update(...)``."""
    from conversations.conf import get_config

    class Live(dict):
        def update(self, *args, **kwargs):
            super().update(*args, **kwargs)
            settings.CONVERSATIONS = dict(self)
            settings.RQ_QUEUES = {"default": {**settings.RQ_QUEUES["default"], "DEFAULT_TIMEOUT": self["JOB_TIMEOUT"]}}
            get_config.cache_clear()

    live = Live()
    live.update({**settings.CONVERSATIONS, **FAST})
    yield live
    get_config.cache_clear()


# A Redis URL where nothing listens.
NOWHERE = "redis://127.0.0.1:9/0"


@pytest.fixture
def unreachable_cache(settings, conversations_settings):
    """A cache alias ``down`` on a Redis that is not there: call the returned function to put the
    app's state there (``CACHE_ALIAS``), and again with False to bring it back. Sessions stay where
    the test keeps them."""
    settings.CACHES = {**settings.CACHES, "down": {**settings.CACHES["default"], "LOCATION": NOWHERE}}

    def down(is_down=True):
        conversations_settings.update(CACHE_ALIAS="down" if is_down else "default")

    return down


@pytest.fixture
def unreachable_queue(settings):
    """Call the returned function to point the RQ queue at a Redis that is not there, and again with
    False to bring it back."""
    url = settings.RQ_QUEUES["default"]["URL"]

    def down(is_down=True):
        settings.RQ_QUEUES = {"default": {**settings.RQ_QUEUES["default"], "URL": NOWHERE if is_down else url}}

    return down


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


def run_worker():
    """Run every queued job in a real forking worker (burst mode), as production does."""
    from django_rq import get_worker

    connections.close_all()  # a forked work horse must not share the test's database socket
    worker = get_worker("default")
    worker.work(burst=True)
    return worker


@pytest.fixture
def worker():
    return run_worker


@pytest.fixture
def owner_client(db):
    """A browser-like client: session + CSRF enforced, with the csrftoken cookie set."""
    return make_client()


def make_client():
    client = Client(enforce_csrf_checks=True)
    client.get("/")  # sets the csrftoken cookie, as the demo page does
    client.csrf = client.cookies["csrftoken"].value
    return client


def api_post(client, url, data=None, **extra):
    import json

    return client.post(url, data=json.dumps(data if data is not None else {}), content_type="application/json",
                       HTTP_X_CSRFTOKEN=client.csrf, **extra)


def start_turn(client, content="What time is it in Tokyo?"):
    """Create a conversation and post one message; return the 202 body."""
    conversation = api_post(client, "/api/conversations/").json()
    response = api_post(client, f"/api/conversations/{conversation['id']}/turns/", {"content": content})
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


def worker_env(**conversations):
    """Environment for a separate `manage.py rqworker` process that sees this test's database and settings."""
    from conversations.conf import get_config

    env = dict(os.environ)
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        env["DATABASE_URL"] = f"sqlite:///{db['NAME']}"
    else:
        env["DATABASE_URL"] = f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    for key, value in {**get_config(), **conversations}.items():
        if key == "TOOLS":
            value = ",".join(value)
        env[f"CONVERSATIONS_{key}"] = str(value)
    return env


@pytest.fixture
def worker_process(transactional_db):
    """Start ``manage.py rqworker`` processes (``start(n=1, **overrides)``); all are stopped after the test."""
    processes = []

    def start(n=1, **overrides):
        env = worker_env(**overrides)
        for _ in range(n):
            processes.append(subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "rqworker"], env=env,
                                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return processes

    yield start
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
