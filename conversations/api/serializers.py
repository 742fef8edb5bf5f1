import re

from django.utils.translation import gettext_lazy as _
from rest_framework import serializers

from ..conf import get_config
from ..models import Turn

# C0 and C1 control characters except tab and newline, plus DEL.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class MessageField(serializers.CharField):
    """Text with control characters (but tab and newline) removed before any other check."""

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        return _CONTROL.sub("", value.replace("\r\n", "\n")).strip()

    def run_validation(self, data=serializers.empty):
        if isinstance(data, str):
            data = _CONTROL.sub("", data)
        return super().run_validation(data)


class TurnCreateSerializer(serializers.Serializer):
    content = MessageField(
        trim_whitespace=True,
        error_messages={
            "required": _("Write a message first."),
            "blank": _("Write a message first."),
            "invalid": _("The message must be text."),
            "null": _("Write a message first."),
        },
    )

    def validate_content(self, value):
        limit = get_config()["MAX_MESSAGE_LENGTH"]
        if len(value) > limit:
            raise serializers.ValidationError(
                _("The message is too long: %(length)d characters, at most %(limit)d allowed.")
                % {"length": len(value), "limit": limit}
            )
        return value


# -- Response shapes. The views build plain dicts; these describe them in the OpenAPI schema. --

class ConversationSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    created_at = serializers.DateTimeField()


class ToolCallSerializer(serializers.Serializer):
    id = serializers.CharField(allow_blank=True)
    name = serializers.CharField(allow_blank=True)
    arguments = serializers.DictField()


class MessageSerializer(serializers.Serializer):
    """One transcript entry. Tool results carry ``tool_call_id``, ``name`` and ``is_error``;
    assistant messages that asked for tools carry ``tool_calls``."""

    id = serializers.IntegerField()
    role = serializers.ChoiceField(choices=["user", "assistant", "tool"])
    content = serializers.CharField(allow_blank=True)
    tool_calls = ToolCallSerializer(many=True, required=False)
    tool_call_id = serializers.CharField(required=False, allow_blank=True)
    name = serializers.CharField(required=False, allow_blank=True)
    is_error = serializers.BooleanField(required=False)


class TranscriptMessageSerializer(MessageSerializer):
    turn = serializers.UUIDField()


class TurnSummarySerializer(serializers.Serializer):
    id = serializers.UUIDField()
    conversation = serializers.UUIDField()
    status = serializers.ChoiceField(choices=Turn.Status.choices)
    done = serializers.BooleanField()
    poll_url = serializers.CharField()
    cancel_url = serializers.CharField()


class ConversationDetailSerializer(ConversationSerializer):
    messages = TranscriptMessageSerializer(many=True)
    active_turn = TurnSummarySerializer(allow_null=True)


class TurnStateSerializer(serializers.Serializer):
    """What the poll view serves: the turn's messages so far, and ``done`` once it has ended."""

    id = serializers.UUIDField()
    conversation = serializers.UUIDField()
    status = serializers.ChoiceField(choices=Turn.Status.choices)
    done = serializers.BooleanField()
    messages = MessageSerializer(many=True)
    error = serializers.CharField(allow_null=True, allow_blank=True)
    version = serializers.IntegerField()


class ErrorSerializer(serializers.Serializer):
    """Every refusal: one sentence for the visitor."""

    detail = serializers.CharField()


class ValidationErrorSerializer(serializers.Serializer):
    """A 400: ``detail`` for an unreadable request, or a list of messages per field."""

    detail = serializers.CharField(required=False)
    content = serializers.ListField(child=serializers.CharField(), required=False)
    non_field_errors = serializers.ListField(child=serializers.CharField(), required=False)
