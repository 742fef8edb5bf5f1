"""A crowd at once: many streamed turns served by few worker processes, with each worker class.

    .venv/bin/python -m bench.crowd [--database postgres|sqlite|URL] [--skip crowd,many,kill]

A fake OpenAI-compatible server, in a process of its own, streams every answer word by word
(``--words`` words, one every 0.1 s: 3 s by default), recording when it sent each word. Everything runs as in production:
gunicorn (2 sync workers) takes the POSTs and the polls, ``manage.py rqworker`` processes run
the turns. Three parts:

- ``crowd``: ``--visitors`` (60) visitors post one message each at the same moment, served by
  4 worker processes: first with ``conversations.worker.Worker`` (one forked work horse per
  turn), then with ``ConcurrentWorker``. How many completed, how many were turned away after
  ``QUEUE_WAIT``, and when the last answer was done, against one answer's time.
- ``many``: ``--many`` (200) streamed turns in flight in one ``ConcurrentWorker`` process
  (``WORKER_THREADS`` = that many), answers of ``--many-words`` (200: 20 s, so that every turn
  still streams when the last one starts; the table says how many streamed at once). Lag: from the provider sending a word to the turn's state
  (what the poll view serves) first holding it, read for every turn in a loop from the cache by
  a reader process, each turn from the moment its POST was answered; shown also by part of the answer, by second, and once every turn streams;
  the worker's PSS at rest and at its peak, per turn in flight; the peak of PostgreSQL
  connections from that worker process (``pg_stat_activity``).
- ``kill``: ``--kill`` (50) turns in flight in one ``ConcurrentWorker`` process, SIGKILLed
  while streaming their answers (``--kill-words``, 10 s), once a second process has started. The second
  process's reaper finds the killed one's lease expired (``infra.lease``, 2 s) and continues each
  turn there, while widget-like pollers (one poll a second per turn, through gunicorn) follow
  them. All must complete.
"""

import argparse
import json
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from bench.common import Stack, machine, memory_kib, percentile, table, visitor

WORD_INTERVAL = 0.1
FORKING, CONCURRENT = "conversations.worker.Worker", "conversations.worker.ConcurrentWorker"


class StreamingProvider:
    """Streams each answer, ``words`` words one every WORD_INTERVAL; ``sent[(question, n)]`` is
    when word ``n`` of the answer to ``question`` (the last user message) left. Runs in the
    process that makes it (see ``ProviderProcess``); ``GET /control`` answers ``requests`` and
    ``sent``, ``POST /control`` sets ``words``."""

    def __init__(self, words, port=0):
        from tests.support.fake_stream import encode, openai_stream

        provider = self
        self.sent, self.requests = {}, 0
        self.words = words
        self.lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args):
                pass

            def control(self, data):
                body = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                # list() copies the items in one step: the streaming threads add to ``sent`` meanwhile.
                items = list(provider.sent.items()) if "sent=0" not in self.path else []
                self.control({"requests": provider.requests,
                              "sent": [[question, number, at] for (question, number), at in items]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if self.path == "/control":
                    provider.words = body["words"]
                    return self.control({})
                question = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
                with provider.lock:
                    provider.requests += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                words = provider.words
                events = openai_stream(pieces=[f"w{n:04d} " for n in range(words)])
                try:
                    # Event 0 opens the message, events 1..words are the words, one every
                    # WORD_INTERVAL; the finish reason, the usage and [DONE] follow the last word at
                    # once, as a real provider sends them.
                    for number, event in enumerate(events):
                        if 1 < number <= words:
                            time.sleep(WORD_INTERVAL)
                        data = encode(event)
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                        self.wfile.flush()
                        if 1 <= number <= words:
                            provider.sent[(question, number - 1)] = time.time()
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except OSError:  # the worker went away (killed): its connection with it
                    self.close_connection = True

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 1024

            def handle_error(self, request, client_address):
                pass  # a killed worker's connections reset: expected in the kill part

        self.server = Server(("127.0.0.1", port), Handler)

    def serve(self):
        self.server.serve_forever()


def _serve_provider(words, port):
    StreamingProvider(words, port).serve()


class ProviderProcess:
    """The fake provider in a process of its own, so that its 200 streaming threads do not share
    a GIL with the bench's state reader (the lag measured is the worker's, not the bench's)."""

    def __init__(self, words):
        from bench.common import free_port, wait_for_port

        port = free_port()
        self.process = multiprocessing.get_context("fork").Process(target=_serve_provider, args=(words, port),
                                                                   daemon=True)
        self.process.start()
        wait_for_port(port)
        self.control = f"http://127.0.0.1:{port}/control"
        self.url = f"http://127.0.0.1:{port}/v1"

    def _status(self, sent=True):
        import requests

        return requests.get(self.control + ("" if sent else "?sent=0"), timeout=30).json()

    @property
    def requests(self):
        return self._status(sent=False)["requests"]

    @property
    def sent(self):
        return {(question, number): at for question, number, at in self._status()["sent"]}

    def set_words(self, words):
        import requests

        requests.post(self.control, json={"words": words}, timeout=10).raise_for_status()

    def close(self):
        self.process.terminate()
        self.process.join(10)


def start_workers(stack, count, worker_class, **conversations):
    stack.env["RQ_WORKER_CLASS"] = worker_class
    for key, value in conversations.items():
        stack.env[f"CONVERSATIONS_{key}"] = str(value)
    return stack.workers(count)


def queue_connection():
    from conversations.infra.queue import get_queue

    return get_queue().connection


def manage_rqworker():
    from bench.common import PYTHON, ROOT

    return PYTHON, str(ROOT / "manage.py"), "rqworker"


def stop(processes, sig=signal.SIGTERM):
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, sig)
    for process in processes:
        process.wait(60)
    from rq import Worker

    from conversations.infra.queue import get_queue

    connection = get_queue().connection
    for worker in Worker.all(connection=connection):  # a SIGKILLed one leaves its key until it expires
        worker.register_death()


def visitors(base, count):
    def prepare(_):
        session = visitor(base)
        return session, session.post(base + "/api/conversations/", json={}).json()["id"]

    with ThreadPoolExecutor(20) as pool:
        return list(pool.map(prepare, range(count)))


def post_all(base, prepared, label, on_posted=None):
    """Every visitor posts at the same moment; returns (first POST's wall time, [(question, turn id)]).
    ``on_posted(question, turn id)`` is called as each POST is answered."""
    barrier = threading.Barrier(len(prepared))

    def post(item):
        index, (session, conversation) = item
        question = f"{label} question {index}"
        barrier.wait()
        response = session.post(f"{base}/api/conversations/{conversation}/turns/", json={"content": question})
        response.raise_for_status()
        turn_id = response.json()["id"]
        if on_posted is not None:
            on_posted(question, turn_id)
        return question, turn_id

    started = time.time()
    with ThreadPoolExecutor(len(prepared)) as pool:
        posted = list(pool.map(post, enumerate(prepared)))
    return started, posted


def wait_done(turn_ids, timeout, on_read=None, more=None):
    """Read every turn's state until all are done; returns {turn id: final state}. ``more()``, if
    given, is asked before each read for turn ids to add, and returns None once there are no more.

    Each round reads the turns' version counters (integers, cheap), then only the states whose
    version moved: a reader that unpickled 200 states a hundred times a second would take a
    core of its own from the 2 the worker shares with it."""
    from django.core.cache import caches

    from conversations.conf import get_config
    from conversations.infra.state import _version_key, state_key

    cache = caches[get_config()["CACHE_ALIAS"]]
    finished, seen, deadline = {}, {}, time.monotonic() + timeout
    turns = list(turn_ids)
    adding = more is not None
    while (adding or len(finished) < len(turns)) and time.monotonic() < deadline:
        if adding:
            added = more()
            if added is None:
                adding = False
            else:
                turns += added
        waiting = [turn_id for turn_id in turns if turn_id not in finished]
        versions = cache.get_many([_version_key(turn_id) for turn_id in waiting])
        moved = [turn_id for turn_id in waiting if versions.get(_version_key(turn_id)) != seen.get(turn_id)]
        found = cache.get_many([state_key(turn_id) for turn_id in moved])
        now = time.time()
        for turn_id in moved:
            data = found.get(state_key(turn_id))
            if data is None:
                continue
            seen[turn_id] = data["version"]
            if on_read is not None:
                on_read(turn_id, data, now)
            if data["done"]:
                finished[turn_id] = data
        time.sleep(0.01)
    return finished


def crowd(stack, base, args):
    from conversations.core.sentences import not_picked_up_message

    rows = []
    for worker_class in (FORKING, CONCURRENT):
        workers = start_workers(stack, 4, worker_class)
        prepared = visitors(base, args.visitors)
        started, posted = post_all(base, prepared, worker_class.rsplit(".", 1)[1])
        finished = wait_done([turn_id for _, turn_id in posted], timeout=120)
        stop(workers)
        states = list(finished.values())
        answer = args.words * WORD_INTERVAL
        last = max(s["updated_at"] for s in states) - started
        rows.append([worker_class.rsplit(".", 1)[1], len(posted), sum(s["status"] == "completed" for s in states),
                     sum(s["error"] == not_picked_up_message() for s in states), len(posted) - len(states),
                     f"{answer:.1f}", f"{last:.1f}", f"{last / answer:.2f}"])
    print(f"\n{args.visitors} visitors at once, answers of {args.words} words streamed over "
          f"{args.words * WORD_INTERVAL:.1f}s, 4 rqworker processes, {stack.database_label}\n")
    table(["worker class", "posted", "completed", "turned away (QUEUE_WAIT)", "not done", "one answer s",
           "last answer done s", "last / one answer"], rows)


def pg_connections(stack):
    """Connections to the benchmark's PostgreSQL database now (every process's, this one's too),
    or None on SQLite. Counted from a connection of its own, closed again."""
    if not stack.pg_name:
        return None
    from django.db import connections

    try:
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [stack.pg_name])
            return cursor.fetchone()[0]
    finally:
        connections.close_all()


def _read_words(results, timeout):
    """In the reader process: every turn's state read in a loop until all are done, each from the
    moment its POST was answered (``(turn id, question)`` pairs arrive through ``results`` as
    they are, then None); sends back ``(first_seen, finished)``: when each word ``(question, n)``
    was first in a state, and the final states."""
    question_of, first_seen, words_seen = {}, {}, {}
    ended = []

    def more():
        if ended:
            return None
        added = []
        while results.poll():
            item = results.recv()
            if item is None:
                ended.append(True)  # this call's additions are the last
                break
            turn_id, question = item
            question_of[turn_id] = question
            added.append(turn_id)
        return added

    def on_read(turn_id, data, now):
        last = data["messages"][-1] if data["messages"] else {}
        if last.get("role") != "assistant":
            return
        count = len(last["content"]) // 6  # "w0000 " per word; a turn's text only grows
        for number in range(words_seen.get(turn_id, 0), count):
            first_seen[(question_of[turn_id], number)] = now
        words_seen[turn_id] = max(count, words_seen.get(turn_id, 0))

    finished = wait_done([], timeout=timeout, on_read=on_read, more=more)
    results.send((first_seen, finished))


def many(stack, base, args):
    from bench.common import process_tree

    # Answers long enough that every turn is still streaming when the last one starts: the burst
    # of POSTs alone takes seconds on this machine, and with short answers the first turns would
    # be done before the last began (not "200 in flight").
    words = args.many_words
    stack.provider.set_words(words)
    workers = start_workers(stack, 1, CONCURRENT, WORKER_THREADS=args.many)
    pid = workers[0].pid
    time.sleep(1)
    rest_pss = sum(memory_kib(p)[1] for p in process_tree(pid))
    prepared = visitors(base, args.many)
    # Connections before the turns: this process's own, gunicorn's (kept, CONN_MAX_AGE).
    baseline_connections = pg_connections(stack)
    peak = {"pss": rest_pss, "connections": baseline_connections or 0}
    sampling = threading.Event()

    def sample():
        while not sampling.wait(0.2):
            peak["pss"] = max(peak["pss"], sum(memory_kib(p)[1] for p in process_tree(pid)))
            count = pg_connections(stack)
            if count is not None:
                peak["connections"] = max(peak["connections"], count)

    # The state reader in a process of its own, forked before any thread of this one starts.
    reading, results = multiprocessing.get_context("fork").Pipe()
    reader = multiprocessing.get_context("fork").Process(target=_read_words, args=(results, 180), daemon=True)
    reader.start()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    # Each turn is read from the moment its POST is answered, not once all 200 are (that took
    # seconds, and every word sent meanwhile counted as lag).
    sending = threading.Lock()

    def on_posted(question, turn_id):
        with sending:
            reading.send((turn_id, question))

    started, posted = post_all(base, prepared, "many", on_posted=on_posted)
    question_of = {turn_id: question for question, turn_id in posted}
    with sending:
        reading.send(None)
    first_seen, finished = reading.recv()
    # When the burst's turns were enqueued (their POSTs' commits) and started (claimed by the
    # worker), from the first POST; and how every turn ended.
    from collections import Counter

    from conversations.models import Turn

    rows = Turn.objects.filter(pk__in=list(question_of))
    enqueued = sorted(turn.enqueued_at.timestamp() - started for turn in rows)
    began = sorted(turn.started_at.timestamp() - started for turn in rows if turn.started_at)
    endings = Counter(f"{turn.status}{': ' + turn.error if turn.error else ''}" for turn in rows)
    reader.join(10)
    sampling.set()
    sampler.join()
    stop(workers)
    questions = set(question_of.values())  # the provider also served the parts before this one
    sent = {key: at for key, at in stack.provider.sent.items() if key[0] in questions}
    lags = [first_seen[key] - at for key, at in sent.items() if key in first_seen]
    # Where in the answers the lag is: its first words (every turn starting at once), its last
    # (the reply's row saved, the final state), the rest.
    by_part = {"first 3 words": [], "middle words": [], "last 3 words": []}
    for (question, number), at in sent.items():
        if (question, number) in first_seen:
            part = "first 3 words" if number < 3 else "last 3 words" if number >= words - 3 else "middle words"
            by_part[part].append(first_seen[(question, number)] - at)
    first_sent = min(sent.values())
    # After the last turn's first word: the lag once no turn is starting any more (with long
    # answers, also once the first turns have ended).
    last_began = max(at for (question, number), at in sent.items() if number == 0)
    by_part["sent after the last turn began"] = [first_seen[key] - at for key, at in sent.items()
                                                 if key in first_seen and at > last_began]
    by_second = {}
    for key, at in sent.items():
        if key in first_seen:
            by_second.setdefault(int(at - first_sent), []).append(first_seen[key] - at)
    states = list(finished.values())
    from conversations.conf import get_config

    # The most turns streaming at one moment (between their first and last word sent).
    spans = {}
    for (question, number), at in sent.items():
        first, last = spans.get(question, (at, at))
        spans[question] = (min(first, at), max(last, at))
    edges = sorted([(first, 1) for first, _ in spans.values()] + [(last, -1) for _, last in spans.values()])
    in_flight = peak_in_flight = 0
    for _, step in edges:
        in_flight += step
        peak_in_flight = max(peak_in_flight, in_flight)
    publish = get_config()["PUBLISH_INTERVAL"]
    print(f"\n{args.many} streamed turns ({words} words over {words * WORD_INTERVAL:.1f}s) in one "
          f"ConcurrentWorker process (WORKER_THREADS {args.many}), {stack.database_label}; PUBLISH_INTERVAL "
          f"{publish}s\n")
    table(["turns", "most streaming at once", "completed", "words timed", "lag p50 s", "lag p95 s", "lag max s",
           "PSS at rest MiB", "peak PSS MiB", "PSS per turn in flight KiB", "DB connections before",
           "DB connections peak"],
          [[len(posted), peak_in_flight, sum(s["status"] == "completed" for s in states), len(lags),
            f"{percentile(lags, 0.5):.3f}", f"{percentile(lags, 0.95):.3f}", f"{max(lags):.3f}",
            f"{rest_pss / 1024:.0f}", f"{peak['pss'] / 1024:.0f}", f"{(peak['pss'] - rest_pss) / args.many:.0f}",
            baseline_connections if baseline_connections is not None else "–",
            peak["connections"] if baseline_connections is not None else "–"]])
    print(f"\nAfter the first POST: the last turn enqueued at {enqueued[-1]:.1f}s; turns started (median / last) "
          f"at {percentile(began, 0.5):.1f}s / {began[-1]:.1f}s. The last turn's first word was sent "
          f"{last_began - first_sent:.1f}s after the first turn's. Endings: {dict(endings)}\n")
    table(["words", "timed", "lag p50 s", "lag p95 s", "lag max s"],
          [[part, len(values), f"{percentile(values, 0.5):.3f}", f"{percentile(values, 0.95):.3f}",
            f"{max(values):.3f}"]
           for part, values in list(by_part.items()) + [(f"sent in second {second}", values)
                                                         for second, values in sorted(by_second.items())]
           if values])


def kill(stack, base, args):
    from conversations.models import CallRecord, Turn

    stack.env["CONVERSATIONS_MAX_RESUMES"] = "2"
    victim = start_workers(stack, 1, CONCURRENT, WORKER_THREADS=args.kill)
    prepared = visitors(base, args.kill)
    stack.provider.set_words(args.kill_words)  # answers long enough to outlast the rescuer's start
    _, posted = post_all(base, prepared, "kill")
    turn_ids = [turn_id for _, turn_id in posted]
    sessions = {turn_id: session for (session, _), (_, turn_id) in zip(prepared, posted)}
    # Once every turn is streaming.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        streaming = Turn.objects.filter(pk__in=turn_ids, status=Turn.Status.RUNNING).count()
        if streaming == len(turn_ids) and stack.provider.requests >= len(turn_ids):
            break
        time.sleep(0.05)
    # Another worker process, once the victim holds every turn; the kill once it has registered.
    from rq import Worker

    rescuer = [stack.spawn(*manage_rqworker())]
    while len(Worker.all(connection=queue_connection())) < 2:
        time.sleep(0.05)
    held = Turn.objects.filter(pk__in=turn_ids, status=Turn.Status.RUNNING).count()
    os.killpg(victim[0].pid, signal.SIGKILL)
    killed = time.time()
    victim[0].wait(10)

    polling = threading.Event()

    # Read here, not in each poller's thread: a thread keeps its database connection, and the
    # pollers would hold more than the pool has.
    conversation_of = {str(turn): conversation for turn, conversation in
                       Turn.objects.filter(pk__in=turn_ids).values_list("id", "conversation_id")}

    def poll(turn_id):  # a widget: one poll a second until done
        url = f"{base}/api/conversations/{conversation_of[turn_id]}/turns/{turn_id}/"
        while not polling.is_set():
            try:
                if sessions[turn_id].get(url, timeout=10).json()["done"]:
                    return
            except Exception:  # noqa: BLE001 - a busy gunicorn: the widget polls again
                pass
            time.sleep(1)

    with ThreadPoolExecutor(len(turn_ids)) as pool:
        futures = [pool.submit(poll, turn_id) for turn_id in turn_ids]
        finished = wait_done(turn_ids, timeout=120)
        polling.set()
        for future in futures:
            future.result()
    stop(rescuer)
    states = list(finished.values())
    resumed = Turn.objects.filter(pk__in=turn_ids, resumes=1).count()
    last = max(s["updated_at"] for s in states) - killed if states else float("nan")
    # When each turn was continued: its resume record's offset from the turn's start.
    continued = [(record.turn.started_at.timestamp() + record.started_offset) - killed for record in
                 CallRecord.objects.filter(turn_id__in=turn_ids, kind=CallRecord.Kind.RESUME).select_related("turn")]
    print(f"\n{args.kill} streamed turns ({args.kill_words * WORD_INTERVAL:.1f}s answers) in one ConcurrentWorker, "
          f"SIGKILLed while streaming them; another process running; STALE_AFTER {stack.env['CONVERSATIONS_STALE_AFTER']}s\n")
    table(["turns", "running when killed", "completed", "continued once (resumes = 1)", "not done",
           "last continued after the kill s", "last done after the kill s"],
          [[len(turn_ids), held, sum(s["status"] == "completed" for s in states), resumed,
            len(turn_ids) - len(states), f"{max(continued, default=float('nan')):.1f}", f"{last:.1f}"]])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", default="postgres", help='"postgres", "sqlite" or a DATABASE_URL')
    parser.add_argument("--visitors", type=int, default=60)
    parser.add_argument("--many", type=int, default=200)
    parser.add_argument("--kill", type=int, default=50)
    parser.add_argument("--words", type=int, default=30, help="words per answer, one every 0.1 s")
    parser.add_argument("--many-words", type=int, default=200, help="words per answer in the many part")
    parser.add_argument("--kill-words", type=int, default=100, help="words per answer in the kill part")
    parser.add_argument("--skip", default="", help="parts to leave out: crowd,many,kill")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))

    print(machine())
    provider = ProviderProcess(args.words)  # before Django is set up: a plain fork
    conversations = {"PROVIDER": "openai", "BASE_URL": provider.url, "API_KEY": "bench", "MODEL": "bench",
                     "STREAM": "true", "STALE_AFTER": 5, "ALLOWED_ENDPOINTS": "http://127.0.0.1:*"}
    try:
        with Stack(database=args.database, conversations=conversations) as stack:
            stack.provider = provider
            base = stack.gunicorn(2)
            if "crowd" not in skip:
                crowd(stack, base, args)
            if "many" not in skip:
                many(stack, base, args)
            if "kill" not in skip:
                kill(stack, base, args)
    finally:
        provider.close()


if __name__ == "__main__":
    main()
