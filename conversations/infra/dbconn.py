"""A running turn's database connection, kept or handed back while the turn waits.

A turn touches the database at its step boundaries only (claim, each saved round-trip, the
final write) and spends the rest waiting on a provider or a tool. One turn per work horse may
keep its connection meanwhile; a ``ConcurrentWorker`` running many turns in threads of one
process must not let each keep one (each would be idle, and hundreds exceed PostgreSQL's
``max_connections``). Closing it before every wait cost a new connection per step, though: on
PostgreSQL a connect, its first statement and the close took 5–6 ms of wall time and 1 ms of
the worker's CPU (and a server process forked), against 0.12–0.16 ms and 0.1 ms for the
statement on a kept one (``bench.pg_connect``), five times in a 3-round tool turn. So the
process gives its waiting turns a budget (``WORKER_IDLE_CONNECTIONS``): a thread that finds a
free place in it keeps its PostgreSQL connection across its waits until its job ends; the
others close theirs before each wait and open one again at the next query. A kept connection is
never in a transaction while it waits (one inside a transaction is never given up, and never
waited with), and one the server closed meanwhile (restarted, terminated by an administrator,
timed out) is closed at the wait's end, so that the next step opens a new one instead of
failing; the site's ``CONN_HEALTH_CHECKS`` then applies to its next query, as at a request's
start.

With Django's pool (PostgreSQL's ``"pool"`` option) a close hands the connection back to the
pool, whose ``max_size`` bounds what is kept, and the next step takes one from it, no connect
made (0.2–0.3 ms in ``bench.pg_connect``): there it is closed before every wait, as before.
SQLite's connections, which hold no server process, are always kept; other database servers'
are closed before every wait, as before.
"""

import contextlib
import contextvars
import select

from django.db import connections, transaction

_release = contextvars.ContextVar("conversations_release_connections_between_steps", default=False)
_on_wait = contextvars.ContextVar("conversations_on_wait", default=None)
_budget = contextvars.ContextVar("conversations_idle_connection_budget", default=None)
_kept = contextvars.ContextVar("conversations_kept_connections", default=None)


def release_between_steps(on_wait=None, budget=None):
    """From now on in this thread (a new thread starts without it), ``waiting()`` closes the
    database connections, after calling ``on_wait()`` (if given): the worker learns that its turn
    is about to wait. ``budget``: the process's ``threading.BoundedSemaphore`` of connections its
    waiting turns may keep instead; each one kept holds a place until ``close_all()``."""
    _release.set(True)
    _on_wait.set(on_wait)
    _budget.set(budget)
    _kept.set(set())


@contextlib.contextmanager
def waiting():
    """Around a turn's wait on a provider or a tool, if ``release_between_steps()`` was asked for
    in this thread: before it, each of this thread's PostgreSQL connections is kept if it holds a
    place in the budget or finds a free one, and closed otherwise; one inside a transaction is
    kept (see the module's docstring for the other databases). After it, a kept one the server
    closed meanwhile is closed, and its place given back."""
    if not _release.get():
        yield
        return
    on_wait = _on_wait.get()
    if on_wait is not None:
        on_wait()
    for connection in connections.all(initialized_only=True):
        if connection.in_atomic_block or connection.vendor == "sqlite" or _keeps(connection):
            continue
        connection.close()
    try:
        yield
    finally:
        for alias in list(_kept.get()):
            connection = connections[alias]
            if connection.connection is None or _closed_by_server(connection):
                _give_up(connection)
            else:
                connection.health_check_done = False  # CONN_HEALTH_CHECKS checks it before its next query


def close_all():
    """Close this thread's database connections, and give the places in the budget they held back
    (a ``ConcurrentWorker``'s thread, when its job ends: the next job runs in another)."""
    for connection in connections.all(initialized_only=True):
        _give_up(connection)


def _keeps(connection):
    """Whether ``connection`` (PostgreSQL's, unpooled, open, not in a transaction) may stay open
    during this wait: it holds a place in the budget, or took a free one now."""
    kept, budget = _kept.get(), _budget.get()
    if connection.alias in kept:
        return True
    if connection.vendor != "postgresql" or connection.pool is not None or connection.connection is None \
            or budget is None or not budget.acquire(blocking=False):
        return False
    kept.add(connection.alias)
    return True


def _give_up(connection):
    """Close ``connection``, its place in the budget (if it held one) given back first: a close that
    raises must not keep the place taken."""
    kept = _kept.get()
    if kept is not None and connection.alias in kept:
        kept.remove(connection.alias)
        _budget.get().release()
    connection.close()


def _closed_by_server(connection):
    """Whether ``connection`` was closed while it waited, idle: the driver knows it already, or the
    server sent it something, which is then its closing notice (a terminated backend, a server
    shutting down, an idle timeout) or the end of the stream; no round trip is made to find out."""
    if connection.connection.closed:
        return True
    sent = select.poll()  # not select(): a busy worker's sockets may be numbered past its FD_SETSIZE of 1024
    sent.register(connection.connection.fileno(), select.POLLIN)
    return bool(sent.poll(0))


# The SQL that turns a running turn's step commits asynchronous, for its transaction only.
ASYNC_COMMIT = "SET LOCAL synchronous_commit TO OFF"
_unsent = contextvars.ContextVar("conversations_step_async_commit_unsent", default=None)


@contextlib.contextmanager
def step():
    """``transaction.atomic()`` for a running turn's own intermediate writes (its claim, each saved
    round-trip), whose commit need not wait for the disk: on PostgreSQL ``synchronous_commit`` is
    off for this transaction only (``SET LOCAL``). Its rows are visible to every other session at
    the commit, as ever, and a killed worker loses none of them; only a crash of the database
    server itself may lose the last fraction of a second of such commits, never leaving the
    database inconsistent (a turn whose server crashed fails with it: the dead-job net ends it).
    Each commit waited for a disk flush, milliseconds on an ordinary disk, more than the whole of
    the round-trip's own statements; a turn makes one per round-trip. SQLite's counterpart is the
    write-ahead log with ``synchronous=NORMAL`` of the demo's settings (docs/deployment.md). The
    final write keeps the site's own setting, and so does a transaction this one is nested in.

    The ``SET LOCAL`` travels with the step's first statement sent through ``folded()`` (one
    network round trip, not two: a step's round trips to a loaded database server were most of
    its time), when the driver binds parameters on the client (psycopg 3's default in Django,
    which then sends statements as one string); PostgreSQL reads the setting only at the commit.
    Otherwise, or when the step sent none that way, it is sent on its own."""
    connection = transaction.get_connection()
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if not (outermost and connection.vendor == "postgresql"):
            yield
            return
        if not binds_on_client(connection):
            with connection.cursor() as cursor:
                cursor.execute(ASYNC_COMMIT)
            yield
            return
        token = _unsent.set(connection)
        try:
            yield
            if _unsent.get() is connection:
                with connection.cursor() as cursor:
                    cursor.execute(ASYNC_COMMIT)
        finally:
            _unsent.reset(token)


@contextlib.contextmanager
def lone_step():
    """``step()`` for a write of one statement (a turn's claim), without a transaction of its own
    where that statement can commit by itself as the step's would: the ``BEGIN`` and ``COMMIT``
    were two of its three round trips to the database. Outside any transaction, on PostgreSQL
    where the driver binds on the client the step's ``SET LOCAL`` goes in the statement's own
    string (``folded``), which PostgreSQL runs as one implicit transaction, its commit not waiting
    for the disk as a step's; on SQLite the statement is its own transaction, holding the write
    lock only while it runs. Elsewhere (inside the caller's transaction, another driver or
    database) it is ``step()``. The body sends exactly one statement, through ``statements``, or
    several sent as one string where that string is a transaction of its own
    (``one_string_transaction``: a round trip's save, ``runner.TurnRunner.commit_mine``)."""
    connection = transaction.get_connection()
    alone = (connection.vendor == "sqlite" and not connection.in_atomic_block) or one_string_transaction(connection)
    if not alone:
        with step():
            yield
        return
    token = _unsent.set(connection if connection.vendor == "postgresql" else None)
    try:
        yield
    finally:
        _unsent.reset(token)


def folded(connection, sql):
    """``sql`` to send on ``connection``, with the ``SET LOCAL`` of the step it is sent in appended
    when that is still to be sent (``step``): the statement's own result comes first, so its
    row count and rows read as before."""
    if _unsent.get() is not connection:
        return sql
    _unsent.set(None)
    return f"{sql}; {ASYNC_COMMIT}"


def one_string_transaction(connection):
    """Whether statements sent together on ``connection`` as one string (``statements.send``) run
    as one transaction of their own, committed at the string's end and rolled back whole by an
    error in any of them: PostgreSQL runs a string of several statements so (its implicit
    transaction), which it gets as one where the driver binds on the client, outside any
    transaction. A step sent so needs no ``BEGIN`` and no ``COMMIT``, two of its three round trips;
    its ``SET LOCAL`` (``lone_step``) applies to that transaction as to an explicit one."""
    return binds_on_client(connection) and not connection.in_atomic_block and connection.get_autocommit()


def binds_on_client(connection):
    """Whether ``connection`` sends a statement and its parameters as one string, in which several
    statements may go, each with a result of its own: PostgreSQL through psycopg 3's client-side
    cursors, Django's default for it (the ``server_side_binding`` option turns them off). psycopg2
    would keep only the last statement's result; SQLite's driver refuses more than one."""
    return connection.vendor == "postgresql" and connection.Database.__name__ == "psycopg" and \
        connection.settings_dict["OPTIONS"].get("server_side_binding") is not True
