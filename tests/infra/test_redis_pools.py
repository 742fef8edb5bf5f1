"""A process's threads share its Redis clients: the cache's (``conversations.cache.RedisCache``)
and the queue's (``infra.queue.get_queue``). When every connection of a pool is in use, a thread
waits for one; it does not fail. redis-py's default pool raises ``MaxConnectionsError`` at once
(100 connections since redis-py 8): in a ``ConcurrentWorker`` of 200 turns, one in ten crashed.
The worker's own client (RQ's bookkeeping in every job's thread) is another one, made by
django-rq. Here pools of 2 connections are shared by 24 threads."""

import threading

import django_rq
import pytest
from django.core.cache import caches

from conversations.infra import queue
from conversations.worker import ConcurrentWorker

THREADS, ROUNDS = 24, 25


def in_threads(work):
    """Run ``work(n)`` in THREADS threads at once; returns the exceptions they raised."""
    errors, start = [], threading.Barrier(THREADS)

    def run(n):
        start.wait()
        try:
            for _ in range(ROUNDS):
                work(n)
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return errors


def test_threads_wait_for_a_connection_of_the_caches_pool(settings):
    location = settings.CACHES["default"]["LOCATION"]
    settings.CACHES = {**settings.CACHES, "narrow": {"BACKEND": "conversations.cache.RedisCache",
                                                     "LOCATION": location, "OPTIONS": {"max_connections": 2}}}
    cache = caches["narrow"]

    def work(n):
        cache.set(f"pool-test:{n}", n)
        assert cache.get(f"pool-test:{n}") == n
        cache.incr("pool-test:count")

    cache.set("pool-test:count", 0)
    assert in_threads(work) == []
    assert cache.get("pool-test:count") == THREADS * ROUNDS


def test_a_pool_class_the_site_names_is_kept(settings):
    location = settings.CACHES["default"]["LOCATION"]
    settings.CACHES = {**settings.CACHES, "own": {"BACKEND": "conversations.cache.RedisCache", "LOCATION": location,
                                                  "OPTIONS": {"pool_class": "redis.ConnectionPool"}}}
    import redis

    client = caches["own"]._cache.get_client(write=True)
    assert type(client.connection_pool) is redis.ConnectionPool


@pytest.fixture
def narrow_queues(settings, monkeypatch):
    """The turns' queue on clients whose pools have 2 connections (``max_connections`` in its URL)."""
    name = next(iter(settings.RQ_QUEUES))
    conf = settings.RQ_QUEUES[name]
    settings.RQ_QUEUES = {**settings.RQ_QUEUES, name: {**conf, "URL": conf["URL"] + "?max_connections=2"}}
    monkeypatch.setattr(queue, "_connections", {})
    return name


def the_queues_client(name):
    return queue.get_queue().connection


def a_concurrent_workers_client(name):
    """What ``manage.py rqworker`` builds: django-rq makes the client, the worker and its queues share it."""
    return django_rq.get_worker(name, worker_class=ConcurrentWorker).connection


@pytest.mark.parametrize("client_of", [the_queues_client, a_concurrent_workers_client])
def test_threads_wait_for_a_connection_of_rqs_pool(narrow_queues, client_of):
    connection = client_of(narrow_queues)
    assert connection.connection_pool.max_connections == 2
    connection.delete("pool-test:queue")

    def work(n):
        connection.incr("pool-test:queue")
        connection.ping()

    try:
        assert in_threads(work) == []
        assert int(connection.get("pool-test:queue")) == THREADS * ROUNDS
    finally:
        connection.delete("pool-test:queue")
