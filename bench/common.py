"""What every benchmark needs: a private Redis, a database, gunicorn, RQ workers, the machine's
description and a table printer.

``Stack`` starts the services as separate processes, the way they run in production (web
and workers share only Redis and the database), and stops them on exit. The benchmark
process itself is set up as a Django process on the same settings (``bench.settings``), so
it can create rows and read states directly.
"""

import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import dev  # noqa: E402  (the same Redis starter the test runner uses)

PYTHON = sys.executable


def free_port():
    return dev.free_port()


def wait_for_port(port, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if dev.port_open("127.0.0.1", port):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


def postgres_answers():
    return dev.port_open("127.0.0.1", 5432) and shutil.which("psql") is not None


def psql(sql, database="postgres"):
    subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", database, "-q", "-c", sql],
                   check=True, capture_output=True)


class Stack:
    """Redis, a migrated database, and (on request) gunicorn and RQ workers, for one benchmark run.

    ``database``: "postgres" (a fresh database on 127.0.0.1:5432, dropped afterwards), "sqlite"
    (a temporary file), or a DATABASE_URL. ``conversations``: CONVERSATIONS_<KEY> overrides for
    every process.
    """

    def __init__(self, *, database="postgres", conversations=None):
        self.tmp = Path(tempfile.mkdtemp(prefix="conversations-bench-"))
        self.processes = []
        self.pg_name = None
        self.database = database
        self.conversations = conversations or {}
        self.outer_path = os.environ.get("PYTHONPATH", "")  # the caller's own path (gunicorn installed apart)

    def __enter__(self):
        redis_port = free_port()
        self.redis = dev.start_redis(redis_port, self.tmp / "redis")
        self.env = dict(os.environ)
        self.env.update({
            "DJANGO_SETTINGS_MODULE": "bench.settings",
            "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
            "SECRET_KEY": "benchmark-only-secret-key-not-for-production-000000",
            "DEBUG": "0",
            "SECURE_COOKIES": "0",
            "LOG_LEVEL": "WARNING",
            # As docs/deployment.md recommends: gunicorn workers keep their database connection.
            "CONN_MAX_AGE": "60",
            # The caller's own path after the project's (gunicorn installed apart, say).
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), self.outer_path])),
        })
        self.env["DATABASE_URL"] = self.database_url()
        for key, value in self.conversations.items():
            self.env[f"CONVERSATIONS_{key}"] = str(value)
        os.environ.update(self.env)
        import django

        django.setup()
        subprocess.run([PYTHON, str(ROOT / "manage.py"), "migrate", "--no-input", "-v", "0"],
                       env=self.env, cwd=ROOT, check=True)
        return self

    def database_url(self):
        if self.database == "sqlite":
            return f"sqlite:///{self.tmp / 'bench.sqlite3'}"
        if self.database == "postgres":
            if not postgres_answers():
                raise SystemExit("No PostgreSQL on 127.0.0.1:5432: pass --database sqlite or a DATABASE_URL.")
            self.pg_name = f"conversations_bench_{os.getpid()}"
            psql(f"CREATE DATABASE {self.pg_name}")
            return f"postgres://postgres@127.0.0.1:{self.database_port()}/{self.pg_name}"
        return self.database

    def database_port(self):
        """5432, or with ``BENCH_DB_LATENCY_MS`` set the port of a ``bench.latency_proxy`` in front of
        it, which delays each chunk by that many milliseconds each way: a database on another host."""
        delay = os.environ.get("BENCH_DB_LATENCY_MS")
        if not delay:
            return 5432
        from bench import latency_proxy

        proxy, port = latency_proxy.start(delay)
        self.processes.append(proxy)
        return port

    @property
    def database_label(self):
        if not self.env["DATABASE_URL"].startswith("postgres"):
            return "SQLite"
        delay = os.environ.get("BENCH_DB_LATENCY_MS")
        return f"PostgreSQL through a proxy adding {delay} ms each way" if delay else "PostgreSQL"

    def spawn(self, *args, env=None, cwd=ROOT, **kwargs):
        """Start a process with the stack's environment (updated with ``env``) in a session of its own."""
        process = subprocess.Popen(list(args), env={**self.env, **(env or {})}, cwd=cwd, stdout=subprocess.DEVNULL,
                                   stderr=kwargs.pop("stderr", subprocess.DEVNULL), start_new_session=True, **kwargs)
        self.processes.append(process)
        return process

    def gunicorn(self, workers, *, env=None):
        """Serve the site with ``workers`` sync gunicorn workers (their environment updated with
        ``env``); returns the base URL. The master is ``self.processes[-1]`` right after."""
        port = free_port()
        self.spawn(PYTHON, "-m", "gunicorn", "chatproject.wsgi", "--bind", f"127.0.0.1:{port}",
                   "--workers", str(workers), "--worker-class", "sync", "--backlog", "2048",
                   "--log-level", "warning", env=env)
        wait_for_port(port)
        base = f"http://127.0.0.1:{port}"
        import requests

        # The master binds the port before its workers have imported Django: wait until
        # every worker answers (several requests in a row), or the first measurement pays for it.
        deadline, answered = time.monotonic() + 120, 0
        while answered < 4 * workers:
            if time.monotonic() > deadline:
                raise RuntimeError("gunicorn did not answer within 120s")
            try:
                answered += requests.get(base + "/", timeout=5).status_code == 200
            except requests.RequestException:
                time.sleep(0.2)
        return base

    def workers(self, count, *, pool=False, root=ROOT):
        """Start ``count`` RQ workers (``count`` × ``rqworker``, or one ``rqworker-pool``) and wait
        until all have registered; returns the top-level processes. ``root``: the tree whose code
        they run (another commit's, written out by ``tree_at``)."""
        manage = [PYTHON, str(root / "manage.py")]
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(root), self.outer_path]))} if root != ROOT else None
        if pool:
            started = [self.spawn(*manage, "rqworker-pool", "--num-workers", str(count), env=env, cwd=root)]
        else:
            # BENCH_WORKER_LOG=<file>: the workers' logs go there (docs/benchmarks.md).
            log = os.environ.get("BENCH_WORKER_LOG")
            started = [self.spawn(*manage, "rqworker", stderr=open(log, "a") if log else subprocess.DEVNULL, env=env,
                                  cwd=root) for _ in range(count)]
        self.wait_for_workers(count)
        return started

    @staticmethod
    def wait_for_workers(count):
        """Wait until ``count`` RQ workers (on any queue) have registered."""
        from rq import Worker

        from conversations.infra.queue import get_queue

        deadline = time.monotonic() + 120
        while len(Worker.all(connection=get_queue().connection)) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(Worker.all(connection=get_queue().connection))} workers registered")
            time.sleep(0.1)

    def tree_at(self, commit):
        """The project's files at ``commit`` (``git archive``), written under the stack's directory
        once; returns their root, for ``workers(root=…)``."""
        root = self.tmp / f"tree-{commit[:12]}"
        if not root.exists():
            root.mkdir()
            archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
        return root

    def stop(self, process, timeout=60):
        """Stop ``process`` (one ``spawn`` started) warmly (SIGTERM to its session) and wait for it."""
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def __exit__(self, *exc):
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        from django.db import connections

        connections.close_all()
        dev.stop([self.redis])
        if self.pg_name:
            psql(f"DROP DATABASE IF EXISTS {self.pg_name} WITH (FORCE)")
        shutil.rmtree(self.tmp, ignore_errors=True)


def process_tree(*pids):
    """``pids`` and all their descendants, from one scan of /proc."""
    children = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], list(pids)
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def _stat_fields(pids):
    """The fields after the command name in /proc/<pid>/stat of ``pids`` and all their
    descendants (a process gone is skipped): field 3 of proc(5) is index 0 here."""
    for pid in process_tree(*pids):
        try:
            yield Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue


def cpu_seconds(*pids):
    """User + system CPU seconds of ``pids`` and all their descendants, the children they have
    reaped included (a forking worker's work horses), from /proc; a process gone counts 0."""
    tick = os.sysconf("SC_CLK_TCK")
    total = sum(
        sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
        for fields in _stat_fields(pids)
    )
    return total / tick


def minor_faults(*pids):
    """Minor page faults of ``pids`` and all their descendants, reaped children included, from
    /proc: in a forked child, each first write to a page it shares with its parent is one (a
    copy on write)."""
    return sum(int(fields[7]) + int(fields[8]) for fields in _stat_fields(pids))  # minflt, cminflt


def memory_kib(pid):
    """(RSS, PSS) of one process in KiB from /proc/<pid>/smaps_rollup, or (0, 0) if it is gone."""
    rss = pss = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1])
            elif line.startswith("Pss:"):
                pss = int(line.split()[1])
    except OSError:
        pass
    return rss, pss


def machine():
    """A one-line description of this machine and its software, for the results."""
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    redis_version = subprocess.run([dev.redis_binary(), "--version"], capture_output=True, text=True).stdout.split()
    redis_version = next((p.split("=")[1] for p in redis_version if p.startswith("v=")), "?")
    import django
    import rq

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"nproc {os.cpu_count()}, {cpu}, Python {platform.python_version()}, Django {django.get_version()}, "
            f"RQ {rq.__version__}, Redis {redis_version}; load average at start {load}")


def percentile(values, fraction):
    values = sorted(values)
    if not values:
        return float("nan")
    index = min(len(values) - 1, max(0, round(fraction * (len(values) - 1))))
    return values[index]


def median(values):
    return statistics.median(values) if values else float("nan")


def table(headers, rows):
    """Print a Markdown table (so it can be pasted into docs/benchmarks.md as is)."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")
    sys.stdout.flush()


class ScriptedProvider:
    """An OpenAI-compatible provider on 127.0.0.1 that answers at once (or after ``delay`` seconds).

    Each conversation gets ``calls`` model calls: while the request carries fewer than
    ``calls - 1`` tool results it asks for a tool (``current_time``, then ``search_faq``),
    then it answers in text. It decides from the request itself, so any number of turns may
    run at once. ``served`` lists ``(wall-clock start, seconds spent answering)`` per request.
    """

    TOOLS = [("current_time", {"city": "Tokyo"}), ("search_faq", {"query": "refunds"})]

    def __init__(self, *, calls=3, delay=0.0):
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from tests.support.fakes import openai_text, openai_tool_calls

        provider = self
        self.served = []
        self._lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # http.server writes the headers and the body separately; with Nagle's algorithm on,
            # the body waits for the client's delayed ACK of the headers (about 30-40 ms a reply).
            disable_nagle_algorithm = True

            def log_message(self, *args):
                pass

            def do_POST(self):
                wall, started = time.time(), time.perf_counter()
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                results = sum(1 for m in body.get("messages", []) if m.get("role") == "tool")
                if results < calls - 1:
                    name, arguments = provider.TOOLS[results % len(provider.TOOLS)]
                    reply = openai_tool_calls((f"call_{results + 1}", name, arguments))
                else:
                    reply = openai_text("It is 21:04 in Tokyo; refunds take up to 30 days.")
                if delay:
                    time.sleep(delay)
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                with provider._lock:
                    provider.served.append((wall, time.perf_counter() - started))

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 1024

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def time_between(self, start, end):
        """Seconds spent answering requests that arrived between two wall-clock instants."""
        with self._lock:
            return sum(seconds for wall, seconds in self.served if start <= wall <= end)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def visitor(base):
    """A ``requests`` session that behaves like the widget: csrftoken cookie, X-CSRFToken header."""
    import requests

    session = requests.Session()
    session.get(base + "/").raise_for_status()
    session.headers["X-CSRFToken"] = session.cookies["csrftoken"]
    return session
