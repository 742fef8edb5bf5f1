"""The admin's assistant pages in real headless Chromium: an assistant with the versions it
answered with, the overview per assistant and day, and a rated turn. With
``SCREENSHOTS=docs/images`` the pages are also saved there (the images in docs/admin.md)."""

import os
import random
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.utils import timezone

from conversations.models import Assistant, Conversation, Turn
from tests.browser.pages import admin_page
from tests.support.helpers import ROOT, api_post, make_client, poll_until_done

pytestmark = pytest.mark.django_db(transaction=True)


def history(assistants, rng, days=7):
    """A week of finished turns for the overview: a few dozen per assistant and day."""
    # Each turn on its own day's date, whatever the time of the run: today's so far, earlier
    # days' before 23:00 (a turn lasts seconds), so none slips into the day before the week.
    now = timezone.localtime()
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    rows = []
    for day in range(days):
        for assistant, share in assistants:
            conversation = Conversation.objects.create(owner_token="history", assistant=assistant)
            for _ in range(int(rng.randrange(20, 40) * share)):
                span = int((now - midnight).total_seconds()) if day == 0 else 23 * 3600
                start = midnight - timedelta(days=day) + timedelta(seconds=rng.randrange(max(1, span)))
                duration = rng.lognormvariate(1.0, 0.5)
                tokens = rng.randrange(300, 3000), rng.randrange(30, 400)
                rows.append(Turn(
                    conversation=conversation, assistant=assistant, enqueued_at=start, started_at=start,
                    finished_at=start + timedelta(seconds=duration), job_timeout=120, deadline_margin=20,
                    status=rng.choice(["completed"] * 18 + ["incomplete", "failed"]), margin_left=118 - duration,
                    input_tokens=tokens[0], output_tokens=tokens[1], model="gpt-4o-mini",
                    cost=(tokens[0] * Decimal("0.15") + tokens[1] * Decimal("0.60")) / 1_000_000,
                    rating=rng.choice(["", "", "up", "up", "up", "down"])))
    Turn.objects.bulk_create(rows)


def shoot(page, name):
    target = os.environ.get("SCREENSHOTS")
    if target:
        page.screenshot(path=str(Path(ROOT, target, name)), full_page=True)


def test_an_assistant_the_overview_and_a_rated_turn_in_the_admin(browser, live_server, worker, conversations_settings):
    conversations_settings.update(CREDENTIALS={"support-key": "sk-demo"}, DEMO_DELAY=0.2)
    support = Assistant.objects.create(
        slug="support", name="Help desk", provider="demo", credential="support-key", tools=["search_faq"],
        system_prompt="You answer questions about orders, shipping and refunds, briefly and kindly.",
        greeting="Hi! Ask me about refunds, shipping or your order.", max_steps=4,
        suggestions=["How do refunds work?", "How long does shipping take?"])
    shop = Assistant.objects.create(slug="shop", name="Shop assistant", provider="demo", tools=["current_time"],
                                    system_prompt="You help visitors choose products.", job_timeout=30)
    visitor = make_client()
    conversation = api_post(visitor, "/api/conversations/", {"assistant": "support"}).json()["id"]
    turn = api_post(visitor, f"/api/conversations/{conversation}/turns/", {"content": "How do refunds work?"}).json()
    worker()
    poll_until_done(visitor, turn["poll_url"])
    rating = f"/api/conversations/{conversation}/turns/{turn['id']}/rating/"
    assert api_post(visitor, rating, {"value": "up", "comment": "Clear, and it quoted the policy."}).status_code == 201
    support.system_prompt += " Always give the refund window in days."
    support.save()
    history([(support, 1.0), (shop, 0.6), (None, 0.3)], random.Random(16))
    with admin_page(browser, live_server) as page:
        page.goto(f"{live_server.url}/admin/conversations/assistant/{support.pk}/change/")
        assert page.locator("#id_tools input[value=search_faq]").is_checked()
        assert page.locator("#id_credential").input_value() == "support-key"
        assert page.locator(".assistant-snapshot").count() == 1  # the version that answered the rated turn
        shoot(page, "admin-assistant.png")

        page.goto(f"{live_server.url}/admin/conversations/assistant/overview/?days=7")
        rows = page.locator("tr.overview-row")
        assert rows.count() == 21
        assert [rows.nth(i).inner_text().split("\t")[1] for i in range(3)] == [
            "Help desk support", "Shop assistant shop", "the site's settings"]
        shoot(page, "admin-overview.png")

        page.goto(f"{live_server.url}/admin/conversations/turn/{turn['id']}/change/")
        body = page.locator("#content").inner_text()
        assert "Clear, and it quoted the policy." in body and "Help desk (support)" in body
        assert page.locator(".turn-rating-up").count() == 1
        shoot(page, "admin-rated-turn.png")
