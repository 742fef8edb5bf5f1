"""The admin answers "what happened in this turn, and where did the time go?".

Turns, messages and call records are facts: nobody adds or edits them here. The turn page
shows the transcript, a timeline of every provider call attempt and tool run (server-rendered
bars, widths in percent of the job timeout) and the RQ job. Two operations act on turns:
re-run (a new turn with the same visitor message) and cancel. They need the ``change_turn``
permission, which here means "may operate on turns", not "may edit them".
"""

import json
import uuid

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, DurationField, ExpressionWrapper, F, Q
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import NoReverseMatch, path, reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.utils.translation import ngettext
from redis.exceptions import RedisError
from rq.exceptions import NoSuchJobError
from rq.job import Job

from . import jobs, turns
from .conf import get_config
from .models import CallRecord, Conversation, Message, Turn

def redact(text):
    """``text`` with the provider API key blanked out, should a provider have echoed it back."""
    text = "" if text is None else str(text)
    key = str(get_config().get("API_KEY") or "")
    if len(key) >= 4 and key in text:
        text = text.replace(key, "[API key hidden]")
    return text


def seconds(value, digits=2):
    """``value`` seconds as text ("1.25 s"), or an em dash when unknown."""
    return "—" if value is None else f"{value:.{digits}f} s"


def percent(value, scale):
    """``value`` as a CSS percentage of ``scale``, clamped to 0–100, always with a dot decimal."""
    share = 0.0 if not scale else max(0.0, min(100.0, value / scale * 100))
    return f"{share:.2f}%"


# -- the turn page: timeline, transcript, RQ job -----------------------------------------------


OUTCOME_CLASS = {"ok": "ok", "skipped": "skipped", "timeout": "timeout"}


def build_timeline(turn, calls):
    """The timeline of ``turn`` from its ``CallRecord`` rows, ready for the template.

    Every position is a percentage of the job timeout (RQ's ``job_timeout``), so the right
    edge is the moment RQ would kill the job; markers show the job's own deadline and the
    final write. Offsets are measured from the turn's start in the job, like the records.
    Returns a dict with ``rows``, ``markers``, ``ticks`` and ``totals``.
    """
    job_timeout = turn.job_timeout or float(get_config()["JOB_TIMEOUT"])
    margin = turn.deadline_margin if turn.deadline_margin is not None else float(get_config()["DEADLINE_MARGIN"])
    scale = max([job_timeout] + [c.started_offset + c.duration for c in calls])
    rows = []
    for call in calls:
        allowed = call.timeout if call.timeout is not None else 0.0
        rows.append({
            "kind": call.get_kind_display(),
            "kind_code": call.kind,
            "name": redact(call.name),
            "attempt": call.attempt,
            "offset": seconds(call.started_offset),
            "timeout": seconds(call.timeout),
            "remaining_before": seconds(call.remaining_before),
            "duration": seconds(call.duration),
            "outcome": call.get_outcome_display(),
            "outcome_class": OUTCOME_CLASS.get(call.outcome, "error"),
            "status_code": call.status_code,
            "detail": redact(call.detail),
            "left": percent(call.started_offset, scale),
            "width": percent(call.duration, scale),
            # The grey band is the time the call was allowed; the solid bar inside it, what it took.
            "allowed_width": percent(min(allowed, scale - call.started_offset), scale),
        })
    markers = [{"label": _("deadline"), "at": seconds(job_timeout - margin, 1),
                "left": percent(job_timeout - margin, scale), "css": "deadline"},
               {"label": _("job timeout"), "at": seconds(job_timeout, 1),
                "left": percent(job_timeout, scale), "css": "job-timeout"}]
    if turn.margin_left is not None:
        written = job_timeout - turn.margin_left
        markers.append({"label": _("final write"), "at": seconds(written, 1), "left": percent(written, scale),
                        "css": "final-write"})
    totals = {
        "model": seconds(sum(c.duration for c in calls if c.kind == CallRecord.Kind.MODEL)),
        "tool": seconds(sum(c.duration for c in calls if c.kind == CallRecord.Kind.TOOL)),
        "attempts": sum(1 for c in calls if c.kind == CallRecord.Kind.MODEL),
        "runs": sum(1 for c in calls if c.kind == CallRecord.Kind.TOOL),
    }
    ticks = [{"left": percent(scale * i / 4, scale), "label": seconds(scale * i / 4, 1)} for i in range(5)]
    return {"rows": rows, "markers": markers, "ticks": ticks, "totals": totals,
            "job_timeout": seconds(job_timeout, 1), "deadline": seconds(job_timeout - margin, 1),
            "margin_left": seconds(turn.margin_left, 1)}


def build_transcript(turn, rows):
    """The messages of ``turn`` in order, each a dict the template renders as escaped text."""
    entries = []
    for message in rows:
        calls = [{"id": c.get("id", ""), "name": redact(c.get("name", "")),
                  "arguments": redact(json.dumps(c.get("arguments") or {}, indent=2, ensure_ascii=False,
                                                 sort_keys=True))}
                 for c in (message.tool_calls or []) if isinstance(c, dict)]
        entries.append({"role": message.role, "role_label": message.get_role_display(),
                        "content": redact(message.content), "tool_calls": calls,
                        "tool_name": redact(message.tool_name), "tool_call_id": message.tool_call_id,
                        "is_error": message.is_error, "created_at": message.created_at})
    return entries


def job_status(turn):
    """The RQ job of ``turn`` as ``(status, url)``: status is RQ's, "gone" or "unknown"; url is
    django-rq's job page (None when there is nothing to link to)."""
    if not turn.job_id:
        return None, None
    queue = jobs.get_queue()
    try:
        job = Job.fetch(turn.job_id, connection=queue.connection, serializer=queue.serializer)
        status = job.get_status(refresh=False)
        status = getattr(status, "value", status) or "unknown"  # JobStatus is an Enum: show "finished"
    except NoSuchJobError:
        return "gone", None
    except RedisError:
        return "unknown (Redis unreachable)", None
    return status, rq_job_url(queue.name, turn.job_id)


def rq_job_url(queue_name, job_id):
    """django-rq's job detail page for ``job_id``, or None when its URLs are not installed."""
    from django_rq.settings import get_queues_map

    index = get_queues_map().get(queue_name)
    if index is None:
        return None
    try:
        return reverse("django_rq:job_detail", kwargs={"queue_index": index, "job_id": job_id})
    except NoReverseMatch:
        return None


# -- operations ----------------------------------------------------------------------------


def rerun_turn(turn):
    """Enqueue a new turn in ``turn``'s conversation with the same visitor message.

    Returns ``(new_turn, None)``, or ``(None, reason)`` when it must not run: no visitor
    message, another turn of the conversation still active, or the queue unreachable.
    """
    message = turn.messages.filter(role=Message.Role.USER).order_by("id").first()
    if message is None:
        return None, _("it has no visitor message to send again")
    try:
        new, _created = turns.start(
            lambda: Conversation.objects.select_for_update().get(pk=turn.conversation_id), message.content)
    except turns.TurnActive:
        return None, _("its conversation is still answering a message; wait for it or cancel it first")
    except turns.QueueUnavailable:
        return None, _("the job queue is unreachable")
    return new, None


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


# -- filters -------------------------------------------------------------------------------


class NearDeadlineFilter(admin.SimpleListFilter):
    """Turns whose final write came close to, or after, the job's own deadline.

    ``margin_left`` is the time left before RQ's job timeout at the final write, and the own
    deadline sits ``deadline_margin`` before that timeout. "Near" means the final write came
    later than ``NEAR_SECONDS`` before the own deadline; "overran" that it came after it, in
    the margin kept for the final write. Turns that never reached a final write are in neither.
    """

    title = gettext_lazy("ended near the deadline")
    parameter_name = "deadline"
    NEAR_SECONDS = 5.0

    def lookups(self, request, model_admin):
        return [
            ("near", gettext_lazy("within %(s)d s of its deadline or later") % {"s": self.NEAR_SECONDS}),
            ("overran", gettext_lazy("after its deadline")),
        ]

    def queryset(self, request, queryset):
        if self.value() == "near":
            return queryset.filter(margin_left__lt=F("deadline_margin") + self.NEAR_SECONDS)
        if self.value() == "overran":
            return queryset.filter(margin_left__lt=F("deadline_margin"))
        return queryset


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


def owner_label(conversation):
    user = conversation.user
    if user is None:
        return _("anonymous visitor")
    email = getattr(user, "email", "")
    return f"{user.get_username()} <{email}>" if email else user.get_username()


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
    search_fields = ("user__username", "user__email")
    fields = ("id", "owner", "created_at")
    readonly_fields = fields
    inlines = [TurnInline]
    date_hierarchy = "created_at"

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("user").annotate(turn_count=Count("turns"))

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
class TurnAdmin(ReadOnlyMixin, admin.ModelAdmin):
    """The turn list and the turn page (timeline, transcript, RQ job), with re-run and cancel."""

    list_display = ("short_id", "status_badge", "conversation_short", "owner_short", "started", "duration_text",
                    "model_calls", "tool_calls", "tokens", "margin_left_text")
    list_display_links = ("short_id",)
    list_filter = ("status", NearDeadlineFilter, "provider", "model")
    list_select_related = ("conversation", "conversation__user")
    date_hierarchy = "enqueued_at"
    search_fields = ("conversation__user__username", "conversation__user__email", "messages__content")
    search_help_text = gettext_lazy("A turn or conversation id, a username or email, or words of a message.")
    actions = ["rerun_selected", "cancel_selected"]
    fieldsets = [
        (None, {"fields": ("status_badge", "error_text", "conversation_link", "owner", ("provider", "model"))}),
        (gettext_lazy("Clocks"), {"fields": (("enqueued_at", "started_at", "finished_at"), "duration_text",
                                             ("job_timeout", "deadline_margin", "deadline_at"),
                                             "margin_left_text")}),
        (gettext_lazy("Work"), {"fields": (("model_calls", "tool_calls"), ("input_tokens", "output_tokens"),
                                           "cancel_requested")}),
        (gettext_lazy("RQ job"), {"fields": ("job_id", "rq_status")}),
    ]
    readonly_fields = ("status_badge", "conversation_link", "owner", "provider", "model", "enqueued_at",
                       "started_at", "finished_at", "duration_text", "job_timeout", "deadline_margin",
                       "deadline_at", "margin_left_text", "model_calls", "tool_calls", "input_tokens",
                       "output_tokens", "cancel_requested", "error_text", "job_id", "rq_status")

    class Media:
        css = {"all": ["conversations/admin.css"]}

    def get_queryset(self, request):
        elapsed = ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField())
        return super().get_queryset(request).select_related("conversation__user").annotate(elapsed=elapsed)

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

    @admin.display(description=gettext_lazy("owner"), ordering="conversation__user__username")
    def owner_short(self, obj):
        user = obj.conversation.user
        if user is None:
            return _("anonymous visitor")
        return format_html('<span title="{}">{}</span>', owner_label(obj.conversation), user.get_username())

    @admin.display(description=gettext_lazy("started"), ordering="started_at")
    def started(self, obj):
        if obj.started_at is None:
            return "—"
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
        return f"{obj.input_tokens or 0} / {obj.output_tokens or 0}"

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

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if obj is not None:
            context.update({
                "timeline": build_timeline(obj, list(obj.calls.order_by("started_offset", "id"))),
                "transcript": build_transcript(obj, list(obj.messages.order_by("id"))),
                "turn_error": redact(obj.error),
                "can_operate": self.has_operate_permission(request, obj),
                "is_active": obj.status in Turn.ACTIVE_STATUSES,
            })
        return super().render_change_form(request, context, add=add, change=change, form_url=form_url, obj=obj)

    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        return [
            path("<path:object_id>/rerun/", self.admin_site.admin_view(self.rerun_view), name="%s_%s_rerun" % info),
            path("<path:object_id>/cancel/", self.admin_site.admin_view(self.cancel_view),
                 name="%s_%s_cancel" % info),
        ] + super().get_urls()

    def _operated_turn(self, request, object_id):
        if request.method != "POST":
            return None
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
        if turn is None:
            return HttpResponseNotAllowed(["POST"])
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
        if turn is None:
            return HttpResponseNotAllowed(["POST"])
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
