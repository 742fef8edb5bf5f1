"""The types a custom provider builds on (docs/providers.md): ``from conversations.types import
ChatMessage, ModelReply, ...``. They live in ``conversations.core.types``; nothing in the app
imports this module."""

from .core.types import ChatMessage, ModelReply, Outcome, ToolCall, ToolResult, Usage, record_call

__all__ = ["ChatMessage", "ModelReply", "Outcome", "ToolCall", "ToolResult", "Usage", "record_call"]
