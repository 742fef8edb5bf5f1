"""OpenAI-compatible Chat Completions: OpenAI, Azure OpenAI, Ollama, vLLM, llama.cpp server,
OpenRouter, Groq and the like.

``BASE_URL`` is the API root (``https://api.openai.com/v1``, ``http://localhost:11434/v1``…);
``/chat/completions`` is appended unless already there, and a query string is kept, so an Azure
deployment URL with ``?api-version=…`` works as is. The key goes in ``Authorization: Bearer``,
or in ``api-key`` for Azure (an Azure host, or a URL with ``api-version``).
"""

import json
from urllib.parse import urlsplit

from ..core.streaming import OpenAIStream
from ..core.types import ErrorCode, Finish, ModelReply, ToolCall, Usage
from .base import (
    BaseProvider, ProviderError, error_detail, names_quota, names_refusal, names_unknown_model, stated_status,
)

FINISH = {"stop": Finish.STOP, "tool_calls": Finish.TOOL_CALLS, "function_call": Finish.TOOL_CALLS,
          "length": Finish.LENGTH, "content_filter": Finish.REFUSED}


class OpenAIProvider(BaseProvider):
    name = "openai"
    default_model = "gpt-4o-mini"
    default_base_url = "https://api.openai.com/v1"

    def url(self):
        """``BASE_URL`` + ``/chat/completions``, keeping a query string (Azure's ``api-version``)."""
        return self.endpoint(lambda path: path if path.endswith("/chat/completions") else path + "/chat/completions")

    def is_azure(self):
        """Azure hosts, and any URL carrying Azure's ``api-version`` query, take the key in ``api-key``."""
        parts = urlsplit(self.url())
        host = parts.hostname or ""
        return "api-version=" in parts.query or host.endswith(
            (".openai.azure.com", ".cognitiveservices.azure.com", ".services.ai.azure.com"))

    def headers(self):
        if not self.api_key:
            return {}  # local servers (Ollama, llama.cpp) need none
        if self.is_azure():
            return {"api-key": self.api_key}
        return {"Authorization": f"Bearer {self.api_key}"}

    def payload(self, messages, tools):
        body = {"model": self.model, "messages": [self.message(m) for m in messages]}
        if tools:
            body["tools"] = [
                {"type": "function",
                 "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
                for t in tools
            ]
        return body

    @staticmethod
    def message(message):
        """One ``ChatMessage`` as a Chat Completions message dict."""
        if message.role == "tool":
            return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
        if message.role == "assistant" and message.tool_calls:
            return {
                "role": "assistant",
                "content": message.content or None,
                "tool_calls": [
                    {"id": c.id, "type": "function",
                     "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                    for c in message.tool_calls
                ],
            }
        return {"role": message.role, "content": message.content}

    stream_class = OpenAIStream

    def complete(self, messages, tools, on_text=None):
        payload = self.payload(messages, tools)
        if self.streams(on_text):
            payload.update(stream=True, stream_options={"include_usage": True})
        return self.post(self.url(), payload, self.headers(), self.parse, on_text)

    def parse(self, data):
        """A Chat Completions reply as a ``ModelReply``; ``bad_response`` if it has no message."""
        choices = data.get("choices")
        if not choices or not isinstance(choices[0], dict) or not isinstance(choices[0].get("message"), dict):
            raise ProviderError(ErrorCode.BAD_RESPONSE, "no choices[0].message in the reply")
        choice = choices[0]
        message = choice["message"]
        calls = []
        for raw in message.get("tool_calls") or []:
            function = raw.get("function") or {}
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments or "{}")
                except ValueError:
                    # Handed to the tool runner, which turns it into an error result for the model.
                    arguments = {"__invalid_json__": arguments}
            calls.append(ToolCall(id=raw.get("id") or f"call_{len(calls) + 1}", name=function.get("name") or "",
                                  arguments=arguments if arguments is not None else {}))
        usage = None
        if isinstance(data.get("usage"), dict):
            usage = Usage(input_tokens=int(data["usage"].get("prompt_tokens") or 0),
                          output_tokens=int(data["usage"].get("completion_tokens") or 0))
        text = message.get("content") or ""
        if not isinstance(text, str):  # some servers send a list of content parts
            text = "".join(part.get("text", "") for part in text if isinstance(part, dict))
        if message.get("refusal"):
            return ModelReply(text=message["refusal"], finish=Finish.REFUSED, usage=usage, model=_model(data))
        finish = FINISH.get(choice.get("finish_reason") or "stop", Finish.STOP)
        if calls and finish != Finish.LENGTH:
            finish = Finish.TOOL_CALLS
        elif finish == Finish.TOOL_CALLS:
            finish = Finish.STOP  # announced tool calls that never came: take the text as the answer
        return ModelReply(text=text, tool_calls=calls if finish == Finish.TOOL_CALLS else [], finish=finish, usage=usage,
                          model=_model(data))


    def error_from_failure(self, failure):
        """Read OpenAI's ``{"error": {"code", "type", "message"}}`` (or Ollama's ``{"error": "..."}``)."""
        body = failure.json() if failure.status else {}
        error = body.get("error")
        if isinstance(error, str):
            error = {"message": error}
        if not isinstance(error, dict):
            return super().error_from_failure(failure)
        status = stated_status(failure)
        code = str(error.get("code") or "")
        kind = str(error.get("type") or "")
        text = str(error.get("message") or "")
        lowered = text.lower()
        detail = error_detail(failure.status, code or kind, text, self.api_key)
        if code == "context_length_exceeded" or "context length" in lowered or "context window" in lowered \
                or "maximum context" in lowered or status == 413:
            return ProviderError(ErrorCode.CONTEXT_LENGTH, detail)
        if names_refusal(code, text) or names_refusal(kind, ""):  # also as a gateway's 500 quotes it
            return ProviderError(ErrorCode.REFUSED, detail)
        if names_quota(code, text) or names_quota(kind, ""):
            return ProviderError(ErrorCode.QUOTA, detail)
        if names_unknown_model(status, code or kind, text):
            return self.unknown_model(detail)
        if code == "invalid_api_key" or status in (401, 403):
            return ProviderError(ErrorCode.AUTH, detail)
        if status == 400 and (error.get("param") in ("stream", "stream_options") or "stream" in lowered):
            return ProviderError(ErrorCode.STREAM_REFUSED, detail)
        # What the status says for an HTTP error, the type says for an error event in a stream (200).
        if "rate_limit" in code or "rate_limit" in kind:
            return ProviderError(ErrorCode.RATE_LIMITED, detail)
        if kind in ("server_error", "service_unavailable") or code in ("server_error", "service_unavailable"):
            return ProviderError(ErrorCode.UNAVAILABLE, detail)
        if kind == "invalid_request_error" and status == 200:  # an error event in a stream: no status to go by
            return ProviderError(ErrorCode.BAD_REQUEST, detail)
        fallback = super().error_from_failure(failure)
        return ProviderError(fallback.code, detail)


def _model(data):
    """The model a reply says answered it ("" when it does not say)."""
    model = data.get("model")
    return model[:200] if isinstance(model, str) else ""
