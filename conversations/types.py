"""The types a custom provider builds on (docs/providers.md): ``from conversations.types import
ChatMessage, ModelReply, ...``. They live in ``conversations.core.types``; nothing in the app
imports this module."""

from .core.types import ChatMessage, ErrorCode, ModelReply, Outcome, ToolCall, ToolResult, Usage, record_call

__all__ = ["ChatMessage", "ErrorCode", "ModelReply", "Outcome", "ToolCall", "ToolResult", "Usage", "record_call"]
