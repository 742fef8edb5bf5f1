"""The rows of test sets, drafts and test runs. A draft holds an assistant's edited answering
fields; the assistant's own row stays what visitors get until the draft is promoted. A draft's
turns record an ``AssistantVersion`` of the same assistant, as every turn does, so that a
promoted draft answers visitors with the very version its run was scored with."""

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.utils.translation import gettext_lazy as _

# By name: conversations.models imports these models (at its end), never the other way round.
ASSISTANT, VERSION, TURN = "conversations.Assistant", "conversations.AssistantVersion", "conversations.Turn"

# The assistant fields a draft may change: what answers, not who may chat or what the widget shows.
DRAFT_FIELDS = ("system_prompt", "provider", "model", "base_url", "credential", "tools", "knowledge_sources",
                "fallbacks", "max_steps", "max_tokens", "call_timeout", "job_timeout")


class TestSet(models.Model):
    """Questions an assistant should answer well."""

    __test__ = False  # not a pytest class

    name = models.SlugField(_("name"), max_length=100, unique=True, help_text=_(
        "What manage.py run_test_set names."))
    assistant = models.ForeignKey(ASSISTANT, on_delete=models.CASCADE, related_name="test_sets",
                                  verbose_name=_("assistant"))
    description = models.TextField(_("description"), blank=True)
    # Optional: an assistant that judges each answer against the rubric, in a turn of its own.
    judge = models.ForeignKey(ASSISTANT, null=True, blank=True, on_delete=models.PROTECT, related_name="+",
                              verbose_name=_("judge"), help_text=_(
                                  "An assistant that reads each question and answer with the rubric and replies "
                                  "PASS or FAIL and why; empty: no judge."))
    rubric = models.TextField(_("rubric"), blank=True, help_text=_("What the judge checks a good answer for."))
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        verbose_name = _("test set")
        verbose_name_plural = _("test sets")

    def __str__(self):
        return self.name


class TestQuestion(models.Model):
    """One question, and what a good answer to it must (and must not) do."""

    __test__ = False

    class Visitor(models.TextChoices):
        ANONYMOUS = "anonymous", _("anonymous visitor")
        SIGNED_IN = "signed_in", _("signed-in visitor")
        MEMBER = "member", _("member (signed in, in TEST_MEMBER_GROUPS)")

    MAX_LENGTH = 4000

    test_set = models.ForeignKey(TestSet, on_delete=models.CASCADE, related_name="questions")
    position = models.PositiveIntegerField(_("position"), default=0)
    question = models.TextField(_("question"), max_length=MAX_LENGTH)
    earlier_messages = models.JSONField(_("earlier messages"), default=list, blank=True, help_text=_(
        'The conversation before the question, as JSON: [{"role": "user", "content": "…"}, {"role": '
        '"assistant", "content": "…"}].'))
    visitor = models.CharField(_("visitor"), max_length=10, choices=Visitor.choices, default=Visitor.ANONYMOUS)
    must_contain = models.JSONField(_("must contain"), default=list, blank=True, help_text=_(
        "Phrases the answer must contain (case ignored)."))
    must_not_contain = models.JSONField(_("must not contain"), default=list, blank=True, help_text=_(
        "Phrases the answer must not contain (case ignored)."))
    must_cite = models.CharField(_("must cite"), max_length=500, blank=True, help_text=_(
        "A link or page address the answer must give, e.g. /help/reset-password/."))
    must_use_tool = models.CharField(_("must use tool"), max_length=200, blank=True)
    max_seconds = models.FloatField(_("within seconds"), null=True, blank=True, validators=[MinValueValidator(0)])
    max_cost = models.DecimalField(_("costs at most"), max_digits=14, decimal_places=8, null=True, blank=True)

    class Meta:
        ordering = ["test_set", "position", "id"]
        verbose_name = _("test question")
        verbose_name_plural = _("test questions")

    def __str__(self):
        return self.question[:80]


class AssistantDraft(models.Model):
    """An assistant's next configuration: its ``DRAFT_FIELDS`` as they would be, which visitors
    never get until it is promoted (``evals.drafts.promote``). Promoting keeps the live values
    it replaced, so that rolling back is one action too."""

    assistant = models.ForeignKey(ASSISTANT, on_delete=models.CASCADE, related_name="drafts",
                                  verbose_name=_("assistant"))
    note = models.CharField(_("what changes"), max_length=200, blank=True)
    changes = models.JSONField(_("changes"), default=dict, blank=True, help_text=_(
        'The fields it changes, as JSON: {"system_prompt": "…", "tools": ["search_site"]}.'))
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    promoted_at = models.DateTimeField(_("promoted at"), null=True, blank=True)
    promoted_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+", verbose_name=_("promoted by"))
    promoted_run = models.ForeignKey("TestRun", null=True, blank=True, on_delete=models.PROTECT, related_name="+",
                                     verbose_name=_("justified by run"))
    # The live values the promotion replaced (DRAFT_FIELDS): what rolling back restores.
    replaced = models.JSONField(default=dict, blank=True, editable=False)
    rolled_back_at = models.DateTimeField(_("rolled back at"), null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = _("assistant draft")
        verbose_name_plural = _("assistant drafts")

    def __str__(self):
        return f"{self.assistant_id and self.assistant.slug}: {self.note or self.pk}"

    def applied(self, assistant=None):
        """An unsaved copy of ``assistant`` (by default this draft's, read afresh) with this
        draft's changes over it: what a turn of the draft runs with."""
        Assistant = self._meta.get_field("assistant").related_model
        base = assistant if assistant is not None else Assistant.objects.get(pk=self.assistant_id)
        copy = Assistant(**{f.attname: getattr(base, f.attname) for f in Assistant._meta.concrete_fields})
        for name, value in (self.changes or {}).items():
            if name in DRAFT_FIELDS:
                setattr(copy, name, value)
        copy._state.adding = False
        return copy


class TestRun(models.Model):
    """A test set run against the live assistant and (optionally) a draft, side by side."""

    __test__ = False

    class Status(models.TextChoices):
        RUNNING = "running", _("running")
        STOPPED = "stopped", _("stopped")
        FINISHED = "finished", _("finished")

    test_set = models.ForeignKey(TestSet, on_delete=models.CASCADE, related_name="runs")
    draft = models.ForeignKey(AssistantDraft, null=True, blank=True, on_delete=models.SET_NULL, related_name="runs")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.RUNNING)
    concurrency = models.PositiveSmallIntegerField(default=2, validators=[MinValueValidator(1)])
    # Spent by both sides together; the run starts no more turns past it (None: no limit).
    max_cost = models.DecimalField(max_digits=14, decimal_places=8, null=True, blank=True)
    started_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = _("test run")
        verbose_name_plural = _("test runs")

    def __str__(self):
        return f"{self.test_set_id and self.test_set.name} #{self.pk}"


class TestResult(models.Model):
    """One question answered by one side of a run, and how its answer scored."""

    __test__ = False

    class Side(models.TextChoices):
        LIVE = "live", _("live")
        DRAFT = "draft", _("draft")

    run = models.ForeignKey(TestRun, on_delete=models.CASCADE, related_name="results")
    question = models.ForeignKey(TestQuestion, on_delete=models.CASCADE, related_name="results")
    side = models.CharField(max_length=5, choices=Side.choices)
    turn = models.OneToOneField(TURN, null=True, blank=True, on_delete=models.SET_NULL, related_name="test_result")
    judge_turn = models.OneToOneField(TURN, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    version = models.ForeignKey(VERSION, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    scored = models.BooleanField(default=False)
    passed = models.BooleanField(null=True)
    # [{"check": "contains", "passed": true, "reason": "…"}]
    checks = models.JSONField(default=list, blank=True)
    seconds = models.FloatField(null=True, blank=True)
    cost = models.DecimalField(max_digits=14, decimal_places=8, null=True, blank=True)

    class Meta:
        ordering = ["run", "question__position", "question_id", "side"]
        verbose_name = _("test result")
        verbose_name_plural = _("test results")
        constraints = [models.UniqueConstraint(fields=["run", "question", "side"],
                                               name="conversations_testresult_unique")]


__all__ = ["AssistantDraft", "TestQuestion", "TestResult", "TestRun", "TestSet"]
