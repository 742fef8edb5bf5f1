"""A tool call that needs the visitor's approval, through the real widget in headless Chromium
against the live server, a real worker process and Redis: the widget shows what the call will do
and its exact arguments as text, with Approve / Decline; the request survives a reload; approved,
the call runs once and the answer lands; declined, it never runs and the model says so."""

import pytest
from playwright.sync_api import expect

from tests.approvals.tools import TOOLS, runs
from tests.browser.test_widget_handoff import audit
from tests.support.fakes import FakeProvider, openai_text, openai_tool_calls

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def provider_settings(fake):
    return {"PROVIDER": "openai", "BASE_URL": fake.url, "API_KEY": "sk-test", "MODEL": "fake-model", "TOOLS": TOOLS,
            "STREAM": False, "APPROVAL_WAIT": 120}


def test_the_visitor_approves_a_call_after_a_reload_and_it_runs_once(chat_page, worker_process,
                                                                     conversations_settings):
    with FakeProvider() as fake:
        fake.add(openai_tool_calls(("call_1", "refund", {"order": "A1"})), openai_text("Your order A1 is refunded."))
        settings = provider_settings(fake)
        conversations_settings.update(**settings)
        worker_process(**settings)
        chat = chat_page().open()
        chat.send("Refund my order A1, please.")

        ask = chat.locator(".cvw-approval")
        expect(ask.locator(".cvw-approval-summary")).to_have_text("Refund order A1 in full.")
        expect(chat.locator(".cvw-status")).to_have_text("Waiting for your approval…")
        assert '"order": "A1"' in ask.locator(".cvw-approval-arguments").text_content()
        assert runs() == 0
        assert audit(chat.page) == []  # the request and its buttons pass axe-core (WCAG 2.2 AA)
        ask.locator(".cvw-approval-approve").focus()  # reachable from the keyboard

        chat.page.reload()  # a reload (or a tab closed and opened again) loses nothing
        ask = chat.locator(".cvw-approval")
        expect(ask.locator(".cvw-approval-summary")).to_have_text("Refund order A1 in full.")
        ask.locator(".cvw-approval-approve").click()

        expect(chat.locator(".cvw-msg-assistant").last).to_have_text("Your order A1 is refunded.")
        expect(chat.locator(".cvw-approval")).to_have_count(0)
    assert runs() == 1
    assert len(fake.requests) == 2


def test_the_visitor_declines_a_call_shown_as_text_and_it_never_runs(chat_page, worker_process,
                                                                     conversations_settings):
    with FakeProvider() as fake:
        order = '<img src=x onerror="document.title=1">'
        fake.add(openai_tool_calls(("call_1", "refund", {"order": order})), openai_text("Fine: nothing was refunded."))
        settings = provider_settings(fake)
        conversations_settings.update(**settings)
        worker_process(**settings)
        chat = chat_page().open()
        chat.send("Refund it.")

        ask = chat.locator(".cvw-approval")
        expect(ask.locator(".cvw-approval-summary")).to_have_text(f"Refund order {order} in full.")
        assert ask.locator("img").count() == 0  # the model's arguments are text, never HTML
        ask.locator(".cvw-approval-decline").click()

        expect(chat.locator(".cvw-msg-assistant").last).to_have_text("Fine: nothing was refunded.")
        expect(chat.locator(".cvw-approval")).to_have_count(0)
        assert chat.page.title() != "1"
    assert runs() == 0
    assert "declined" in fake.requests[1]["json"]["messages"][-1]["content"]
