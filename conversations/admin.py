from django.contrib import admin

from .models import CallRecord, Conversation, Message, Turn


class ReadOnlyMixin:
    """Turns, messages and calls are records of what happened: nobody adds or edits them."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class MessageInline(ReadOnlyMixin, admin.TabularInline):
    model = Message
    fields = ("role", "content", "tool_calls", "tool_name", "is_error", "created_at")
    readonly_fields = fields
    extra = 0


class CallInline(ReadOnlyMixin, admin.TabularInline):
    model = CallRecord
    fields = ("kind", "name", "attempt", "started_offset", "timeout", "remaining_before", "duration", "outcome",
              "status_code", "detail")
    readonly_fields = fields
    extra = 0


class TurnInline(ReadOnlyMixin, admin.TabularInline):
    model = Turn
    fields = ("id", "status", "enqueued_at", "finished_at", "model_calls", "tool_calls", "error")
    readonly_fields = fields
    extra = 0
    show_change_link = True


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("id", "user", "created_at")
    list_select_related = ("user",)
    search_fields = ("id", "user__username")
    readonly_fields = ("id", "user", "created_at")
    exclude = ("owner_token",)
    inlines = [TurnInline]
    date_hierarchy = "created_at"

    def has_add_permission(self, request):
        return False


@admin.register(Turn)
class TurnAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ("id", "status", "conversation", "enqueued_at", "model_calls", "tool_calls", "margin_left")
    list_filter = ("status", "provider", "model")
    list_select_related = ("conversation",)
    date_hierarchy = "enqueued_at"
    search_fields = ("id", "conversation__id")
    exclude = ("idempotency_key",)
    inlines = [MessageInline, CallInline]


@admin.register(Message)
class MessageAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ("id", "role", "turn", "created_at")
    list_filter = ("role",)
    search_fields = ("content",)
