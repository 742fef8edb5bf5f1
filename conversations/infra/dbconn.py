"""A running turn's database connection, handed back while the turn waits.

A turn touches the database at its step boundaries only (claim, each saved round-trip, the
final write) and spends the rest waiting on a provider or a tool. One turn per work horse may
keep its connection meanwhile; a ``ConcurrentWorker`` running many turns in threads of one
process must not (each thread would hold one, idle, and hundreds exceed PostgreSQL's
``max_connections``), so its threads ask for the connection to be closed before each wait. The
next query opens one again, or takes one from Django's pool (PostgreSQL's ``"pool"`` option).
SQLite's connections, which hold no server process, are kept.
"""

import contextvars

from django.db import connections

_release = contextvars.ContextVar("conversations_release_connections_between_steps", default=False)
_on_wait = contextvars.ContextVar("conversations_on_wait", default=None)


def release_between_steps(on_wait=None):
    """From now on in this thread (a new thread starts without it), ``release()`` closes the
    database connections, after calling ``on_wait()`` (if given): the worker learns that its turn
    is about to wait."""
    _release.set(True)
    _on_wait.set(on_wait)


def release():
    """Before a turn waits on a provider or a tool: close this thread's connections to a database
    server, if ``release_between_steps()`` was asked for in it; one inside a transaction is kept.
    A SQLite connection is kept too: it holds no server process, only the file, and opening it
    again cost more than the round-trip's own writes (the thread closes it when its job ends)."""
    if not _release.get():
        return
    on_wait = _on_wait.get()
    if on_wait is not None:
        on_wait()
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block and connection.vendor != "sqlite":
            connection.close()
