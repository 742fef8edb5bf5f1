"""A few rows of docs/providers.md's failure table through the real LiteLLM proxy, by hand: not
collected by the suite (CI needs no LiteLLM), run on purpose as docs/providers.md says
("Measured through the real LiteLLM proxy"). The fake upstream is the suite's fake provider on
port 18938; the proxy (its config in that section) listens on 127.0.0.1:4038. Each row's result is
printed as one JSON line."""

import json
import time

import pytest

from conversations.models import CallRecord
from tests.support.fake_stream import openai_stream, streaming
from tests.support.fake_wire import openai_error, run_turn_here
from tests.support.fakes import FakeProvider, Reply, openai_text

pytestmark = pytest.mark.django_db(transaction=True)

ANSWER = "Refunds are paid within 30 days."
GATEWAY = "http://127.0.0.1:4038/v1"
GATEWAY_KEY = "sk-gateway-master-0123456789"  # the config's master_key
UPSTREAM_PORT = 18938  # the config's api_base

ROWS = {
    "plain answer": (lambda: streaming(openai_stream(ANSWER)), {}),
    "401 upstream": (lambda: openai_error(401, "Incorrect API key provided: sk-upst****6789.",
                                          code="invalid_api_key"), {}),
    "unknown model at the gateway": (lambda: None, {"MODEL": "nope"}),
    "a key the gateway does not know": (lambda: None, {"API_KEY": "sk-wrong-gateway-key-000"}),
    "429 upstream, Retry-After 1": (lambda: Reply(429, openai_error(429, "Rate limit reached for gpt-4o-mini",
                                                                    code="rate_limit_exceeded").body,
                                                  {"Retry-After": "1"}), {}),
    "500 upstream": (lambda: openai_error(500, "The server had an error while processing your request.",
                                          type="server_error"), {}),
    "refusal before text": (lambda: openai_error(400, "The response was filtered due to the prompt triggering Azure "
                                                      "OpenAI's content management policy.", code="content_filter"), {}),
    "refusal after text": (lambda: streaming(openai_stream("Here is how to", finish="content_filter")), {}),
    "upstream answers a stream request with JSON": (lambda: openai_text(ANSWER), {}),
    "stream cut after text": (lambda: streaming(openai_stream(ANSWER, done=False)[:4], then="reset"), {}),
}


@pytest.fixture(scope="module")
def upstream():
    # One server for every row: the gateway keeps its connections to the upstream open.
    with FakeProvider(port=UPSTREAM_PORT) as fake:
        yield fake


@pytest.mark.parametrize("case", list(ROWS))
def test_through_litellm(conversations_settings, upstream, case):
    make, settings = ROWS[case]
    upstream._script.clear()
    upstream.requests.clear()
    if make() is not None:
        upstream.add(*[make() for _ in range(12)])  # the gateway's own retries take more than one
    time.sleep(6)  # the gateway cools its one deployment down for 5 s after a failure
    conversations_settings.update(**{**dict(PROVIDER="openai", BASE_URL=GATEWAY, MODEL="gpt-4o-mini",
                                            API_KEY=GATEWAY_KEY, MAX_ATTEMPTS=1, CALL_TIMEOUT=20, JOB_TIMEOUT=60,
                                            DEADLINE_MARGIN=10, STREAM_IDLE_TIMEOUT=10, TOOLS=[]), **settings})
    started = time.monotonic()
    turn = run_turn_here("How do refunds work?")
    lines = [f"{r.get_outcome_display()}: {r.detail}" if r.detail else r.get_outcome_display()
             for r in CallRecord.objects.filter(turn=turn, kind="model").order_by("id")]
    print(json.dumps({"case": case, "status": turn.status, "error": turn.error,
                      "answer": list(turn.messages.filter(role="assistant").values_list("content", flat=True)),
                      "timeline": lines, "upstream_calls": len(upstream.requests),
                      "seconds": round(time.monotonic() - started, 1)}, ensure_ascii=False))
