"""Anthropic Messages API (``POST /v1/messages``).

``BASE_URL`` defaults to ``https://api.anthropic.com``; ``/v1/messages`` is appended (or just
``/messages`` when the URL already ends in ``/v1``). The key goes in ``x-api-key``. The system
prompt is a top-level field, ``max_tokens`` (the ``MAX_TOKENS`` setting) is required, tool
results travel as ``tool_result`` blocks in a user message, and the first message must be the
user's.
"""

from ..core.streaming import AnthropicStream
from ..core.types import ErrorCode, Finish, ModelReply, ToolCall, Usage
from .base import (
    BaseProvider, ProviderError, error_detail, names_quota, names_refusal, names_unknown_model, stated_status,
)

API_VERSION = "2023-06-01"

STOP = {"end_turn": Finish.STOP, "stop_sequence": Finish.STOP, "pause_turn": Finish.STOP, "tool_use": Finish.TOOL_CALLS,
        "max_tokens": Finish.LENGTH, "model_context_window_exceeded": Finish.LENGTH, "refusal": Finish.REFUSED}


class AnthropicProvider(BaseProvider):
    name = "anthropic"
    default_model = "claude-sonnet-4-5"
    default_base_url = "https://api.anthropic.com"

    def url(self):
        def messages(path):
            if path.endswith("/v1/messages"):
                return path
            return path + ("/messages" if path.endswith("/v1") else "/v1/messages")

        return self.endpoint(messages)

    api_version = API_VERSION

    def headers(self):
        """``anthropic-version`` and the key in ``x-api-key``; a subclass may send others (a gateway's)."""
        headers = {"anthropic-version": self.api_version}
        if self.api_key:
            headers["x-api-key"] = self.api_key
        return headers

    def payload(self, messages, tools):
        system = "\n\n".join(m.content for m in messages if m.role == "system" and m.content)
        body = {"model": self.model, "max_tokens": int(self.config["MAX_TOKENS"]),
                "messages": self.wire_messages([m for m in messages if m.role != "system"])}
        if system:
            body["system"] = system
        if tools:
            body["tools"] = [{"name": t.name, "description": t.description, "input_schema": t.parameters}
                             for t in tools]
        return body

    @staticmethod
    def blocks(message):
        """One ``ChatMessage`` as ``(role, content blocks)``; a tool result is a user's ``tool_result``."""
        if message.role == "tool":
            block = {"type": "tool_result", "tool_use_id": message.tool_call_id, "content": message.content}
            if message.is_error:
                block["is_error"] = True
            return "user", [block]
        # The API refuses empty text blocks, so an empty text is left out.
        blocks = [{"type": "text", "text": message.content}] if message.content else []
        if message.role == "assistant":
            blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}
                       for c in message.tool_calls]
        return message.role, blocks

    def wire_messages(self, messages):
        """Consecutive messages of one role merged into one message (so the results of one
        assistant turn's tool calls share a user message), starting with a user message."""
        wire = []
        for message in messages:
            role, blocks = self.blocks(message)
            if not blocks:
                continue
            if wire and wire[-1]["role"] == role:
                # tool_result blocks must come first in a user message.
                wire[-1]["content"] = sorted(wire[-1]["content"] + blocks, key=lambda b: b["type"] != "tool_result")
            else:
                wire.append({"role": role, "content": blocks})
        while wire and wire[0]["role"] != "user":
            wire.pop(0)
        for message in wire:
            content = message["content"]
            if len(content) == 1 and content[0]["type"] == "text":
                message["content"] = content[0]["text"]  # the plain form, as most examples show it
        return wire

    stream_class = AnthropicStream

    def complete(self, messages, tools, on_text=None):
        payload = self.payload(messages, tools)
        if self.streams(on_text):
            payload["stream"] = True
        return self.post(self.url(), payload, self.headers(), self.parse, on_text)

    def parse(self, data):
        """A Messages reply as a ``ModelReply``: text blocks joined, ``tool_use`` blocks as calls."""
        if data.get("type") == "error":
            raise ProviderError(ErrorCode.BAD_RESPONSE, "an error object in a 200 reply")
        content = data.get("content")
        if not isinstance(content, list):
            raise ProviderError(ErrorCode.BAD_RESPONSE, "no content list in the reply")
        texts, calls = [], []
        for block in content:
            if block.get("type") == "text":
                texts.append(block.get("text") or "")
            elif block.get("type") == "tool_use":
                arguments = block.get("input")
                calls.append(ToolCall(id=block.get("id") or f"toolu_{len(calls) + 1}", name=block.get("name") or "",
                                      arguments=arguments if isinstance(arguments, dict) else
                                      {"__invalid_json__": arguments}))
        usage = None
        if isinstance(data.get("usage"), dict):
            raw = data["usage"]
            # input_tokens excludes prompt-cache reads and writes; the turn records all input.
            usage = Usage(
                input_tokens=sum(int(raw.get(k) or 0) for k in
                                 ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")),
                output_tokens=int(raw.get("output_tokens") or 0))
        finish = STOP.get(data.get("stop_reason") or "end_turn", Finish.STOP)
        if finish == Finish.TOOL_CALLS and not calls:
            finish = Finish.STOP
        return ModelReply(text="\n\n".join(t for t in texts if t), tool_calls=calls if finish == Finish.TOOL_CALLS else [],
                          finish=finish, usage=usage,
                          model=data["model"][:200] if isinstance(data.get("model"), str) else "")

    def error_from_failure(self, failure):
        """Read Anthropic's ``{"type": "error", "error": {"type", "message"}}``."""
        error = (failure.json() if failure.status else {}).get("error")
        if not isinstance(error, dict):
            return super().error_from_failure(failure)
        status = stated_status(failure)
        kind = str(error.get("type") or "")
        text = str(error.get("message") or "")
        lowered = text.lower()
        # A gateway's own error in OpenAI's shape has the type "None" and the status in its code.
        shown = kind if kind not in ("", "None") else str(error.get("code") or "")
        detail = error_detail(failure.status, shown, text, self.api_key)
        if kind == "authentication_error" or status == 401:
            return ProviderError(ErrorCode.AUTH, detail)
        if kind == "permission_error" or status == 403:
            return ProviderError(ErrorCode.AUTH, detail)
        if names_refusal(kind, text):  # also as a gateway's 500 quotes it
            return ProviderError(ErrorCode.REFUSED, detail)
        if names_quota(kind, text):
            return ProviderError(ErrorCode.QUOTA, detail)
        if names_unknown_model(status, kind, text):
            return self.unknown_model(detail)
        if kind == "request_too_large" or status == 413 or "prompt is too long" in lowered \
                or "context window" in lowered or "context length" in lowered:
            return ProviderError(ErrorCode.CONTEXT_LENGTH, detail)
        if status == 400 and "stream" in lowered:
            return ProviderError(ErrorCode.STREAM_REFUSED, detail)
        if kind == "rate_limit_error":
            return ProviderError(ErrorCode.RATE_LIMITED, detail)
        if kind in ("overloaded_error", "api_error"):
            return ProviderError(ErrorCode.UNAVAILABLE, detail)
        if kind == "timeout_error":
            return ProviderError(ErrorCode.TIMEOUT, detail)
        if kind == "invalid_request_error" and status == 200:  # an error event in a stream: no status to go by
            return ProviderError(ErrorCode.BAD_REQUEST, detail)
        fallback = super().error_from_failure(failure)
        return ProviderError(fallback.code, detail)
