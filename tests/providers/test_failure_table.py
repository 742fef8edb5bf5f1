"""Every kind of provider failure, directly and behind a gateway (a fake LiteLLM proxy), run through
a real turn: what the visitor reads, the turn's status, and the attempts' lines in the admin's
timeline. The table in docs/providers.md ("What each failure reads as") is this module's ``ROWS``,
rendered by ``table()``; ``test_the_docs_table_is_this_modules`` keeps the two the same.

To rewrite the docs' table after a change here: ``.venv/bin/python -m tests.providers.test_failure_table``
prints it.

Every row runs with ``MAX_ATTEMPTS`` 1 (2 where the row says), ``CALL_TIMEOUT`` 1.5 s,
``CONNECT_TIMEOUT`` 0.5 s, ``STREAM_IDLE_TIMEOUT`` 1 s, streaming on, and 6 s for the turn; in the
timeline column, "…" stands for what changes from run to run (a port, which of two equal limits
fired first).
"""

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.fake_gateway import (
    REFUSAL, answers_unstreamed, empty_stream, error_under_200, gateway_error, html_error, invalid_model, rate_limited,
    upstream_ignores_stream, withholds_headers, wrapped_refusal,
)
from tests.support.fake_stream import openai_stream, streaming
from tests.support.fake_wire import anthropic_error, openai_error, run_turn_here
from tests.support.fakes import (
    FakeProvider, Reply, full_accept_queue, hang, never_read, openai_text, refused_url, trickle_body,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "providers.md"
BEGIN, END = "<!-- failure table: begin -->", "<!-- failure table: end -->"
SECRET = "sk-table-secret-0123456789"
ANSWER = "Refunds are paid within 30 days."

# The visitor's sentences (conversations/providers/base.py and core/sentences.py), as they read them.
AUTH = "The assistant is not set up correctly: the AI service rejected its credentials."
UNKNOWN_MODEL = "The assistant is not set up correctly: the AI service does not know the configured model."
REFUSED = "The assistant could not answer this request."
BUSY = "The AI service is busy right now. Please try again in a minute."
UNAVAILABLE = "The AI service is unavailable right now. Please try again in a minute."
TOO_LONG = "The AI service took too long to answer. Please try again."
UNREACHABLE = "The assistant could not reach the AI service. Please try again later."
QUOTA = "The assistant cannot answer for now: the site's allowance with its AI service is used up."
EMPTY = "The AI service sent an empty answer. Please try again, or ask in other words."
CUT = "The answer was cut short: the connection to the AI service broke off. Please ask again to continue."

UPSTREAM_BUSY = "litellm.RateLimitError: RateLimitError: OpenAIException - Rate limit reached for m"


def stream(text, **kwargs):
    return streaming(openai_stream(text, **kwargs))


def broken_stream(text, then):
    """``text`` streamed word by word, then (without its ending) ``then``: "reset" or "hang"."""
    return streaming(openai_stream(text, done=False)[:1 + len(text.split())], then=then)


def error_event_after(text, error):
    """``text`` streamed, then the error event a gateway sends when its upstream fails mid-stream:
    ``data: {"error": …}`` with the status it means in ``code``."""
    events = openai_stream(text, done=False)[:1 + len(text.split())] + [(None, json.dumps({"error": error}))]
    return streaming(events)


def litellm_error(status, message, kind="None"):
    return {"message": message, "type": kind, "param": "None", "code": str(status)}


@dataclass
class Row:
    failure: str
    route: str  # "direct" or "gateway"
    replies: object  # () -> the fake's behaviours, in order
    status: str
    visitor: str  # the turn's error, the sentence the visitor reads ("" for none)
    timeline: list  # each model attempt's "outcome: detail", "…" for what varies
    answer: str = ""  # text the visitor reads before the sentence (kept from a stream)
    settings: dict = field(default_factory=dict)
    wire: str = "openai"
    endpoint: str = ""  # "refused" or "unaccepted": a socket of its own instead of the fake
    question: str = "How do refunds work?"

    @property
    def id(self):
        return f"{self.route}: {self.failure}"


ROWS = [
    # -- directly ------------------------------------------------------------------------------------------
    Row("connection refused", "direct", lambda: [], "failed", UNREACHABLE,
        ["connection error: ConnectionError to 127.0.0.1:…: connection refused"],
        endpoint="refused"),
    Row("time-out connecting", "direct", lambda: [], "failed", TOO_LONG,
        ["timeout: …timed out connecting (connect limit 0.5s)"], endpoint="unaccepted"),
    Row("time-out sending the request (never read)", "direct", lambda: [never_read], "failed", TOO_LONG,
        ["timeout: …timed out sending the request (connect limit 0.5s)"], question="x" * (16 << 20),
        settings={"HISTORY_MAX_CHARS": 32 << 20}),
    Row("time-out waiting for the first byte", "direct", lambda: [hang], "failed", TOO_LONG,
        ["timeout: …timed out waiting for the first byte (… limit 1.5s)"]),
    Row("time-out between the bytes of a stream, before any text", "direct",
        lambda: [streaming(openai_stream(pieces=[], done=False)[:1], then="hang")], "failed", TOO_LONG,
        ["timeout: timed out between bytes (idle limit 1.0s)"]),
    Row("time-out reading a reply that trickles (unstreamed)", "direct", lambda: [trickle_body(0.1)], "failed",
        TOO_LONG, ["timeout: timed out between bytes (total limit 1.5s)"], settings={"STREAM": False}),
    Row("401 (key refused)", "direct",
        lambda: [openai_error(401, f"Incorrect API key provided: {SECRET}.", code="invalid_api_key")],
        "failed", AUTH, ["HTTP error: HTTP 401 invalid_api_key: Incorrect API key provided: [API key hidden]."]),
    Row("403 (key not allowed)", "direct",
        lambda: [openai_error(403, "You have insufficient permissions for this operation.")],
        "failed", AUTH,
        ["HTTP error: HTTP 403 invalid_request_error: You have insufficient permissions for this operation."]),
    Row("404 unknown model", "direct",
        lambda: [openai_error(404, "The model `m` does not exist or you do not have access to it.",
                              code="model_not_found")],
        "failed", UNKNOWN_MODEL,
        ["HTTP error: HTTP 404 model_not_found: The model `m` does not exist or you do not have access to it. "
         "(the configured model 'm' is not one the service knows)"]),
    Row("408", "direct", lambda: [openai_error(408, "Request timed out.", type="timeout")], "failed", TOO_LONG,
        ["HTTP error: HTTP 408 timeout: Request timed out."]),
    Row("429 with a retry hint that fits", "direct",
        lambda: [Reply(429, openai_error(429, "Rate limit reached for m", code="rate_limit_exceeded").body,
                       {"Retry-After": "1"}), stream(ANSWER)],
        "completed", "", ["HTTP error: HTTP 429 rate_limit_exceeded: Rate limit reached for m", "ok"],
        answer=ANSWER, settings={"MAX_ATTEMPTS": 2}),
    Row("429 with a retry hint past the turn's time", "direct",
        lambda: [Reply(429, openai_error(429, "Rate limit reached for m", code="rate_limit_exceeded").body,
                       {"Retry-After": "60"})],
        "failed", BUSY, ["HTTP error: HTTP 429 rate_limit_exceeded: Rate limit reached for m"],
        settings={"MAX_ATTEMPTS": 2}),
    Row("429 without a retry hint", "direct",
        lambda: [openai_error(429, "Rate limit reached for m", code="rate_limit_exceeded")] * 2,
        "failed", BUSY, ["HTTP error: HTTP 429 rate_limit_exceeded: Rate limit reached for m"] * 2,
        settings={"MAX_ATTEMPTS": 2}),
    Row("429 quota used up (insufficient_quota)", "direct",
        lambda: [openai_error(429, "You exceeded your current quota, please check your plan and billing details.",
                              type="insufficient_quota", code="insufficient_quota")],
        "failed", QUOTA, ["HTTP error: HTTP 429 insufficient_quota: You exceeded your current quota, please check "
                          "your plan and billing details."], settings={"MAX_ATTEMPTS": 2}),
    Row("400 credit balance too low (Anthropic)", "direct",
        lambda: [anthropic_error(400, "invalid_request_error", "Your credit balance is too low to access the "
                                                               "Anthropic API. Please go to Plans & Billing.")],
        "failed", QUOTA, ["HTTP error: HTTP 400 invalid_request_error: Your credit balance is too low to access the "
                          "Anthropic API. Please go to Plans & Billing."], wire="anthropic"),
    Row("500", "direct",
        lambda: [openai_error(500, "The server had an error while processing your request.", type="server_error")],
        "failed", UNAVAILABLE,
        ["HTTP error: HTTP 500 server_error: The server had an error while processing your request."]),
    Row("502 from a proxy (an HTML page)", "direct", lambda: [html_error(502)], "failed", UNAVAILABLE,
        ["HTTP error: HTTP 502: 500 Internal Server Error Internal Server Error nginx"]),
    Row("529 overloaded (Anthropic)", "direct", lambda: [anthropic_error(529, "overloaded_error", "Overloaded")],
        "failed", UNAVAILABLE, ["HTTP error: HTTP 529 overloaded_error: Overloaded"], wire="anthropic"),
    Row("refusal before any text", "direct",
        lambda: [openai_error(400, "The response was filtered due to the prompt triggering Azure OpenAI's content "
                                   "management policy.", code="content_filter")],
        "failed", REFUSED,
        ["HTTP error: HTTP 400 content_filter: The response was filtered due to the prompt triggering Azure "
         "OpenAI's content management policy."]),
    Row("refusal after some text", "direct", lambda: [stream("Here is how to", finish="content_filter")],
        "incomplete", REFUSED, ["ok"], answer="Here is how to"),
    Row("empty answer, twice", "direct", lambda: [empty_stream("openai"), openai_text("")], "failed", EMPTY,
        ["bad response: empty reply: no text and no tool calls"] * 2),
    Row("stream cut after some text (connection reset)", "direct", lambda: [broken_stream(ANSWER, "reset")],
        "incomplete", CUT, ["connection error: the stream broke off: …"], answer=ANSWER),
    Row("stream silent after some text", "direct", lambda: [broken_stream(ANSWER, "hang")],
        "incomplete", CUT, ["timeout: timed out between bytes (idle limit 1.0s)"], answer=ANSWER),

    # -- behind a gateway (what the LiteLLM proxy sends) --------------------------------------------------------
    Row("upstream refused the connection", "gateway",
        lambda: [gateway_error(500, "litellm.InternalServerError: InternalServerError: OpenAIException - "
                                    "Connection error.")],
        "failed", UNAVAILABLE,
        ["HTTP error: HTTP 500 500 [upstream OpenAI, via the gateway]: litellm.InternalServerError: "
         "InternalServerError: OpenAIException - Connection error."]),
    Row("the gateway's time-out (408)", "gateway",
        lambda: [gateway_error(408, "litellm.Timeout: Connection timed out after 65.0 seconds.")],
        "failed", TOO_LONG,
        ["HTTP error: HTTP 408 408 [the gateway's own]: litellm.Timeout: Connection timed out after 65.0 seconds."]),
    Row("the gateway still retrying at the call limit", "gateway",
        lambda: [withholds_headers(5, stream(ANSWER))], "failed", TOO_LONG,
        ["timeout: …timed out waiting for the first byte (… limit 1.5s)"]),
    Row("401, the gateway's key refused", "gateway",
        lambda: [Reply(401, {"error": litellm_error(401, "Authentication Error, Invalid proxy server token passed. "
                                                         f"Received API Key = {SECRET}", "auth_error")})],
        "failed", AUTH,
        ["HTTP error: HTTP 401 401 [the gateway's own]: Authentication Error, Invalid proxy server token passed. "
         "Received API Key = [API key hidden]"]),
    Row("401, the upstream's key refused", "gateway",
        lambda: [gateway_error(401, "litellm.AuthenticationError: AuthenticationError: OpenAIException - "
                                    "Incorrect API key provided")],
        "failed", AUTH,
        ["HTTP error: HTTP 401 401 [upstream OpenAI, via the gateway]: litellm.AuthenticationError: "
         "AuthenticationError: OpenAIException - Incorrect API key provided"]),
    Row("403 from upstream", "gateway",
        lambda: [gateway_error(403, "litellm.PermissionDeniedError: PermissionDeniedError: OpenAIException - "
                                    "You have insufficient permissions for this operation.")],
        "failed", AUTH,
        ["HTTP error: HTTP 403 403 [upstream OpenAI, via the gateway]: litellm.PermissionDeniedError: "
         "PermissionDeniedError: OpenAIException - You have insufficient permissions for this operation."]),
    Row("a model the gateway does not list (400)", "gateway", lambda: [invalid_model("m")], "failed", UNKNOWN_MODEL,
        ["HTTP error: HTTP 400 400 [the gateway's own]: /chat/completions: Invalid model name passed in model=m. "
         "Call `/v1/models` to view available models for your key. (the configured model 'm' is not one the "
         "service knows)"]),
    Row("404 unknown model upstream", "gateway",
        lambda: [gateway_error(404, "litellm.NotFoundError: NotFoundError: OpenAIException - The model `m` does "
                                    "not exist or you do not have access to it.")],
        "failed", UNKNOWN_MODEL,
        ["HTTP error: HTTP 404 404 [upstream OpenAI, via the gateway]: litellm.NotFoundError: NotFoundError: "
         "OpenAIException - The model `m` does not exist or you do not have access to it. (the configured model "
         "'m' is not one the service knows)"]),
    Row("429 with the upstream's retry hint that fits", "gateway", lambda: [rate_limited(1), stream(ANSWER)],
        "completed", "",
        ["HTTP error: HTTP 429 429 [upstream OpenAI, via the gateway]: litellm.RateLimitError: RateLimitError: "
         "OpenAIException - Rate limit reached", "ok"], answer=ANSWER, settings={"MAX_ATTEMPTS": 2}),
    Row("429 without a retry hint", "gateway", lambda: [gateway_error(429, UPSTREAM_BUSY)], "failed", BUSY,
        [f"HTTP error: HTTP 429 429 [upstream OpenAI, via the gateway]: {UPSTREAM_BUSY}"]),
    Row("the gateway's budget for the key spent", "gateway",
        lambda: [Reply(400, {"error": litellm_error(400, "Budget has been exceeded! Key=sk-...6789 Current cost: "
                                                         "1.2, Max budget: 1.0", "budget_exceeded")})],
        "failed", QUOTA, ["HTTP error: HTTP 400 400 [the gateway's own]: Budget has been exceeded! Key=[API key "
                          "hidden] Current cost: 1.2, Max budget: 1.0"], settings={"MAX_ATTEMPTS": 2}),
    Row("500 from upstream", "gateway",
        lambda: [gateway_error(500, "litellm.InternalServerError: InternalServerError: OpenAIException - The server "
                                    "had an error while processing your request.")],
        "failed", UNAVAILABLE,
        ["HTTP error: HTTP 500 500 [upstream OpenAI, via the gateway]: litellm.InternalServerError: "
         "InternalServerError: OpenAIException - The server had an error while processing your request."]),
    Row("upstream overloaded (Anthropic's 529, passed on as a 500)", "gateway",
        lambda: [gateway_error(500, "litellm.InternalServerError: AnthropicException - Overloaded. Handle with "
                                    "`litellm.InternalServerError`.")],
        "failed", UNAVAILABLE,
        ["HTTP error: HTTP 500 500 [upstream Anthropic, via the gateway]: litellm.InternalServerError: "
         "AnthropicException - Overloaded. Handle with `litellm.InternalServerError`."]),
    Row("refusal before any text (wrapped in a 500)", "gateway", lambda: [wrapped_refusal()], "failed", REFUSED,
        ["HTTP error: HTTP 500 500 [upstream OpenAI, via the gateway]: " + REFUSAL[:100] + "…"]),
    Row("refusal after some text (an error event)", "gateway",
        lambda: [error_event_after("Here is how to", litellm_error(500, REFUSAL))], "incomplete", REFUSED,
        ["bad response: HTTP 200 500 [upstream OpenAI, via the gateway]: litellm.ContentPolicyViolationError: …"],
        answer="Here is how to"),
    Row("an upstream that does not stream (an empty stream, then JSON)", "gateway",
        lambda: [upstream_ignores_stream(openai_text(ANSWER))] * 2, "completed", "",
        ["bad response: empty reply: no text and no tool calls", "ok"], answer=ANSWER),
    Row("empty answer, twice", "gateway", lambda: [empty_stream("openai"), openai_text("")], "failed", EMPTY,
        ["bad response: empty reply: no text and no tool calls"] * 2),
    Row("its fallback's error as plain JSON under 200", "gateway",
        lambda: [answers_unstreamed(error_under_200(429, UPSTREAM_BUSY))], "failed", BUSY,
        [f"HTTP error: HTTP 200 429 [upstream OpenAI, via the gateway]: {UPSTREAM_BUSY}"]),
    Row("stream cut upstream after some text (an error event)", "gateway",
        lambda: [error_event_after(ANSWER, litellm_error(500, "litellm.APIConnectionError: OpenAIException - peer "
                                                              "closed connection without sending complete message "
                                                              "body"))],
        "incomplete", UNAVAILABLE,
        ["bad response: HTTP 200 500 [upstream OpenAI, via the gateway]: litellm.APIConnectionError: "
         "OpenAIException - peer closed connection without sending complete message body"], answer=ANSWER),
]


def line_pattern(expected):
    """``expected`` as a regular expression, each "…" standing for any text."""
    return "^" + ".*".join(re.escape(part) for part in expected.split("…")) + "$"


@pytest.fixture
def table_settings(conversations_settings):
    conversations_settings.update(API_KEY=SECRET, MODEL="m", CALL_TIMEOUT=1.5, CONNECT_TIMEOUT=0.5,
                                  STREAM_IDLE_TIMEOUT=1, MAX_ATTEMPTS=1, STREAM=True, TOOLS=[])
    return conversations_settings


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_each_failure_reads_as_the_table_says(table_settings, row):
    from conversations.models import CallRecord

    with FakeProvider() as fake, full_accept_queue() as unaccepted:
        fake.add(*row.replies())
        base = {"refused": refused_url(), "unaccepted": unaccepted}.get(row.endpoint) or (
            fake.url if row.wire == "openai" else f"http://127.0.0.1:{fake.port}")
        table_settings.update(PROVIDER=row.wire, BASE_URL=base, **row.settings)
        turn = run_turn_here(row.question)

    answers = list(turn.messages.filter(role="assistant").values_list("content", flat=True))
    records = CallRecord.objects.filter(turn=turn, kind="model").order_by("id")
    lines = [f"{r.get_outcome_display()}: {r.detail}" if r.detail else r.get_outcome_display() for r in records]
    assert (turn.status, turn.error, answers) == (row.status, row.visitor, [row.answer] if row.answer else [])
    assert len(lines) == len(row.timeline) and all(
        re.match(line_pattern(expected), line, re.S) for expected, line in zip(row.timeline, lines)), lines
    assert SECRET not in turn.error + " ".join(lines)


def cell(text):
    return text.replace("|", "\\|").replace("\n", " ")


def code(text):
    """``text`` as a Markdown code span (a double one around text that holds a backtick)."""
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def table():
    """``ROWS`` as the Markdown table docs/providers.md shows, between its markers."""
    out = ["| failure | route | turn status | the visitor reads | the timeline's lines (each attempt) |",
           "|---|---|---|---|---|"]
    for row in ROWS:
        visitor = f"“{row.answer}”, then: {row.visitor}" if row.answer and row.visitor else (
            f"“{row.answer}”" if row.answer else row.visitor)
        timeline = " → ".join(code(line) for line in row.timeline)
        wire = " (Anthropic's API)" if row.wire == "anthropic" else ""
        out.append(f"| {cell(row.failure)}{wire} | {row.route} | {row.status} | {cell(visitor)} | {cell(timeline)} |")
    return "\n".join(out)


def test_the_docs_table_is_this_modules():
    text = DOCS.read_text()
    assert BEGIN in text and END in text, f"docs/providers.md lost its table markers {BEGIN} … {END}"
    written = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert written == table(), "docs/providers.md's failure table differs from ROWS: " \
                               "run .venv/bin/python -m tests.providers.test_failure_table and paste its output"


if __name__ == "__main__":
    print(table())
