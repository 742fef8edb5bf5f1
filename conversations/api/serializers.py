import re

from django.utils.translation import gettext_lazy as _
from rest_framework import serializers

from ..conf import get_config

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
