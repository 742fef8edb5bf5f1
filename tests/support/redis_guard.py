"""Refuse to run the suite on a Redis database that holds data (it is flushed between tests).

`python3 dev.py test` starts a private, empty Redis server unless REDIS_URL is set, so this
only stops a run pointed (by REDIS_URL) at a Redis that is in use.
"""

import os

import pytest
import redis


def ensure_empty_redis():
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    client = redis.Redis.from_url(url)
    try:
        size = client.dbsize()
    except redis.RedisError as exc:
        pytest.exit(f"The tests need a Redis server at {url} ({exc}). Run them with `python3 dev.py test`.", 2)
    if size and os.environ.get("CONVERSATIONS_TEST_ALLOW_FLUSH") != "1":
        pytest.exit(
            f"Redis at {url} is not empty ({size} keys) and the tests flush it. Run `python3 dev.py test` "
            "(it starts a private Redis) or set REDIS_URL to an empty database.", 2)

