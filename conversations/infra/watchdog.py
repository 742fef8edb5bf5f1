"""The sockets of a provider call, within reach of a watchdog.

``requests`` only knows per-socket-operation timeouts, and closing a socket from another thread
does not wake a blocked ``recv``; ``shutdown()`` does, within milliseconds. So every
connection a provider call opens (plain or TLS, new or kept alive) hands its socket to the
attempt's ``Watchdog``, which shuts them all down when the attempt's total limit passes or
when the turn is stopped. No SIGALRM is used: that would disarm RQ's own job-timeout alarm; and
no thread per attempt: two threads of the process serve every watchdog in it (``_Watchdogs``).
"""

import contextvars
import functools
import os
import socket
import threading
import time
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

# The phases of an attempt, as a time-out names them.
CONNECT, SEND, FIRST_BYTE, BODY = "connecting", "sending the request", "waiting for the first byte", "between bytes"

_current_watchdog = contextvars.ContextVar("conversations_http_watchdog", default=None)
_current_guard = contextvars.ContextVar("conversations_http_address_guard", default=None)


class AddressRefused(OSError):
    """Every address the endpoint's host resolved to is one it may not connect to."""


class AddressGuard:
    """Lets the connections of one attempt go only to addresses ``allowed(ip)`` accepts: the
    host is resolved once, the address checked, and the socket connected to that very address
    (TLS still verifies the host name), so a second lookup cannot hand out another one (DNS
    rebinding). Use as a context manager around the attempt; ``refused`` then says why a
    connection was refused, if one was."""

    def __init__(self, allowed):
        self.allowed = allowed
        self.refused = ""

    def address_for(self, host, port):
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = list(dict.fromkeys(info[4][0] for info in infos))
        for address in addresses:
            if self.allowed(address):
                return address
        self.refused = f"{host} resolves to {', '.join(addresses)}, which this endpoint may not connect to"
        raise AddressRefused(self.refused)

    def __enter__(self):
        self._token = _current_guard.set(self)
        return self

    def __exit__(self, *exc):
        _current_guard.reset(self._token)
        return False


def stopped(check):
    """Whether ``check()`` (the turn's stop flag; None: never) says the turn was stopped. An
    unreadable flag (Redis down) stops nothing: a call is never ended on a guess."""
    if check is None:
        return False
    try:
        return bool(check())
    except Exception:  # noqa: BLE001 - e.g. RedisError
        return False


class Watchdog:
    """Shuts down every socket an attempt opened once ``limit`` seconds have passed, or as soon as
    ``cancelled()`` (looked at every ``poll`` seconds; None: never) says the turn was stopped.

    Use as a context manager around the attempt; afterwards ``expired`` or ``cancelled`` says
    why its sockets were shut, if they were. The process's ``_Watchdogs`` serves them all.
    """

    poll = 0.1  # seconds between two looks at the stop flag: Stop lands within about this

    def __init__(self, limit, cancelled=None):
        self.limit = max(0.0, limit)
        self.expired = False
        self.cancelled = False
        # Where the attempt is (set by its connection, see ``_WatchedConnection``), so that a
        # time-out names the phase it ended in: one of ``PHASES``.
        self.phase = CONNECT
        self.deadline = None  # when it fires (time.monotonic), from the moment it is entered
        self._check_cancel = cancelled
        self._sockets = []
        self._lock = threading.Lock()
        self._left = False  # the attempt is over: its sockets (maybe kept alive for another) are not its any more

    def watch(self, sock):
        with self._lock:
            self._sockets.append(sock)
            if self.expired or self.cancelled:
                _shutdown(sock)

    def read_timeout(self, seconds):
        """From now on, each read of the attempt's sockets waits at most ``seconds`` (a stream
        that has begun: its idle limit)."""
        with self._lock:
            for sock in self._sockets:
                try:
                    sock.settimeout(seconds)
                except OSError:
                    pass  # closed, or a plain socket whose descriptor moved to its TLS wrapper

    def _fire(self, why):
        with self._lock:
            if self._left or self.expired or self.cancelled:
                return
            setattr(self, why, True)
            for sock in self._sockets:
                _shutdown(sock)

    @property
    def fired(self):
        return self.expired or self.cancelled

    def __enter__(self):
        self._token = _current_watchdog.set(self)
        self.deadline = time.monotonic() + self.limit
        _watchdogs.add(self)
        return self

    def __exit__(self, *exc):
        with self._lock:
            self._left = True
        _watchdogs.remove(self)
        _current_watchdog.reset(self._token)
        return False


class _Watchdogs:
    """Every watchdog of this process, served by two threads started with the first: one fires
    each at its limit (it waits and shuts sockets, nothing else, so nothing can hold a limit up),
    the other looks at the stop flag of each that has one every ``Watchdog.poll`` seconds (a look
    may wait on Redis). A thread per attempt, each woken every 0.1 s, cost a ``ConcurrentWorker``
    streaming 200 answers about a third as much CPU again as reading the streams."""

    def __init__(self):
        self._forget()
        # A forked child (a work horse) has none of its parent's threads: it starts its own.
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self):
        self._changed = threading.Condition()
        self._active = set()
        self._started = False

    def add(self, watchdog):
        with self._changed:
            self._active.add(watchdog)
            if not self._started:
                self._started = True
                for target, name in ((self._expire, "conversations-watchdog"),
                                     (self._look, "conversations-stop-looks")):
                    threading.Thread(target=target, name=name, daemon=True).start()
            self._changed.notify_all()

    def remove(self, watchdog):
        with self._changed:
            self._active.discard(watchdog)

    def _expire(self):
        with self._changed:
            while True:
                now = time.monotonic()
                for watchdog in [w for w in self._active if w.deadline <= now]:
                    self._active.discard(watchdog)
                    watchdog._fire("expired")
                deadlines = [w.deadline for w in self._active]
                self._changed.wait(min(deadlines) - now if deadlines else None)

    def _look(self):
        while True:
            with self._changed:
                while not any(w._check_cancel is not None for w in self._active):
                    self._changed.wait()
            time.sleep(Watchdog.poll)
            with self._changed:
                looking = [w for w in self._active if w._check_cancel is not None]
            for watchdog in looking:
                if stopped(watchdog._check_cancel):
                    watchdog._fire("cancelled")
                    self.remove(watchdog)


_watchdogs = _Watchdogs()


def _set_phase(phase):
    watchdog = _current_watchdog.get()
    if watchdog is not None:
        watchdog.phase = phase


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
    """Hands every socket (plain, then TLS-wrapped; new or reused) to the current watchdog, and
    tells it which phase the attempt is in."""

    def _new_conn(self):
        _set_phase(CONNECT)
        guard = _current_guard.get()
        if guard is None:
            sock = super()._new_conn()
        else:
            # Connect to the address checked, not to whatever a second lookup says. urllib3 looks
            # up ``_dns_host``; ``host`` (the Host header, TLS's server name) derives from it too,
            # so it is put back as soon as the socket is connected.
            host = self._dns_host
            self._dns_host = guard.address_for(self.host, self.port)
            try:
                sock = super()._new_conn()
            finally:
                self._dns_host = host
        _watch(sock)
        return sock

    def connect(self):
        _set_phase(CONNECT)
        super().connect()
        _watch(self.sock)
        _set_phase(SEND)

    def request(self, *args, **kwargs):
        _watch(self.sock)  # a kept-alive connection does not connect again
        _set_phase(SEND if self.sock is not None else CONNECT)  # a plain connection connects on its first send
        result = super().request(*args, **kwargs)
        _set_phase(FIRST_BYTE)
        return result

    def getresponse(self, *args, **kwargs):
        _set_phase(FIRST_BYTE)
        response = super().getresponse(*args, **kwargs)
        _set_phase(BODY)
        return response


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
    over the API key's; a process looks the environment up once per origin (a change to it is
    taken, as any setting, by a restart) and never reads netrc. By origin, since what the
    environment sets depends on the scheme, host and port only (``NO_PROXY`` names hosts, the
    proxy is picked by scheme): a forking worker's parent that looked its providers' origins up
    (``engine.job.warm_up``) spares every work horse the scan.
    """
    parts = urlsplit(url)
    proxies, verify = _environment_for(f"{parts.scheme}://{parts.netloc}")
    return {"proxies": dict(proxies), "verify": verify}


@functools.lru_cache(maxsize=256)
def _environment_for(origin):
    found = requests.Session().merge_environment_settings(origin, {}, None, None, None)
    return tuple(found["proxies"].items()), found["verify"]
