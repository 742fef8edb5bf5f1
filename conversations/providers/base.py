"""The provider interface: subclass ``BaseProvider`` and implement ``complete()``."""

from django.utils.translation import gettext_lazy as _


class ProviderError(Exception):
    """A model call failed in a way the turn cannot get past.

    ``code`` names the kind (``auth``, ``unknown_model``, ``context_length``, ``refused``,
    ``bad_response``, ``rate_limited``, ``unavailable``, ``timeout``, ``connection``,
    ``bad_request``); ``message`` is a sentence for the visitor; ``detail`` is for the
    operator's log and the turn's error text. Neither may contain a secret.
    """

    MESSAGES = {
        "auth": _("The assistant is not set up correctly: the AI service rejected its credentials."),
        "unknown_model": _("The assistant is not set up correctly: the AI service does not know the configured model."),
        "context_length": _("This conversation has grown too long for the assistant. Please start a new one."),
        "refused": _("The assistant could not answer this request."),
        "bad_response": _("The AI service sent a reply the assistant could not read. Please try again."),
        "rate_limited": _("The AI service is busy right now. Please try again in a minute."),
        "unavailable": _("The AI service is unavailable right now. Please try again in a minute."),
        "timeout": _("The AI service took too long to answer. Please try again."),
        "connection": _("The assistant could not reach the AI service. Please try again later."),
        "bad_request": _("The AI service rejected the request. Please try again or start a new conversation."),
    }

    def __init__(self, code, detail=""):
        self.code = code
        self.detail = detail
        self.message = str(self.MESSAGES.get(code, self.MESSAGES["bad_request"]))
        super().__init__(f"{code}: {detail}" if detail else code)


class BaseProvider:
    """One LLM API. An instance serves one turn.

    ``config`` is the merged ``CONVERSATIONS`` dict; ``http`` is the turn's ``BudgetedHTTP``
    (every HTTP call must go through it, so that it is bounded by the turn's budget and
    recorded); ``budget`` is the turn's ``Budget``.
    """

    name = "base"
    default_model = ""

    def __init__(self, config, *, http=None, budget=None):
        self.config = config
        self.http = http
        self.budget = budget

    @property
    def model(self):
        return self.config.get("MODEL") or self.default_model

    def complete(self, messages, tools):
        """Call the model once with ``messages`` (``ChatMessage`` list) and ``tools`` (``Tool`` list).

        Returns a ``ModelReply``. Raises ``ProviderError`` for failures, ``BudgetExhausted``
        when no call could be started in the time left.
        """
        raise NotImplementedError(".complete() must be overridden")

    def error_from_failure(self, failure):
        """Map a ``CallFailed`` from the HTTP layer to a ``ProviderError``. Providers refine this."""
        if failure.outcome == "timeout":
            return ProviderError("timeout", failure.detail)
        if failure.outcome == "connection_error":
            return ProviderError("connection", failure.detail)
        if failure.outcome == "bad_response":
            return ProviderError("bad_response", failure.detail)
        status = failure.status or 0
        if status in (401, 403):
            return ProviderError("auth", f"HTTP {status}")
        if status == 404:
            return ProviderError("unknown_model", f"HTTP 404 for model {self.model!r}")
        if status == 429:
            return ProviderError("rate_limited", "HTTP 429")
        if status >= 500 or status == 408:
            return ProviderError("unavailable", f"HTTP {status}")
        return ProviderError("bad_request", f"HTTP {status}")
