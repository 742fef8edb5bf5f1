import pytest

from tests.support.fakes import FakeProvider
from tests.support.helpers import api_post, poll_until_done, run_worker, start_turn

from .tools import TOOLS


@pytest.fixture
def fake(conversations_settings):
    """A fake OpenAI-compatible provider; the approval tools; resuming on; short clocks."""
    with FakeProvider() as provider:
        conversations_settings.update(PROVIDER="openai", BASE_URL=provider.url, API_KEY="k", MODEL="m", TOOLS=TOOLS,
                                      MAX_RESUMES=2, JOB_TIMEOUT=20, DEADLINE_MARGIN=4, CALL_TIMEOUT=10,
                                      STREAM=False, MAX_ATTEMPTS=1, APPROVAL_WAIT=60)
        yield provider


def waiting_turn(client, content="Refund my order A1, please."):
    """Start a turn and run the queue until it waits for an approval; returns (started, state)."""
    started = start_turn(client, content)
    run_worker()
    state = client.get(started["poll_url"]).json()
    assert state["status"] == "waiting_approval", state
    return started, state


def answer(client, started, approval, decision="approve", **changes):
    body = {"call_id": approval["call_id"], "arguments_sha256": approval["arguments_sha256"], "decision": decision,
            **changes}
    return api_post(client, started["approval_url"], body)


def finish(client, started):
    run_worker()
    return poll_until_done(client, started["poll_url"])
