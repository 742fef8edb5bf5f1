"""A worker leaves RQ's pubsub channel at once when it stops (a warm shutdown, the end of a burst).

RQ's teardown sends UNSUBSCRIBE, then stops the thread that listens on the worker's channel.
redis-py 8.2's ``stop()`` joins that thread, and a thread that had read the reply first went back
to waiting for a message for RQ's 60 s: the worker's exit took a minute now and then, on a loaded
host (seen in the suite: a burst worker's ``work()`` returned 60 s late).
Real Redis, each worker class the app ships."""

import threading
import time

import pytest

from tests.support.helpers import make_worker, wait_for


@pytest.mark.django_db
def test_a_worker_leaves_its_channel_at_once_even_when_held_up_right_after_unsubscribing(worker_class):
    worker = make_worker(worker_class)
    worker.subscribe()
    wait_for(lambda: worker.pubsub.subscribed, timeout=5)
    send_unsubscribe = worker.pubsub.unsubscribe

    def held_up(*args, **kwargs):
        # The worker's own thread descheduled just after UNSUBSCRIBE went out, as on a busy host:
        # the listening thread reads the reply before it is told to stop.
        result = send_unsubscribe(*args, **kwargs)
        time.sleep(0.5)
        return result

    worker.pubsub.unsubscribe = held_up
    leaving = threading.Thread(target=worker.unsubscribe, daemon=True)
    started = time.monotonic()
    leaving.start()
    leaving.join(15)

    assert not leaving.is_alive(), "the worker was still leaving its channel after 15 s"
    assert time.monotonic() - started < 5
    worker.pubsub_thread.join(5)
    assert not worker.pubsub_thread.is_alive()
