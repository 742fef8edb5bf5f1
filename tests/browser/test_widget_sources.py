"""The sources of an answer in the widget, against the live server, a real worker and the demo
model: the help articles search_site found are links under the answer, reachable by keyboard,
and come back after a reload; a URL that is not this site's is shown as text, never a link."""

import pytest
from playwright.sync_api import expect

from chatproject.models import Article
from conversations.knowledge.models import Passage

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_articles_an_answer_was_found_in_are_links_under_it_and_come_back_after_a_reload(
        chat_page, worker_process):
    Article.objects.create(slug="bike-repair", title="Repairing a bicycle puncture",
                           body="<p>Patch the inner tube of the bicycle with a repair kit.</p>")
    elsewhere = Article.objects.create(slug="bike-shop", title="Bicycle shops nearby",
                                       body="<p>Bicycle shops repair punctures too.</p>")
    # An index row whose URL is not this site's (a source's URL rule gone wrong): shown, not linked.
    Passage.objects.filter(object_pk=str(elsewhere.pk)).update(url="javascript:alert(1)")
    worker_process(DEMO_DELAY=0.05, TOOLS=["conversations.knowledge.tool.search_site"])
    chat = chat_page().open()
    chat.send("How do I repair a bicycle puncture?")
    expect(chat.locator(".cvw-msg-assistant")).to_contain_text("inner tube")
    sources = chat.page.get_by_role("list", name="Sources")
    expect(sources).to_be_visible()
    article = sources.get_by_role("link", name="Repairing a bicycle puncture")
    expect(article).to_have_attribute("href", f"{chat.base_url}/help/bike-repair/")
    expect(sources.get_by_role("link")).to_have_count(1)
    expect(sources).to_contain_text("Bicycle shops nearby")  # as text
    article.focus()
    expect(article).to_be_focused()

    chat.page.reload()
    expect(chat.locator(".cvw-msg-assistant")).to_contain_text("inner tube")
    restored = chat.page.get_by_role("list", name="Sources")
    expect(restored.get_by_role("link", name="Repairing a bicycle puncture")).to_have_attribute(
        "href", f"{chat.base_url}/help/bike-repair/")
    with chat.page.expect_popup() as opened:
        restored.get_by_role("link", name="Repairing a bicycle puncture").press("Enter")
    expect(opened.value.get_by_role("heading", name="Repairing a bicycle puncture")).to_be_visible()


def test_a_question_the_site_does_not_answer_says_so_and_lists_no_source(chat_page, worker_process):
    Article.objects.all().delete()  # the demo's own, from its data migration, until a test's flush
    Article.objects.create(slug="bicycle-parking", title="Bicycle parking at our shops",
                           body="<p>Every shop has covered bicycle racks at the entrance.</p>")
    Article.objects.create(slug="refund-timing", title="When will I get my refund?",
                           body="<p>Refunds reach your bank within ten working days.</p>")
    worker_process(DEMO_DELAY=0.05, TOOLS=["conversations.knowledge.tool.search_site"])
    chat = chat_page().open()
    chat.send("When does the secret winter sale start?")
    expect(chat.locator(".cvw-msg-assistant")).to_have_text("I could not find that on this site.")
    expect(chat.page.get_by_role("list", name="Sources")).to_have_count(0)
