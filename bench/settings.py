"""The demo project's settings with the benchmarks' URLconf, and no per-visitor limits.

The throttles and the daily token budget exist to stop abuse of a public page; a benchmark
posting 200 turns from one address would trip them, which is not what it measures.
"""

from chatproject.settings import *  # noqa: F401,F403
from chatproject.settings import CONVERSATIONS

ROOT_URLCONF = "bench.urls"

CONVERSATIONS = {
    **CONVERSATIONS,
    "TURN_RATE_PER_OWNER": "",
    "TURN_RATE_PER_IP": "",
    "CONVERSATION_RATE_PER_OWNER": "",
    "CONVERSATION_RATE_PER_IP": "",
    "MAX_ACTIVE_TURNS_PER_ADDRESS": 0,
    "DAILY_TOKEN_BUDGET": 0,
    "MAX_TURNS_PER_CONVERSATION": 0,
}
