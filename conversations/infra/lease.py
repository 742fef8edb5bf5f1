"""A worker process's lease on its turns: how a process that dies without a word (SIGKILL, the
OOM killer) is noticed within seconds, and how a process that was only frozen learns it lost them.

A process holding a lease renews it every ``BEAT`` seconds from a thread that does nothing else
(one Redis round trip); the lease lives ``TTL`` seconds. Once it has expired, anyone who looks
(another worker's reaper, the poll view, a Stop) may declare the process dead — one Lua script,
so a renewal and a declaration never both succeed: either the renewal came first and the process
lives on, or the declaration came first and every later renewal fails. A process whose renewal
fails has lost its turns to continuations and must stop them quietly (``lost``).

Keys, each naming the turns' queue (``QUEUE``), as RQ's own keys do, so that two sites sharing
one Redis database never reap each other's workers: ``conversations:lease:<queue>:<worker>``
(the lease, its value the epoch of its last renewal), ``conversations:lease:<queue>:<worker>:dead``
(the declaration, kept a day), and the hash ``conversations:leases:<queue>`` (every holder not yet
reaped, with when it was last seen).
"""

import threading
import time

from ..conf import get_config

# The lease lives TTL seconds and is renewed every BEAT: a process is taken for dead TTL − BEAT to
# TTL seconds after its last renewal, and only after a freeze of nearly TTL seconds (a SIGSTOP, a
# stalled host) while it lives. A renewal is one Redis round trip from a thread of its own, which
# a Python thread gets within milliseconds even beside a CPU-bound one (the GIL's switch interval).
TTL, BEAT = 2.0, 0.25
DEAD_FOR = 86400  # how long a declaration is kept: a process frozen that long still learns it

# Set in a process whose lease was lost: every turn it runs stops quietly (``engine.runner``).
lost = threading.Event()
_held = threading.Condition()
_until = None  # time.monotonic() until which this process's lease is surely alive; None: it holds none


def fence(timeout=TTL):
    """Whether this process may write for its turns: at once True in a process that holds no lease
    (the web server, a work horse), else once its lease is known to be alive. A process frozen past
    its lease (SIGSTOP) wakes with every thread at once; a write waits here until the lease thread
    has renewed the lease (True) or learnt it was lost (False), so that nothing written after the
    freeze lands over what the turn's continuation wrote meanwhile (the lease thread learns it in
    one round trip once it runs). After ``timeout`` seconds without an answer it is True: the
    database's own check (the turn's job) still holds, and a process whose lease thread is merely
    late (a loaded host) must not hold every publish of its turns back for longer."""
    deadline = time.monotonic() + timeout
    with _held:
        while not lost.is_set() and _until is not None and time.monotonic() >= _until:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            _held.wait(min(left, BEAT))
        return not lost.is_set()


def _set_held(until):
    global _until
    with _held:
        _until = until
        _held.notify_all()

# KEYS: the lease, its declaration, the holders; ARGV: TTL in ms, the worker's name, now (epoch s).
_RENEW = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[1])
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
return 1
"""

# KEYS: the lease, its declaration, the holders; ARGV: the worker's name, DEAD_FOR.
# 1: dead (declared now or before); 0: its lease is alive; -1: it never held one.
_DECLARE = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 1 end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 0 then return -1 end
redis.call('SET', KEYS[2], 1, 'EX', ARGV[2])
return 1
"""


def _queue():
    return get_config()["QUEUE"]


def holders_key():
    return f"conversations:leases:{_queue()}"


def lease_key(name):
    return f"conversations:lease:{_queue()}:{name}"


def dead_key(name):
    return f"{lease_key(name)}:dead"


def _keys(name):
    return lease_key(name), dead_key(name), holders_key()


def renew(connection, name):
    """Renew this process's lease as worker ``name`` (taking it the first time); False once it was
    declared dead (then ``lost`` is set: ``fence`` refuses every write from now on)."""
    sent = time.monotonic()
    if connection.eval(_RENEW, 3, *_keys(name), int(TTL * 1000), name, repr(time.time())):
        _set_held(sent + TTL - BEAT)  # a BEAT short of its expiry in Redis: another clock runs there
        return True
    lost.set()
    _set_held(None)
    return False


def release(connection, name):
    """Give the lease up on a clean exit: the process's turns have ended or been handed over."""
    _set_held(None)
    with connection.pipeline() as pipeline:
        pipeline.delete(lease_key(name))
        pipeline.hdel(holders_key(), name)
        pipeline.execute()


def declare_dead(connection, name):
    """Whether worker ``name`` is dead: True if its lease has expired (it is declared dead now, for
    good) or was declared before, False while it lives, None if it never held a lease (a forking
    worker, or one from before leases: its death is noticed another way)."""
    found = connection.eval(_DECLARE, 3, *_keys(name), name, DEAD_FOR)
    return None if found == -1 else bool(found)


def holders(connection):
    """``{worker name: when it last renewed its lease (epoch s)}`` for every holder not yet reaped."""
    return {_text(name): float(seen) for name, seen in connection.hgetall(holders_key()).items()}


def expired(connection, names):
    """Those of ``names`` whose lease key is gone (candidates for ``declare_dead``), in one round trip."""
    with connection.pipeline(transaction=False) as pipeline:
        for name in names:
            pipeline.exists(lease_key(name))
        found = pipeline.execute()
    return [name for name, alive in zip(names, found) if not alive]


def reaped(connection, name):
    """Forget dead worker ``name`` once its turns were continued or ended (its declaration stays)."""
    connection.hdel(holders_key(), name)


def claim_reaping(connection, name, seconds=30):
    """Whether this caller is the one to reap dead worker ``name`` now (the others skip it)."""
    return bool(connection.set(f"{lease_key(name)}:reaping", 1, nx=True, ex=seconds))


def _text(value):
    return value.decode() if isinstance(value, bytes) else value
