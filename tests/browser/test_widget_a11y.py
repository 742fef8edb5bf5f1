"""An accessibility audit of the widget in every state it can be in, with axe-core (bundled in
axe-playwright-python, so nothing is fetched at test time), plus what a rule engine cannot see.

The API is scripted (tests/browser/scripted.py) so each state stays put while it is audited; the
page, its strings and their translations come from the live server as a visitor gets them.
"""

import pytest
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import expect

from tests.browser.scripted import (QUESTION, USER, ScriptedApi, assistant, state, tool_call, tool_result)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDGET = "[data-conversations-widget]"
# WCAG 2.0, 2.1 and 2.2 at levels A and AA, and axe's best practices.
TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa", "best-practice"]
# Minor findings that stay, each with its reason in docs/widget.md ("Accessibility audit"). None.
ACCEPTED_MINOR = set()

ANSWER = "It is **14:05** in Tokyo.\n\n- Japan has one time zone\n- no daylight saving time"
CUT_SHORT = "The answer was cut short because it reached the length limit."
FAILED = "The model service is not available right now. Please try again in a minute."


def audit(page):
    """axe-core's violations on the widget: a list of (rule, impact, elements)."""
    results = Axe().run(page, context={"include": [[WIDGET]]},
                        options={"runOnly": {"type": "tag", "values": TAGS}, "resultTypes": ["violations"]})
    return [(v["id"], v["impact"], len(v["nodes"])) for v in results.response["violations"]]


def sent(chat, api):
    chat.send(QUESTION)
    expect(chat.locator(".cvw-stop")).to_be_visible()


def shown(chat, api, turn_state, text):
    sent(chat, api)
    api.state = turn_state
    expect(chat.locator(".cvw-log")).to_contain_text(text)


def idle(chat, api):
    expect(chat.locator(".cvw-send")).to_be_enabled()


def sending(chat, api):
    api.hold = True
    chat.send(QUESTION)
    expect(chat.locator(".cvw-pending")).to_have_text(QUESTION)


def waiting(chat, api):
    sent(chat, api)
    expect(chat.locator(".cvw-status")).to_have_text("The assistant is thinking…")


def tool_step(chat, api):
    shown(chat, api, state("running", assistant("", tool_calls=[tool_call(city="Tokyo")]),
                           tool_result("2025-01-01T14:05:00+09:00"), version=3), "current_time: 2025")


def completed(chat, api):
    shown(chat, api, state("completed", assistant(ANSWER), version=3), "no daylight saving time")
    expect(chat.locator(".cvw-send")).to_be_enabled()


def incomplete(chat, api):
    shown(chat, api, state("incomplete", assistant("It is 14:05"), error=CUT_SHORT, version=3), CUT_SHORT)


def failed(chat, api):
    shown(chat, api, state("failed", error=FAILED, version=3), FAILED)


def cancelled(chat, api):
    sent(chat, api)
    chat.locator(".cvw-stop").click()
    api.state = state("cancelled", version=3)
    expect(chat.locator(".cvw-notice")).to_have_text("You stopped this answer.")


def refused(chat, api):
    api.refusal = (429, {"detail": "Too many messages. Try again in 20 seconds."})
    chat.send(QUESTION)
    expect(chat.locator(".cvw-status")).to_have_text("Too many messages. Try again in 20 seconds.")


def restored(chat, api):
    completed(chat, api)
    api.transcript = [{**USER, "turn": 41}, {**assistant(ANSWER), "turn": 41}]
    chat.page.reload()
    expect(chat.locator(".cvw-msg-assistant")).to_contain_text("no daylight saving time")


STATES = {"idle": idle, "sending": sending, "waiting": waiting, "tool step": tool_step,
          "completed": completed, "incomplete": incomplete, "failed": failed, "cancelled": cancelled,
          "error shown": refused, "restored after a reload": restored}


@pytest.mark.parametrize("name", STATES)
def test_the_widget_passes_the_audit(name, chat_page):
    chat = chat_page()
    api = ScriptedApi(chat.page)
    chat.open()
    STATES[name](chat, api)
    violations = audit(chat.page)
    print(f"\naxe {name}: {violations}")
    assert [v for v in violations if v[1] in {"serious", "critical"}] == []
    assert {v[0] for v in violations} <= ACCEPTED_MINOR, violations


def test_the_widget_passes_the_audit_in_spanish(chat_page):
    chat = chat_page(locale="es-ES")
    api = ScriptedApi(chat.page)
    chat.open()
    chat.send(QUESTION)
    expect(chat.locator(".cvw-stop")).to_have_text("Detener")
    api.state = state("incomplete", assistant("Son las 14:05"), error="La respuesta se cortó.", version=3)
    expect(chat.locator(".cvw-notice")).to_have_text("La respuesta se cortó.")
    violations = audit(chat.page)
    print(f"\naxe Spanish: {violations}")
    assert [v for v in violations if v[1] in {"serious", "critical"}] == []
    assert {v[0] for v in violations} <= ACCEPTED_MINOR, violations
