"""An embedded widget's visitor (a visitor token, no cookie) approves its own call with the token,
as every other endpoint takes it; another visitor's token owns nothing of it."""

import time

import pytest

from tests.api.test_embed_tokens import PAGE, SECRET, Page
from tests.support.fakes import openai_text, openai_tool_calls
from tests.support.helpers import run_worker

from .tools import runs

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_visitor_token_approves_its_own_call_and_another_token_cannot(fake, conversations_settings):
    conversations_settings.update(ALLOWED_ORIGINS=[PAGE], IDENTITY_SECRET=SECRET)
    fake.add(openai_tool_calls(("call_1", "refund", {"order": "A1"})), openai_text("Refunded."))
    page, stranger = Page(), Page()
    page.mint(), stranger.mint()
    conversation = page.post("/api/conversations/").json()["id"]
    turn = page.post(f"/api/conversations/{conversation}/turns/", {"content": "Refund A1"}).json()
    run_worker()
    (approval,) = page.get(turn["poll_url"]).json()["approvals"]
    body = {"call_id": approval["call_id"], "arguments_sha256": approval["arguments_sha256"], "decision": "approve"}

    assert stranger.post(turn["approval_url"], body).status_code == 404
    done = page.post(turn["approval_url"], body)
    assert done.status_code == 200 and done["Access-Control-Allow-Origin"] == PAGE and not done.cookies
    run_worker()
    deadline = time.monotonic() + 20
    final = page.get(turn["poll_url"]).json()
    while not final["done"] and time.monotonic() < deadline:
        time.sleep(0.05)
        final = page.get(turn["poll_url"]).json()
    assert final["status"] == "completed" and runs() == 1
