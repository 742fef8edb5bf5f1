"""What an LLM gateway (the LiteLLM proxy, for one) sends where a vendor's API would answer
directly, as behaviours for the fake provider server (``tests.support.fakes.FakeProvider.add``).

A gateway holds the response's headers back while it retries its upstream or waits out the
upstream's ``Retry-After``; it forwards the upstream's headers under a prefix of its own
(``llm_provider-retry-after``); it answers a stream request whose upstream sent a plain JSON
body with an empty stream that ends ``finish_reason: stop`` (and the same upstream's reply to an
unstreamed request whole); a fallback of its own may answer a stream request with plain JSON,
an answer or an error under 200; and its own errors are OpenAI-shaped whatever the wire format
asked for, with the status in ``code`` as a string.
"""

import json
import time

from tests.support.fake_stream import _client_left, anthropic_stream, openai_stream, streaming
from tests.support.fakes import Reply


def withholds_headers(seconds, then):
    """Read the request, send nothing for ``seconds`` (the gateway is busy upstream), then do
    ``then``: a ``Reply`` or another behaviour. Stops early if the client leaves."""
    def behaviour(handler):
        fake = handler.server.fake
        if _client_left(handler, seconds):
            return
        fake.answered_at = getattr(fake, "answered_at", []) + [time.monotonic()]
        if callable(then):
            then(handler)
        else:
            handler.send_json(then.status, then.body, then.headers)
    return behaviour


def empty_stream(wire):
    """The stream a gateway forwards when its upstream answered a stream request with JSON: no
    text, no tool calls, a normal ending (``wire`` is ``"openai"`` or ``"anthropic"``)."""
    return streaming(openai_stream(pieces=[]) if wire == "openai" else anthropic_stream(pieces=[]))


def upstream_ignores_stream(reply, wire="openai"):
    """An upstream that answers every request with plain JSON (``reply``), as the gateway forwards
    it: to a stream request on the OpenAI route an empty stream (the JSON is lost), on the
    Anthropic route the JSON labelled as a stream; to an unstreamed request, ``reply`` itself."""
    def behaviour(handler):
        asked = handler.server.fake.requests[-1]["json"] or {}
        if not asked.get("stream"):
            handler.send_json(200, reply)
        elif wire == "openai":
            empty_stream(wire)(handler)
        else:
            json_as_stream(reply)(handler)
    return behaviour


def answers_unstreamed(reply):
    """The gateway's fallback deployment answering whatever was asked, a stream request too, with
    a plain JSON body (``Content-Type: application/json``): ``reply`` is an answer (a dict) or an
    error under 200 (``error_under_200``)."""
    def behaviour(handler):
        handler.send_json(200, reply)
    return behaviour


def error_under_200(status, message):
    """A gateway's error sent as the 200 JSON body of a stream request: its status only in ``code``."""
    return gateway_error(status, message).body


def json_as_stream(body):
    """An upstream's unstreamed JSON reply passed on as it is, labelled ``text/event-stream``
    (what LiteLLM's Anthropic route does when the upstream ignored ``stream: true``)."""
    def behaviour(handler):
        data = json.dumps(body).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream; charset=utf-8")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        handler.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
        handler.wfile.flush()
    return behaviour


def gateway_error(status, message, *, headers=None):
    """An error of the gateway's own: OpenAI's shape, ``code`` the status as a string."""
    return Reply(status, {"error": {"message": message, "type": "None", "param": "None", "code": str(status)}},
                 headers or {})


def rate_limited(retry_after):
    """The upstream's 429 as a gateway passes it on: its ``Retry-After`` only under the prefix."""
    return gateway_error(429, "litellm.RateLimitError: RateLimitError: OpenAIException - Rate limit reached",
                         headers={"llm_provider-retry-after": str(retry_after)})


# How LiteLLM quotes an upstream content filter's refusal: its own exception's name, the
# upstream's (``OpenAIException``) and the upstream's words, under a status of its own.
REFUSAL = ("litellm.ContentPolicyViolationError: litellm.ContentPolicyViolationError: OpenAIException - The response "
           "was filtered due to the prompt triggering Azure OpenAI's content management policy. Received Model "
           "Group=m\nAvailable Model Group Fallbacks=None")


def wrapped_refusal(status=500):
    """An upstream's refusal as a gateway reports it: a 500 (its retries and fallbacks spent) in
    its own shape, the upstream's words in the message."""
    return gateway_error(status, REFUSAL)


def invalid_model(model):
    """A gateway asked for a model its configuration does not list."""
    return gateway_error(400, f"/chat/completions: Invalid model name passed in model={model}. "
                              "Call `/v1/models` to view available models for your key.")


def html_error(status=500):
    """A proxy's (or a crashed server's) error page: not JSON at all."""
    def behaviour(handler):
        data = (b"<html><head><title>500 Internal Server Error</title></head>\r\n<body>\r\n"
                b"<center><h1>Internal Server Error</h1></center>\r\n<hr><center>nginx</center>\r\n</body></html>")
        handler.send_response(status)
        handler.send_header("Content-Type", "text/html")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
        handler.wfile.flush()
    return behaviour
