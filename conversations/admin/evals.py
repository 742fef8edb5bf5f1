"""The admin of test sets (questions, CSV import, starting a run), drafts of assistants, and test
runs (the comparison of the live version and the draft, Stop, promoting the draft; rolling back
a promotion is on the draft)."""

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count, Q
from django.http import HttpResponseRedirect
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext as _
from django.utils.translation import ngettext
from django.utils.translation import gettext_lazy

from ..assistants import problems
from ..evals import drafts, runs
from ..evals.csvimport import import_csv
from ..evals.models import DRAFT_FIELDS
from ..models import AssistantDraft, TestQuestion, TestResult, TestRun, TestSet
from .assistants import LinesField, can_configure


class TestQuestionForm(forms.ModelForm):
    must_contain = LinesField(required=False, help_text=gettext_lazy("One phrase per line (case ignored)."))
    must_not_contain = LinesField(required=False, help_text=gettext_lazy("One phrase per line (case ignored)."))

    class Meta:
        model = TestQuestion
        fields = ("position", "question", "visitor", "must_contain", "must_not_contain", "must_cite", "must_use_tool",
                  "max_seconds", "max_cost", "earlier_messages")
        widgets = {"question": forms.Textarea(attrs={"rows": 2}), "earlier_messages": forms.Textarea(attrs={"rows": 2})}


class TestQuestionInline(admin.StackedInline):
    model = TestQuestion
    form = TestQuestionForm
    extra = 0


class TestSetForm(forms.ModelForm):
    csv_file = forms.FileField(required=False, label=gettext_lazy("add questions from a CSV file"),
                               help_text=gettext_lazy(
        "Columns: question, visitor, must_contain, must_not_contain (phrases separated by |), must_cite, "
        "must_use_tool, max_seconds, max_cost, earlier_messages (JSON)."))

    class Meta:
        model = TestSet
        fields = ("name", "assistant", "description", "judge", "rubric")

    def clean_csv_file(self):
        upload = self.cleaned_data.get("csv_file")
        if upload is None:
            return None
        if upload.size > 1_000_000:
            raise ValidationError(_("At most 1 MB."))
        try:
            return upload.read().decode("utf-8-sig")
        except UnicodeDecodeError:
            raise ValidationError(_("The file must be UTF-8 text.")) from None


class RunActionForm(ActionForm):
    """The changelist's action bar, with a run's limits beside the action that starts it."""

    concurrency = forms.IntegerField(label=gettext_lazy("turns at a time"), initial=2, min_value=1,
                                     max_value=runs.MAX_CONCURRENCY, required=False)
    max_cost = forms.DecimalField(label=gettext_lazy("cost limit"), min_value=0, max_digits=14, decimal_places=8,
                                  required=False, help_text=gettext_lazy(
                                      "Both sides together; the run asks no more questions once its turns have "
                                      "cost this much. Empty: no limit."))


@admin.register(TestSet)
class TestSetAdmin(admin.ModelAdmin):
    form = TestSetForm
    action_form = RunActionForm
    list_display = ("name", "assistant", "question_count")
    inlines = [TestQuestionInline]
    actions = ["run_live", "run_with_draft"]

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("assistant").annotate(question_count=Count("questions"))

    @admin.display(description=gettext_lazy("questions"), ordering="question_count")
    def question_count(self, obj):
        return obj.question_count

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        text = form.cleaned_data.get("csv_file")
        if text:
            try:
                count = import_csv(form.instance, text)
            except ValidationError as exc:
                self.message_user(request, " ".join(exc.messages), messages.ERROR)
            else:
                self.message_user(request, _("%(count)d questions added from the CSV file.") % {"count": count})

    def run_limits(self, request):
        """The action bar's form, bound to ``request``'s POST and validated."""
        limits = self.action_form(request.POST, auto_id=None)
        limits.fields["action"].choices = self.get_action_choices(request)
        limits.is_valid()
        return limits

    def response_action(self, request, queryset, **kwargs):  # Django 6.1 adds action_location
        # Django's own answer to an invalid action bar is "No action selected": say what is wrong.
        limits = self.run_limits(request)
        wrong = [f"{limits.fields[name].label}: {' '.join(found)}" for name, found in limits.errors.items()
                 if name in ("concurrency", "max_cost")]
        if wrong:
            self.message_user(request, " ".join(wrong), messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())
        return super().response_action(request, queryset, **kwargs)

    def _start(self, request, queryset, with_draft):
        limits = self.run_limits(request).cleaned_data
        concurrency, max_cost = limits.get("concurrency") or 2, limits.get("max_cost")
        for test_set in queryset:
            draft = None
            if with_draft:
                draft = drafts.newest(test_set.assistant)
                if draft is None:
                    self.message_user(request, _("%(assistant)s has no unpromoted draft.") % {
                        "assistant": test_set.assistant}, messages.WARNING)
                    continue
            run = runs.start_run(test_set, draft=draft, concurrency=concurrency, max_cost=max_cost, user=request.user)
            self.message_user(request, _("Test run %(run)s started.") % {"run": run})

    @admin.action(description=gettext_lazy("Run against the live version"), permissions=["change"])
    def run_live(self, request, queryset):
        self._start(request, queryset, False)

    @admin.action(description=gettext_lazy("Run against the live version and the newest draft"),
                  permissions=["change"])
    def run_with_draft(self, request, queryset):
        self._start(request, queryset, True)


class DraftForm(forms.ModelForm):
    class Meta:
        model = AssistantDraft
        fields = ("assistant", "note", "changes")

    def clean(self):
        data = super().clean()
        changes = data.get("changes")
        if not isinstance(changes, dict) or set(changes) - set(DRAFT_FIELDS):
            raise ValidationError({"changes": _("A JSON object whose keys are among: %(fields)s.") % {
                "fields": ", ".join(DRAFT_FIELDS)}})
        if data.get("assistant") is not None:
            draft = AssistantDraft(assistant=data["assistant"], changes=changes)
            found = problems(draft.applied())
            if found:
                raise ValidationError({"changes": [f"{field or '—'}: {reason}" for field, reason in found]})
        return data


@admin.register(AssistantDraft)
class AssistantDraftAdmin(admin.ModelAdmin):
    form = DraftForm
    list_display = ("assistant", "note", "created_at", "promoted_at", "promoted_run", "rolled_back_at")
    readonly_fields = ("promoted_at", "promoted_by", "promoted_run", "rolled_back_at")
    actions = ["roll_back"]

    def get_readonly_fields(self, request, obj=None):
        if obj is not None and obj.promoted_at is not None:  # what went live stays as it was
            return ("assistant", "note", "changes", *self.readonly_fields)
        return self.readonly_fields

    def save_model(self, request, obj, form, change):
        # A draft's turns call where it says with its credential: as the assistant's own fields.
        if drafts.changes_configuration(obj) and not can_configure(request.user):
            raise PermissionDenied
        if not change:
            obj.created_by = request.user
        super().save_model(request, obj, form, change)

    @admin.action(description=gettext_lazy("Roll back the assistant to before this promotion"),
                  permissions=["change"])
    def roll_back(self, request, queryset):
        if not request.user.has_perm("conversations.change_assistant"):
            raise PermissionDenied
        for draft in queryset.filter(promoted_at__isnull=False, rolled_back_at__isnull=True):
            try:
                drafts.rollback(draft.assistant, request.user)
            except ValidationError as exc:
                self.message_user(request, " ".join(exc.messages), messages.ERROR)
            else:
                self.message_user(request, _("%(assistant)s rolled back.") % {"assistant": draft.assistant})


class PassRateChangeList(ChangeList):
    """The run list, with each run's pass rates as counts of each side's results in the list's one
    query (not a summary per row). Only the list shows them: the run's own page and the actions read
    runs without this aggregate."""

    def get_queryset(self, request, *args, **kwargs):
        counts = {}
        for side in TestResult.Side.values:
            counts[f"{side}_questions"] = Count("results", filter=Q(results__side=side))
            counts[f"{side}_passed"] = Count("results", filter=Q(results__side=side, results__passed=True))
        return super().get_queryset(request, *args, **kwargs).annotate(**counts)


@admin.register(TestRun)
class TestRunAdmin(admin.ModelAdmin):
    list_display = ("__str__", "draft", "status", "created_at", "pass_rates")
    list_filter = ("status",)
    fields = ("test_set", "draft", "status", "limits", "started_by", "created_at", "finished_at", "comparison")
    readonly_fields = fields
    actions = ["stop", "promote"]

    def has_add_permission(self, request):
        return False  # started from a test set

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description=gettext_lazy("limits"))
    def limits(self, obj):
        cost = runs.spent(obj)  # summed once: shown, and compared with the limit below
        # "—" rather than 0 while no turn had a price (a model not in PRICES, the demo's), as the comparison shows it
        spent = "—" if cost is None else f"{cost.normalize():f}"
        at_once = ngettext("At most %(count)d turn at a time.", "At most %(count)d turns at a time.",
                           obj.concurrency) % {"count": obj.concurrency}
        if obj.max_cost is None:
            return format_html("{} {}", at_once, _("No cost limit; spent %(spent)s.") % {"spent": spent})
        limit = _("Cost limit %(limit)s; spent %(spent)s.") % {"limit": f"{obj.max_cost.normalize():f}", "spent": spent}
        if not runs.past_cost_limit(obj, cost):
            return format_html("{} {}", at_once, limit)
        left = runs.not_asked(obj)
        reached = (ngettext("The cost limit is reached: the run asks no more questions (%(count)d was not asked).",
                            "The cost limit is reached: the run asks no more questions (%(count)d were not asked).",
                            left) % {"count": left} if left else
                   _("The cost limit is reached: the run asks no more questions."))
        return format_html('{} {} <strong class="test-run-cost-limit">{}</strong>', at_once, limit, reached)

    def get_changelist(self, request, **kwargs):
        return PassRateChangeList

    @admin.display(description=gettext_lazy("pass rate"))
    def pass_rates(self, obj):
        # as runs.summary's pass_rate: passed of all the side's questions, for the sides the run has
        return " · ".join(f"{side} {getattr(obj, f'{side}_passed') / questions:.0%}"
                          for side in TestResult.Side.values if (questions := getattr(obj, f"{side}_questions")))

    @admin.display(description=gettext_lazy("comparison"))
    def comparison(self, obj):
        found = runs.summary(obj)
        changed = {q.pk for q in found["changed"]}
        head = format_html_join("", "<tr><th>{}</th><td>{}/{} ({})</td><td>{}</td><td>{}</td></tr>", (
            (side, f["passed"], f["questions"], f"{f['pass_rate']:.0%}", "—" if f["cost"] is None else f"{f['cost']:f}",
             f"{f['seconds']:.1f} s")
            for side, f in found["sides"].items()))
        rows = []
        by_question = {}
        for result in obj.results.select_related("question").order_by("question__position", "question_id"):
            by_question.setdefault(result.question, {})[result.side] = result

        def cell(result):
            if result is None:
                return "—"
            mark = "✓" if result.passed else "✗"
            return format_html("{} {}", mark, " ".join(runs.failed_reasons(result)))

        for question, sides in by_question.items():
            rows.append((format_html("<strong>{}</strong>", _("changed")) if question.pk in changed else "",
                         str(question), cell(sides.get("live")), cell(sides.get("draft"))))
        body = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", rows)
        return format_html(
            '<table class="test-run-summary"><tr><th></th><th>{}</th><th>{}</th><th>{}</th></tr>{}</table>'
            '<table class="test-run-results"><tr><th></th><th>{}</th><th>{}</th><th>{}</th></tr>{}</table>',
            _("passed"), _("cost"), _("time"), head, _("question"), _("live"), _("draft"), body)

    @admin.action(description=gettext_lazy("Stop"))
    def stop(self, request, queryset):
        if not request.user.has_perm("conversations.change_testrun"):
            raise PermissionDenied
        for run in queryset.filter(status=TestRun.Status.RUNNING):
            runs.stop(run)
            self.message_user(request, _("Test run %(run)s stopped.") % {"run": run})

    @admin.action(description=gettext_lazy("Promote this run's draft to live"))
    def promote(self, request, queryset):
        if not request.user.has_perm("conversations.change_assistant"):
            raise PermissionDenied
        for run in queryset.select_related("draft"):
            if run.draft is None:
                continue
            if drafts.changes_configuration(run.draft) and not can_configure(request.user):
                raise PermissionDenied
            try:
                drafts.promote(run.draft, run, request.user)
            except ValidationError as exc:
                self.message_user(request, " ".join(exc.messages), messages.ERROR)
            else:
                self.message_user(request, _("%(draft)s is live.") % {"draft": run.draft})
