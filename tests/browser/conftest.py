"""Browser fixtures: Debian's headless Chromium driven by Playwright, against pytest-django's
``live_server`` (a thread of this process, using the test database and the real Redis)."""

import os
import shutil

import pytest

# Playwright's sync API keeps an asyncio loop in this thread; the test's own ORM calls are
# still synchronous, so Django's guard against ORM calls from async code does not apply.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
# Generous: two cores are shared with workers and other test runs.
TIMEOUT_MS = 20_000


def chromium_path():
    return os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for the session (never a downloaded browser build)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


class Chat:
    """A page with the widget, plus what its tests look at: the poll requests it made and
    every batch of elements the widget added to the log (recorded in the page)."""

    def __init__(self, page, base_url):
        self.page, self.base_url = page, base_url
        self.polls = []  # (url, request headers) of every poll GET
        self.responses = []  # (url, status) of every poll answer
        self.dialogs = []
        page.on("request", self._on_request)
        page.on("response", self._on_response)
        page.on("dialog", self._on_dialog)
        # The widget draws in a shadow root, which an observer of the document does not see into:
        # each shadow root is observed as it is attached.
        page.add_init_script("""
            window.__batches = [];
            var observer = new MutationObserver(function (records) {
              var added = [];
              records.forEach(function (r) { r.addedNodes.forEach(function (n) {
                if (n.nodeType === 1 && n.tagName === "LI") { added.push(n.className); } }); });
              if (added.length) { window.__batches.push(added); }
            });
            observer.observe(document, {childList: true, subtree: true});
            var attachShadow = Element.prototype.attachShadow;
            Element.prototype.attachShadow = function (init) {
              var root = attachShadow.call(this, init);
              observer.observe(root, {childList: true, subtree: true});
              return root;
            };
        """)

    @staticmethod
    def _is_poll(request):
        return request.method == "GET" and "/turns/" in request.url

    def _on_request(self, request):
        if self._is_poll(request):
            self.polls.append((request.url, request.headers))

    def _on_response(self, response):
        if self._is_poll(response.request):
            self.responses.append((response.url, response.status))

    def _on_dialog(self, dialog):
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def open(self, path="/"):
        self.page.goto(self.base_url + path)
        self.page.locator(".cvw-input").wait_for()
        return self

    def send(self, text):
        self.page.locator(".cvw-input").fill(text)
        self.page.locator(".cvw-input").press("Enter")

    def locator(self, selector, **options):
        return self.page.locator(selector, **options)

    def batches(self):
        return self.page.evaluate("window.__batches")


@pytest.fixture
def chat_page(browser, live_server):
    """A fresh browser context (English) on the live server; ``chat_page(locale=..., **context_options)``
    for another."""
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    contexts = []

    def open_context(locale="en-US", **options):
        """``options``: any of Playwright's ``new_context`` options (viewport, forced_colors...)."""
        context = browser.new_context(locale=locale, **options)
        context.set_default_timeout(TIMEOUT_MS)
        contexts.append(context)
        return Chat(context.new_page(), live_server.url)

    yield open_context
    for context in contexts:
        context.close()
