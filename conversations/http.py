"""The one place that makes a provider HTTP call.

``requests`` only knows per-socket-operation timeouts: a provider that trickles its headers
or body a byte at a time never trips them. Here every attempt gets a *total* wall-clock
limit, ``min(CALL_TIMEOUT, remaining)``: a watchdog timer shuts the attempt's sockets down
when the limit passes, which wakes a blocked ``recv``/``send`` within milliseconds. No
SIGALRM is used, because that would disarm RQ's own job-timeout alarm.

Retries (connection errors, 408, 429, 5xx) stay inside the same budget: the wait before the
next attempt honours ``Retry-After`` (seconds, HTTP date) and ``retry-after-ms``, otherwise a
jittered exponential back-off, and is never taken when the attempt after it could not get
``MIN_CALL_BUDGET`` seconds.

Not bounded: DNS resolution (``getaddrinfo`` cannot be interrupted); use IP addresses or a
local resolver cache when that matters.
"""

import contextvars
import email.utils
import json
import logging
import random
import socket
import threading
import time
from dataclasses import dataclass, field

import requests
from requests.adapters import HTTPAdapter
from urllib3 import exceptions as urllib3_exceptions
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from .budget import BudgetExhausted
from .types import Outcome, record_call

logger = logging.getLogger("conversations.http")

SKIPPED_MESSAGE = "Skipped call — job budget exhausted"

# 529: Anthropic's "overloaded".
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504, 529})

_current_watchdog = contextvars.ContextVar("conversations_http_watchdog", default=None)


class _Watchdog:
    """Shuts down every socket an attempt opened once ``limit`` seconds have passed."""

    def __init__(self, limit):
        self.expired = False
        self._sockets = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(max(0.0, limit), self._fire)
        self._timer.daemon = True

    def watch(self, sock):
        with self._lock:
            self._sockets.append(sock)
            if self.expired:
                _shutdown(sock)

    def _fire(self):
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                _shutdown(sock)

    def __enter__(self):
        self._token = _current_watchdog.set(self)
        self._timer.start()
        return self

    def __exit__(self, *exc):
        self._timer.cancel()
        _current_watchdog.reset(self._token)
        return False


def _shutdown(sock):
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed, or a socket object whose descriptor moved to its TLS wrapper


def _watch(sock):
    watchdog = _current_watchdog.get()
    if watchdog is not None and sock is not None:
        watchdog.watch(sock)


class _WatchedConnection:
    """Hands every socket (plain, then TLS-wrapped; new or reused) to the current watchdog."""

    def _new_conn(self):
        sock = super()._new_conn()
        _watch(sock)
        return sock

    def connect(self):
        super().connect()
        _watch(self.sock)

    def request(self, *args, **kwargs):
        _watch(self.sock)  # a kept-alive connection does not connect again
        return super().request(*args, **kwargs)


class _HTTPConnection(_WatchedConnection, HTTPConnection):
    pass


class _HTTPSConnection(_WatchedConnection, HTTPSConnection):
    pass


class _HTTPConnectionPool(HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSConnectionPool(HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


_POOL_CLASSES = {"http": _HTTPConnectionPool, "https": _HTTPSConnectionPool}


class WatchedAdapter(HTTPAdapter):
    """A ``requests`` adapter whose connections report their sockets to the attempt's watchdog."""

    def __init__(self):
        super().__init__(max_retries=0)  # retries are ours, inside the budget

    def init_poolmanager(self, *args, **kwargs):
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(_POOL_CLASSES)

    def proxy_manager_for(self, *args, **kwargs):
        manager = super().proxy_manager_for(*args, **kwargs)
        manager.pool_classes_by_scheme = dict(_POOL_CLASSES)
        return manager


def new_session():
    """A ``requests`` session whose sockets the watchdog can reach. It does not read the
    environment on each call (see ``environment_settings``)."""
    session = requests.Session()
    session.trust_env = False
    adapter = WatchedAdapter()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def environment_settings(url):
    """The proxies (``HTTPS_PROXY``, ``NO_PROXY``…) and CA bundle (``REQUESTS_CA_BUNDLE``) the
    environment sets for ``url``, as ``requests.Session.request`` keyword arguments.

    ``requests`` looks these up on every call, scanning the whole environment each time, and
    also reads ``~/.netrc``, whose credentials it would send as an ``Authorization`` header
    over the API key's; a turn looks the environment up once per URL and never reads netrc.
    """
    found = requests.Session().merge_environment_settings(url, {}, None, None, None)
    return {"proxies": found["proxies"], "verify": found["verify"]}


class CallFailed(Exception):
    """An attempt (or the last of several) produced no usable response.

    ``outcome`` is an ``Outcome``; ``status``, ``body`` and ``headers``
    are set for HTTP errors. The message never contains request headers (where API keys live).
    """

    def __init__(self, outcome, detail, *, status=None, body="", headers=None, retryable=False):
        super().__init__(detail)
        self.outcome = outcome
        self.detail = detail
        self.status = status
        self.body = body
        self.headers = headers or {}
        self.retryable = retryable

    def json(self):
        """The error body parsed as JSON, or ``{}``."""
        try:
            value = json.loads(self.body)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


@dataclass
class Response:
    status: int
    data: dict
    headers: dict = field(default_factory=dict)


def parse_retry_after(headers, now=None):
    """Seconds to wait according to ``retry-after-ms`` or ``Retry-After`` (seconds or HTTP date), or None."""
    lowered = {k.lower(): v for k, v in (headers or {}).items()}
    value = lowered.get("retry-after-ms")
    if value:
        try:
            return max(0.0, float(value) / 1000.0)
        except ValueError:
            pass
    value = lowered.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def ensure_call_budget(budget, minimum, *, turn_id="", name="", attempt=1, recorder=None):
    """Called before every model call and every attempt of one: returns None when ``budget``
    still has ``minimum`` seconds (``MIN_CALL_BUDGET``) left. Otherwise the call is refused —
    logged at error level, recorded as skipped — and BudgetExhausted is raised."""
    if budget.can_start(minimum):
        return
    remaining = budget.remaining()
    logger.error(
        SKIPPED_MESSAGE,
        extra={"turn_id": turn_id, "call": name, "attempt": attempt, "remaining": round(remaining, 3)},
    )
    record_call(recorder, "model", name, Outcome.SKIPPED, attempt=attempt, started_offset=budget.elapsed(),
                remaining_before=remaining, detail=SKIPPED_MESSAGE)
    raise BudgetExhausted(SKIPPED_MESSAGE)


class BudgetedHTTP:
    """Makes JSON POSTs to a provider within a turn's budget.

    ``recorder(**fields)`` is called once per attempt with the fields of a ``CallRecord``.
    ``sleep`` and ``random`` are class attributes so tests can replace them.
    """

    sleep = staticmethod(time.sleep)
    random = random.Random()

    def __init__(self, budget, config, *, recorder=None, name="", turn_id="", session=None):
        self.budget = budget
        self.config = config
        self.recorder = recorder
        self.name = name
        self.turn_id = turn_id
        self.session = session or new_session()
        self._environment = {}

    def close(self):
        self.session.close()

    def post_json(self, url, payload, headers):
        """POST ``payload`` as JSON; return a ``Response`` with the parsed body.

        Raises ``CallFailed`` for an error the retries could not get past (or that is not
        retried: 4xx other than 408/429, a body that is not JSON), and ``BudgetExhausted``
        when the next attempt could not have ``MIN_CALL_BUDGET`` seconds.
        """
        cfg = self.config
        max_attempts = max(1, int(cfg["MAX_ATTEMPTS"]))
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json", **headers}
        attempt = 0
        while True:
            attempt += 1
            ensure_call_budget(self.budget, cfg["MIN_CALL_BUDGET"], turn_id=self.turn_id, name=self.name,
                               attempt=attempt, recorder=self.recorder)
            try:
                return self._attempt(url, body, headers, attempt)
            except CallFailed as failure:
                if not failure.retryable or attempt >= max_attempts:
                    raise
                wait = parse_retry_after(failure.headers)
                if wait is None:
                    wait = self._backoff(attempt)
                if self.budget.remaining() - wait < cfg["MIN_CALL_BUDGET"]:
                    logger.warning(
                        "Not retrying %s: waiting %.1fs would leave less than %ss",
                        self.name, wait, cfg["MIN_CALL_BUDGET"],
                        extra={"turn_id": self.turn_id, "attempt": attempt},
                    )
                    raise
                self.sleep(wait)

    def _backoff(self, attempt):
        base = float(self.config["BACKOFF_BASE"]) * (2 ** (attempt - 1))
        return min(float(self.config["BACKOFF_MAX"]), base) * (0.5 + self.random.random() / 2)

    def _attempt(self, url, body, headers, attempt):
        cfg = self.config
        remaining = self.budget.remaining()
        limit = self.budget.call_timeout(cfg["CALL_TIMEOUT"])
        connect = min(float(cfg["CONNECT_TIMEOUT"]), limit)
        started_offset = self.budget.elapsed()
        started = time.monotonic()
        outcome, status, detail = Outcome.OK, None, ""
        try:
            with _Watchdog(limit) as watchdog:
                try:
                    if url not in self._environment:
                        self._environment[url] = environment_settings(url)
                    # Never follow a redirect: requests strips only Authorization on the way,
                    # so an x-api-key or api-key header would reach whatever host it names.
                    reply = self.session.post(url, data=body, headers=headers, timeout=(connect, limit),
                                              allow_redirects=False, **self._environment[url])
                    content = reply.content  # read inside the watchdog: the body is what trickles
                except requests.RequestException as exc:
                    if watchdog.expired:
                        outcome, detail = Outcome.TIMEOUT, f"no complete response within {limit:.1f}s"
                    elif _timed_out(exc):  # a socket timeout: connect, or a send the server never read
                        outcome, detail = Outcome.TIMEOUT, f"{_describe(exc)}: timed out (connect limit {connect:.1f}s)"
                    else:
                        outcome, detail = Outcome.CONNECTION_ERROR, _describe(exc)
                    raise CallFailed(outcome, detail, retryable=True) from None
                if watchdog.expired:  # a body without a length "ends" when its socket is shut down
                    outcome, detail = Outcome.TIMEOUT, f"no complete response within {limit:.1f}s"
                    raise CallFailed(outcome, detail, retryable=True)
            status = reply.status_code
            if 300 <= status < 400:  # the Location is not quoted: it may carry a token of its own
                outcome, detail = "http_error", f"HTTP {status} redirect, not followed"
                raise CallFailed(outcome, detail, status=status)
            if status >= 400:
                outcome, detail = Outcome.HTTP_ERROR, f"HTTP {status}"
                raise CallFailed(
                    outcome, detail, status=status, body=content.decode("utf-8", "replace")[:4000],
                    headers=dict(reply.headers), retryable=status in RETRY_STATUSES,
                )
            try:
                data = json.loads(content)
                if not isinstance(data, dict):
                    raise ValueError("not a JSON object")
            except ValueError as exc:
                outcome, detail = Outcome.BAD_RESPONSE, f"malformed JSON from the provider ({exc})"[:200]
                raise CallFailed(outcome, detail, status=status, body=content[:4000].decode("utf-8", "replace"))
            return Response(status=status, data=data, headers=dict(reply.headers))
        finally:
            duration = time.monotonic() - started
            logger.info(
                "provider call turn=%s name=%s attempt=%d timeout=%.2f remaining=%.2f duration=%.3f outcome=%s status=%s",
                self.turn_id, self.name, attempt, limit, remaining, duration, outcome, status,
                extra={
                    "turn_id": self.turn_id, "attempt": attempt, "timeout": round(limit, 3),
                    "remaining": round(remaining, 3), "duration": round(duration, 3), "outcome": outcome,
                },
            )
            record_call(self.recorder, "model", self.name, outcome, attempt=attempt, started_offset=started_offset,
                        timeout=limit, remaining_before=remaining, duration=duration, status_code=status, detail=detail)


def _timed_out(exc):
    """Whether a socket timeout caused ``exc``.

    ``requests`` raises ``Timeout`` only for some of them: a send that timed out (a server
    that never reads a large upload) or a read timeout in the body arrives as a plain
    ``ConnectionError`` or ``ChunkedEncodingError`` wrapping one.
    """
    seen = set()
    pending = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        # urllib3's NewConnectionError subclasses ConnectTimeoutError even for "connection refused".
        timeout_types = (requests.Timeout, TimeoutError, urllib3_exceptions.TimeoutError)
        if isinstance(current, timeout_types) and not isinstance(current, urllib3_exceptions.NewConnectionError):
            return True
        pending += [current.__cause__, current.__context__, getattr(current, "reason", None)]
        pending += [arg for arg in getattr(current, "args", ()) if isinstance(arg, BaseException)]
    return False


def _describe(exc):
    """A short, secret-free description of a connection failure (no URL query, no headers)."""
    name = type(exc).__name__
    reason = str(exc.args[0]) if exc.args else ""
    if "Connection refused" in reason:
        return f"{name}: connection refused"
    if "reset" in reason.lower():
        return f"{name}: connection reset"
    if "IncompleteRead" in reason or "incomplete" in reason.lower():
        return f"{name}: response cut short"
    return name
