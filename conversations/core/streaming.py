"""Reading a streamed model reply: server-sent events, and the two wire formats sent over them.

``EventDecoder`` turns the bytes of a ``text/event-stream`` body into ``(event, data)`` pairs as
they arrive (comments and keep-alives are dropped). ``OpenAIStream`` and ``AnthropicStream``
add those events up into the reply the same API would have sent unstreamed — a
``chat.completion`` object or a ``message`` object — so that each provider parses one shape
whether it streamed or not. Each ``feed()`` returns the text the event added (for the live
state), and ``reply()`` gives the reply so far, also when the stream ended part-way.

Nothing here does I/O or knows about time: ``http.BudgetedHTTP.post_stream`` reads the socket
under the turn's clocks and feeds what it reads.
"""

import json

from .types import ErrorCode

# One event may be large (a long tool argument sent at once), but not without bound.
MAX_EVENT_BYTES = 1024 * 1024

_BLANK = frozenset({b"\n", b"\r\n", b"\r"})


class StreamError(Exception):
    """The stream cannot be read on: a malformed or oversized event, or an error event.

    ``code`` is a ``ProviderError`` code (``ErrorCode.BAD_RESPONSE``) for a stream that cannot be read;
    for an error event it is "" and ``body`` is the event's JSON: the provider classifies it as
    it classifies the same error sent as an HTTP error body (a request error must not count as
    an outage). The message is for the operator's log.
    """

    def __init__(self, code, detail, body=None):
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.body = body


class EventDecoder:
    """Incremental parser of the ``text/event-stream`` format (WHATWG HTML, "server-sent events").

    ``feed(data)`` takes any slice of the body and returns the events completed by it, each an
    ``(event, data)`` pair: ``event`` defaults to ``"message"``; ``data`` lines are joined with
    newlines. Comment lines (``: keep-alive``) and events without data are dropped.
    """

    def __init__(self, max_event_bytes=MAX_EVENT_BYTES):
        self.max_event_bytes = max_event_bytes
        self._pending = []  # the pieces of a line whose end has not arrived yet
        self._pending_size = 0
        self._event = ""
        self._data = []
        self._size = 0

    def feed(self, chunk):
        # Linear in the bytes fed, whatever the lines: a piece without a line end is only kept
        # (not rescanned); otherwise ``splitlines`` cuts the lines at C speed and each costs one
        # comparison when it is a blank line or a comment (the floods a hostile endpoint sends).
        if not chunk:
            return []
        if b"\n" not in chunk and b"\r" not in chunk:
            self._pending.append(chunk)
            self._pending_size += len(chunk)
            self._check_size(self._pending_size)
            return []
        if self._pending:
            chunk = b"".join(self._pending) + chunk
            self._pending, self._pending_size = [], 0
        lines = chunk.splitlines(True)  # on CRLF, LF and CR, as the format says (bytes: nothing else)
        last = lines[-1]
        if not last.endswith(b"\n"):  # unfinished, or ending in a CR that may be the first half of a CRLF
            lines.pop()
            self._pending, self._pending_size = [last], len(last)
        events = []
        for line in lines:
            if line in _BLANK:
                if self._data or self._event:
                    event, data = self._event or "message", self._data
                    self._event, self._data, self._size = "", [], 0
                    if data:
                        events.append((event, "\n".join(data)))
                continue
            if line[0] == 0x3A:  # ":" a comment (a keep-alive): not even decoded
                continue
            self._field(line.rstrip(b"\r\n").decode("utf-8", "replace"))
        self._check_size(self._pending_size)
        return events

    def _check_size(self, pending):
        if self._size + pending > self.max_event_bytes:
            raise StreamError(ErrorCode.BAD_RESPONSE, f"an event of more than {self.max_event_bytes} bytes")

    def _field(self, line):
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
            self._size += len(value)
            self._check_size(0)
        elif name == "event":
            self._event = value


class ReplyLimit:
    """The most characters one reply may add up to (``MAX_REPLY_CHARS``): its text, and each tool
    call's arguments. A hostile or runaway endpoint can stream without end; what passes the limit
    is dropped and ``exceeded`` says why, so that the reader ends the call there, and the row,
    the live state and the poll response stay bounded. ``None``: no limit."""

    def __init__(self, max_chars=None):
        self.max_chars = max_chars
        self.text_chars = 0
        self.exceeded = ""

    def text(self, piece):
        """``piece`` of the reply's text, cut where the text passes the limit."""
        if self.max_chars is None:
            return piece
        room = max(0, self.max_chars - self.text_chars)
        if len(piece) > room:
            piece = piece[:room]
            self.exceeded = f"the reply's text passed {self.max_chars} characters"
        self.text_chars += len(piece)
        return piece

    def arguments(self, length, piece):
        """``piece`` of one tool call's arguments, ``length`` characters long so far, cut where they
        pass the limit."""
        if self.max_chars is None:
            return piece
        room = max(0, self.max_chars - length)
        if len(piece) > room:
            self.exceeded = f"a tool call's arguments passed {self.max_chars} characters"
            return piece[:room]
        return piece


def _json(data, what):
    try:
        value = json.loads(data)
    except ValueError:
        raise StreamError(ErrorCode.BAD_RESPONSE, f"malformed JSON in {what}: {data[:80]!r}") from None
    if not isinstance(value, dict):
        raise StreamError(ErrorCode.BAD_RESPONSE, f"{what} is not a JSON object")
    return value


class OpenAIStream:
    """Adds up Chat Completions chunks (``stream: true``, ``stream_options.include_usage``).

    Text comes in ``choices[0].delta.content``; a tool call's ``id`` and ``function.name`` come
    in its first piece and its ``function.arguments`` in fragments, matched by ``index``; the
    finish reason in a later chunk, the usage in a last chunk with no choices; then ``[DONE]``.
    """

    def __init__(self, max_chars=None):
        self.limit = ReplyLimit(max_chars)
        self.done = False
        self.text = []
        self.refusal = []
        self.calls = {}
        self.finish_reason = None
        self.usage = None
        self.model = None

    def feed(self, event, data):
        """Take one event; return the text it added ("" for none)."""
        if data.strip() == "[DONE]":
            self.done = True
            return ""
        chunk = _json(data, "a chunk")
        if isinstance(chunk.get("error"), dict):
            raise StreamError("", "an error event in the stream", body=chunk)
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        if isinstance(chunk.get("model"), str):
            self.model = chunk["model"]
        added = ""
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                added = self.limit.text(delta["content"])
                self.text.append(added)
            if isinstance(delta.get("refusal"), str):
                self.refusal.append(self.limit.text(delta["refusal"]))
            for piece in delta.get("tool_calls") or []:
                self._call_piece(piece)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return added

    def _call_piece(self, piece):
        index = piece.get("index", len(self.calls))
        call = self.calls.setdefault(index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
        if piece.get("id"):
            call["id"] = piece["id"]
        function = piece.get("function") or {}
        if function.get("name"):
            call["function"]["name"] += function["name"]
        if isinstance(function.get("arguments"), str):
            call["function"]["arguments"] += self.limit.arguments(len(call["function"]["arguments"]),
                                                                    function["arguments"])

    def reply(self):
        """The ``chat.completion`` object these chunks add up to (so far)."""
        message = {"role": "assistant", "content": "".join(self.text),
                   "refusal": "".join(self.refusal) or None}
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        reply = {"object": "chat.completion",
                 "choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason}]}
        if self.usage is not None:
            reply["usage"] = self.usage
        if self.model is not None:
            reply["model"] = self.model
        return reply


class AnthropicStream:
    """Adds up Messages API events: ``message_start`` (the message, input usage),
    ``content_block_start``/``_delta``/``_stop`` (text deltas; a tool's ``input`` as
    ``input_json_delta`` fragments), ``message_delta`` (stop reason, output usage),
    ``message_stop``; ``ping`` is ignored and ``error`` ends the stream."""

    def __init__(self, max_chars=None):
        self.limit = ReplyLimit(max_chars)
        self.done = False
        self.message = {"type": "message", "role": "assistant", "content": [], "stop_reason": None, "usage": {}}
        self._blocks = {}
        self._json = {}
        self._json_chars = {}  # the length of each tool block's input so far

    def feed(self, event, data):
        """Take one event; return the text it added ("" for none)."""
        body = _json(data, f"a {event} event")
        kind = body.get("type") or event
        if kind == "message_start":
            start = body.get("message") or {}
            self.message["usage"].update(start.get("usage") or {})
            if isinstance(start.get("model"), str):
                self.message["model"] = start["model"]
        elif kind == "content_block_start":
            block = dict(body.get("content_block") or {})
            if block.get("type") == "tool_use":
                block["input"] = {}
                self._json[body.get("index", 0)] = []
            self._blocks[body.get("index", 0)] = block
        elif kind == "content_block_delta":
            return self._delta(body.get("index", 0), body.get("delta") or {})
        elif kind == "content_block_stop":
            self._close(body.get("index", 0))
        elif kind == "message_delta":
            delta = body.get("delta") or {}
            if delta.get("stop_reason"):
                self.message["stop_reason"] = delta["stop_reason"]
            self.message["usage"].update(body.get("usage") or {})
        elif kind == "message_stop":
            self.done = True
        elif kind == "error" or isinstance(body.get("error"), dict):  # also a gateway's, in OpenAI's shape
            raise StreamError("", "an error event in the stream", body=body)
        return ""

    def _delta(self, index, delta):
        block = self._blocks.setdefault(index, {"type": "text", "text": ""})
        if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
            added = self.limit.text(delta["text"])
            block["text"] = block.get("text", "") + added
            return added
        if delta.get("type") == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            piece = self.limit.arguments(self._json_chars.get(index, 0), delta["partial_json"])
            self._json.setdefault(index, []).append(piece)
            self._json_chars[index] = self._json_chars.get(index, 0) + len(piece)
        return ""

    def _close(self, index):
        """A tool block's ``input`` is whole only at its stop: parse the fragments then."""
        pieces = self._json.pop(index, None)
        if pieces is None or index not in self._blocks:
            return
        raw = "".join(pieces)
        try:
            self._blocks[index]["input"] = json.loads(raw) if raw else {}
        except ValueError:
            self._blocks[index]["input"] = raw  # parse() hands it on as invalid arguments

    def reply(self):
        """The ``message`` object these events add up to (so far)."""
        for index in list(self._json):  # a tool block still open when the stream ended
            self._close(index)
        return {**self.message, "content": [self._blocks[i] for i in sorted(self._blocks)]}
