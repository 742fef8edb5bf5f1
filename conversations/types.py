"""The project's own message and tool-call types; providers translate to and from their wire formats."""

from dataclasses import dataclass, field


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
    """

    tool_call_id: str
    name: str
    output: str
    is_error: bool = False
    detail: str = ""


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


@dataclass
class ModelReply:
    """What one model call produced.

    ``finish`` is ``"stop"`` (a final answer), ``"tool_calls"`` (run them and call again),
    ``"length"`` (cut off by the output limit) or ``"refused"`` (content filter / refusal).
    """

    text: str = ""
    tool_calls: list = field(default_factory=list)
    finish: str = "stop"
    usage: Usage | None = None
