"""The provider HTTP path against a real server on 127.0.0.1 that misbehaves in every way we know.

Every call must end near its total limit ``min(CALL_TIMEOUT, remaining)`` whatever the server
does, and record what happened. Bounds are generous (limit + 1 s); the measured overruns are
in ``bench/deadlines.py`` and ``docs/deadlines.md``.
"""

import contextlib
import logging
import socket
import threading
import time

import pytest
from redis.exceptions import RedisError

from conversations.core.budget import Budget, BudgetExhausted
from conversations.infra.http import SKIPPED_MESSAGE, BudgetedHTTP, CallFailed
from conversations.infra.watchdog import Watchdog, new_session
from tests.support.fakes import (
    FakeProvider, SilentListener, cut_short_then_stall, full_accept_queue, hang, malformed_json, never_read,
    openai_text, refused_url, reset_mid_body, retry_after, retry_after_date, retry_after_ms, trickle_body,
    trickle_headers, unavailable,
)

LIMIT = 1.0
SLACK = 1.0

CONFIG = {
    "CALL_TIMEOUT": LIMIT,
    # Larger than the limit, so that only the total limit can end a stalled connect.
    "CONNECT_TIMEOUT": 5,
    "MIN_CALL_BUDGET": 0.5,
    "MAX_ATTEMPTS": 1,
    "BACKOFF_BASE": 0.05,
    "BACKOFF_MAX": 0.2,
}

BIG_UPLOAD = {"messages": [{"role": "user", "content": "x" * (16 << 20)}]}


class Call:
    """One ``post_json`` through a fresh ``BudgetedHTTP``; keeps its records, result and elapsed time."""

    def __init__(self, budget=10.0, http=None, **config):
        self.records = []
        self.budget = Budget(budget)
        self.http = http or BudgetedHTTP(self.budget, {**CONFIG, **config}, recorder=self.record, name="fake-model")
        self.http.budget = self.budget

    def record(self, **fields):
        self.records.append(fields)

    def post(self, base_url, payload=None):
        self.error = self.response = None
        started = time.monotonic()
        try:
            self.response = self.http.post_json(base_url + "/chat/completions", payload or {"model": "m"}, {})
        except (CallFailed, BudgetExhausted) as exc:
            self.error = exc
        self.elapsed = time.monotonic() - started
        return self

    @property
    def outcomes(self):
        return [r["outcome"] for r in self.records]


def served_by(behaviour):
    fake = FakeProvider()
    fake.add(behaviour)
    return fake


STALLS = {
    "silent after accept": lambda: SilentListener(),
    "server reads the request, never answers": lambda: served_by(hang),
    "body trickled a byte at a time": lambda: served_by(trickle_body(0.1)),
    "headers trickled a byte at a time": lambda: served_by(trickle_headers(0.1)),
    "body cut short, then stall": lambda: served_by(cut_short_then_stall),
    "connect never completes": full_accept_queue,
}


@pytest.mark.parametrize("fault", list(STALLS))
def test_stalled_call_ends_at_its_total_limit_as_a_timeout(fault):
    with STALLS[fault]() as server:
        url = server if isinstance(server, str) else server.url
        call = Call().post(url)

    assert isinstance(call.error, CallFailed) and call.error.outcome == "timeout"
    assert LIMIT - 0.05 <= call.elapsed <= LIMIT + SLACK
    (record,) = call.records
    assert record["outcome"] == "timeout" and record["timeout"] == pytest.approx(LIMIT)
    assert record["attempt"] == 1 and record["status_code"] is None
    assert LIMIT - 0.05 <= record["duration"] <= LIMIT + SLACK
    assert record["remaining_before"] == pytest.approx(10.0, abs=0.2)


def test_upload_the_server_never_reads_ends_at_the_limit():
    with served_by(never_read) as fake:
        call = Call().post(fake.url, BIG_UPLOAD)

    assert call.error.outcome == "timeout"
    # The payload is encoded before the attempt starts; the attempt itself is what is bounded,
    # and it ends at the limit, not before (the send really blocked).
    assert LIMIT - 0.05 <= call.records[0]["duration"] <= LIMIT + SLACK


def test_watchdog_shutdown_wakes_a_blocked_send():
    """A socket with no timeout at all, blocked in ``sendall`` to a peer that never reads."""
    with served_by(never_read) as fake, socket.create_connection(("127.0.0.1", fake.port)) as sock:
        sock.settimeout(None)
        sock.sendall(b"POST /v1 HTTP/1.1\r\nHost: x\r\nContent-Length: 67108864\r\n\r\n")
        started = time.monotonic()
        with Watchdog(0.5) as watchdog, pytest.raises(OSError):
            watchdog.watch(sock)
            sock.sendall(b"x" * (64 << 20))
        elapsed = time.monotonic() - started
    assert watchdog.expired
    assert 0.45 <= elapsed <= 0.5 + SLACK


def test_watchdog_shutdown_wakes_a_blocked_receive():
    with SilentListener() as server, socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.settimeout(None)
        started = time.monotonic()
        with Watchdog(0.5) as watchdog:
            watchdog.watch(sock)
            assert sock.recv(1) == b""  # woken by shutdown(), as if the peer had closed
        elapsed = time.monotonic() - started
    assert 0.45 <= elapsed <= 0.5 + SLACK


def test_stall_on_a_kept_alive_connection_is_cut_too():
    """A reused connection does not connect again; its socket must still be watched."""
    with FakeProvider() as fake:
        fake.add(openai_text("first"), trickle_body(0.1))
        http = BudgetedHTTP(Budget(10), CONFIG, session=new_session())
        first = Call(http=http).post(fake.url)
        second = Call(http=http).post(fake.url)

    assert first.response.data["choices"][0]["message"]["content"] == "first"
    assert fake.requests[0]["client"] == fake.requests[1]["client"]  # the same connection
    assert second.error.outcome == "timeout"
    assert LIMIT - 0.05 <= second.elapsed <= LIMIT + SLACK


def test_call_after_an_aborted_one_succeeds_on_a_fresh_connection():
    with FakeProvider() as fake:
        fake.add(hang, openai_text("hello again"))
        http = BudgetedHTTP(Budget(10), CONFIG)
        aborted = Call(http=http).post(fake.url)
        after = Call(http=http).post(fake.url)

    assert aborted.error.outcome == "timeout"
    assert after.error is None and after.response.data["choices"][0]["message"]["content"] == "hello again"
    assert after.elapsed < 1
    assert fake.requests[0]["client"] != fake.requests[1]["client"]


def test_parallel_calls_each_end_at_their_own_limit():
    calls = {}

    def call_with_budget(limit, url):
        # The budget starts in the thread, right before its call: on a loaded machine a thread can
        # start late, and building the client (a requests session, its TLS context) took over
        # 0.3 s of the 0.5 s budget once, so that call was skipped rather than timed out.
        call = Call(CALL_TIMEOUT=60, MIN_CALL_BUDGET=0.2)
        call.http.budget = call.budget = Budget(limit)
        calls[limit] = call.post(url)

    with FakeProvider() as fake:
        fake.repeat(hang, 3)
        threads = [threading.Thread(target=call_with_budget, args=(limit, fake.url)) for limit in (0.5, 1.0, 1.5)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)

    assert sorted(calls) == [0.5, 1.0, 1.5]  # a thread that raised would leave its call out
    for limit, call in calls.items():
        assert call.error.outcome == "timeout"
        assert limit - 0.05 <= call.elapsed <= limit + SLACK, (limit, call.elapsed)
        assert call.records[0]["timeout"] == pytest.approx(limit, abs=0.05)


def test_many_attempts_in_flight_share_two_watchdog_threads_and_each_ends_at_its_own_limit():
    """A ``ConcurrentWorker`` has hundreds of calls in flight: their watchdogs are served by two
    threads of the process, not one each, and every one still fires at its own limit; a Stop
    reaches only the attempt whose turn was stopped."""
    limits = [0.3 + 0.02 * n for n in range(40)]
    stop = threading.Event()
    fired_at = {}
    with contextlib.ExitStack() as stack:
        before = threading.active_count()
        started = time.monotonic()
        watchdogs = [stack.enter_context(Watchdog(limit, cancelled=lambda: False)) for limit in limits]
        stopped = stack.enter_context(Watchdog(30, cancelled=stop.is_set))
        threads = threading.active_count() - before
        stop.set()
        deadline = started + max(limits) + SLACK
        while len(fired_at) < len(limits) + 1 and time.monotonic() < deadline:
            for watchdog in watchdogs + [stopped]:
                if watchdog.fired and watchdog not in fired_at:
                    fired_at[watchdog] = time.monotonic() - started
            time.sleep(0.005)

    assert threads <= 2  # none at all once the process's two run
    assert all(watchdog.expired for watchdog in watchdogs) and stopped.cancelled and not stopped.expired
    late = [(limit, round(fired_at[w], 3)) for limit, w in zip(limits, watchdogs)
            if not limit - 0.01 <= fired_at[w] <= limit + 0.25]
    assert late == []
    assert fired_at[stopped] < 0.5


def test_a_watchdog_whose_attempt_is_over_never_shuts_its_sockets():
    """A kept-alive connection goes back to the pool when its attempt ends: a limit passing later
    must not shut it under the next attempt."""
    with SilentListener() as server, socket.create_connection(("127.0.0.1", server.port)) as sock:
        with Watchdog(0.1) as watchdog:
            watchdog.watch(sock)
        time.sleep(0.3)
        sock.settimeout(0.2)
        with pytest.raises(socket.timeout):  # still open: a shut socket would read b"" at once
            sock.recv(1)
    assert not watchdog.fired


def test_budget_below_the_connect_timeout_bounds_the_connect():
    with full_accept_queue() as url:
        call = Call(budget=1.0, CALL_TIMEOUT=60, CONNECT_TIMEOUT=10).post(url)

    assert call.error.outcome == "timeout"
    assert 0.95 <= call.elapsed <= 1.0 + SLACK
    assert call.records[0]["timeout"] == pytest.approx(1.0, abs=0.05)


def test_spent_budget_makes_no_connection_at_all(caplog):
    with SilentListener() as server:
        call = Call(budget=0.2)  # below MIN_CALL_BUDGET (0.5): no call may start
        with caplog.at_level(logging.ERROR, logger="conversations.http"):
            call.post(server.url)
        time.sleep(0.1)  # give the listener a chance to see a connection, had there been one
        accepted = list(server.accepted)

    assert isinstance(call.error, BudgetExhausted)
    assert accepted == []
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(logging.ERROR, SKIPPED_MESSAGE)]
    (record,) = call.records
    assert (record["outcome"], record["timeout"], record["duration"]) == ("skipped", 0, 0)


def test_connection_refused_is_a_connection_error_and_is_retried():
    call = Call(MAX_ATTEMPTS=3).post(refused_url())

    assert call.error.outcome == "connection_error"
    assert "connection refused" in call.error.detail
    assert call.outcomes == ["connection_error"] * 3
    assert [r["attempt"] for r in call.records] == [1, 2, 3]
    assert call.elapsed < 2


def test_connection_reset_mid_body_is_retried_then_succeeds():
    with FakeProvider() as fake:
        fake.add(reset_mid_body, openai_text("after the reset"))
        call = Call(MAX_ATTEMPTS=3).post(fake.url)

    assert call.error is None
    assert call.outcomes == ["connection_error", "ok"]
    assert call.records[0]["detail"].endswith("connection reset")


def test_malformed_json_is_a_bad_response_and_not_retried():
    with FakeProvider() as fake:
        fake.add(malformed_json, openai_text("never asked for"))
        call = Call(MAX_ATTEMPTS=3).post(fake.url)

    assert call.error.outcome == "bad_response"
    assert call.outcomes == ["bad_response"]
    assert len(fake.requests) == 1


def gaps(fake):
    times = [r["at"] for r in fake.requests]
    return [b - a for a, b in zip(times, times[1:])]


@pytest.mark.parametrize("reply, low, high", [
    (retry_after(1), 1.0, 1.0 + SLACK),
    (retry_after_ms(300), 0.3, 0.3 + SLACK),
    (retry_after_date(2), 0.9, 2.0 + SLACK),  # an HTTP date has one-second resolution
], ids=["seconds", "retry-after-ms", "http-date"])
def test_retry_after_inside_the_budget_is_honoured(reply, low, high):
    with FakeProvider() as fake:
        fake.add(reply, openai_text("now it works"))
        call = Call(MAX_ATTEMPTS=3).post(fake.url)

    assert call.error is None
    assert call.outcomes == ["http_error", "ok"]
    assert call.records[0]["status_code"] == 429 and call.records[1]["status_code"] == 200
    (gap,) = gaps(fake)
    assert low <= gap <= high


def test_retry_after_beyond_the_budget_gives_up_at_once():
    with FakeProvider() as fake:
        fake.add(retry_after(30), openai_text("too late"))
        call = Call(budget=5, MAX_ATTEMPTS=3).post(fake.url)

    assert call.error.status == 429 and call.error.outcome == "http_error"
    assert len(fake.requests) == 1
    assert call.elapsed < 1


def test_503_without_retry_after_backs_off_and_retries():
    with FakeProvider() as fake:
        fake.add(unavailable(), unavailable(), openai_text("third time lucky"))
        call = Call(MAX_ATTEMPTS=3).post(fake.url)

    assert call.error is None
    assert call.outcomes == ["http_error", "http_error", "ok"]
    # Jittered exponential back-off: base 0.05 then 0.1, each scaled by 0.5–1.0.
    first, second = gaps(fake)
    assert 0.025 <= first <= 0.05 + SLACK and 0.05 <= second <= 0.1 + SLACK


def test_an_unreadable_stop_flag_does_not_end_the_wait_before_a_retry():
    def flag():
        raise RedisError("Redis is down")

    with FakeProvider() as fake:
        fake.add(unavailable(), openai_text("answered after the wait"))
        call = Call(MAX_ATTEMPTS=2, BACKOFF_BASE=0.3, BACKOFF_MAX=0.3)
        call.http.cancelled = flag
        call.post(fake.url)

    assert call.error is None and call.outcomes == ["http_error", "ok"]


def test_503_every_time_ends_after_max_attempts():
    with FakeProvider() as fake:
        fake.repeat(unavailable(), 5)
        call = Call(MAX_ATTEMPTS=3).post(fake.url)

    assert call.error.status == 503
    assert len(fake.requests) == 3 and call.outcomes == ["http_error"] * 3


@pytest.mark.parametrize("status", [400, 401, 403, 404])
def test_client_errors_are_not_retried(status):
    with FakeProvider() as fake:
        fake.repeat(unavailable(status), 3)
        call = Call(MAX_ATTEMPTS=3).post(fake.url)

    assert call.error.status == status and not call.error.retryable
    assert len(fake.requests) == 1


def test_retries_stop_when_the_next_attempt_could_not_get_its_minimum():
    """Each hang eats the call's limit; the third attempt would start with too little left."""
    with FakeProvider() as fake:
        fake.repeat(hang, 3)
        call = Call(budget=2.8, CALL_TIMEOUT=1.0, MIN_CALL_BUDGET=1.0, MAX_ATTEMPTS=5).post(fake.url)

    assert call.error.outcome == "timeout"
    assert call.outcomes == ["timeout", "timeout"]
    assert call.elapsed <= 2.8


@pytest.mark.parametrize("fault", ["upload never read", "connect never completes"])
def test_socket_timeout_before_the_total_limit_is_recorded_as_a_timeout(fault):
    """With CONNECT_TIMEOUT under the limit, the connect (and the send of the request) end first,
    on the socket's own timeout; that is still a timeout, not a connection error."""
    with contextlib.ExitStack() as stack:
        if fault == "upload never read":
            url = stack.enter_context(served_by(never_read)).url
        else:
            url = stack.enter_context(full_accept_queue())
        call = Call(CONNECT_TIMEOUT=0.5).post(url, BIG_UPLOAD)

    assert call.error.outcome == "timeout" and call.error.retryable
    phase = "sending the request" if fault == "upload never read" else "connecting"
    assert call.error.detail.endswith(f"timed out {phase} (connect limit 0.5s)")
    assert 0.45 <= call.records[0]["duration"] <= 0.5 + SLACK


@pytest.mark.parametrize("why", ["expired", "cancelled"])
def test_a_socket_handed_to_the_watchdog_after_it_fired_is_shut_at_once(why):
    """A connection opened after the call's limit passed (or after a Stop) must not block its
    thread: the watchdog will never fire again for it."""
    limit, cancelled = (0.05, None) if why == "expired" else (30, lambda: True)
    with SilentListener() as server, socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.settimeout(2)  # only so that a failure does not hang the suite
        with Watchdog(limit, cancelled=cancelled) as watchdog:
            deadline = time.monotonic() + 2
            while not watchdog.fired and time.monotonic() < deadline:
                time.sleep(0.01)
            started = time.monotonic()
            watchdog.watch(sock)
            assert sock.recv(1) == b""  # shut down, as if the peer had closed
            elapsed = time.monotonic() - started
    assert getattr(watchdog, why) and elapsed < 0.5


def test_a_tls_failure_names_the_endpoint_and_says_tls():
    with FakeProvider() as fake:  # plain HTTP: a TLS handshake with it fails
        port = fake.url.split(":")[2].split("/")[0]
        call = Call(MAX_ATTEMPTS=1).post(fake.url.replace("http://", "https://"))

    assert call.error.outcome == "connection_error"
    assert call.error.detail.startswith(f"SSLError to 127.0.0.1:{port}: TLS: ")


def test_the_environments_proxies_are_looked_up_by_origin_and_no_proxy_still_holds(monkeypatch):
    """Looked up once per origin, the proxies are still the environment's for each host: one that
    ``NO_PROXY`` names goes direct, whatever the path, and another through the proxy."""
    from conversations.infra import watchdog

    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("NO_PROXY", "direct.invalid")
    watchdog._environment_for.cache_clear()
    try:
        direct = [watchdog.environment_settings(f"https://direct.invalid/v1/{path}") for path in ("a", "b?x=1")]
        proxied = watchdog.environment_settings("https://api.invalid:8443/v1/chat/completions")
    finally:
        watchdog._environment_for.cache_clear()

    assert [settings["proxies"].get("https") for settings in direct] == [None, None]
    assert proxied["proxies"]["https"] == "http://proxy.invalid:3128"
