"""Conversations and messages in the Django admin, read-only: they are facts, as turns are
(``admin.turns``), and only superusers may delete them."""

import uuid

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.db.models import Count
from django.utils.translation import gettext_lazy

from ..models import Conversation, Message, Turn
from ..redaction import hide_keys
from .privacy import EraseActions
from .timeline import seconds


class ReadOnlyMixin:
    """Turns, messages and calls are records of what happened: nobody adds or edits them;
    only superusers may delete them (to honour an erasure request, say)."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return request.user.is_superuser and super().has_delete_permission(request, obj)


def user_fields(user_model=None):
    """The user model's login name field and, when it has a separate one, its email field
    (``USERNAME_FIELD``, ``EMAIL_FIELD``): what the admin searches and orders owners by. A
    custom user model may have no ``username`` (an email login) or no email at all."""
    user_model = user_model or get_user_model()
    fields = [user_model.USERNAME_FIELD]
    email = user_model.get_email_field_name()
    if email not in fields and any(f.name == email for f in user_model._meta.get_fields()):
        fields.append(email)
    return fields


class TurnInline(ReadOnlyMixin, admin.TabularInline):
    model = Turn
    fields = ("status", "started_at", "duration_text", "model_calls", "tool_calls", "margin_left_text", "error")
    readonly_fields = fields
    ordering = ("enqueued_at",)
    extra = 0
    show_change_link = True

    @admin.display(description=gettext_lazy("duration"))
    def duration_text(self, obj):
        return seconds(obj.duration, 1)

    @admin.display(description=gettext_lazy("time left at final write"))
    def margin_left_text(self, obj):
        return seconds(obj.margin_left, 1)


@admin.register(Conversation)
class ConversationAdmin(EraseActions, ReadOnlyMixin, admin.ModelAdmin):
    actions = ["erase_selected", "erase_owners"]
    list_display = ("id", "owner", "created_at", "turn_count")
    list_select_related = ("user",)
    fields = ("id", "owner", "created_at")
    readonly_fields = fields
    inlines = [TurnInline]
    date_hierarchy = "created_at"

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("user").annotate(turn_count=Count("turns"))

    def get_search_fields(self, request):
        """The owner's login name and email, whatever the user model calls them."""
        return [f"user__{field}" for field in user_fields()]

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        try:
            return queryset.filter(pk=uuid.UUID(term)), False
        except ValueError:
            return super().get_search_results(request, queryset, search_term)

    @admin.display(description=gettext_lazy("owner"))
    def owner(self, obj):
        return obj.owner_label

    @admin.display(description=gettext_lazy("turns"), ordering="turn_count")
    def turn_count(self, obj):
        return obj.turn_count


@admin.register(Message)
class MessageAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ("id", "role", "excerpt", "turn", "created_at")
    list_filter = ("role",)
    list_select_related = ("turn",)
    search_fields = ("content",)
    fields = ("turn", "role", "content_text", "tool_calls", "tool_call_id", "tool_name", "is_error", "created_at")
    readonly_fields = fields

    @admin.display(description=gettext_lazy("content"))
    def excerpt(self, obj):
        return hide_keys(obj.content)[:80]

    @admin.display(description=gettext_lazy("content"))
    def content_text(self, obj):
        return hide_keys(obj.content)
