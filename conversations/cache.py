"""Django's Redis cache backend, keeping one ``redis.Redis`` client per connection pool.

Django's backend builds a new ``redis.Redis`` object for every cache operation; with
redis-py 8 that costs about as much as the Redis round trip itself, and the poll view and
the job's publishes are made of little else. Use it in place of Django's backend::

    CACHES = {"default": {"BACKEND": "conversations.cache.RedisCache", "LOCATION": REDIS_URL}}

Everything else (serialisation, pools, options) is Django's. ``redis.Redis`` objects are
safe to share between threads, and their pools reconnect after a fork.
"""

from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient


class ReusingRedisCacheClient(RedisCacheClient):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._clients = {}

    def get_client(self, key=None, *, write=False):
        pool = self._get_connection_pool(write)
        client = self._clients.get(id(pool))
        if client is None:
            client = self._clients[id(pool)] = self._client(connection_pool=pool)
        return client


class RedisCache(DjangoRedisCache):
    def __init__(self, server, params):
        super().__init__(server, params)
        self._class = ReusingRedisCacheClient
