"""The screenshots of docs/widget.md: both widget modes on a host page with its own styles, one of
them mid-stream, the other with its answer rated. No server: Chromium gets the widget's files from this checkout and the API's
states from this script (route interception), in the shape the poll view serves them.

    .venv/bin/python bench/widget_screenshots.py [--out docs/images]
"""

import argparse
import json
import os
import shutil
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent
STATIC = ROOT / "conversations" / "static" / "conversations"
ORIGIN = "http://shop.test"
TURNS = "/api/conversations/c1/turns/"

HOST_STYLE = """
html { font-size: 17px; } body { margin: 0; font: 1rem/1.7 Georgia, "DejaVu Serif", serif; color: #3a2e22;
  background: #f7f1e6; } header { background: #5b3a1e; color: #fbe9cf; padding: 1rem 2rem; letter-spacing: .2em;
  text-transform: uppercase; } main { display: grid; grid-template-columns: 1fr 32rem; gap: 2rem; padding: 2rem; }
h1 { font-weight: normal; font-size: 2.2rem; margin: 0 0 1rem; } label, button { text-transform: uppercase;
  letter-spacing: .3em; } button { all: unset; background: #b5542b; color: #fff; padding: .6rem 1.4rem; }
li { list-style: "✿ "; margin: .6rem 0; } * { box-sizing: content-box; }
"""
PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Crumb & Co.</title>
<style>{style}</style></head><body><header>Crumb &amp; Co. · Bakery</header><main><div><h1>Opening hours</h1>
<p>Fresh bread every morning from seven. Ask our assistant about orders, allergens or delivery.</p>
<ul><li>Sourdough, rye and spelt</li><li>Cakes to order</li></ul><button>Order now</button></div>
<div>{widget}</div></main><script src="/static/conversations/widget.js"></script></body></html>"""
WIDGET = """<conversations-widget data-mode="{mode}" data-api-url="/api/conversations/" data-csrf-token="x"
  {extra}></conversations-widget>"""

QUESTION = "Do you deliver to Tokyo, and what time is it there?"
STEP = [{"id": 2, "role": "assistant", "content": "", "tool_calls": [
    {"id": "c1", "name": "current_time", "arguments": {"city": "Tokyo"}}]},
    {"id": 3, "role": "tool", "content": "2025-05-02T09:14:00+09:00", "tool_call_id": "c1", "name": "current_time",
     "is_error": False}]
ANSWER = ("It is **09:14** in Tokyo right now.\n\nWe do not deliver abroad, but our sourdough keeps for a week:"
          "\n\n- order by Thursday\n- collect on Saturday")


def state(status, messages, version):
    return {"id": 1, "conversation": "c1", "status": status, "done": status == "completed", "error": None,
            "version": version, "messages": [{"id": 1, "role": "user", "content": QUESTION}, *messages]}


def shoot(page, mode, final, path, extra=""):
    served = {"state": state("running", STEP, 2)}

    def answer(route):
        url = route.request.url[len(ORIGIN):]
        if url.startswith("/static/conversations/"):
            return route.fulfill(path=str(STATIC / url.rsplit("/", 1)[1]))
        if url == "/api/conversations/" and route.request.method == "POST":
            return route.fulfill(status=201, content_type="application/json", body='{"id": "c1"}')
        if url == TURNS and route.request.method == "POST":
            return route.fulfill(status=202, content_type="application/json", body=json.dumps(
                {"id": 1, "status": "queued", "done": False, "poll_url": TURNS + "1/", "cancel_url": TURNS + "1/cancel/"}))
        if url == TURNS + "1/rating/":
            return route.fulfill(status=201, content_type="application/json", body=json.dumps(
                {"turn": "1", "rated_at": "2025-05-02T00:14:00Z", **json.loads(route.request.post_data)}))
        if url == TURNS + "1/":
            return route.fulfill(status=200, content_type="application/json", body=json.dumps(served["state"]))
        widget = WIDGET.format(mode=mode, extra=extra)
        return route.fulfill(content_type="text/html", body=PAGE.format(style=HOST_STYLE, widget=widget))

    page.unroute("**/*")
    page.route("**/*", answer)
    page.goto(ORIGIN + "/")
    if mode == "launcher":
        page.locator(".cvw-launcher").click()
    page.locator(".cvw-input").fill(QUESTION)
    page.locator(".cvw-input").press("Enter")
    page.locator(".cvw-step-done").wait_for()
    served["state"] = state("running", [*STEP, {"id": None, "role": "assistant", "streaming": True,
                                                "content": ANSWER[:70]}], 3) if not final else \
        state("completed", [*STEP, {"id": 4, "role": "assistant", "content": ANSWER}], 3)
    page.locator(".cvw-growing" if not final else ".cvw-msg-assistant li >> nth=1").wait_for()
    if final:  # the visitor found it helpful: the pressed thumb, the comment box and the thanks
        page.get_by_role("button", name="Helpful", exact=True).click()
        page.locator(".cvw-rate-said").wait_for()
        page.locator(".cvw-log").evaluate("log => { log.scrollTop = log.scrollHeight; }")
    page.locator(".cvw-input").blur()
    page.locator(".cvw-thumb").first.blur() if final else None
    page.screenshot(path=str(path))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "images"))
    args = parser.parse_args()
    chromium = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or "/usr/bin/chromium"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox",
                                             "--disable-gpu", "--no-first-run", "--disable-background-networking",
                                             "--disable-component-update", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1200, "height": 760}, reduced_motion="reduce")
        shoot(page, "inline", False, Path(args.out) / "widget-inline-streaming.png")
        shoot(page, "launcher", True, Path(args.out) / "widget-launcher.png",
              extra='style="--cvw-accent: #7a3b12; --cvw-assistant-background: #f3e9dc"')
        browser.close()


if __name__ == "__main__":
    main()
