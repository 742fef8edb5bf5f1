import re

from django.utils.translation import gettext_lazy as _
from drf_spectacular.extensions import OpenApiSerializerExtension, OpenApiSerializerFieldExtension
from rest_framework import serializers

from ..conf import get_config
from ..models import Assistant, Turn

# C0 and C1 control characters except tab and newline, plus DEL.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# A message must contain one character that is neither whitespace nor a control character
# (the OpenAPI schema states the same rule, for clients and fuzzers).
NOT_BLANK_PATTERN = r"[^\s\x00-\x1f\x7f-\x9f]"


class VisitorTextField(serializers.CharField):
    """Text a visitor wrote: a string (numbers, lists and other JSON values are refused rather
    than turned into text), with control characters (but tab and newline) removed."""

    def run_validation(self, data=serializers.empty):
        if data is not serializers.empty and data is not None:
            if not isinstance(data, str):
                self.fail("invalid")
            self.check_sent_length(data)
            data = _CONTROL.sub("", data)
        return super().run_validation(data)

    def check_sent_length(self, data):
        """A limit on the text as sent, before anything is removed (none here)."""


class MessageField(VisitorTextField):
    """A visitor's message: at most ``MAX_MESSAGE_LENGTH`` characters as sent; control characters
    (but tab and newline) are then removed and the ends trimmed."""

    def check_sent_length(self, data):
        limit = get_config()["MAX_MESSAGE_LENGTH"]
        if len(data) > limit:
            raise serializers.ValidationError(
                _("The message is too long: %(length)d characters, at most %(limit)d allowed.")
                % {"length": len(data), "limit": limit}
            )

    def to_internal_value(self, data):
        return super().to_internal_value(data).strip()


class MessageFieldSchema(OpenApiSerializerFieldExtension):
    """Describes ``MessageField`` in the OpenAPI schema with the limits in force when it is generated."""

    target_class = MessageField

    def map_serializer_field(self, auto_schema, direction):
        """The JSON schema of a message."""
        return {"type": "string", "minLength": 1, "maxLength": get_config()["MAX_MESSAGE_LENGTH"],
                "pattern": NOT_BLANK_PATTERN}


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


class AssistantSlugField(serializers.CharField):
    """The slug of an active assistant (validated by the serializer against the database)."""


class AssistantSlugFieldSchema(OpenApiSerializerFieldExtension):
    """Describes ``AssistantSlugField`` as a slug, without listing the site's assistants: the
    schema is public, and some assistants are for staff or a permission only."""

    target_class = AssistantSlugField

    def map_serializer_field(self, auto_schema, direction):
        """The JSON schema of an assistant's slug: a slug, "" or null."""
        # Not empty: drf-spectacular adds "" (the default) as a branch of its own, and a value may match only one.
        return {"type": "string", "nullable": True, "minLength": 1, "maxLength": 50, "pattern": r"^[-a-zA-Z0-9_]+$",
                "description": "The slug of an assistant the caller may use; \"\" or null: the site's default."}


class ConversationCreateSerializer(serializers.Serializer):
    """``POST /api/conversations/``: which assistant answers the new conversation (its slug);
    absent, "" or null: the site's default. ``validated_data["assistant"]`` is the ``Assistant``."""

    # Not trimmed: " support" or "\x1d" (Python strips both) is no slug, and must not become the default.
    assistant = AssistantSlugField(required=False, allow_null=True, allow_blank=True, max_length=50,
                                   trim_whitespace=False,
                                   error_messages={"invalid": _("Name an assistant by its slug.")})

    def validate_assistant(self, slug):
        """The active ``Assistant`` named ``slug`` (None for "" or None); an unknown or inactive one is refused."""
        if not slug:
            return None
        assistant = Assistant.objects.filter(slug=slug, active=True).first()
        if assistant is None:
            raise serializers.ValidationError(
                _("There is no assistant “%(slug)s” on this site.") % {"slug": slug})
        return assistant


class CommentField(VisitorTextField):
    """A visitor's comment on an answer: at most the field's ``max_length`` characters as sent (as
    the schema says), control characters (but tab and newline) then removed."""

    def check_sent_length(self, data):
        if self.max_length is not None and len(data) > self.max_length:
            self.fail("max_length", max_length=self.max_length)


RATING_CHOICES = [choice for choice, _label in Turn.Rating.choices]


class RatingCreateSerializer(serializers.Serializer):
    value = serializers.ChoiceField(choices=RATING_CHOICES, error_messages={
        "required": _("Rate the answer “up” or “down”."), "invalid_choice": _("Rate the answer “up” or “down”."),
        "null": _("Rate the answer “up” or “down”.")})
    # The column's length is the one rule (the widget gets it from the template tag too).
    comment = CommentField(required=False, allow_blank=True, default="",
                           max_length=Turn._meta.get_field("rating_comment").max_length, error_messages={
        "invalid": _("The comment must be text."),
        "max_length": _("The comment is too long: at most 500 characters are allowed.")})


class ApprovalCreateSerializer(serializers.Serializer):
    """An approval or a decline of one tool call the turn waits for: exactly the call id and the
    SHA-256 of its arguments that the turn's state showed."""

    call_id = serializers.CharField(min_length=1, max_length=200, error_messages={
        "required": _("Say which action you are answering."), "blank": _("Say which action you are answering.")})
    arguments_sha256 = serializers.RegexField(r"^[0-9a-f]{64}$", error_messages={
        "required": _("Send back the details' fingerprint the request showed."),
        "invalid": _("Send back the details' fingerprint the request showed.")})
    decision = serializers.ChoiceField(choices=["approve", "decline"], error_messages={
        "required": _("Approve or decline the action."), "invalid_choice": _("Approve or decline the action.")})

    def validate(self, attrs):
        unknown = sorted(set(self.initial_data) - set(self.fields)) if isinstance(self.initial_data, dict) else []
        if unknown:  # nothing else a client sends (a "history", an "approved" flag) stands for an approval
            raise serializers.ValidationError(_("Only call_id, arguments_sha256 and decision may be sent."))
        return attrs


class ApprovalCreateSchema(OpenApiSerializerExtension):
    """The schema says what the view enforces: no field but the three (``additionalProperties: false``)."""

    target_class = ApprovalCreateSerializer

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_basic_serializer(self.target, direction)
        # A call id is text DRF keeps: no NUL anywhere (refused), not only whitespace (trimmed to blank).
        schema["properties"]["call_id"]["pattern"] = f"^[^\\x00]*{NOT_BLANK_PATTERN}[^\\x00]*$"
        return {**schema, "additionalProperties": False}


class ApprovalSerializer(serializers.Serializer):
    call_id = serializers.CharField()
    status = serializers.CharField(help_text='"approved" or "declined".')
    decided_at = serializers.DateTimeField()


class PendingApprovalSerializer(serializers.Serializer):
    """A tool call waiting for a person: shown as text, never HTML."""

    call_id = serializers.CharField()
    tool = serializers.CharField()
    summary = serializers.CharField(help_text="What the call will do, in the tool's words (plain text).")
    arguments = serializers.CharField(help_text="The exact arguments, as JSON text.")
    arguments_sha256 = serializers.CharField(help_text="Send it back with the decision.")
    approver = serializers.CharField(help_text='Who may approve it: "visitor" or "staff" (in the admin).')
    expires_at = serializers.FloatField(help_text="Unix time after which the turn ends unanswered.")


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
    rating_url = serializers.CharField(help_text="Where the visitor rates the turn's answer, once it has ended.")
    approval_url = serializers.CharField(help_text="Where the visitor approves or declines a tool call the turn "
                                                   "waits for (its state's approvals).")


class NewConversationSerializer(ConversationSerializer):
    assistant = serializers.SlugField(allow_null=True, help_text="The assistant's slug; null: the site's default.")


class RatingSerializer(serializers.Serializer):
    """A visitor's rating of one answer (a finished turn)."""

    turn = serializers.UUIDField()
    value = serializers.ChoiceField(choices=RATING_CHOICES)
    comment = serializers.CharField(allow_blank=True)
    rated_at = serializers.DateTimeField()


class RatingShortSerializer(serializers.Serializer):
    value = serializers.ChoiceField(choices=RATING_CHOICES)
    comment = serializers.CharField(allow_blank=True)


class TurnEndingSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=Turn.Status.choices)
    error = serializers.CharField(allow_null=True, help_text="The sentence the visitor read at the end, if any.")


class ConversationDetailSerializer(NewConversationSerializer):
    messages = TranscriptMessageSerializer(many=True)
    active_turn = TurnSummarySerializer(allow_null=True)
    endings = serializers.DictField(child=TurnEndingSerializer(),
                                    help_text="How each finished turn ended (status and sentence), by turn id.")
    ratings = serializers.DictField(child=RatingShortSerializer(),
                                    help_text="The visitor's rating of each rated turn, by turn id.")
    rating_urls = serializers.DictField(child=serializers.CharField(),
                                        help_text="Where each finished turn's answer is rated, by turn id.")


class TurnStateSerializer(serializers.Serializer):
    """What the poll view serves: the turn's messages so far, and ``done`` once it has ended."""

    id = serializers.UUIDField()
    conversation = serializers.UUIDField()
    status = serializers.ChoiceField(choices=Turn.Status.choices)
    done = serializers.BooleanField()
    messages = MessageSerializer(many=True)
    error = serializers.CharField(allow_null=True, allow_blank=True)
    version = serializers.IntegerField()
    resuming = serializers.BooleanField(help_text="True while a new job takes over from a worker that died or "
                                                  "shut down (MAX_RESUMES); the messages stay as they were.")
    approvals = PendingApprovalSerializer(many=True, help_text="While status is waiting_approval: the tool calls "
                                                               "waiting for a person.")


class ErrorSerializer(serializers.Serializer):
    """Every refusal: one sentence for the visitor."""

    detail = serializers.CharField()


class ValidationErrorSerializer(serializers.Serializer):
    """A 400: ``detail`` for an unreadable request, or a list of messages per field."""

    detail = serializers.CharField(required=False)
    content = serializers.ListField(child=serializers.CharField(), required=False)
    assistant = serializers.ListField(child=serializers.CharField(), required=False)
    value = serializers.ListField(child=serializers.CharField(), required=False)
    comment = serializers.ListField(child=serializers.CharField(), required=False)
    call_id = serializers.ListField(child=serializers.CharField(), required=False)
    arguments_sha256 = serializers.ListField(child=serializers.CharField(), required=False)
    decision = serializers.ListField(child=serializers.CharField(), required=False)
    non_field_errors = serializers.ListField(child=serializers.CharField(), required=False)
