"""Host pages for the widget tests: a page of someone's site with ``{% chat_widget %}`` tags in
it (rendered by the real tag) and, if the test wants, the host's own stylesheet. The page is
served at a path of the live server by route interception, so its static files and API are the
live server's."""

import contextlib
import json

from django.template import engines
from django.test import RequestFactory
from django.utils import translation

PAGE = """{% load conversations %}<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1"><title>A host page</title>
<style>STYLE</style></head><body><main><h1>A host page</h1>BODY</main></body></html>"""

# What a site's own stylesheet may do to every element of its pages (issue 14).
AGGRESSIVE = """
html { font-size: 18px; }
body { font-family: Georgia, serif; color: #222; background: #f6f1e7; line-height: 2; letter-spacing: .05em; }
* { box-sizing: content-box; }
label { text-transform: uppercase; letter-spacing: .3em; color: red; font-size: 30px; }
button { all: unset; background: hotpink; padding: 2em; font-family: cursive; }
textarea { background: yellow; border: 5px dotted green; font-size: 22px; width: 50px; }
ol, ul { list-style: upper-roman; padding: 3em; margin: 3em; }
li { margin: 1em; border: 2px solid orange; }
p, span, div, section { text-indent: 2em; text-align: right; font-style: italic; }
:focus-visible { outline: none; }
"""


def render(body, style="", language="en"):
    """The page's HTML: ``body`` (Django template text, with the conversations tags loaded), in
    ``language`` (whatever an earlier request of this thread left active)."""
    request = RequestFactory().get("/host-page/")
    source = PAGE.replace("STYLE", style).replace("BODY", body)
    with translation.override(language):
        return engines["django"].from_string(source).render({"request": request}, request=request)


def open_host_page(chat, body, style="", path="/host-page/"):
    """Serve ``body`` at ``path`` and open it in ``chat``'s page, once its widgets are drawn."""
    html = render(body, style)
    chat.page.route(f"**{path}", lambda route: route.fulfill(content_type="text/html", body=html))
    chat.page.goto(chat.base_url + path)
    chat.page.locator(".cvw").first.wait_for(state="attached")
    chat.page.wait_for_function("""() => [...document.querySelectorAll("[data-conversations-widget]")]
        .every(host => host.shadowRoot && !host.shadowRoot.querySelector(".cvw").hidden)""")
    return chat


def plain_page(*widgets):
    """A page that is no Django template, with one widget element per ``widgets`` item (its
    data attributes), as the README's snippet builds it."""
    hosts = "".join("<conversations-widget data-api-url=\"/api/conversations/\" {}></conversations-widget>".format(
        " ".join(f"data-{k}='{json.dumps(v) if isinstance(v, dict) else v}'" for k, v in attrs.items()))
        for attrs in widgets)
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Plain</title></head><body><main>"
            f"{hosts}<script src=\"/static/conversations/widget.js\" defer></script></main></body></html>")


@contextlib.contextmanager
def admin_page(browser, live_server, viewport=None):
    """A browser page signed in to the admin as a new superuser (a window of ``viewport``, 1280×900
    unless given); closed on leaving."""
    from django.contrib.auth.models import User

    User.objects.create_superuser("admin", "admin@example.com", "pw-123456789")
    context = browser.new_context(viewport=viewport or {"width": 1280, "height": 900})
    page = context.new_page()
    try:
        page.goto(f"{live_server.url}/admin/login/")
        page.fill("#id_username", "admin")
        page.fill("#id_password", "pw-123456789")
        page.click("input[type=submit]")
        yield page
    finally:
        context.close()


def settled(page):
    """Wait until the page's finite CSS animations have finished (a new message fades in over
    0.15 s): an audit taken mid-fade measures a half-transparent text's contrast.

    The widget lives in a shadow root, and `document.getAnimations()` does not see into shadow
    roots (Chromium returns none of the widget's), so every open shadow root is asked as well."""
    page.evaluate("""() => {
        const roots = [document, ...[...document.querySelectorAll("*")].map(e => e.shadowRoot).filter(Boolean)];
        return Promise.all(roots.flatMap(root => root.getAnimations())
            .filter(a => a.effect && a.effect.getComputedTiming().iterations !== Infinity)
            .map(a => a.finished.catch(() => null)));
    }""")
