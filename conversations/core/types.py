"""The project's own message and tool-call types; providers translate to and from their wire formats.

Also what became of each call a turn made (``Outcome``) and the one way to record it (``record_call``).
"""

from dataclasses import dataclass, field
from enum import StrEnum

from django.db.models import TextChoices
from django.utils.translation import gettext_lazy as _


class Outcome(TextChoices):
    """How one provider call attempt or tool run ended; ``CallRecord.outcome`` stores it."""

    OK = "ok", _("ok")
    HTTP_ERROR = "http_error", _("HTTP error")
    TIMEOUT = "timeout", _("timeout")
    CONNECTION_ERROR = "connection_error", _("connection error")
    BAD_RESPONSE = "bad_response", _("bad response")
    SKIPPED = "skipped", _("skipped")
    CANCELLED = "cancelled", _("stopped")
    ERROR = "error", _("error")


def record_call(recorder, kind, name, outcome, *, started_offset, remaining_before, timeout=0.0, duration=0.0,
                attempt=1, status_code=None, detail=""):
    """Hand ``recorder`` the fields of one ``CallRecord``: a provider call attempt (``kind``
    ``"model"``) or a tool run (``"tool"``), with times in seconds on the turn's budget.

    Called once per attempt, skipped call and tool run; ``recorder`` is the turn's
    (``TurnRunner.record``), or None when nothing is recorded. ``outcome`` must be an ``Outcome``
    (a value that is not one raises ValueError). Returns None.
    """
    if recorder is None:
        return
    recorder(kind=kind, name=name, attempt=attempt, started_offset=started_offset, timeout=timeout,
             remaining_before=remaining_before, duration=duration, outcome=Outcome(outcome),
             status_code=status_code, detail=detail)


@dataclass
class ToolCall:
    """The model asks for ``name`` to be run with ``arguments``; ``id`` pairs it with its result."""

    id: str
    name: str
    arguments: dict = field(default_factory=dict)

    def as_dict(self):
        return {"id": self.id, "name": self.name, "arguments": self.arguments}


@dataclass
class ToolResult:
    """What a tool gave back for one ``ToolCall``; ``is_error`` results are handed to the model too.

    ``output`` is what the model and the visitor see; ``detail``, for the operator only (the
    admin's timeline and the log), says what went wrong when that differs from ``output``.
    ``outcome`` is how the run ended (an ``Outcome``); left out, it is ``ERROR`` for an error
    result and ``OK`` otherwise. Any outcome but ``OK`` makes the result an error.
    """

    tool_call_id: str
    name: str
    output: str
    is_error: bool = False
    outcome: str = ""
    detail: str = ""

    def __post_init__(self):
        self.outcome = Outcome(self.outcome or (Outcome.ERROR if self.is_error else Outcome.OK))
        self.is_error = self.outcome != Outcome.OK


@dataclass
class ChatMessage:
    """One entry of the history sent to a provider.

    ``role`` is ``"system"``, ``"user"``, ``"assistant"`` (possibly with ``tool_calls``) or
    ``"tool"`` (a result, with ``tool_call_id`` and ``name``).
    """

    role: str
    content: str = ""
    tool_calls: list = field(default_factory=list)
    tool_call_id: str = ""
    name: str = ""
    is_error: bool = False


@dataclass
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0


class Finish(StrEnum):
    """Why a model's reply ended (``ModelReply.finish``), whatever the vendor called it."""

    STOP = "stop"  # a final answer
    TOOL_CALLS = "tool_calls"  # run them and call again
    LENGTH = "length"  # cut off by the output limit
    REFUSED = "refused"  # a content filter or a refusal
    CUT = "cut"  # a streamed reply that broke off: ``text`` is what had arrived, ``cut_reason`` why,
    # ``cut_code`` the ErrorCode of the error event that ended it ("" when the connection broke)


class ErrorCode(StrEnum):
    """What kind of failure a ``ProviderError`` is (its ``code``). Each has the sentence a
    visitor reads (``ProviderError.MESSAGES``); the chain fails over on the outages
    (``providers.chain.OUTAGE_CODES``), and a turn of an assistant names the assistant for the
    ones that mean its configuration is wrong (``assistants.SETUP_CODES``). A ``StrEnum``: the
    value is what logs and the admin's timeline have always shown."""

    AUTH = "auth"  # the service refused the key
    UNKNOWN_MODEL = "unknown_model"
    CONTEXT_LENGTH = "context_length"  # the conversation is too long for the model
    REFUSED = "refused"  # a content filter
    BAD_RESPONSE = "bad_response"  # a reply that cannot be read
    RATE_LIMITED = "rate_limited"
    QUOTA = "quota"  # the account's credit or spending limit is used up: waiting a minute will not help
    UNAVAILABLE = "unavailable"  # 5xx, an overloaded service, every circuit of a chain open
    TIMEOUT = "timeout"
    CONNECTION = "connection"
    BAD_REQUEST = "bad_request"  # any other refusal of the request
    REDIRECTED = "redirected"  # a 3xx, never followed
    STREAM_REFUSED = "stream_refused"  # a service that will not stream
    KEY_NOT_BOUND = "key_not_bound"  # the key may not go to the endpoint (endpoints.check_key)
    ENDPOINT_REFUSED = "endpoint_refused"  # an admin-set endpoint at an address it may not reach


@dataclass
class ModelReply:
    """What one model call produced; ``finish`` says why it ended (``Finish``)."""

    text: str = ""
    tool_calls: list = field(default_factory=list)
    finish: Finish = Finish.STOP
    usage: Usage | None = None
    cut_reason: str = ""
    cut_code: str = ""
    model: str = ""  # the model that answered, as the provider names it (may differ from the one asked)

    @property
    def empty(self):
        """A finished reply with nothing in it: no text and no tool call. A gateway forwards one
        when its upstream answered a stream request with JSON; a content filter sends one too."""
        return self.finish == Finish.STOP and not self.text.strip() and not self.tool_calls
