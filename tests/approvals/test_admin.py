"""The admin side of approvals: the turn page shows each request, who approved or declined it and
when, and the call's result; staff-only calls are approved from a list only staff with
``approve_toolcall`` see; an assistant may ask for approvals of tools that do not ask themselves."""

import pytest
from django.test import Client
from django.urls import reverse

from conversations.models import Assistant, ToolApproval, Turn
from tests.support.fakes import openai_text, openai_tool_calls
from tests.support.helpers import api_post, make_client, poll_until_done, run_worker, staff

from .conftest import answer, finish, waiting_turn
from .tools import runs

pytestmark = pytest.mark.django_db(transaction=True)

STAFF_LIST = "/admin/conversations/staffapproval/"


def test_the_turn_page_shows_the_request_who_approved_it_when_and_the_result(fake):
    fake.add(openai_tool_calls(("call_1", "refund", {"order": "<b>A1</b>"})), openai_text("Refunded."))
    client = make_client()
    started, state = waiting_turn(client)
    answer(client, started, state["approvals"][0])
    finish(client, started)
    admin = staff("root", superuser=True)

    page = admin.get(reverse("admin:conversations_turn_change", args=[started["id"]])).content.decode()

    assert 'id="approvals"' in page
    assert "Refund order &lt;b&gt;A1&lt;/b&gt; in full." in page and "<b>A1</b>" not in page  # text, never HTML
    assert "the visitor" in page and "Order &lt;b&gt;A1&lt;/b&gt; refunded." in page
    approval = ToolApproval.objects.get(turn_id=started["id"])
    assert approval.decided_at is not None and approval.status == "approved"
    assert "asked visitor to approve call call_1" in page and "approved by the visitor" in page  # the timeline


def test_staff_only_calls_are_approved_from_a_list_only_staff_with_the_permission_see(fake):
    fake.add(openai_tool_calls(("call_1", "close_account", {"account": "acme"})), openai_text("Closed."))
    client = make_client()
    started, state = waiting_turn(client, "Close my account acme.")
    assert state["approvals"][0]["approver"] == "staff"

    outsider = staff("olga", "view_turn")
    assert outsider.get(STAFF_LIST).status_code == 403
    assert Client().get(STAFF_LIST).status_code == 302  # to the login page
    ana = staff("ana", "approve_toolcall")
    listing = ana.get(STAFF_LIST).content.decode()
    assert "close_account" in listing and "Close the account acme." in listing

    pk = ToolApproval.objects.get(turn_id=started["id"]).pk
    response = ana.post(STAFF_LIST, {"action": "approve", "_selected_action": [pk]}, follow=True)
    assert "1 call(s) approved." in response.content.decode()
    final = finish(client, started)
    assert final["status"] == "completed" and runs() == 1
    approval = ToolApproval.objects.get(pk=pk)
    assert (approval.decided_by, approval.decided_by_visitor) == (ana.user, False)
    assert "close_account" not in ana.get(STAFF_LIST).content.decode()  # no longer waiting

    again = ana.post(STAFF_LIST, {"action": "approve", "_selected_action": [pk]}, follow=True)
    assert again.status_code == 200 and runs() == 1


def test_a_visitor_may_decline_a_staff_only_call(fake):
    fake.add(openai_tool_calls(("call_1", "close_account", {"account": "acme"})), openai_text("Kept it open."))
    client = make_client()
    started, state = waiting_turn(client, "Close my account acme.")
    assert answer(client, started, state["approvals"][0], "decline").status_code == 200
    assert finish(client, started)["status"] == "completed" and runs() == 0


def test_an_assistant_asks_for_approval_of_a_tool_that_does_not_ask_itself(fake, conversations_settings):
    assistant = Assistant.objects.create(slug="shop", name="Shop", system_prompt="You sell things.",
                                         provider="openai", base_url=fake.url, model="m",
                                         tools=["order_status"], approval_tools=["order_status"])
    fake.add(openai_tool_calls(("call_1", "order_status", {"order": "A1"})), openai_text("On its way."))
    client = make_client()
    conversation = api_post(client, "/api/conversations/", {"assistant": "shop"}).json()["id"]
    started = api_post(client, f"/api/conversations/{conversation}/turns/", {"content": "Where is A1?"}).json()
    run_worker()
    state = client.get(started["poll_url"]).json()
    assert state["status"] == "waiting_approval" and runs("status") == 0
    answer(client, started, state["approvals"][0])
    run_worker()
    assert poll_until_done(client, started["poll_url"])["status"] == "completed" and runs("status") == 1
    assert Turn.objects.get(pk=started["id"]).assistant_version.snapshot["approval_tools"] == ["order_status"]
    assistant.approval_tools = ["refund"]  # not among its tools
    with pytest.raises(Exception, match="must also be among its tools"):
        assistant.full_clean()


def test_the_checks_refuse_an_approval_wait_no_one_could_meet_and_warn_of_staff_tools_without_an_admin(
        conversations_settings, settings):
    from conversations.checks import check_config

    conversations_settings.update(APPROVAL_WAIT=0, TOOLS=["tests.approvals.tools.close_account"])
    ids = [m.id for m in check_config()]
    assert "conversations.E075" in ids and "conversations.W076" not in ids
    settings.INSTALLED_APPS = [app for app in settings.INSTALLED_APPS if app != "django.contrib.admin"]
    found = [m for m in check_config() if m.id == "conversations.W076"]
    assert len(found) == 1 and "close_account" in found[0].msg
    conversations_settings.update(APPROVAL_WAIT=600)
    assert "conversations.E075" not in [m.id for m in check_config()]


def test_the_assistant_form_offers_the_tools_that_need_an_approval_and_refuses_one_it_lacks(admin_client):
    add = "/admin/conversations/assistant/add/"
    form = admin_client.get(add).content.decode()
    assert 'name="approval_tools" value="search_faq"' in form
    fields = {"name": "Shop", "slug": "shop", "active": "on", "system_prompt": "Sell.", "provider": "demo",
              "model": "", "base_url": "", "credential": "", "greeting": "", "suggestions": "", "access": "public",
              "tools": ["search_faq"], "approval_tools": ["current_time"],
              "versions-TOTAL_FORMS": "0", "versions-INITIAL_FORMS": "0"}
    refused = admin_client.post(add, fields)
    assert refused.status_code == 200 and not Assistant.objects.exists()
    assert "“current_time” must also be among its tools." in refused.content.decode()
    saved = admin_client.post(add, {**fields, "approval_tools": ["search_faq"]})
    assert saved.status_code == 302
    assert Assistant.objects.get().approval_tools == ["search_faq"]
