"""The provider interface: subclass ``BaseProvider`` and implement ``complete()``.

A provider translates between the project's own types (``ChatMessage``, ``ToolCall``,
``ModelReply``, ``Usage`` in ``conversations.types``; ``Tool`` in ``conversations.tools``) and
one vendor's wire format. It makes its HTTP calls through ``self.post()`` (the turn's
``BudgetedHTTP``), which bounds every attempt by the turn's budget, records it, and maps
failures to ``ProviderError``.
"""

import dataclasses
import functools
import inspect
import json
import logging
import re

from django.utils.translation import gettext_lazy as _

from ..endpoints import locate
from ..infra.http import CallCancelled, CallFailed, PartialReply
from ..redaction import quoting, redact, texts_in
from ..core.streaming import ReplyLimit
from ..core.types import ErrorCode, Finish, Outcome

logger = logging.getLogger("conversations.providers")


class ProviderError(Exception):
    """A model call failed in a way the turn cannot get past.

    ``code`` names the kind, an ``ErrorCode`` (a code given as its string value becomes the
    member; one of a custom provider's own stays as given and reads as ``bad_request``);
    ``message`` is a sentence for the visitor (it becomes the turn's error);
    ``detail`` is for the operator's log. Neither may contain a secret: build ``detail`` with
    ``redact()`` when it quotes the provider.
    """

    MESSAGES = {
        ErrorCode.AUTH: _("The assistant is not set up correctly: the AI service rejected its credentials."),
        ErrorCode.UNKNOWN_MODEL: _("The assistant is not set up correctly: the AI service does not know the "
                                   "configured model."),
        ErrorCode.CONTEXT_LENGTH: _("This conversation has grown too long for the assistant. Please start a new one."),
        ErrorCode.REFUSED: _("The assistant could not answer this request."),
        ErrorCode.BAD_RESPONSE: _("The AI service sent a reply the assistant could not read. Please try again."),
        ErrorCode.RATE_LIMITED: _("The AI service is busy right now. Please try again in a minute."),
        ErrorCode.QUOTA: _("The assistant cannot answer for now: the site's allowance with its AI service is "
                           "used up."),
        ErrorCode.UNAVAILABLE: _("The AI service is unavailable right now. Please try again in a minute."),
        ErrorCode.TIMEOUT: _("The AI service took too long to answer. Please try again."),
        ErrorCode.CONNECTION: _("The assistant could not reach the AI service. Please try again later."),
        ErrorCode.BAD_REQUEST: _("The AI service rejected the request. Please try again or start a new conversation."),
        ErrorCode.STREAM_REFUSED: _("The assistant is not set up correctly: the AI service would not stream its "
                                    "answer."),
        ErrorCode.REDIRECTED: _("The assistant is not set up correctly: the AI service's address answered with a "
                                "redirect (HTTP %(status)s), which is not followed."),
        ErrorCode.KEY_NOT_BOUND: _("The assistant is not set up correctly: its key may not be sent to its endpoint."),
        ErrorCode.ENDPOINT_REFUSED: _("The assistant is not set up correctly: its endpoint is not one the site "
                                      "allows."),
    }

    def __init__(self, code, detail="", **params):
        try:
            self.code = ErrorCode(code)
        except ValueError:
            self.code = code
        self.detail = detail
        self.message = str(self.MESSAGES.get(code, self.MESSAGES[ErrorCode.BAD_REQUEST]))
        if params:
            self.message %= params
        super().__init__(f"{code}: {detail}" if detail else code)


# How vendors and gateways say that the model asked for is unknown: OpenAI's code and Azure's,
# Anthropic's error type; or, in the message of a 400 or 404, LiteLLM's "Invalid model name
# passed in model=…", OpenAI's "The model `x` does not exist", Ollama's "model "x" not found",
# Bedrock's "The provided model identifier is invalid".
UNKNOWN_MODEL_CODES = frozenset({"model_not_found", "DeploymentNotFound", "not_found_error"})
_UNKNOWN_MODEL_TEXT = re.compile(r"(?i)\b(?:invalid|unknown) model\b|\bno such model\b|"
                                 r"\bmodel\b.{0,120}\b(?:not found|does not exist|doesn't exist|is invalid)")


def names_unknown_model(status, kind, text):
    """Whether an error reply (its ``status``, its code or type ``kind``, its message ``text``) says
    the model is unknown to the service: a configuration to fix, not a request to try again."""
    if kind in UNKNOWN_MODEL_CODES:
        return True
    if status == 404:
        return "model" in str(text).lower()
    return status == 400 and bool(_UNKNOWN_MODEL_TEXT.search(str(text)))


# How a content filter's refusal is spelled: OpenAI's and Azure's codes, or in any message, the
# vendors' words ("content management policy", "content filtering policy") and LiteLLM's
# ``ContentPolicyViolationError``. A gateway wraps the upstream's refusal in an error of its own,
# often a 500 (or code "500" inside a stream), quoting these words: they, not its status, say
# it is this request's refusal and no outage.
REFUSAL_CODES = frozenset({"content_filter", "content_policy_violation"})
_REFUSAL_TEXT = re.compile(r"(?i)ContentPolicyViolation|\bcontent[ _]?(?:filter|policy|management polic)")


# How a used-up allowance is spelled: OpenAI's 429 ``insufficient_quota`` ("You exceeded your
# current quota"), Anthropic's 400 "Your credit balance is too low", a LiteLLM key's or team's
# ``budget_exceeded`` ("Budget has been exceeded!"). Not a rate limit: no retry gets past it.
QUOTA_CODES = frozenset({"insufficient_quota", "budget_exceeded"})
_QUOTA_TEXT = re.compile(r"(?i)\bexceeded your current quota\b|\bcredit balance is too low\b|"
                         r"\bBudget has been exceeded\b")


def names_quota(kind, text):
    """Whether an error reply (its code or type ``kind``, its message ``text``) says the account's
    credit or spending limit is used up, said directly or quoted by a gateway."""
    return kind in QUOTA_CODES or bool(_QUOTA_TEXT.search(str(text)))


def names_refusal(kind, text):
    """Whether an error reply (its code or type ``kind``, its message ``text``) is a content
    filter's refusal of this request, said directly or quoted by a gateway."""
    return kind in REFUSAL_CODES or bool(_REFUSAL_TEXT.search(str(text)))


# Whose error a gateway passes on, where it says. LiteLLM names its own exception and, for an
# upstream's error, the upstream's: "litellm.RateLimitError: RateLimitError: OpenAIException - Rate
# limit reached" (AnthropicException, AzureException, BedrockException, VertexAIException, …). Its
# own errors name no upstream: "litellm.Timeout: …" waiting for one, "Invalid model name passed in
# model=…", "Authentication Error, …" (type auth_error), "Budget has been exceeded! …" (type
# budget_exceeded), "No deployments available for selected model" (all of them cooling down).
_UPSTREAM_EXCEPTION = re.compile(r"\b([A-Z][A-Za-z0-9_]*?)Exception - ")
_GATEWAY_OWN_TEXT = re.compile(r"^\s*litellm\.|\bInvalid model name passed\b|^\s*Authentication Error\b|"
                               r"\bBudget has been exceeded\b|\bNo deployments available\b|\bLiteLLM\b")
GATEWAY_OWN_KINDS = frozenset({"auth_error", "budget_exceeded"})


def who_answered(kind, text):
    """Whose error a reply (its type ``kind``, its message ``text``) is, as a gateway tells it, for
    the operator's timeline and log: "upstream OpenAI, via the gateway" for an upstream's error it
    passes on, "the gateway's own" for its own, "" when the reply does not say (a vendor answering
    directly, or a gateway that does not name its upstream)."""
    upstream = _UPSTREAM_EXCEPTION.search(str(text))
    if upstream and upstream.group(1) not in ("Proxy", "LiteLLM", "Litellm"):
        return f"upstream {upstream.group(1)}, via the gateway"
    if kind in GATEWAY_OWN_KINDS or _GATEWAY_OWN_TEXT.search(str(text)):
        return "the gateway's own"
    return ""


def error_detail(status, kind, text, *secrets):
    """The operator's line for an error reply: ``HTTP <status> <kind>``, whose error it is when a
    gateway tells (``who_answered``), and the message, redacted."""
    who = who_answered(kind, text)
    head = f"HTTP {status} {kind}".strip() + (f" [{who}]" if who else "")
    return f"{head}: {redact(text, *secrets)}"


def stated_status(failure):
    """The HTTP status an error stands for: its own, except under a 200 (an error event in a stream,
    or a gateway's error answering a stream request as plain JSON), where a gateway writes the
    status it means in the error's ``code`` ("429", "500"). ``failure`` is a ``CallFailed``."""
    if failure.status != 200:
        return failure.status
    error = failure.json().get("error")
    code = str(error.get("code") or "") if isinstance(error, dict) else ""
    return int(code) if re.fullmatch(r"[45][0-9][0-9]", code) else failure.status


def excerpt(body, *secrets, limit=200):
    """A short, redacted excerpt of an error body of any kind (an HTML error page's text, plain
    text, JSON of an unknown shape) for the operator's log; "" for an empty one."""
    text = re.sub(r"(?is)<(script|style)\b.*?</\1>|<[^>]*>", " ", str(body or ""))
    return redact(" ".join(text.split()), *secrets, limit=limit)


def call_complete(provider, messages, tools, on_text=None):
    """``provider.complete(messages, tools, on_text=on_text)``; a provider written before streaming
    existed takes no ``on_text``, and is called as it expects (its text then arrives all at once)."""
    if _takes_on_text(getattr(provider.complete, "__func__", provider.complete)):
        return provider.complete(messages, tools, on_text=on_text)
    return provider.complete(messages, tools)


@functools.lru_cache(maxsize=256)
def _takes_on_text(complete):
    """Whether ``complete`` (a provider class's method) takes ``on_text``: read once per method
    (by the process: ``inspect.signature`` cost each model call a tenth of a millisecond), not per call."""
    return "on_text" in inspect.signature(complete).parameters


class BaseProvider:
    """One LLM API. An instance serves one turn; the runner builds it from the ``PROVIDER`` setting.

    ``config`` is the merged ``CONVERSATIONS`` dict; ``http`` is the turn's ``BudgetedHTTP``
    (every HTTP call must go through it, so that it is bounded by the turn's budget and
    recorded); ``budget`` is the turn's ``Budget``.

    Subclasses set ``name`` and ``default_model`` and implement ``complete()``; most only need
    ``self.post()`` and, for their own error bodies, ``error_from_failure()``.
    """

    name = "base"
    default_model = ""
    default_base_url = ""

    def __init__(self, config, *, http=None, budget=None):
        self.config = config
        self.http = http
        self.budget = budget

    @classmethod
    def check_model(cls, model):
        """Called when an assistant naming this provider is saved: a sentence saying why the
        provider cannot use ``model``, or None when it can, or cannot know before a call (most
        cannot: their list of models is on the server, and a rejected name fails the first turn)."""
        return None

    @property
    def model(self):
        """The model asked for: the ``MODEL`` setting, else the provider's default."""
        return self.config.get("MODEL") or self.default_model

    @property
    def first(self):
        """The provider a turn calls first: this one (a chain: its first link's)."""
        return self

    @property
    def answered_by(self):
        """The provider whose reply the last call returned: this one (a chain: the link that answered)."""
        return self

    @property
    def api_key(self):
        return self.config.get("API_KEY") or ""

    def endpoint(self, path_for):
        """``BASE_URL`` (else ``default_base_url``) with its path, without a trailing slash, given to
        ``path_for(path)`` for the API's own; the query is kept (Azure's ``api-version``). Rebuilt
        from the parts ``endpoints.locate`` reads, the parse keys are checked against; a URL it
        does not read as plain is refused here (``endpoint_refused``), whatever gave it."""
        base = self.config.get("BASE_URL") or self.default_base_url
        location = locate(base)
        if location is None:
            raise ProviderError(ErrorCode.ENDPOINT_REFUSED, f"{self.name}: its endpoint is not a plain URL "
                                                            "scheme://host[:port]/path: not sent")
        return location._replace(path=path_for(location.path.rstrip("/"))).url

    def complete(self, messages, tools, on_text=None):
        """Called once per model round-trip with ``messages`` (``ChatMessage`` list, the history
        already trimmed, possibly starting with a ``system`` message) and ``tools`` (``Tool`` list).
        ``on_text(text)``, when given, wants each piece of the answer's text as it is written
        (``streams()`` says whether to ask for a stream).

        Returns a ``ModelReply`` (``finish=Finish.CUT`` when a stream broke off after some text).
        Raises ``ProviderError`` for failures, ``BudgetExhausted`` when no call could be started
        in the time left, ``CallCancelled`` (with ``.reply``, the text so far or None) when the
        turn was stopped during the call.
        """
        raise NotImplementedError(".complete() must be overridden")

    # The accumulator (conversations.streaming) for this API's streamed replies; None: no streaming.
    stream_class = None

    def streams(self, on_text):
        """Whether to ask for a stream: the provider can, ``STREAM`` allows it, and someone listens."""
        return self.stream_class is not None and on_text is not None and bool(self.config["STREAM"])

    def post(self, url, payload, headers, parse, on_text=None):
        """POST ``payload`` through the turn's ``BudgetedHTTP`` and return ``parse(data)``; streamed
        (``post_stream``) when ``streams(on_text)``, the payload then asking for it.

        A failed call becomes the ``ProviderError`` from ``error_from_failure()``; a reply that
        ``parse`` cannot read (a missing key, a wrong type) becomes ``bad_response``. Both are
        logged for the operator, without the key. A stream that broke off after some text gives
        that text as a ``Finish.CUT`` reply (``Finish.REFUSED`` when a content filter's error event
        ended it), without its unfinished tool calls.
        """
        with quoting(texts_in(payload)):
            try:
                if self.streams(on_text):
                    response = self.http.post_stream(url, payload, headers, self.stream_class(), on_text,
                                                     classify=self.error_from_failure)
                else:
                    response = self.http.post_json(url, payload, headers, classify=self.error_from_failure)
            except CallFailed as failure:
                error = self.error_from_failure(failure)
                logger.error("%s call failed (%s): %s", self.name, error.code, error.detail)
                raise error from None
            except PartialReply as cut:
                logger.error("%s stream cut short: %s", self.name, cut.detail)
                reply = self.parse_reply(parse, cut.data)
                return dataclasses.replace(reply, tool_calls=[], finish=cut.finish, cut_reason=cut.detail,
                                           cut_code=cut.code)
            except CallCancelled as stop:
                stop.reply = self.parse_reply(parse, stop.data) if stop.data is not None else None
                raise
            return self.bounded(self.parse_reply(parse, response.data))

    def bounded(self, reply):
        """``reply`` within ``MAX_REPLY_CHARS`` (its text, and each tool call's arguments), as a
        stream is cut (``streaming.ReplyLimit``): an unstreamed reply may be as large, and what is
        saved, published and served must stay bounded. Past it: the text so far, no tool calls,
        ``finish=Finish.LENGTH``."""
        limit = ReplyLimit(self.config.get("MAX_REPLY_CHARS") or None)
        text = limit.text(reply.text)
        for call in reply.tool_calls:
            limit.arguments(0, json.dumps(call.arguments))
        if not limit.exceeded:
            return reply
        logger.error("%s reply cut: %s", self.name, limit.exceeded)
        return dataclasses.replace(reply, text=text, tool_calls=[], finish=Finish.LENGTH, cut_reason=limit.exceeded)

    def parse_reply(self, parse, data):
        """``parse(data)``; an unreadable reply becomes ``bad_response`` (logged)."""
        try:
            return parse(data)
        except ProviderError as error:
            logger.error("%s reply unusable (%s): %s", self.name, error.code, error.detail)
            raise
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            error = ProviderError(ErrorCode.BAD_RESPONSE,
                                  f"unexpected reply shape: {type(exc).__name__}: {redact(exc)}")
            logger.error("%s reply unusable (%s): %s", self.name, error.code, error.detail)
            raise error from None

    def error_from_failure(self, failure):
        """Map a ``CallFailed`` from the HTTP layer to a ``ProviderError``.

        Called by ``post()``; providers override it to read their own error bodies and fall
        back to this mapping by status code.
        """
        if failure.code:  # an error event in a stream names its kind
            return ProviderError(failure.code, failure.detail)
        status = stated_status(failure) or 0
        if status == (failure.status or 0):  # not an error event or 200 body that names its own status
            if failure.outcome == Outcome.TIMEOUT:
                return ProviderError(ErrorCode.TIMEOUT, failure.detail)
            if failure.outcome == Outcome.CONNECTION_ERROR:
                return ProviderError(ErrorCode.CONNECTION, failure.detail)
            if failure.outcome == Outcome.BAD_RESPONSE:
                return ProviderError(ErrorCode.BAD_RESPONSE, failure.detail)
        if 300 <= status < 400:
            return ProviderError(ErrorCode.REDIRECTED, failure.detail, status=status)
        quoted = excerpt(failure.body, self.api_key)
        detail = f"HTTP {failure.status}: {quoted}" if quoted else f"HTTP {failure.status}"
        if status in (401, 403):
            return ProviderError(ErrorCode.AUTH, detail)
        if names_refusal("", failure.body):
            return ProviderError(ErrorCode.REFUSED, detail)
        if names_quota("", failure.body):
            return ProviderError(ErrorCode.QUOTA, detail)
        if status == 404 or names_unknown_model(status, "", failure.body):
            return self.unknown_model(detail)
        if status == 413:
            return ProviderError(ErrorCode.CONTEXT_LENGTH, detail)
        if status == 429:
            return ProviderError(ErrorCode.RATE_LIMITED, detail)
        if status == 408:  # a gateway's own time-out waiting for its upstream
            return ProviderError(ErrorCode.TIMEOUT, detail)
        if status >= 500:
            return ProviderError(ErrorCode.UNAVAILABLE, detail)
        return ProviderError(ErrorCode.BAD_REQUEST, detail)

    def unknown_model(self, detail):
        """The ``unknown_model`` error, its detail naming the configured model for the operator."""
        return ProviderError(ErrorCode.UNKNOWN_MODEL, f"{detail} (the configured model {self.model!r} is not one the "
                                              "service knows)")
