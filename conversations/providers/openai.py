"""OpenAI-compatible Chat Completions (OpenAI, Azure-style base URLs, Ollama, vLLM, llama.cpp, OpenRouter, Groq…)."""

import json
from urllib.parse import urlsplit, urlunsplit

from ..http import CallFailed
from ..types import ModelReply, ToolCall, Usage
from .base import BaseProvider, ProviderError

FINISH = {"stop": "stop", "tool_calls": "tool_calls", "function_call": "tool_calls", "length": "length",
          "content_filter": "refused"}


class OpenAIProvider(BaseProvider):
    name = "openai"
    default_model = "gpt-4o-mini"
    default_base_url = "https://api.openai.com/v1"

    def url(self):
        """``BASE_URL`` + ``/chat/completions``, keeping a query string (Azure's ``api-version``)."""
        parts = urlsplit(self.config.get("BASE_URL") or self.default_base_url)
        path = parts.path.rstrip("/")
        if not path.endswith("/chat/completions"):
            path += "/chat/completions"
        return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))

    def headers(self):
        key = self.config.get("API_KEY")
        if not key:
            return {}
        if "azure" in urlsplit(self.url()).netloc:
            return {"api-key": key}
        return {"Authorization": f"Bearer {key}"}

    def payload(self, messages, tools):
        body = {"model": self.model, "messages": [self._message(m) for m in messages]}
        if tools:
            body["tools"] = [
                {"type": "function",
                 "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
                for t in tools
            ]
        return body

    @staticmethod
    def _message(message):
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

    def complete(self, messages, tools):
        try:
            response = self.http.post_json(self.url(), self.payload(messages, tools), self.headers())
        except CallFailed as failure:
            raise self.error_from_failure(failure) from None
        return self.parse(response.data)

    def parse(self, data):
        try:
            choice = data["choices"][0]
            message = choice["message"]
        except (KeyError, IndexError, TypeError):
            raise ProviderError("bad_response", "no choices[0].message in the reply") from None
        calls = []
        for raw in message.get("tool_calls") or []:
            function = raw.get("function") or {}
            try:
                arguments = json.loads(function.get("arguments") or "{}")
            except ValueError:
                arguments = {"__invalid_json__": function.get("arguments", "")}
            calls.append(ToolCall(id=raw.get("id") or "", name=function.get("name") or "", arguments=arguments))
        usage = None
        if isinstance(data.get("usage"), dict):
            usage = Usage(input_tokens=int(data["usage"].get("prompt_tokens") or 0),
                          output_tokens=int(data["usage"].get("completion_tokens") or 0))
        finish = FINISH.get(choice.get("finish_reason") or "stop", "stop")
        if message.get("refusal"):
            return ModelReply(text=message["refusal"], finish="refused", usage=usage)
        if calls:
            finish = "tool_calls"
        return ModelReply(text=message.get("content") or "", tool_calls=calls, finish=finish, usage=usage)

    def error_from_failure(self, failure):
        error = failure.json().get("error") if failure.status else None
        if isinstance(error, dict):
            code = str(error.get("code") or "")
            kind = str(error.get("type") or "")
            if code == "context_length_exceeded" or "context length" in str(error.get("message", "")).lower():
                return ProviderError("context_length", f"HTTP {failure.status} {code}")
            if code == "model_not_found" or (failure.status == 404 and "model" in str(error.get("message", ""))):
                return ProviderError("unknown_model", f"HTTP {failure.status} model {self.model!r} not found")
            if code == "content_filter" or kind == "content_filter":
                return ProviderError("refused", f"HTTP {failure.status} content filter")
            if code == "invalid_api_key" or failure.status == 401:
                return ProviderError("auth", f"HTTP {failure.status} {code}".strip())
        return super().error_from_failure(failure)
