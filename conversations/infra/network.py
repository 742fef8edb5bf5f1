"""Where a connection failed and why, in words an operator can act on.

A bare ``ConnectionError`` in a log says nothing about which of the site's services broke, or
how. These helpers name the endpoint (host and port only: never a URL's user, password, path
or query, where keys sometimes travel) and the operating system's reason (connection refused,
name not known, a TLS failure…), found in the exception's chain. Used for provider calls
(``http``), Redis (the API's 503, the admin's 500, the deploy check) and ``provider_health``.
"""

import socket
import ssl
from urllib.parse import urlsplit


def endpoint(url):
    """``host:port`` of ``url`` (the scheme's default port when it names none); "" when it names no host."""
    try:
        parts = urlsplit(str(url))
        port = parts.port
    except ValueError:
        return ""
    if not parts.hostname:
        return ""
    default = {"http": 80, "https": 443, "redis": 6379, "rediss": 6379, "unix": None}.get(parts.scheme)
    port = port or default
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{port}" if port else host


def _chain(exc):
    """``exc`` and every exception behind it (causes, contexts, urllib3's ``reason``, wrapped
    arguments), breadth first, each once."""
    seen, pending = set(), [exc]
    while pending:
        current = pending.pop(0)
        if current is None or id(current) in seen or not isinstance(current, BaseException):
            continue
        seen.add(id(current))
        yield current
        pending += [current.__cause__, current.__context__, getattr(current, "reason", None)]
        pending += [arg for arg in getattr(current, "args", ()) if isinstance(arg, BaseException)]


def os_reason(exc):
    """The operating system's reason behind ``exc``, lower case ("connection refused", "name not
    known (Name or service not known)", "TLS: certificate verify failed…"), or "" when none is found."""
    for current in _chain(exc):
        if isinstance(current, ssl.SSLCertVerificationError):
            return f"TLS: {current.verify_message or current.reason or 'certificate verify failed'}"
        if isinstance(current, ssl.SSLError):
            return f"TLS: {current.reason or current.strerror or type(current).__name__}"
        if isinstance(current, socket.gaierror):
            return f"name not known ({current.strerror})" if current.strerror else "name not known"
        if isinstance(current, ConnectionRefusedError):
            return "connection refused"
        if isinstance(current, ConnectionResetError):
            return "connection reset"
        if isinstance(current, OSError) and current.strerror:
            return current.strerror[:1].lower() + current.strerror[1:]
    return ""


def failed_endpoint(exc):
    """``host:port`` that ``exc`` (from requests/urllib3) failed to reach, or ""."""
    request = getattr(exc, "request", None)
    if getattr(request, "url", None):
        return endpoint(request.url)
    for current in _chain(exc):
        pool = getattr(current, "pool", None) or getattr(current, "conn", None)
        if getattr(pool, "host", None):
            return f"{pool.host}:{pool.port}" if getattr(pool, "port", None) else pool.host
    return ""


def redis_endpoint(url):
    """Where a Redis URL points, for a log or a check: ``host:port`` and the database, no password."""
    where = endpoint(url)
    try:
        parts = urlsplit(str(url))
    except ValueError:
        return where
    if parts.scheme == "unix":
        return f"unix socket {parts.path}"
    database = parts.path.strip("/")
    return f"{where} (database {database})" if database else where


def describe_redis_error(exc):
    """A Redis error in one line: redis-py's own words name host, port and reason ("Error 111
    connecting to 127.0.0.1:6390. Connection refused."), where its ``repr`` says only
    ``network:ConnectionError``. redis-py never puts the password in them."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
