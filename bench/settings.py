"""The demo project's settings with the benchmarks' URLconf, and no per-visitor limits.

The throttles and the daily token budget exist to stop abuse of a public page; a benchmark
posting 200 turns from one address would trip them, which is not what it measures.
"""

import os

from chatproject.settings import *  # noqa: F401,F403
from chatproject.settings import CONVERSATIONS, DATABASES, INSTALLED_APPS, RQ_QUEUES

ROOT_URLCONF = "bench.urls"

# Off unless a benchmark asks for one through CONVERSATIONS_<KEY> (``bench.common.Stack``), which the
# demo's settings have already read into CONVERSATIONS: a bench's own setting wins over these.
_UNLIMITED = {
    "TURN_RATE_PER_OWNER": "",
    "TURN_RATE_PER_IP": "",
    "CONVERSATION_RATE_PER_OWNER": "",
    "CONVERSATION_RATE_PER_IP": "",
    "MAX_ACTIVE_TURNS_PER_ADDRESS": 0,
    "DAILY_TOKEN_BUDGET": 0,
    "MAX_TURNS_PER_CONVERSATION": 0,
}
CONVERSATIONS = {**CONVERSATIONS, **{key: value for key, value in _UNLIMITED.items()
                                     if not os.environ.get(f"CONVERSATIONS_{key}")}}

# On PostgreSQL, Django's connection pool (psycopg_pool, the "postgres" extra), as
# docs/deployment.md recommends with the concurrent worker: its turns hand their connection
# back before every wait, and without a pool each takes a new one, a new server process with
# cold caches. BENCH_DB_POOL=0 measures without it. Not for the forking worker: its work horses
# would inherit the parent's pool, its sockets and none of its threads.
_FORKING = os.environ.get("RQ_WORKER_CLASS") in ("conversations.worker.Worker", "rq.Worker")
if (DATABASES["default"]["ENGINE"].endswith("postgresql") and os.environ.get("BENCH_DB_POOL", "1") == "1"
        and not _FORKING):
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # the pool keeps them; Django refuses both
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {"min_size": 1, "max_size": 10}

# bench.turn_overhead's queues, one per worker process it starts (each worker class of the app,
# RQ's own forking and non-forking workers for the naive job), all on the same Redis.
RQ_QUEUES = {**RQ_QUEUES, **{name: next(iter(RQ_QUEUES.values())) for name in ("default", "forking", "bare", "simple",
                                                                            "default-traced", "forking-traced")}}

# bench.turn_trace: each process logs the steps of its jobs to a file in that directory.
if os.environ.get("BENCH_TRACE"):
    INSTALLED_APPS = [*INSTALLED_APPS, "bench.turn_trace.Tracing"]
