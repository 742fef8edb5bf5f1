import re

from django.utils.translation import gettext_lazy as _
from rest_framework import serializers

from ..conf import get_config

# C0 and C1 control characters except tab and newline, plus DEL.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class TurnCreateSerializer(serializers.Serializer):
    content = serializers.CharField(
        trim_whitespace=True,
        error_messages={
            "required": _("Write a message first."),
            "blank": _("Write a message first."),
            "invalid": _("The message must be text."),
            "null": _("Write a message first."),
        },
    )

    def validate_content(self, value):
        value = _CONTROL.sub("", value.replace("\r\n", "\n")).strip()
        if not value:
            raise serializers.ValidationError(_("Write a message first."))
        limit = get_config()["MAX_MESSAGE_LENGTH"]
        if len(value) > limit:
            raise serializers.ValidationError(
                _("The message is too long: %(length)d characters, at most %(limit)d allowed.")
                % {"length": len(value), "limit": limit}
            )
        return value
