"""What a model call costs the HTTP client before its bytes leave, pinned as counts (not times,
which the machine's load moves): a turn's calls to one URL with the same headers have
``requests`` prepare that request (the URL parsed and quoted, the session's headers merged) once,
and each call still sends its own body, with its length, the headers and the cookies the
provider set. Against a real server on 127.0.0.1."""

import requests

from conversations.core.budget import Budget
from conversations.infra.http import BudgetedHTTP
from tests.support.fakes import FakeProvider, Reply, openai_text

CONFIG = {"CALL_TIMEOUT": 5, "CONNECT_TIMEOUT": 5, "MIN_CALL_BUDGET": 0.5, "MAX_ATTEMPTS": 1,
          "BACKOFF_BASE": 0.05, "BACKOFF_MAX": 0.2}


def count_url_preparations(monkeypatch):
    """Each URL ``requests`` parses, checks and quotes for a request (``PreparedRequest.prepare_url``)."""
    prepared = []
    original = requests.PreparedRequest.prepare_url

    def prepare_url(self, url, params):
        prepared.append(url)
        return original(self, url, params)

    monkeypatch.setattr(requests.PreparedRequest, "prepare_url", prepare_url)
    return prepared


def test_a_turns_three_calls_to_one_url_prepare_its_request_once(monkeypatch):
    prepared = count_url_preparations(monkeypatch)
    with FakeProvider() as fake:
        fake.repeat(openai_text("ok"), 3)
        http = BudgetedHTTP(Budget(30), CONFIG, name="model")
        answers = [http.post_json(fake.url + "/chat/completions", {"model": "m", "messages": ["x"] * number},
                                  {"Authorization": "Bearer k"}).data["choices"][0]["message"]["content"]
                   for number in range(1, 4)]
        http.close()

    assert answers == ["ok", "ok", "ok"]
    assert prepared == [fake.url + "/chat/completions"]
    # Each call sent its own body, with its own length, and every header a Session.post sends.
    assert [len(request["json"]["messages"]) for request in fake.requests] == [1, 2, 3]
    for request in fake.requests:
        headers = request["headers"]
        assert request["path"] == "/v1/chat/completions"
        assert headers["Content-Length"] == str(len(request["raw"]))
        assert headers["Authorization"] == "Bearer k"
        assert headers["Content-Type"] == "application/json" and headers["Accept"] == "application/json"
        assert headers["User-Agent"].startswith("python-requests/")
        assert "Cookie" not in headers


def test_the_cookies_a_provider_sets_go_with_the_next_calls_of_the_turn():
    """A provider behind a CDN sets cookies on its replies (Cloudflare's ``__cf_bm``), which a
    ``requests`` session sends back on the next call: a request prepared once must not drop them."""
    with FakeProvider() as fake:
        fake.add(Reply(body=openai_text("one"), headers={"Set-Cookie": "__cf_bm=first; Path=/"}),
                 Reply(body=openai_text("two"), headers={"Set-Cookie": "__cf_bm=second; Path=/"}),
                 openai_text("three"))
        http = BudgetedHTTP(Budget(30), CONFIG, name="model")
        for _ in range(3):
            http.post_json(fake.url + "/chat/completions", {"model": "m"}, {"Authorization": "Bearer k"})
        http.close()

    assert [request["headers"].get("Cookie") for request in fake.requests] == [
        None, "__cf_bm=first", "__cf_bm=second"]


def test_each_call_of_a_request_prepared_once_goes_through_the_proxy_the_environment_names(monkeypatch):
    """``HTTP_PROXY`` (looked up once per origin) still carries every call: the proxy, here the
    fake server itself, receives each request for the provider's host, which is never resolved."""
    from conversations.infra import watchdog

    with FakeProvider() as proxy:
        proxy.repeat(openai_text("via the proxy"), 2)
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        watchdog._environment_for.cache_clear()
        try:
            http = BudgetedHTTP(Budget(30), CONFIG, name="model")
            answers = [http.post_json("http://provider.invalid/v1/chat/completions", {"model": "m"}, {}).data
                       for _ in range(2)]
            http.close()
        finally:
            watchdog._environment_for.cache_clear()

    assert [answer["choices"][0]["message"]["content"] for answer in answers] == ["via the proxy"] * 2
    assert [request["path"] for request in proxy.requests] == ["http://provider.invalid/v1/chat/completions"] * 2
