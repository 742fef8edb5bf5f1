"""Count the widget's poll requests and bytes for one turn, with and without 304s.

Drives the real widget in headless Chromium (Debian's /usr/bin/chromium) against a running
demo site, e.g. in another terminal:

    python3 dev.py demo --port 8765
    .venv/bin/python bench/poll_requests.py --url http://127.0.0.1:8765/ [--runs 3] [--screenshot PATH]

"Without 304s" strips the If-None-Match header from every poll, so each poll gets a full
200 answer, as a client that ignores ETags would. Bytes per poll: the request's header block
+ the response's header block + the response body (HTTP/1.1, no compression).
"""

import argparse
import os
import shutil
import statistics
import time
from urllib.parse import urlsplit

from playwright.sync_api import sync_playwright

QUESTION = "What time is it in Tokyo, and how do refunds work?"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


def header_bytes(headers, first_line):
    """Bytes of an HTTP/1.1 header block: the first line, each "name: value" line, the blank line."""
    return len(first_line) + 2 + sum(len(h["name"]) + 2 + len(h["value"]) + 2 for h in headers) + 2


def one_turn(browser, url, *, etags, screenshot=None):
    context = browser.new_context(viewport={"width": 560, "height": 720}, device_scale_factor=2)
    page = context.new_page()
    polls = []

    def strip_etag(route):
        headers = {k: v for k, v in route.request.headers.items() if k.lower() != "if-none-match"}
        route.continue_(headers=headers)

    if not etags:
        page.route("**/turns/*/", strip_etag)
    # "response", not "requestfinished": Chromium reports a 304 answer to a no-store fetch as failed.
    page.on("response", lambda r: polls.append(r) if r.request.method == "GET" and "/turns/" in r.url else None)
    page.goto(url)
    page.locator(".cvw-input").fill(QUESTION)
    started = time.monotonic()
    page.locator(".cvw-input").press("Enter")
    if screenshot:
        page.locator(".cvw-step .cvw-result").first.wait_for()
        page.locator(".cvw").screenshot(path=screenshot)
    page.locator(".cvw-msg-assistant").wait_for(timeout=60_000)
    page.locator(".cvw-stop").wait_for(state="hidden")
    elapsed = time.monotonic() - started
    page.wait_for_timeout(1500)  # any poll after done would show up here
    rows = []
    for response in polls:
        body = len(response.body()) if response.status == 200 else 0
        request_line = f"GET {urlsplit(response.url).path} HTTP/1.1"
        status_line = f"HTTP/1.1 {response.status} {response.status_text}"
        rows.append((response.status, header_bytes(response.request.headers_array(), request_line)
                     + header_bytes(response.headers_array(), status_line) + body, body))
    context.close()
    return elapsed, rows


def summary(label, results):
    """One markdown row: the mean over the runs of each figure."""
    mean = statistics.mean
    counts = mean(len(rows) for _, rows in results)
    not_modified = mean(sum(1 for status, _, _ in rows if status == 304) for _, rows in results)
    bodies = mean(sum(body for _, _, body in rows) for _, rows in results)
    total = mean(sum(size for _, size, _ in rows) for _, rows in results)
    seconds = mean(elapsed for elapsed, _ in results)
    print(f"| {label} | {seconds:.1f} s | {counts:.1f} | {not_modified:.1f} | {bodies:,.0f} B | {total:,.0f} B |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8765/")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--screenshot", help="also save a PNG of the widget mid-turn")
    options = parser.parse_args()
    executable = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or "/usr/bin/chromium"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=ARGS)
        if options.screenshot:
            one_turn(browser, options.url, etags=True, screenshot=options.screenshot)
        with_etags = [one_turn(browser, options.url, etags=True) for _ in range(options.runs)]
        without = [one_turn(browser, options.url, etags=False) for _ in range(options.runs)]
        browser.close()
    print(f"Question: {QUESTION!r}; mean of {options.runs} runs\n")
    print("| polling | turn took | poll requests | of them 304 | response bodies | bytes on the wire |")
    print("|---|---|---|---|---|---|")
    summary("with ETag / 304", with_etags)
    summary("without 304 (If-None-Match stripped)", without)


if __name__ == "__main__":
    main()
