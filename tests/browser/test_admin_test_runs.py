"""A test run's comparison page in real headless Chromium: the live version and a draft side by
side, question by question. With ``SCREENSHOTS=docs/images`` the page is also saved there (the
image in docs/admin.md)."""

from decimal import Decimal

import pytest

from conversations.models import AssistantDraft
from tests.browser.test_admin_assistants import shoot
from tests.browser.pages import admin_page
from tests.evals.test_test_sets import REFUNDS, TIME, drive, make_assistant, make_set

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_runs_comparison_page(browser, live_server):
    assistant = make_assistant(name="Help desk")
    test_set = make_set(assistant, [
        {"question": TIME, "must_contain": ["Tokyo"], "must_use_tool": "current_time", "max_seconds": 8},
        {"question": REFUNDS, "must_contain": ["30 days"], "must_use_tool": "search_faq"},
        {"question": "How long does shipping take?", "must_contain": ["working day"], "must_not_contain": ["free"]},
        {"question": "What time is it in Paris?", "must_contain": ["Paris"]}])
    draft = AssistantDraft.objects.create(assistant=assistant, note="FAQ only, shorter prompt",
                                          changes={"tools": ["search_faq"], "system_prompt": "Answer from the FAQ."})
    from conversations.evals import runs

    run = drive(runs.start_run(test_set, draft=draft, concurrency=2, max_cost=Decimal("0.5")))
    with admin_page(browser, live_server) as page:
        page.goto(f"{live_server.url}/admin/conversations/testrun/{run.pk}/change/")
        assert page.locator(".field-limits .readonly").inner_text() == (
            "At most 2 turns at a time. Cost limit 0.5; spent —.")  # the demo model has no price
        summary = page.locator("table.test-run-summary tr")
        assert summary.nth(1).inner_text().split("\t")[:3] == ["live", "4/4 (100%)", "—"]  # the demo has no price
        assert summary.nth(2).inner_text().split("\t")[:2] == ["draft", "2/4 (50%)"]
        rows = page.locator("table.test-run-results tr")
        assert rows.count() == 5
        assert "changed" in rows.nth(1).inner_text() and "did not use the tool current_time" in rows.nth(1).inner_text()
        shoot(page, "admin-test-run.png")
