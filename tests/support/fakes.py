"""A fake LLM provider: a real HTTP server on 127.0.0.1, speaking a provider's wire format.

Tests queue what the server does for each request it receives, in order::

    with FakeProvider() as fake:
        fake.add(openai_tool_calls(("search_faq", {"query": "refunds"})), openai_text("Done."))
        ... CONVERSATIONS = {"PROVIDER": "openai", "BASE_URL": fake.url, ...}
        fake.requests[0]["json"]["messages"]

A queued item is a dict (sent as a 200 JSON reply), a ``Reply`` (status, body, headers), or
a callable ``behaviour(handler)`` that writes whatever it likes to the socket (see the fault
helpers below). When the queue is empty the server answers with ``default`` (by default a
500 "script exhausted").

Faults below the HTTP layer are separate servers: ``SilentListener`` (accepts, never reads or
answers), ``full_accept_queue()`` (a connect that never completes) and ``refused_url()``.
"""

import contextlib
import email.utils
import json
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Reply:
    status: int = 200
    body: object = field(default_factory=dict)
    headers: dict = field(default_factory=dict)


def openai_text(text, *, finish_reason="stop", prompt_tokens=11, completion_tokens=7, model="fake-model"):
    """A Chat Completions reply with a final text answer."""
    return {
        "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                     "logprobs": None, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


def openai_tool_calls(*calls, prompt_tokens=13, completion_tokens=5, model="fake-model"):
    """A Chat Completions reply asking for tools: each call is ``(name, arguments)`` or ``(id, name, arguments)``."""
    tool_calls = []
    for number, call in enumerate(calls, start=1):
        call_id, name, arguments = call if len(call) == 3 else (f"call_{number}", *call)
        tool_calls.append({"id": call_id, "type": "function",
                           "function": {"name": name, "arguments": json.dumps(arguments)}})
    return {
        "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": tool_calls,
                                             "refusal": None},
                     "logprobs": None, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle on, the body waits ~30 ms for the
    # client's delayed ACK, on every reply.
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def do_POST(self):
        fake = self.server.fake
        behaviour = fake.next_behaviour()
        if getattr(behaviour, "reads_body", True):
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
        else:
            raw, body = b"", None
        fake.record({"method": "POST", "path": self.path, "headers": dict(self.headers), "json": body,
                     "raw": raw, "at": time.monotonic(), "client": self.client_address})
        if callable(behaviour):
            behaviour(self)
            return
        reply = behaviour if isinstance(behaviour, Reply) else Reply(body=behaviour)
        self.send_json(reply.status, reply.body, reply.headers)

    do_GET = do_POST

    def send_json(self, status, body, headers=None):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class FakeProvider:
    """The server; use as a context manager. ``url`` is its base URL (``http://127.0.0.1:PORT/v1``);
    ``host``, another loopback address (127.0.0.2), stands for another machine; ``port`` 0 takes a free one."""

    def __init__(self, default=None, host="127.0.0.1", port=0):
        self.default = default
        self._script = deque()
        self._lock = threading.Lock()
        self.requests = []
        self.sent_at = []  # when each streamed event left (tests/support/fake_stream.py)
        self.closed_at = None  # when the client closed a streamed reply's connection
        self.stop_event = threading.Event()
        self.server = _Server((host, port), _Handler)
        self.server.fake = self
        self.port = self.server.server_address[1]
        self.url = f"http://{host}:{self.port}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def add(self, *behaviours):
        with self._lock:
            self._script.extend(behaviours)
        return self

    def repeat(self, behaviour, times):
        return self.add(*([behaviour] * times))

    def next_behaviour(self):
        with self._lock:
            if self._script:
                return self._script.popleft()
        if self.default is not None:
            return self.default
        return Reply(500, {"error": {"message": "fake provider: script exhausted", "type": "server_error"}})

    def record(self, request):
        with self._lock:
            self.requests.append(request)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_event.set()
        self.server.shutdown()
        self.server.server_close()


# -- faults: callables that take the request handler ----------------------------------------

def hang(handler, seconds=3600):
    """Accept, read the request, never answer (until the test ends)."""
    handler.server.fake.stop_event.wait(seconds)
    handler.close_connection = True


def trickle_body(interval=0.5, body=None):
    """Send headers at once, then the body one byte per ``interval`` seconds."""
    def behaviour(handler):
        data = json.dumps(body or openai_text("slow")).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.flush()
        _drip(handler, data, interval)
    return behaviour


def trickle_headers(interval=0.5):
    """Send the status line and headers one byte per ``interval`` seconds."""
    def behaviour(handler):
        data = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Padding: " + b"x" * 200 + b"\r\n"
        _drip(handler, data, interval)
    return behaviour


def cut_short_then_stall(handler):
    """Promise a long body, send part of it, then go silent."""
    data = json.dumps(openai_text("cut")).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data) + 1000))
    handler.end_headers()
    handler.wfile.write(data[:10])
    handler.wfile.flush()
    hang(handler)


def reset_mid_body(handler):
    """Send part of the body, then reset the connection (RST)."""
    data = json.dumps(openai_text("reset")).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data[:10])
    handler.wfile.flush()
    handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    handler.connection.close()
    handler.close_connection = True


def malformed_json(handler):
    handler.send_json(200, b'{"choices": [{"message": ')


def _drip(handler, data, interval):
    for byte in data:
        if handler.server.fake.stop_event.wait(interval):
            return
        try:
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()
        except OSError:
            return
    handler.close_connection = True


def never_read(handler):
    """Never read the request body (a large upload blocks the client's send) and never answer."""
    hang(handler)


never_read.reads_body = False


def retry_after(seconds, *, status=429):
    """A 429 (or ``status``) with ``Retry-After: <seconds>``."""
    return Reply(status, {"error": {"message": "slow down", "type": "rate_limit"}}, {"Retry-After": str(seconds)})


def retry_after_date(seconds, *, status=429):
    """A 429 whose ``Retry-After`` is an HTTP date ``seconds`` from now (computed when it is sent)."""
    def behaviour(handler):
        when = email.utils.formatdate(time.time() + seconds, usegmt=True)
        handler.send_json(status, {"error": {"message": "slow down"}}, {"Retry-After": when})
    return behaviour


def retry_after_ms(milliseconds, *, status=429):
    """A 429 with OpenAI's ``retry-after-ms`` header."""
    return Reply(status, {"error": {"message": "slow down"}}, {"retry-after-ms": str(milliseconds)})


def unavailable(status=503):
    """A 5xx without ``Retry-After``."""
    return Reply(status, {"error": {"message": "overloaded", "type": "server_error"}})


def http_error(status, message="error", code=None):
    """An OpenAI-style error reply."""
    return Reply(status, {"error": {"message": message, "type": "invalid_request_error", "code": code}})


class SilentListener:
    """A TCP server that accepts connections and then neither reads nor answers."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.accepted = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted.append(conn)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(1)
        for conn in self.accepted:
            conn.close()
        self.sock.close()


@contextlib.contextmanager
def full_accept_queue():
    """Yield the URL of a listening socket whose accept queue is full: a connect to it never completes.

    ``listen(0)`` and nobody calling ``accept()``: once the queue holds what it can, Linux
    drops further SYNs and the client's ``connect()`` waits for ever.
    """
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    address = server.getsockname()
    fillers = []
    try:
        for _ in range(16):
            client = socket.socket()
            client.settimeout(0.2)
            try:
                client.connect(address)
            except OSError:
                client.close()
                break
            fillers.append(client)
        else:
            raise RuntimeError("could not fill the accept queue")
        yield f"http://{address[0]}:{address[1]}/v1"
    finally:
        for client in fillers:
            client.close()
        server.close()


def refused_url():
    """The URL of a port nothing listens on (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def together(size, text):
    """A provider behaviour that answers only once ``size`` requests are in flight at the same time."""
    barrier = threading.Barrier(size)

    def behaviour(handler):
        try:
            barrier.wait(timeout=20)
        except threading.BrokenBarrierError:
            handler.send_json(500, {"error": {"message": "fake provider: requests did not overlap"}})
            return
        handler.send_json(200, openai_text(text))
    return behaviour


def embeddings_from(concepts, size=8):
    """A behaviour of an OpenAI-compatible ``/v1/embeddings`` endpoint with deterministic vectors:
    each text's vector adds up the axes (0 … ``size`` - 1) of the words of ``concepts``
    (``{word: axis}``) it holds; a text holding none of them points along the last axis, which no
    word has. So two texts are as close in meaning as the concepts they share."""
    def behaviour(handler):
        body = handler.server.fake.requests[-1]["json"] or {}
        data = []
        for number, text in enumerate(body.get("input") or []):
            vector = [0.0] * size
            for word in "".join(c.lower() if c.isalnum() else " " for c in text).split():
                if word in concepts:
                    vector[concepts[word]] += 1.0
            if not any(vector):
                vector[-1] = 1.0
            data.append({"object": "embedding", "index": number, "embedding": vector})
        handler.send_json(200, {"object": "list", "data": data, "model": body.get("model", "")})
    return behaviour
