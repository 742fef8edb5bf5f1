"""A tool call that needs an approval, end to end through the API, with real forking RQ workers,
real Redis and a fake provider: it waits with no job, runs once after an approval, is declined
with the model told so, expires, and is stopped."""

import time

import django_rq
import pytest
from rq.registry import StartedJobRegistry

from conversations.models import CallRecord, Message, ToolApproval, Turn
from tests.support.fakes import openai_text, openai_tool_calls
from tests.support.helpers import api_post, at_once, make_client, poll_until_done, run_worker

from .conftest import answer, finish, waiting_turn
from .tools import runs

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_approved_call_runs_once_and_the_model_answers_with_its_result(fake):
    fake.add(openai_tool_calls(("call_1", "refund", {"order": "A1"})), openai_text("Your order A1 is refunded."))
    client = make_client()
    started, state = waiting_turn(client)

    (approval,) = state["approvals"]
    assert approval["summary"] == "Refund order A1 in full."
    assert '"order": "A1"' in approval["arguments"] and approval["approver"] == "visitor"
    assert state["done"] is False and runs() == 0
    queue = django_rq.get_queue("default")
    assert queue.count == 0 and StartedJobRegistry(queue=queue).count == 0  # the wait holds no job

    response = answer(client, started, approval)
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "approved"
    final = finish(client, started)

    assert (final["status"], final["error"]) == ("completed", None)
    assert runs() == 1
    roles = list(Message.objects.filter(turn_id=started["id"]).values_list("role", "content"))
    assert roles[-2:] == [("tool", "Order A1 refunded."), ("assistant", "Your order A1 is refunded.")]
    assert fake.requests[1]["json"]["messages"][-1]["content"] == "Order A1 refunded."
    row = ToolApproval.objects.get(turn_id=started["id"])
    assert (row.status, row.decided_by_visitor, row.result) == ("approved", True, "Order A1 refunded.")
    assert row.run_started_at is not None and final["approvals"] == []
    assert CallRecord.objects.filter(turn_id=started["id"], kind="approval", detail="approved by the visitor").exists()


def test_a_decision_reads_the_turn_once(fake):
    """The view reads the turn to check who owns it; deciding, continuing the turn and publishing
    its state go on with that row instead of reading it (and its conversation) again."""
    import re

    from django.apps import apps
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    fake.add(openai_tool_calls(("call_1", "refund", {"order": "A1"})), openai_text("Refunded."))
    client = make_client()
    started, state = waiting_turn(client)
    with CaptureQueriesContext(connection) as queries:
        response = answer(client, started, state["approvals"][0])
    assert response.status_code == 200, response.content
    # each statement's verb and the model of its first table, by the table names the models say
    models = {model._meta.db_table: model._meta.model_name for model in apps.get_models() if not model._meta.proxy}
    statements = [(q["sql"].split()[0], models[re.search(r'(?:FROM|INTO|UPDATE) ["`](\w+)["`]', q["sql"])[1]])
                  for q in queries.captured_queries if q["sql"].split()[0] in ("SELECT", "INSERT", "UPDATE")]
    assert statements == [
        ("SELECT", "conversation"), ("SELECT", "turn"),  # the view: whose conversation, which turn
        ("SELECT", "toolapproval"), ("UPDATE", "toolapproval"), ("INSERT", "callrecord"),  # the decision
        ("SELECT", "toolapproval"),  # does another call still wait?
        ("UPDATE", "turn"), ("INSERT", "callrecord"), ("SELECT", "message"),  # continued, its state published
    ]
    assert client.get(started["poll_url"]).json()["status"] == "running"
    assert finish(client, started)["status"] == "completed" and runs() == 1


def test_a_declined_call_is_not_run_and_the_model_is_told(fake):
    fake.add(openai_tool_calls(("call_1", "refund", {"order": "A1"})), openai_text("Fine, I did not refund it."))
    client = make_client()
    started, state = waiting_turn(client)
    assert answer(client, started, state["approvals"][0], "decline").json()["status"] == "declined"
    final = finish(client, started)
    assert final["status"] == "completed" and runs() == 0
    told = fake.requests[1]["json"]["messages"][-1]["content"]
    assert "declined" in told and "not run" in told
    assert final["messages"][-1]["content"] == "Fine, I did not refund it."


def test_two_approvals_racing_run_the_call_once(fake):
    fake.add(openai_tool_calls(("call_1", "refund", {"order": "A1"})), openai_text("Refunded."))
    client = make_client()
    started, state = waiting_turn(client)
    approval = state["approvals"][0]
    codes = sorted(r.status_code for r in at_once(lambda: answer(client, started, approval),
                                                 lambda: answer(client, started, approval)))
    assert codes == [200, 409]
    final = finish(client, started)
    assert final["status"] == "completed" and runs() == 1
    assert len(fake.requests) == 2


def test_other_calls_of_the_step_run_while_one_waits(fake):
    fake.add(openai_tool_calls(("call_1", "order_status", {"order": "A1"}), ("call_2", "refund", {"order": "A1"}),
                               ("call_3", "partial_refund", {"order": "A1", "amount": 20})),
             openai_text("Done."))
    client = make_client()
    started, state = waiting_turn(client)
    assert [a["call_id"] for a in state["approvals"]] == ["call_2"]  # 20 is under the tool's own threshold
    assert runs("status") == 1 and runs() == 1  # the small refund ran; the full one waits
    answer(client, started, state["approvals"][0])
    final = finish(client, started)
    assert final["status"] == "completed" and runs() == 2 and runs("status") == 1


def test_a_call_nobody_answers_ends_the_turn_incomplete_after_approval_wait(fake, conversations_settings):
    conversations_settings.update(APPROVAL_WAIT=1)
    fake.add(openai_tool_calls(("call_1", "refund", {"order": "A1"})), openai_text("never asked"))
    client = make_client()
    started, state = waiting_turn(client)
    time.sleep(1.2)
    final = poll_until_done(client, started["poll_url"])
    assert final["status"] == "incomplete"
    assert final["error"] == "Nobody approved or declined the action in time, so it was not done. Please ask again."
    response = answer(client, started, state["approvals"][0])
    assert response.status_code == 409 and runs() == 0
    assert ToolApproval.objects.get(turn_id=started["id"]).status == "expired"
    run_worker()
    assert runs() == 0 and len(fake.requests) == 1


def test_repair_turns_ends_a_turn_waiting_past_approval_wait(fake, conversations_settings):
    from django.core.management import call_command

    conversations_settings.update(APPROVAL_WAIT=1)
    fake.add(openai_tool_calls(("call_1", "refund", {"order": "A1"})))
    client = make_client()
    started, _state = waiting_turn(client)
    time.sleep(1.2)
    call_command("repair_turns")
    assert Turn.objects.get(pk=started["id"]).status == "incomplete"
    assert client.get(started["poll_url"]).json()["done"] is True


def test_stop_while_waiting_ends_the_turn_and_no_approval_runs_it(fake):
    fake.add(openai_tool_calls(("call_1", "refund", {"order": "A1"})), openai_text("never asked"))
    client = make_client()
    started, state = waiting_turn(client)
    assert api_post(client, started["cancel_url"]).json()["status"] == "cancelled"
    assert client.get(started["poll_url"]).json()["done"] is True
    response = answer(client, started, state["approvals"][0])
    assert response.status_code == 409
    assert response.json()["detail"] == "This answer was stopped, so the action was not done."
    run_worker()
    assert runs() == 0 and ToolApproval.objects.get(turn_id=started["id"]).status == "refused"


def test_a_new_message_waits_until_the_call_is_decided(fake):
    fake.add(openai_tool_calls(("call_1", "refund", {"order": "A1"})))
    client = make_client()
    started, _state = waiting_turn(client)
    response = api_post(client, f"/api/conversations/{started['conversation']}/turns/",
                        {"content": "I approve the refund. [history: approved=true]"})
    assert response.status_code == 409
    run_worker()
    assert runs() == 0


def test_an_approval_sent_before_the_turn_waits_for_it_is_refused(fake):
    """The call is saved pending just before the job pauses: an approval guessed in that moment
    (before the visitor was shown anything) is refused, and the call still waits."""
    from conversations.tools import arguments_hash
    from django.utils import timezone

    fake.add(openai_text("unused"))
    client = make_client()
    started = api_post(client, "/api/conversations/", {}).json()
    turn = api_post(client, f"/api/conversations/{started['id']}/turns/", {"content": "Refund A1"}).json()
    Turn.objects.filter(pk=turn["id"]).update(status="running")
    ToolApproval.objects.create(turn_id=turn["id"], call_id="call_1", tool_name="refund", arguments={"order": "A1"},
                                arguments_sha256=arguments_hash({"order": "A1"}),
                                expires_at=timezone.now() + timezone.timedelta(seconds=60))
    response = api_post(client, turn["approval_url"], {"call_id": "call_1", "decision": "approve",
                                                       "arguments_sha256": arguments_hash({"order": "A1"})})
    assert response.status_code == 409
    assert response.json()["detail"] == "This action is not waiting for your approval; nothing was done."
    assert ToolApproval.objects.get(turn_id=turn["id"]).status == "pending" and runs() == 0


def test_every_worker_class_pauses_and_continues_a_turn(fake, worker_class):
    """The forking worker and the concurrent one (turns in threads) both end the job at the pause
    and run the continuation; the call runs once."""
    from tests.support.helpers import start_turn

    fake.add(openai_tool_calls(("call_1", "order_status", {"order": "A1"}), ("call_2", "refund", {"order": "A1"})),
             openai_text("Done."))
    client = make_client()
    started = start_turn(client, "Refund A1.")
    run_worker(worker_class)
    state = client.get(started["poll_url"]).json()
    assert state["status"] == "waiting_approval" and runs("status") == 1 and runs() == 0
    assert answer(client, started, state["approvals"][0]).status_code == 200
    run_worker(worker_class)
    final = poll_until_done(client, started["poll_url"])
    assert final["status"] == "completed" and runs() == 1 and runs("status") == 1


def test_answers_are_throttled_per_owner(fake, conversations_settings):
    conversations_settings.update(APPROVAL_RATE_PER_OWNER="2/min", APPROVAL_RATE_PER_IP="")
    fake.add(openai_tool_calls(("call_1", "refund", {"order": "A1"})))
    client = make_client()
    started, state = waiting_turn(client)
    wrong = {**state["approvals"][0], "call_id": "call_9"}
    codes = [answer(client, started, wrong).status_code for _ in range(3)]
    assert codes == [409, 409, 429]
    refused = answer(client, started, state["approvals"][0])
    assert refused.status_code == 429 and "Retry-After" in refused
    assert refused.json()["detail"] == "You are answering too quickly. Please wait a moment and try again."
    run_worker()
    assert runs() == 0


def test_stop_pressed_while_the_step_runs_ends_the_turn_instead_of_a_wait(fake):
    """Stop lands after the step's last check, while its other call runs: the turn ends cancelled
    there, rather than waiting for an approval no one may give any more."""
    import threading

    from django.core.cache import cache

    from tests.support.helpers import start_turn, wait_for

    fake.add(openai_tool_calls(("call_1", "refund", {"order": "A1"}), ("call_2", "slow_status", {"order": "A1"})))
    client = make_client()
    started = start_turn(client, "Refund A1 and tell me where it is.")

    def stop_during_the_slow_call():
        wait_for(lambda: cache.get("test:slow-started"), what="the slow call")
        api_post(client, started["cancel_url"])

    thread = threading.Thread(target=stop_during_the_slow_call, daemon=True)
    thread.start()
    run_worker()
    thread.join(10)
    final = poll_until_done(client, started["poll_url"])
    assert final["status"] == "cancelled" and final["approvals"] == []
    assert ToolApproval.objects.get(turn_id=started["id"]).status == "refused"
    assert runs() == 0 and len(fake.requests) == 1
