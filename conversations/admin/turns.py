"""The admin answers "what happened in this turn, and where did the time go?".

Turns, messages and call records are facts: nobody adds or edits them here. The turn page
shows the transcript, a timeline of every provider call attempt and tool run (server-rendered
bars, widths in percent of the job timeout) and the RQ job. Two operations act on turns:
re-run (a new turn with the same visitor message) and cancel. They need the ``change_turn``
permission, which here means "may operate on turns", not "may edit them". What the turn page
shows is built in ``timeline``.
"""

import csv
import uuid

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import flatten_fieldsets
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError
from django.db.models import DurationField, ExpressionWrapper, F, Q
from django.http import HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.utils.translation import ngettext
from django.views.decorators.http import require_POST
from redis.exceptions import RedisError

from ..engine import handoff, lifecycle
from ..evals.collect import add_turns
from ..models import TestSet, Turn
from .filters import NearDeadlineFilter, QueueFilter, RatingFilter
from ..redaction import hide_keys
from .timeline import job_status, seconds, turn_page
from ..engine.configure import chains
from ..conf import get_config
from ..providers.chain import provider_health
from ..infra.queue import get_queue
from .assistants import configuration_html
from .conversations import ReadOnlyMixin, user_fields
from .export import CSV_COLUMNS, csv_cell, rated_rows


def with_assistant(conversation):
    """A re-run's ``admit``: not while staff hold the conversation, and one turn at a time."""
    handoff.ensure_with_assistant(conversation)
    lifecycle.ensure_idle(conversation)


def rerun_turn(turn):
    """Enqueue a new turn in ``turn``'s conversation with the same visitor message.

    Returns ``(new_turn, None)``, or ``(None, reason)`` when it must not run: no visitor
    message, another turn of the conversation still active, or the queue unreachable.
    """
    try:
        new = lifecycle.rerun(turn, admit=with_assistant)
    except lifecycle.TurnActive:
        return None, _("its conversation is still answering a message; wait for it or cancel it first")
    except (handoff.Held, handoff.Refused):
        return None, _("its conversation is with a person (or closed by them); hand it back to the assistant first")
    except lifecycle.QueueUnavailable:
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
        return lifecycle.stop(turn, end_orphaned=True).status
    except RedisError:
        return UNREACHABLE


class TurnAssistantColumns:
    """What ``TurnAdmin`` shows of assistants, ratings and costs, and its CSV export action."""

    @admin.display(description=gettext_lazy("assistant"), ordering="assistant__name")
    def assistant_short(self, obj):
        if obj.assistant_id is None:
            return "—"
        version = obj.assistant_version.fingerprint[:7] if obj.assistant_version_id else ""
        return format_html('{} <span class="assistant-version" title="{}">{}</span>', obj.assistant.name,
                           _("configuration version"), version)

    @admin.display(description=gettext_lazy("assistant"))
    def assistant_link(self, obj):
        if obj.assistant_id is None:
            return _("the site's settings")
        url = reverse("admin:conversations_assistant_change", args=[obj.assistant_id])
        return format_html('<a href="{}">{}</a> ({})', url, obj.assistant.name, obj.assistant.slug)

    @admin.display(description=gettext_lazy("configuration that answered"))
    def version_text(self, obj):
        if obj.assistant_version_id is None:
            return "—"
        return format_html("{}{}", obj.assistant_version.fingerprint, configuration_html(obj.assistant_version))

    @admin.display(description=gettext_lazy("rating"), ordering="rating")
    def rating_text(self, obj):
        if not obj.rating:
            return "—"
        return format_html('<span class="turn-rating turn-rating-{}">{}</span>{}', obj.rating, obj.get_rating_display(),
                           format_html(' <span class="turn-rating-comment" title="{}">✎</span>', obj.rating_comment)
                           if obj.rating_comment else "")

    @admin.display(description=gettext_lazy("visitor's comment"))
    def rating_comment_text(self, obj):
        return obj.rating_comment or "—"

    @admin.display(description=gettext_lazy("cost"), ordering="cost")
    def cost_text(self, obj):
        return "—" if obj.cost is None else f"{obj.cost:.4f}"

    # A bulk copy of visitors' words leaving the admin: for staff trusted to operate on turns.
    @admin.action(description=gettext_lazy("Export the rated ones among the selected turns as CSV"),
                  permissions=["operate"])
    def export_rated_csv(self, request, queryset):
        response = HttpResponse(content_type="text/csv; charset=utf-8")
        stamp = timezone.localtime().strftime("%Y%m%d-%H%M")
        response["Content-Disposition"] = f'attachment; filename="rated-turns-{stamp}.csv"'
        # Every cell quoted: a spreadsheet splitting on ";" or tab still reads each cell as one.
        writer = csv.writer(response, quoting=csv.QUOTE_ALL)
        writer.writerow(CSV_COLUMNS)
        for turn in rated_rows(queryset).iterator():
            writer.writerow([csv_cell(value) for value in (
                turn.pk, turn.finished_at.isoformat() if turn.finished_at else "",
                turn.assistant.slug if turn.assistant_id else "",
                turn.assistant_version.fingerprint if turn.assistant_version_id else "", turn.rating,
                turn.rating_comment, turn.question, turn.answer, turn.status, turn.model, turn.input_tokens,
                turn.output_tokens, turn.cost)])
        return response


class TestSetChoiceForm(forms.Form):
    """Which test set the visitor's messages of some turns go to: one of their assistants', or
    (empty) each assistant's ``<slug>-from-turns``."""

    test_set = forms.ModelChoiceField(queryset=TestSet.objects.none(), required=False,
                                      label=gettext_lazy("test set"),
                                      empty_label=gettext_lazy("the assistant's “…-from-turns” (created when missing)"))

    def __init__(self, *args, assistants=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["test_set"].queryset = TestSet.objects.filter(assistant_id__in=assistants).select_related(
            "assistant")


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
    actions = ["rerun_selected", "cancel_selected", "export_rated_csv", "add_to_test_set"]
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
        return obj.conversation.owner_label

    @admin.display(description=gettext_lazy("owner"), ordering=f"conversation__user__{user_fields()[0]}")
    def owner_short(self, obj):
        user = obj.conversation.user
        if user is None:
            return _("anonymous visitor")
        return format_html('<span title="{}">{}</span>', obj.conversation.owner_label, user.get_username())

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
        return hide_keys(obj.error) or "—"

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
            context.update(turn_page(obj), can_operate=self.has_operate_permission(request, obj),
                           can_add_question=self.may_add_questions(request) and obj.assistant_id is not None
                           and not obj.conversation.internal)
        return super().render_change_form(request, context, add=add, change=change, form_url=form_url, obj=obj)

    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        return [
            path("<path:object_id>/rerun/", self.admin_site.admin_view(require_POST(self.rerun_view)),
                 name="%s_%s_rerun" % info),
            path("<path:object_id>/cancel/", self.admin_site.admin_view(require_POST(self.cancel_view)),
                 name="%s_%s_cancel" % info),
            path("<path:object_id>/add-to-test-set/", self.admin_site.admin_view(self.add_to_test_set_view),
                 name="%s_%s_add_to_test_set" % info),
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

    def add_to_test_set_view(self, request, object_id):
        """The turn page's "Add to a test set": GET shows the choice of test set, POST adds the
        turn's question to it and redirects back to the turn."""
        if not self.may_add_questions(request):
            raise PermissionDenied
        turn = self._operated_turn(request, object_id)
        response = self.choose_test_set(request, Turn.objects.filter(pk=turn.pk), turn=turn)
        return response or HttpResponseRedirect(self._change_url(turn))

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

    def may_add_questions(self, request):
        # Visitors' words copied into a test set: for staff trusted to operate on turns who may add questions.
        return self.has_operate_permission(request) and request.user.has_perm("conversations.add_testquestion")

    @admin.action(description=gettext_lazy("Add the visitor's message to a test set…"), permissions=["operate"])
    def add_to_test_set(self, request, queryset):
        if not self.may_add_questions(request):
            raise PermissionDenied
        return self.choose_test_set(request, queryset)

    def choose_test_set(self, request, turns, turn=None):
        """The page where staff pick the test set ``turns`` go to (``turn``: from its own page), or,
        when that page's form is posted, add them to it and return None."""
        assistants = set(turns.exclude(assistant=None).values_list("assistant_id", flat=True))
        form = TestSetChoiceForm(request.POST if request.method == "POST" and "apply" in request.POST else None,
                                 assistants=assistants)
        if form.is_bound and form.is_valid():
            self.report_added(request, add_turns(turns, form.cleaned_data["test_set"]))
            return None
        chosen = list(turns.select_related("assistant").order_by("enqueued_at"))
        return TemplateResponse(request, "admin/conversations/turn/add_to_test_set.html", {
            **self.admin_site.each_context(request), "opts": self.opts, "title": _("Add to a test set"),
            "form": form, "turns": chosen, "turn": turn, "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "back": self._change_url(turn) if turn is not None else reverse(
                f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist")})

    def report_added(self, request, added):
        for test_set, count in added.items():
            self.message_user(request, ngettext("%(count)d question added to the test set %(name)s.",
                                                "%(count)d questions added to the test set %(name)s.", count) % {
                "count": count, "name": test_set.name}, messages.SUCCESS)
        if not added:
            self.message_user(request, _("No visitor's turn of the test set's assistant was selected; nothing added."),
                              messages.WARNING)

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
