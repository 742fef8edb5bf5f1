"""The admin answers "what happened in this turn, and where did the time go?".

Turns, messages and call records are facts: nobody adds or edits them here. The turn page
shows the transcript, a timeline of every provider call attempt and tool run (server-rendered
bars, widths in percent of the job timeout) and the RQ job. Two operations act on turns:
re-run (a new turn with the same visitor message) and cancel. They need the ``change_turn``
permission, which here means "may operate on turns", not "may edit them". What the turn page
shows is built in ``timeline``.
"""

import uuid

from django.contrib import admin, messages
from django.contrib.admin.utils import flatten_fieldsets
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError
from django.db.models import Count, DurationField, ExpressionWrapper, F, Q
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.utils.translation import ngettext
from django.views.decorators.http import require_POST
from redis.exceptions import RedisError

from ..engine import lifecycle as turns
from ..models import Conversation, Message, Turn
from .filters import NearDeadlineFilter, QueueFilter, RatingFilter
from .assistants import TurnAssistantColumns
from .timeline import job_status, owner_label, redact, seconds, turn_page
from ..engine.configure import chains
from ..conf import get_config
from ..providers.chain import provider_health
from ..infra.queue import get_queue

# -- operations ----------------------------------------------------------------------------


def rerun_turn(turn):
    """Enqueue a new turn in ``turn``'s conversation with the same visitor message.

    Returns ``(new_turn, None)``, or ``(None, reason)`` when it must not run: no visitor
    message, another turn of the conversation still active, or the queue unreachable.
    """
    try:
        new = turns.rerun(turn)
    except turns.TurnActive:
        return None, _("its conversation is still answering a message; wait for it or cancel it first")
    except turns.QueueUnavailable:
        return None, _("the job queue is unreachable")
    return (new, None) if new is not None else (None, _("it has no visitor message to send again"))


UNREACHABLE = "unreachable"  # stop_turn(): a running turn that the request to stop could not reach


def stop_turn(turn):
    """Cancel ``turn``. Returns its status afterwards, or ``UNREACHABLE`` when it is still
    running and Redis, which carries the request to stop, is unreachable.

    A queued turn ends ``cancelled`` at once and a running one before its next model or tool
    call. A turn whose RQ job is gone or dead would never see the request, so it is ended here.
    """
    try:
        return turns.stop(turn, end_orphaned=True).status
    except RedisError:
        return UNREACHABLE


# -- model admins --------------------------------------------------------------------------


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
class ConversationAdmin(ReadOnlyMixin, admin.ModelAdmin):
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
        return owner_label(obj)

    @admin.display(description=gettext_lazy("turns"), ordering="turn_count")
    def turn_count(self, obj):
        return obj.turn_count


@admin.register(Turn)
class TurnAdmin(TurnAssistantColumns, ReadOnlyMixin, admin.ModelAdmin):
    """The turn list and the turn page (timeline, transcript, RQ job), with re-run and cancel."""

    list_display = ("short_id", "status_badge", "assistant_short", "conversation_short", "owner_short", "started",
                    "duration_text", "model_calls", "tool_calls", "tokens", "margin_left_text", "rating_text",
                    "cost_text")
    list_display_links = ("short_id",)
    list_filter = ("status", QueueFilter, NearDeadlineFilter, RatingFilter, "assistant", "provider", "model")
    date_hierarchy = "enqueued_at"
    search_help_text = gettext_lazy("A turn or conversation id, a username or email, or words of a message.")
    actions = ["rerun_selected", "cancel_selected", "export_rated_csv"]
    fieldsets = [
        (None, {"fields": ("status_badge", "error_text", "conversation_link", "owner", ("provider", "model"),
                           "assistant_link", "version_text")}),
        (gettext_lazy("Visitor's rating"), {"fields": (("rating_text", "rated_at"), "rating_comment_text")}),
        (gettext_lazy("Clocks"), {"fields": (("enqueued_at", "started_at", "finished_at"), "duration_text",
                                             ("job_timeout", "deadline_margin", "deadline_at"),
                                             "margin_left_text")}),
        (gettext_lazy("Work"), {"fields": (("model_calls", "tool_calls"), ("input_tokens", "output_tokens",
                                                                            "usage_estimated"),
                                           "cost_text", "cancel_requested")}),
        (gettext_lazy("RQ job"), {"fields": ("job_id", "rq_status")}),
    ]
    readonly_fields = flatten_fieldsets(fieldsets)  # every field the page shows

    class Media:
        css = {"all": ["conversations/admin.css"]}

    def get_queryset(self, request):
        elapsed = ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField())
        return super().get_queryset(request).select_related(
            "conversation__user", "assistant", "assistant_version").annotate(elapsed=elapsed)

    def get_search_fields(self, request):
        """The owner's login name and email, whatever the user model calls them, and the messages."""
        return [f"conversation__user__{field}" for field in user_fields()] + ["messages__content"]

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        try:
            value = uuid.UUID(term)
        except ValueError:
            return super().get_search_results(request, queryset, search_term)
        return queryset.filter(Q(pk=value) | Q(conversation_id=value)), False

    # -- permissions: read-only, but operators may re-run and cancel -------------------

    def has_operate_permission(self, request, obj=None):
        """Whether the user may re-run and cancel turns (the ``change_turn`` permission)."""
        return request.user.has_perm(f"{self.opts.app_label}.change_{self.opts.model_name}")

    # -- columns and fields ----------------------------------------------------------------

    @admin.display(description=gettext_lazy("turn"), ordering="enqueued_at")
    def short_id(self, obj):
        return format_html('<span title="{}">{}</span>', obj.id, str(obj.id)[:8])

    @admin.display(description=gettext_lazy("status"), ordering="status")
    def status_badge(self, obj):
        return format_html('<span class="turn-status turn-status-{}">{}</span>', obj.status, obj.get_status_display())

    @admin.display(description=gettext_lazy("owner"))
    def owner(self, obj):
        return owner_label(obj.conversation)

    @admin.display(description=gettext_lazy("owner"), ordering=f"conversation__user__{user_fields()[0]}")
    def owner_short(self, obj):
        user = obj.conversation.user
        if user is None:
            return _("anonymous visitor")
        return format_html('<span title="{}">{}</span>', owner_label(obj.conversation), user.get_username())

    @admin.display(description=gettext_lazy("started"), ordering="started_at")
    def started(self, obj):
        if obj.started_at is None:
            return _("never") if obj.done else "—"  # "never": it ended in the queue (see QueueFilter)
        return date_format(timezone.localtime(obj.started_at), "SHORT_DATETIME_FORMAT")

    @admin.display(description=gettext_lazy("conversation"))
    def conversation_short(self, obj):
        url = reverse(f"admin:{self.opts.app_label}_conversation_change", args=[obj.conversation_id])
        return format_html('<a href="{}" title="{}">{}</a>', url, obj.conversation_id, str(obj.conversation_id)[:8])

    @admin.display(description=gettext_lazy("conversation"))
    def conversation_link(self, obj):
        url = reverse(f"admin:{self.opts.app_label}_conversation_change", args=[obj.conversation_id])
        return format_html('<a href="{}">{}</a>', url, obj.conversation_id)

    @admin.display(description=gettext_lazy("duration"), ordering="elapsed")
    def duration_text(self, obj):
        if obj.duration is None:
            return _("running") if obj.status == Turn.Status.RUNNING else "—"
        return seconds(obj.duration, 1)

    @admin.display(description=gettext_lazy("tokens in / out"))
    def tokens(self, obj):
        if obj.input_tokens is None and obj.output_tokens is None:
            return "—"
        tokens = f"{obj.input_tokens or 0} / {obj.output_tokens or 0}"
        # A call ended before the provider said what it used (a Stop, a stream cut off): estimated.
        return _("%(tokens)s (estimated)") % {"tokens": tokens} if obj.usage_estimated else tokens

    @admin.display(description=gettext_lazy("time left at final write"), ordering="margin_left")
    def margin_left_text(self, obj):
        if obj.margin_left is None:
            return "—"
        overran = obj.deadline_margin is not None and obj.margin_left < obj.deadline_margin
        return format_html('<span class="{}">{}</span>', "margin-overran" if overran else "margin",
                           seconds(obj.margin_left, 1))

    @admin.display(description=gettext_lazy("error shown to the visitor"))
    def error_text(self, obj):
        return redact(obj.error) or "—"

    @admin.display(description=gettext_lazy("RQ status"))
    def rq_status(self, obj):
        status, url = job_status(obj)
        if status is None:
            return "—"
        if url:
            return format_html('{} · <a href="{}">{}</a>', status, url, _("open in django-rq"))
        return status

    # -- the turn page -----------------------------------------------------------------------

    def changelist_view(self, request, extra_context=None):
        """The turn list, headed by the circuit breaker of each provider of the site's chain and of
        the active assistants' (``manage.py provider_health``)."""
        try:
            health = provider_health(get_config(), get_queue().connection, chains())
        except (RedisError, DatabaseError):  # the list must show whatever Redis does
            health = []
        return super().changelist_view(request, {**(extra_context or {}), "provider_health": health})

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if obj is not None:
            context.update(turn_page(obj), can_operate=self.has_operate_permission(request, obj))
        return super().render_change_form(request, context, add=add, change=change, form_url=form_url, obj=obj)

    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        return [
            path("<path:object_id>/rerun/", self.admin_site.admin_view(require_POST(self.rerun_view)),
                 name="%s_%s_rerun" % info),
            path("<path:object_id>/cancel/", self.admin_site.admin_view(require_POST(self.cancel_view)),
                 name="%s_%s_cancel" % info),
        ] + super().get_urls()

    def _operated_turn(self, request, object_id):
        if not self.has_operate_permission(request):
            raise PermissionDenied
        try:
            uuid.UUID(str(object_id))
        except ValueError:
            raise PermissionDenied  # noqa: B904 - a malformed id is treated like a foreign one
        return get_object_or_404(self.get_queryset(request), pk=object_id)

    def _change_url(self, turn):
        return reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_change", args=[turn.pk])

    def rerun_view(self, request, object_id):
        """POST from the turn page: re-run this turn; redirects to the new turn's page."""
        turn = self._operated_turn(request, object_id)
        new, reason = rerun_turn(turn)
        if new is None:
            self.message_user(request, _("Turn %(id)s was not re-run: %(reason)s.") % {"id": turn.pk, "reason": reason},
                              messages.WARNING)
            return HttpResponseRedirect(self._change_url(turn))
        self.message_user(request, _("Re-running the message of turn %(old)s as turn %(new)s.") % {
            "old": turn.pk, "new": new.pk}, messages.SUCCESS)
        return HttpResponseRedirect(self._change_url(new))

    def cancel_view(self, request, object_id):
        """POST from the turn page: cancel this turn; redirects back to it."""
        turn = self._operated_turn(request, object_id)
        self._report_cancel(request, [(turn, stop_turn(turn))])
        return HttpResponseRedirect(self._change_url(turn))

    # -- actions on the turn list ----------------------------------------------------------

    @admin.action(description=gettext_lazy("Re-run selected turns (same visitor message, new turn)"),
                  permissions=["operate"])
    def rerun_selected(self, request, queryset):
        started, refused = 0, []
        for turn in queryset.order_by("enqueued_at"):
            new, reason = rerun_turn(turn)
            if new is None:
                refused.append(_("%(id)s: %(reason)s") % {"id": str(turn.pk)[:8], "reason": reason})
            else:
                started += 1
        if started:
            self.message_user(request, ngettext("Re-running %d turn.", "Re-running %d turns.", started) % started,
                              messages.SUCCESS)
        if refused:
            self.message_user(request, _("Not re-run: %s.") % "; ".join(refused), messages.WARNING)

    @admin.action(description=gettext_lazy("Cancel selected turns"), permissions=["operate"])
    def cancel_selected(self, request, queryset):
        active = queryset.filter(status__in=Turn.ACTIVE_STATUSES)
        self._report_cancel(request, [(turn, stop_turn(turn)) for turn in active])

    def _report_cancel(self, request, results):
        ended = sum(1 for _turn, status in results if status == Turn.Status.CANCELLED)
        stopping = sum(1 for _turn, status in results if status in Turn.ACTIVE_STATUSES)
        if ended:
            self.message_user(request, ngettext("%d turn cancelled.", "%d turns cancelled.", ended) % ended,
                              messages.SUCCESS)
        if stopping:
            self.message_user(request, ngettext(
                "%d running turn asked to stop: it ends cancelled before its next model or tool call.",
                "%d running turns asked to stop: they end cancelled before their next model or tool call.",
                stopping) % stopping, messages.SUCCESS)
        unreachable = sum(1 for _turn, status in results if status == UNREACHABLE)
        if unreachable:
            self.message_user(request, ngettext(
                "%d running turn could not be asked to stop: Redis is unreachable.",
                "%d running turns could not be asked to stop: Redis is unreachable.",
                unreachable) % unreachable, messages.ERROR)
        if not ended and not stopping and not unreachable:
            self.message_user(request, _("No running or queued turn was selected; nothing to cancel."),
                              messages.WARNING)


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
        return redact(obj.content)[:80]

    @admin.display(description=gettext_lazy("content"))
    def content_text(self, obj):
        return redact(obj.content)
