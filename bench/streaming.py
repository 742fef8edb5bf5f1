"""Streaming benchmark: how soon a visitor sees what the model writes, what it costs, and how
fast Stop stops.

    .venv/bin/python -m bench.streaming [--database sqlite|postgres] [--seconds 20] [--runs 3]

A fake OpenAI-compatible server streams an answer word by word (one word every 0.1 s for
``--seconds``) to a turn run by a real ``rqworker``, served by gunicorn, as in production:

- lag: from the provider sending a word to the poll view first returning it (a poller asking
  every 10 ms, so the figure is the pipeline's, not the poll interval's), and to the word
  appearing in the real widget in headless Chromium (its own polling included; one run);
- polls: requests and bytes a widget-like poller (every 0.3 s while text grows, with ETags)
  makes for the whole answer;
- one partial publish (cache only), timed in this process;
- Stop: from the cancel request to the provider's connection being closed, and to the poll
  view answering ``done``.
"""

import argparse
import time

from bench.common import Stack, machine, median, percentile, table

WORD_INTERVAL = 0.1


def words(count):
    return [f"w{n:04d} " for n in range(count)]


def queue_stream(fake, count):
    """Have ``fake`` stream the next request's answer, ``count`` words, one every WORD_INTERVAL."""
    from tests.support.fake_stream import openai_stream, streaming

    fake.add(streaming(openai_stream(pieces=words(count)), interval=WORD_INTERVAL))


def start_turn(base, session, content):
    conversation = session.post(f"{base}/api/conversations/", json={}).json()["id"]
    response = session.post(f"{base}/api/conversations/{conversation}/turns/", json={"content": content})
    response.raise_for_status()
    return response.json()


def measure_lag(base, fake, count):
    """Seconds from each word leaving the provider to the first poll that returned it."""
    from bench.common import visitor

    session = visitor(base)
    started = start_turn(base, session, "Stream for me")
    seen = []  # (monotonic time of the answer, characters of streamed text in it)
    while True:
        data = session.get(base + started["poll_url"]).json()
        now = time.monotonic()
        last = data["messages"][-1] if data["messages"] else {}
        if last.get("role") == "assistant":
            seen.append((now, len(last["content"])))
        if data["done"]:
            break
        time.sleep(0.01)
    lags, cumulative = [], 0
    sent = fake.sent_at[-(count + 4):]  # this answer's events: role, the words, finish, usage, [DONE]
    for sent_at, word in zip(sent[1:], words(count)):  # the first event carries no text
        cumulative += len(word)
        shown = next((at for at, length in seen if length >= cumulative), None)
        if shown is not None:
            lags.append(shown - sent_at)
    return lags


WATCH_WIDGET = """
    window.__shown = [];
    function watch(root) {
      new MutationObserver(function () {
        var answers = root.querySelectorAll(".cvw-msg-assistant");
        if (!answers.length) { return; }
        var words = (answers[answers.length - 1].textContent.match(/w\\d{4}/g) || []).length;
        window.__shown.push([Date.now(), words]);
      }).observe(root, {childList: true, subtree: true, characterData: true});
    }
    var attachShadow = Element.prototype.attachShadow;
    Element.prototype.attachShadow = function (init) { var root = attachShadow.call(this, init); watch(root); return root; };
"""


def serve_static(route):
    """Answer a request for /static/… from the app's and the demo's static directories."""
    from urllib.parse import urlsplit

    from bench.common import ROOT

    name = urlsplit(route.request.url).path.split("/static/", 1)[1]
    for folder in (ROOT / "conversations" / "static", ROOT / "static"):
        if (folder / name).is_file():
            return route.fulfill(path=str(folder / name))
    return route.fulfill(status=404)


def measure_widget_lag(base, fake, count):
    """Seconds from each word leaving the provider to its appearing in the real widget, in
    Debian's headless Chromium (wall clocks: both run on this machine)."""
    from playwright.sync_api import sync_playwright

    from tests.browser.conftest import CHROMIUM_ARGS, chromium_path

    offset = time.time() - time.monotonic()  # the fake stamps its sends on the monotonic clock
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.add_init_script(WATCH_WIDGET)
        page.route("**/static/**", serve_static)  # gunicorn, as in production, serves no static files
        page.goto(base + "/")
        already = len(fake.sent_at)
        page.locator(".cvw-input").fill("Stream for me")
        page.locator(".cvw-input").press("Enter")
        deadline = time.monotonic() + count * WORD_INTERVAL + 30
        while time.monotonic() < deadline:
            shown = page.evaluate("window.__shown")
            if shown and shown[-1][1] >= count:
                break
            page.wait_for_timeout(200)
        browser.close()
    sent = fake.sent_at[already:][1:count + 1]  # the first event carries no text
    lags = []
    for index, sent_at in enumerate(sent):
        seen = next((at / 1000 for at, words in shown if words >= index + 1), None)
        if seen is not None:
            lags.append(seen - (sent_at + offset))
    return lags


def measure_polls(base, fake):
    """Requests and response bytes of a widget-like poller over one streamed answer."""
    from bench.common import visitor

    session = visitor(base)
    started = start_turn(base, session, "Stream for me")
    etag, requests_made, received = None, 0, 0
    while True:
        headers = {"If-None-Match": etag} if etag else {}
        response = session.get(base + started["poll_url"], headers=headers)
        requests_made += 1
        received += len(response.content) + sum(len(k) + len(v) + 4 for k, v in response.headers.items())
        if response.status_code == 200:
            etag = response.headers.get("ETag")
            data = response.json()
            if data["done"]:
                return requests_made, received
            streaming = bool(data["messages"]) and data["messages"][-1].get("streaming")
        time.sleep(0.3 if streaming else 1.0)


def measure_publish(runs=2000):
    """Microseconds for one partial publish of a state with a 2,000-character growing answer."""
    from conversations.infra import state

    data = {"id": "bench-turn", "conversation": "c", "owner": {"user": None, "token": "t"}, "status": "running",
            "done": False, "error": None, "job_id": "j", "started_at": time.time(),
            "messages": [{"id": 1, "role": "user", "content": "Stream for me"},
                         {"id": None, "role": "assistant", "content": "w" * 2000, "streaming": True}]}
    state.publish(data)
    started = time.perf_counter()
    for _ in range(runs):
        state.publish(data)
    return (time.perf_counter() - started) / runs * 1e6


def measure_stop(base, fake, *, after=2.0):
    """(cancel request → provider connection closed, cancel request → poll answers done), seconds."""
    from bench.common import visitor

    session = visitor(base)
    fake.closed_at, already = None, len(fake.sent_at)
    started = start_turn(base, session, "Stream for me")
    deadline = time.monotonic() + 30
    while len(fake.sent_at) - already < after / WORD_INTERVAL and time.monotonic() < deadline:
        time.sleep(0.01)
    asked = time.monotonic()
    session.post(base + started["cancel_url"], json={}).raise_for_status()
    while not session.get(base + started["poll_url"]).json()["done"]:
        time.sleep(0.005)
    done = time.monotonic()
    while fake.closed_at is None and time.monotonic() < deadline:
        time.sleep(0.005)
    return fake.closed_at - asked, done - asked


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", default="sqlite")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    count = int(args.seconds / WORD_INTERVAL)

    from tests.support.fakes import FakeProvider

    lags, polls, stops, widget = [], [], [], []
    with FakeProvider() as fake:
        settings = {"PROVIDER": "openai", "BASE_URL": fake.url, "API_KEY": "bench", "TOOLS": "",
                    "JOB_TIMEOUT": int(args.seconds + 40), "CALL_TIMEOUT": int(args.seconds + 10),
                    "STREAM": "1", "PUBLISH_INTERVAL": "0.25", "STATE_TTL": 600,
                    "TURN_RATE_PER_OWNER": "", "TURN_RATE_PER_IP": "", "MAX_ACTIVE_TURNS_PER_OWNER": 0}
        with Stack(database=args.database, conversations=settings) as stack:
            base = stack.gunicorn(2)
            stack.workers(1)
            for _ in range(args.runs):
                queue_stream(fake, count)
                lags += measure_lag(base, fake, count)
                queue_stream(fake, count)
                polls.append(measure_polls(base, fake))
                queue_stream(fake, count)
                stops.append(measure_stop(base, fake))
            queue_stream(fake, count)
            widget = measure_widget_lag(base, fake, count)
            publish_us = measure_publish()

    print(machine())
    print(f"{args.runs} runs, {args.database}; a word every {WORD_INTERVAL}s for {args.seconds:.0f}s; "
          f"PUBLISH_INTERVAL 0.25 s\n")
    table(["measure", "p50", "p95", "max", "n"], [
        ["provider sends a word → poll view returns it (ms)", f"{median(lags) * 1000:.0f}",
         f"{percentile(lags, 0.95) * 1000:.0f}", f"{max(lags) * 1000:.0f}", str(len(lags))],
        ["provider sends a word → it shows in the widget, Chromium (ms)", f"{median(widget) * 1000:.0f}",
         f"{percentile(widget, 0.95) * 1000:.0f}", f"{max(widget) * 1000:.0f}", str(len(widget))],
        ["Stop → provider connection closed (ms)", f"{median([s[0] for s in stops]) * 1000:.0f}",
         f"{percentile([s[0] for s in stops], 0.95) * 1000:.0f}", f"{max(s[0] for s in stops) * 1000:.0f}",
         str(len(stops))],
        ["Stop → poll view answers done (ms)", f"{median([s[1] for s in stops]) * 1000:.0f}",
         f"{percentile([s[1] for s in stops], 0.95) * 1000:.0f}", f"{max(s[1] for s in stops) * 1000:.0f}",
         str(len(stops))],
    ])
    requests_made = [p[0] for p in polls]
    received = [p[1] for p in polls]
    print(f"\nwidget-like poller over a {args.seconds:.0f} s answer: {median(requests_made):.0f} requests, "
          f"{median(received) / 1024:.0f} KiB (median of {len(polls)})")
    print(f"one partial publish (cache only, 2,000-character answer): {publish_us:.0f} µs")


if __name__ == "__main__":
    main()
