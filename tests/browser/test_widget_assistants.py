"""Two assistants on one page, through the real widget: each shows its own greeting and
suggested questions, and a suggestion clicked starts a conversation with that widget's
assistant, answered by it (its own system prompt), not the site's default."""

import pytest
from django.template import Context, Template
from django.test import RequestFactory
from playwright.sync_api import expect

from conversations.models import Assistant, Conversation

pytestmark = pytest.mark.django_db(transaction=True)


def page_with(csrf_cookie, *slugs):
    """The HTML of a page with one widget per assistant slug, rendered by the real tag for the
    browser whose csrftoken cookie is ``csrf_cookie`` (so the token it embeds matches)."""
    request = RequestFactory().get("/help/")
    request.META["CSRF_COOKIE"] = csrf_cookie  # what CsrfViewMiddleware would read from the cookie
    tags = "".join(f'<section id="{slug}">{{% chat_widget assistant="{slug}" %}}</section>' for slug in slugs)
    body = Template("{% load conversations %}" + tags).render(Context({"request": request}))
    return f"<!doctype html><html lang='en'><head><title>Help</title></head><body><main>{body}</main></body></html>"


def test_each_widget_greets_and_starts_its_own_assistants_conversation(chat_page, worker_process):
    Assistant.objects.create(slug="support", name="Support", provider="demo", system_prompt="You are Support.",
                             greeting="Hi! Ask me about refunds.", suggestions=["How do refunds work?"])
    Assistant.objects.create(slug="shop", name="Shop", provider="demo", system_prompt="You are Shop.",
                             greeting="Looking for something?", suggestions=["What time is it in Tokyo?"],
                             tools=["current_time"])
    worker_process(DEMO_DELAY=0.05)
    chat = chat_page()
    chat.page.goto(chat.base_url + "/")  # a real page of the site first: it sets the csrftoken cookie
    cookie = next(c["value"] for c in chat.page.context.cookies() if c["name"] == "csrftoken")
    html = page_with(cookie, "support", "shop")
    chat.page.route("**/help/", lambda route: route.fulfill(body=html, content_type="text/html"))
    chat.page.goto(chat.base_url + "/help/")

    support, shop = chat.page.locator("#support"), chat.page.locator("#shop")
    expect(support.locator(".cvw-greeting")).to_have_text("Hi! Ask me about refunds.")
    expect(shop.locator(".cvw-greeting")).to_have_text("Looking for something?")
    shop.locator(".cvw-suggestion", has_text="What time is it in Tokyo?").click()
    expect(shop.locator(".cvw-msg-user")).to_have_text("What time is it in Tokyo?")
    expect(shop.locator(".cvw-suggestion")).to_have_count(0)  # gone once a message is sent
    expect(shop.locator(".cvw-msg-assistant").last).to_contain_text("in Tokyo")
    expect(support.locator(".cvw-suggestion")).to_have_count(1)  # the other widget is untouched

    conversation = Conversation.objects.get()
    assert conversation.assistant.slug == "shop"
    assert conversation.turns.get().assistant.slug == "shop"
