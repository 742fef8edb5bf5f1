"""Fixtures: a real Redis (from REDIS_URL; `python3 dev.py test` starts a private one) for every
test outside tests/core/, the suite's short clocks, real forking RQ workers and widget-like
clients. Plain helpers are in helpers.py."""

import logging
import subprocess
import sys

import pytest
from django.core.cache import cache

from tests.support.helpers import FAST, FORKING, NOWHERE, ROOT, WORKER_CLASSES, logged_in_client, make_client, run_worker, worker_env


@pytest.fixture(scope="session")
def _redis_guard():
    """Once per run, before the first test that uses Redis: refuse a Redis that holds data."""
    from tests.support.redis_guard import ensure_empty_redis

    ensure_empty_redis()


@pytest.fixture(autouse=True)
def _clean_redis(_redis_guard):
    """Each test starts with an empty Redis database (checked to be ours before the first one).
    tests/core/conftest.py turns this off: the pure core's tests run without Redis."""
    cache._cache.get_client(write=True).flushdb()
    yield


@pytest.fixture(autouse=True)
def _language_reset():
    """A request through the test client leaves its language active in this thread (LocaleMiddleware
    activates it and nothing deactivates it): each test starts in the site's default language."""
    yield
    from django.utils import translation

    translation.deactivate()


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


@pytest.fixture(autouse=True)
def _forking_worker_by_default(settings):
    """The suite's workers fork a work horse per turn unless a test asks for another class
    (``worker_class``, ``any_worker``): many tests kill that horse. Worker processes follow
    (``worker_env``)."""
    settings.RQ = {"WORKER_CLASS": FORKING}


@pytest.fixture
def worker():
    return run_worker


@pytest.fixture(params=WORKER_CLASSES, ids=["forking", "concurrent"])
def worker_class(request):
    """Each worker class in turn (a dotted path), for the tests of what every worker must keep."""
    return request.param


@pytest.fixture
def any_worker(worker_class):
    """``run_worker`` of each worker class in turn."""
    return lambda: run_worker(worker_class)


@pytest.fixture
def owner_client(db):
    """A browser-like client: session + CSRF enforced, with the csrftoken cookie set."""
    return make_client()


@pytest.fixture(params=["anonymous", "logged_in"])
def visitor(request, db):
    """A widget's client, once as an anonymous visitor and once as a logged-in user: every path
    the API takes must answer both alike."""
    return make_client() if request.param == "anonymous" else logged_in_client()


@pytest.fixture
def worker_process(transactional_db, tmp_path):
    """Start ``manage.py rqworker`` processes (``start(n=1, **overrides)``), or one ``manage.py
    rqworker-pool`` of ``n`` workers (``pool=True``); all are stopped after the test. Each one's
    output goes to a file of the test's (``process.log_path``), with the stacks of its threads
    added on SIGABRT (``helpers.wait_for_exit`` shows both when a process does not exit)."""
    processes = []

    def start(n=1, worker_class=None, pool=False, **overrides):
        env = {**worker_env(**overrides), "PYTHONFAULTHANDLER": "1"}
        command = [sys.executable, str(ROOT / "manage.py"), "rqworker"]
        if pool:
            command, n = [sys.executable, str(ROOT / "manage.py"), "rqworker-pool", "--num-workers", str(n)], 1
        if worker_class is not None:
            command += ["--worker-class", worker_class]
        for _ in range(n):
            log_path = tmp_path / f"worker-{len(processes)}.log"
            with open(log_path, "wb") as log:
                process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
            process.log_path = log_path
            processes.append(process)
        return processes

    yield start
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.fixture
def log_file(tmp_path):
    """Every log record of this process and of the forked work horses (which inherit the
    handler), at DEBUG, in one file."""
    path = tmp_path / "all.log"
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s %(args)s"))
    root, levels = logging.getLogger(), {name: logging.getLogger(name).level for name in ("", "conversations", "rq")}
    root.addHandler(handler)
    for name in levels:
        logging.getLogger(name).setLevel(logging.DEBUG)
    yield path
    root.removeHandler(handler)
    handler.close()
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
