"""Django's Redis cache backend, with one ``redis.Redis`` client and connection pool per process.

Django's backend builds a new ``redis.Redis`` object for every cache operation; with
redis-py 8 that costs about as much as the Redis round trip itself, and the poll view and
the job's publishes are made of little else. And Django's cache handler (``caches``) builds a
cache object per thread, each with pools of its own: a ``ConcurrentWorker``'s turns, each in a
thread, each call's watchdog in another, opened a connection each. Here every cache object of a
process with the same location and options uses one client, and its one pool. Use it in place
of Django's backend::

    CACHES = {"default": {"BACKEND": "conversations.cache.RedisCache", "LOCATION": REDIS_URL}}

Everything else (serialisation, options) is Django's. ``redis.Redis`` objects are safe to
share between threads, and their pools reconnect after a fork.

The pool is redis-py's ``BlockingConnectionPool`` unless ``OPTIONS`` name a ``pool_class``: when
all its connections (``max_connections``, 100 here as in redis-py's own pool) are in use, a thread
waits for one (up to the pool's ``timeout``, 20 s) instead of failing. redis-py's default pool
raises ``MaxConnectionsError`` at once: with 200 turns in one process, one turn in ten crashed.
"""

import os
import threading

from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient
from django.utils.functional import cached_property


class ReusingRedisCacheClient(RedisCacheClient):
    """Django's client, keeping one ``redis.Redis`` per pool, and one pool per server even when
    threads ask for it at the same moment."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._clients = {}
        self._lock = threading.Lock()

    def _get_connection_pool(self, write):
        index = self._get_connection_pool_index(write)
        pool = self._pools.get(index)
        if pool is None:
            with self._lock:
                pool = self._pools.get(index)
                if pool is None:
                    pool = self._pools[index] = self._pool_class.from_url(self._servers[index], **self._pool_options)
        return pool

    def get_client(self, key=None, *, write=False):
        pool = self._get_connection_pool(write)
        client = self._clients.get(id(pool))
        if client is None:
            client = self._clients.setdefault(id(pool), self._client(connection_pool=pool))
        return client


def _forget_clients():
    """Start without the clients of the parent process: a lock another thread of the parent held
    at the fork would be held for good in the child."""
    global _clients_lock
    _clients.clear()
    _clients_lock = threading.Lock()


_clients = {}  # (servers, options) -> the process's ReusingRedisCacheClient for them
_clients_lock = threading.Lock()
os.register_at_fork(after_in_child=_forget_clients)


# Connections per pool, as redis-py's own default; a ConcurrentWorker's turns hold one only for a round trip.
POOL_SIZE = 100


class RedisCache(DjangoRedisCache):
    def __init__(self, server, params):
        super().__init__(server, params)
        self._class = ReusingRedisCacheClient
        if "pool_class" not in self._options:
            self._options = {"pool_class": "redis.BlockingConnectionPool", "max_connections": POOL_SIZE,
                             **self._options}

    @cached_property
    def _cache(self):
        """The process's client for this location and these options, shared by the cache objects
        of every thread (Django's ``caches`` makes one per thread)."""
        key = (tuple(self._servers), repr(sorted(self._options.items())))
        with _clients_lock:
            client = _clients.get(key)
            if client is None:
                client = _clients[key] = self._class(self._servers, **self._options)
        return client



def wait_for_connections(client):
    """Give redis-py ``client`` (one made elsewhere: django-rq makes the queue's and the worker's)
    a ``BlockingConnectionPool`` of the same size and connection settings, in place, so that
    everything holding the client (a worker and its queues) shares it: a thread then waits for a
    free connection instead of failing with ``MaxConnectionsError``. A pool of another kind (a
    Sentinel's, or one already blocking) is kept. Returns ``client``."""
    import redis

    pool = client.connection_pool
    if type(pool) is redis.ConnectionPool:
        client.connection_pool = redis.BlockingConnectionPool(
            connection_class=pool.connection_class, max_connections=pool.max_connections, **pool.connection_kwargs)
    return client
