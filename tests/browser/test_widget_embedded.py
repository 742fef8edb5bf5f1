"""The widget on a page of another site, from the one script tag: a plain HTML page served by
another server (http://127.0.0.1:<port>), the API on the live server (http://localhost:<port>,
another site), in a Chromium profile that blocks third-party cookies, a real worker and a
streaming fake provider. The widget chats with a visitor token and no cookie: a streamed
answer, Stop, a rating, 304s while nothing changes, a reload that restores the conversation;
its token renewed, and past WIDGET_TOKEN_MAX_AGE a new one for the same visitor; a page of an
origin not allowed is told so, and nothing is created; the sources under an answer link to the
API's site, whose articles they are, not to the page's.

Chromium 156 blocks third-party cookies in Playwright's default (incognito-like) contexts; a
persistent profile follows its ``profile.cookie_controls_mode`` preference (1: block third-party
cookies, 0: allow them, as a regular profile does by default). The tests use a persistent
profile with 1 and check that it holds: a cookie the API's own page sets in an iframe of the
host page (Django's csrftoken, made ``SameSite=None; Secure`` here so that only the blocking
can keep it out) is not set.
"""

import http.server
import json
import os
import threading
import time

import pytest
from playwright.sync_api import expect

from chatproject.models import Article
from conversations.knowledge.models import Passage
from conversations.models import Conversation, Turn
from tests.browser.conftest import CHROMIUM_ARGS, TIMEOUT_MS, Chat, chromium_path
from tests.support.fake_stream import openai_stream, streaming
from tests.support.fakes import FakeProvider
from tests.support.helpers import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

QUESTION = "Where is my parcel?"
WORDS = ["Your ", "parcel ", "left ", "the ", "depot ", "this ", "morning ", "and ", "arrives ", "tomorrow "]


class HostSite:
    """A plain static site on 127.0.0.1 (another site than the API's localhost): ``pages`` maps a
    path to its HTML."""

    def __init__(self):
        pages = self.pages = {}

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = pages.get(self.path.split("?")[0], "").encode()
                self.send_response(200 if body else 404)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def embedding_page(api, probe=True):
    """A shop's page with the one script tag of docs/widget.md, and an iframe of the API site's
    own page, whose csrftoken cookie the browser must refuse as third-party."""
    frame = f'<iframe src="{api}/" title="probe" hidden></iframe>' if probe else ""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>A shop</title></head><body><main>'
            f'<h1>A shop on another site</h1>{frame}'
            f'<script src="{api}/static/conversations/embed.js" data-api="{api}/api/" defer></script>'
            f'</main></body></html>')


@pytest.fixture
def host_site():
    site = HostSite()
    yield site
    site.close()


@pytest.fixture
def blocking_profile(browser, tmp_path, settings):
    """A persistent Chromium profile that blocks third-party cookies (see the module), started by
    the session's Playwright (``browser``'s), of which a process can have only one."""
    settings.CSRF_COOKIE_SAMESITE, settings.CSRF_COOKIE_SECURE = "None", True
    os.makedirs(tmp_path / "Default")
    (tmp_path / "Default" / "Preferences").write_text(json.dumps({"profile": {"cookie_controls_mode": 1}}))
    expect.set_options(timeout=TIMEOUT_MS)
    context = browser.browser_type.launch_persistent_context(
        str(tmp_path), executable_path=chromium_path(), args=CHROMIUM_ARGS, locale="en-US")
    context.set_default_timeout(TIMEOUT_MS)
    yield context
    context.close()


def api_requests(page, api):
    """Every request the page makes to the API, with all its headers (cookies included)."""
    seen = []
    page.on("request", lambda request: seen.append((request.url, request.all_headers()))
            if request.url.startswith(api + "/api/") else None)
    return seen




def test_an_embedded_widget_chats_streams_stops_rates_and_reloads_without_cookies(
        blocking_profile, host_site, live_server, worker_process, conversations_settings):
    api = live_server.url
    conversations_settings.update(ALLOWED_ORIGINS=[host_site.origin])
    host_site.pages["/"] = embedding_page(api)
    # A word every 0.5 s (polls while an answer grows come every 0.3 s: some find nothing new),
    # then silence until Stop shuts the call.
    with FakeProvider() as fake:
        fake.add(streaming(openai_stream(pieces=WORDS, done=False)[:len(WORDS) + 1], interval=0.5, then="hang"))
        provider = {"PROVIDER": "openai", "BASE_URL": fake.url, "API_KEY": "sk-test", "MODEL": "fake-model"}
        conversations_settings.update(**provider)
        worker_process(**provider)
        chat = Chat(blocking_profile.new_page(), api)
        sent = api_requests(chat.page, api)
        chat.page.goto(host_site.origin + "/")
        chat.send(QUESTION)
        expect(chat.locator(".cvw-growing")).to_contain_text("Your parcel")  # streamed, word by word
        expect(chat.locator(".cvw-growing")).to_contain_text("left the depot")
        chat.locator(".cvw-stop").click()
        expect(chat.locator(".cvw-notice")).to_have_text("You stopped this answer.")

    assert 304 in [status for _url, status in chat.responses]
    assert all(headers.get("if-none-match") for _url, headers in chat.polls[1:])
    chat.page.get_by_role("group", name="Rate this answer").get_by_role("button", name="Helpful", exact=True).click()
    wait_for(lambda: Turn.objects.get().rating == "up")

    chat.page.reload()
    expect(chat.locator(".cvw-msg-user")).to_have_text(QUESTION)
    expect(chat.locator(".cvw-msg-assistant")).to_contain_text("Your parcel left the depot")
    expect(chat.page.get_by_role("button", name="Helpful", exact=True)).to_have_attribute("aria-pressed", "true")

    conversation = Conversation.objects.get()
    assert conversation.user is None and conversation.owner_token.startswith("v:")  # the token's visitor
    assert Turn.objects.get().status == "cancelled"
    # No cookie went to the API, and the browser indeed blocks the API site's cookies here: the
    # csrftoken its own page set in the iframe was refused.
    assert sent and not [url for url, headers in sent if "cookie" in headers]
    assert [c["name"] for c in blocking_profile.cookies() if c["domain"] == "localhost"] == []


def test_a_page_of_an_origin_not_allowed_is_told_so_and_nothing_is_created(
        blocking_profile, host_site, live_server, conversations_settings):
    conversations_settings.update(ALLOWED_ORIGINS=["https://shop.example.com"])
    host_site.pages["/"] = embedding_page(live_server.url, probe=False)
    page = blocking_profile.new_page()

    page.goto(host_site.origin + "/")

    expect(page.locator(".conversations-refused")).to_have_text(
        f"This assistant cannot be used on pages of {host_site.origin}.")
    expect(page.locator("conversations-widget")).to_have_count(0)
    assert not Conversation.objects.exists()


def test_the_token_is_renewed_before_it_expires_and_the_conversation_goes_on(
        blocking_profile, host_site, live_server, worker_process, conversations_settings):
    conversations_settings.update(ALLOWED_ORIGINS=[host_site.origin], WIDGET_TOKEN_TTL=6)  # renewed after 5 s
    worker_process(DEMO_DELAY=0.05)
    host_site.pages["/"] = embedding_page(live_server.url, probe=False)
    chat = Chat(blocking_profile.new_page(), live_server.url)
    sent = api_requests(chat.page, live_server.url)
    chat.page.goto(host_site.origin + "/")
    chat.send("First question")
    expect(chat.locator(".cvw-msg-assistant")).to_have_count(1)

    time.sleep(7)  # the first token has expired by now
    chat.send("Second question")

    expect(chat.locator(".cvw-msg-assistant")).to_have_count(2)
    expect(chat.locator(".cvw-msg-user")).to_have_text(["First question", "Second question"])
    renewals = [headers for url, headers in sent if url.endswith("/widget-token/") and "authorization" in headers]
    assert renewals  # the token was sent to be renewed, not a new visitor made
    assert Conversation.objects.count() == 1 and Turn.objects.filter(status="completed").count() == 2


def test_the_sources_of_an_embedded_answer_link_to_the_articles_on_the_chat_site(
        blocking_profile, host_site, live_server, worker_process, conversations_settings):
    """The articles are the chat site's: a path resolves against its origin, not the shop page's,
    and an absolute URL on it is a link; a URL of the shop's own origin is not the chat site's."""
    api = live_server.url
    conversations_settings.update(ALLOWED_ORIGINS=[host_site.origin])
    Article.objects.create(slug="bike-repair", title="Repairing a bicycle puncture",
                           body="<p>Patch the inner tube of the bicycle with a repair kit.</p>")
    shops = Article.objects.create(slug="bike-shops", title="Bicycle shops nearby",
                                   body="<p>Bicycle shops repair punctures too.</p>")
    rental = Article.objects.create(slug="bike-rental", title="Renting a bicycle",
                                    body="<p>Rent a bicycle while the puncture is repaired.</p>")
    Passage.objects.filter(object_pk=str(shops.pk)).update(url=f"{api}/help/bike-shops/")
    Passage.objects.filter(object_pk=str(rental.pk)).update(url=f"{host_site.origin}/help/bike-rental/")
    worker_process(DEMO_DELAY=0.05, TOOLS=["conversations.knowledge.tool.search_site"])
    host_site.pages["/"] = embedding_page(api, probe=False)
    chat = Chat(blocking_profile.new_page(), api)
    chat.page.goto(host_site.origin + "/")
    chat.send("How do I repair a bicycle puncture?")

    expect(chat.locator(".cvw-msg-assistant")).to_contain_text("inner tube")
    sources = chat.page.get_by_role("list", name="Sources")
    expect(sources.get_by_role("link", name="Repairing a bicycle puncture")).to_have_attribute(
        "href", f"{api}/help/bike-repair/")
    expect(sources.get_by_role("link", name="Bicycle shops nearby")).to_have_attribute(
        "href", f"{api}/help/bike-shops/")
    expect(sources.get_by_role("link")).to_have_count(2)
    expect(sources).to_contain_text("Renting a bicycle")  # as text


def test_past_the_max_age_an_anonymous_visitors_widget_starts_a_new_chain_and_keeps_the_conversation(
        blocking_profile, host_site, live_server, worker_process, conversations_settings):
    # Renewed after 10 s (two thirds of 15), and again after 20 s: past the max age of 15 s. The first
    # renewal has 5 s to arrive before the token expires, less up to 1 s of each whole-second stamp:
    # with a lifetime of 9 s (2 s to spare) a loaded CI machine once had it refused.
    conversations_settings.update(ALLOWED_ORIGINS=[host_site.origin], WIDGET_TOKEN_TTL=15, WIDGET_TOKEN_MAX_AGE=15)
    worker_process(DEMO_DELAY=0.05)
    host_site.pages["/"] = embedding_page(live_server.url, probe=False)
    chat = Chat(blocking_profile.new_page(), live_server.url)
    sent = api_requests(chat.page, live_server.url)
    minted = []
    chat.page.on("response", lambda response: minted.append((response.request.headers.get("authorization") is not None,
                                                             response.status))
                 if response.url.endswith("/widget-token/") else None)
    chat.page.goto(host_site.origin + "/")
    chat.send("First question")
    expect(chat.locator(".cvw-msg-assistant")).to_have_count(1)

    deadline = time.monotonic() + 45
    while not ((True, 401) in minted and minted[-1] == (False, 200)):  # the page's events come while it waits
        assert time.monotonic() < deadline, f"no new chain after a refused renewal: {minted}"
        chat.page.wait_for_timeout(100)
    chat.send("Second question")

    expect(chat.locator(".cvw-msg-assistant")).to_have_count(2)
    expect(chat.locator(".cvw-msg-user")).to_have_text(["First question", "Second question"])
    refused = minted.index((True, 401))
    # The first token, renewed at least once, then a renewal refused and a new chain for the visitor.
    assert minted[0] == (False, 200) and (True, 200) in minted[1:refused], minted
    assert minted[refused + 1] == (False, 200), minted
    assert Conversation.objects.count() == 1 and Turn.objects.filter(status="completed").count() == 2
    assert sent and not [url for url, headers in sent if "cookie" in headers]


def test_an_embedded_widget_offers_a_person_and_the_visitor_reads_the_staff_reply(
        blocking_profile, host_site, live_server, conversations_settings):
    """With a visitor token on another site, "Talk to a person" is offered where the assistant
    offers it, as on the site's own pages, and staff's reply reaches the widget."""
    from django.contrib.auth.models import User

    from conversations.engine import handoff
    from conversations.models import Assistant

    api = live_server.url
    conversations_settings.update(ALLOWED_ORIGINS=[host_site.origin])
    Assistant.objects.create(slug="support", name="Support", provider="demo", system_prompt="You are Support.",
                             handoff=Assistant.HandoffWays.BUTTON)
    host_site.pages["/"] = embedding_page(api, probe=False).replace(
        'data-api=', 'data-assistant="support" data-api=')
    chat = Chat(blocking_profile.new_page(), api)
    sent = api_requests(chat.page, api)
    chat.page.goto(host_site.origin + "/")

    chat.page.get_by_role("button", name="Talk to a person").click()
    expect(chat.locator(".cvw-handoff")).to_contain_text("A person will reply here.")
    conversation = Conversation.objects.get()
    assert conversation.handoff == "waiting" and conversation.owner_token.startswith("v:")
    ana = User.objects.create_user("ana", first_name="Ana", is_staff=True)
    handoff.reply(conversation.pk, ana, "Hello from our team: how can I help?")
    expect(chat.locator(".cvw-msg-staff")).to_contain_text("Hello from our team: how can I help?")
    expect(chat.locator(".cvw-handoff")).to_contain_text("Ana from support joined the conversation.")
    assert sent and not [url for url, headers in sent if "cookie" in headers]
