"""Assistants and their versions; conversations, their turns, the messages of each turn and a
record of every call a turn made."""

import uuid

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.utils.translation import gettext_lazy as _

from .core.types import Outcome
from .assistants import problems
from .redaction import redaction_problems
from .knowledge.models import IndexedObject, Passage, StaleObject  # noqa: F401  (the app's models: the knowledge index)


class Assistant(models.Model):
    """A configuration that answers visitors, edited in the admin: its own prompt, provider, model,
    endpoint, tools, fallback providers and (where set) limits over the site's ``CONVERSATIONS``
    settings. It names credentials of ``CONVERSATIONS["CREDENTIALS"]``; an API key is never
    stored here."""

    MAX_SUGGESTIONS = 4
    SUGGESTION_MAX_LENGTH = 200

    slug = models.SlugField(_("slug"), unique=True, help_text=_('What a page names: {% chat_widget assistant="slug" %}.'))
    name = models.CharField(_("name"), max_length=100, help_text=_("Shown to visitors as the widget's title."))
    active = models.BooleanField(_("active"), default=True, help_text=_(
        "An inactive assistant is offered nowhere, and its conversations get no more answers."))
    system_prompt = models.TextField(_("system prompt"))
    provider = models.CharField(_("provider"), max_length=200, default="demo", help_text=_(
        "demo, openai, anthropic, or the dotted path of a BaseProvider subclass."))
    model = models.CharField(_("model"), max_length=200, blank=True, help_text=_("Empty: the provider's default."))
    base_url = models.URLField(_("endpoint"), max_length=500, blank=True, help_text=_(
        "The API's base URL; empty for the vendor's own."))
    credential = models.CharField(_("credential"), max_length=100, blank=True, help_text=_(
        'A name in CONVERSATIONS["CREDENTIALS"]; empty: the site\'s API_KEY.'))
    tools = models.JSONField(_("tools"), default=list, blank=True, help_text=_(
        "Names of the site's registered tools this assistant may use."))
    # None keeps the site's FALLBACKS (as every assistant did before it had a chain of its own).
    fallbacks = models.JSONField(_("fallback providers"), null=True, blank=True, default=None, help_text=_(
        'Tried in order when the provider above is down, as JSON: [{"provider": "anthropic", "model": '
        '"claude-sonnet-4-5", "base_url": "", "credential": "anthropic-key"}]. Each credential is a name in '
        'CONVERSATIONS["CREDENTIALS"] (empty: no key), never a key itself. Empty: the site\'s FALLBACKS; []: '
        "none."))
    max_steps = models.PositiveSmallIntegerField(_("model round-trips per turn"), null=True, blank=True,
                                                 validators=[MinValueValidator(1)])
    max_tokens = models.PositiveIntegerField(_("longest answer (tokens)"), null=True, blank=True,
                                             validators=[MinValueValidator(1)])
    call_timeout = models.PositiveIntegerField(_("call timeout (s)"), null=True, blank=True)
    job_timeout = models.PositiveIntegerField(_("job timeout (s)"), null=True, blank=True)
    greeting = models.CharField(_("greeting"), max_length=500, blank=True, help_text=_(
        "The widget's first message, before the visitor writes."))
    suggestions = models.JSONField(_("suggested first questions"), default=list, blank=True)
    # Pages on other sites that may embed this assistant (besides CONVERSATIONS["ALLOWED_ORIGINS"]).
    allowed_origins = models.JSONField(_("allowed origins"), default=list, blank=True, help_text=_(
        "Sites whose pages may embed this assistant with the script tag below, one origin per line: "
        "https://www.example.com, or https://*.example.com for every subdomain."))
    knowledge_sources = models.JSONField(_("knowledge sources"), default=list, blank=True, help_text=_(
        "Names of the site's knowledge sources its search_site tool may search; empty: all of them."))
    # Besides the tools declared ``@tool(approval=...)``: never fewer than the tool itself asks for.
    approval_tools = models.JSONField(_("tools that need an approval"), default=list, blank=True, help_text=_(
        "Names of its tools whose every call waits for the visitor's approval (a tool that asks for one "
        "itself always does)."))

    class Access(models.TextChoices):
        PUBLIC = "public", _("anyone (as LOGIN_REQUIRED allows)")
        SIGNED_IN = "signed_in", _("signed-in users")
        STAFF = "staff", _("staff")
        PERMISSION = "permission", _("users with the permission below")

    access = models.CharField(_("who may chat"), max_length=20, choices=Access.choices, default=Access.PUBLIC,
                              help_text=_("Checked when a conversation starts and again before each answer."))
    access_permission = models.CharField(_("permission"), max_length=255, blank=True, help_text=_(
        'For "users with the permission below": "app_label.codename", e.g. "conversations.view_turn". '
        "Superusers hold every permission."))

    class HandoffWays(models.TextChoices):
        OFF = "", _("never")
        BUTTON = "button", _("the visitor's “Talk to a person” button")
        TOOL = "tool", _("the assistant's hand_to_person tool")
        BOTH = "both", _("the button and the tool")

    # Which ways a conversation may be handed to a person (engine/handoff.py); off for every
    # assistant that existed before, so that no site starts getting handoffs nobody answers.
    handoff = models.CharField(_("hand to a person through"), max_length=10, choices=HandoffWays.choices,
                               blank=True, default=HandoffWays.OFF, help_text=_(
                                   "Staff with the “answer handoff” permission then answer in the admin's inbox."))
    # Privacy (docs/privacy.md): None keeps the site's REDACT, RETENTION_DAYS and RETENTION_FROM.
    redact = models.JSONField(_("redact before storage"), null=True, blank=True, default=None, help_text=_(
        'Replaced in what visitors write, the answers and tool results before they are stored: a list of '
        '"card", "email", "phone", as JSON: ["card", "email"]. Empty: the site\'s REDACT; []: nothing.'))

    class RetentionFrom(models.TextChoices):
        SITE = "", _("as the site's settings say")
        CREATED = "created", _("since the conversation started")
        LAST_MESSAGE = "last_message", _("since its last message")

    retention_days = models.PositiveIntegerField(_("keep conversations (days)"), null=True, blank=True, help_text=_(
        "Conversations are deleted this many days after the moment below (purge_conversations). Empty: the "
        "site's RETENTION_DAYS; 0: kept until erased."))
    retention_from = models.CharField(_("counted"), max_length=20, choices=RetentionFrom.choices, blank=True,
                                      default=RetentionFrom.SITE)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = _("assistant")
        verbose_name_plural = _("assistants")
        # Where an assistant's calls go and with which key: more than changing what it says
        # (assistants.CONFIGURE_FIELDS are read-only without it).
        permissions = [("configure_provider", _("Can change an assistant's provider, endpoint, credential and "
                                                "fallbacks"))]

    def __str__(self):
        return self.name

    def allows(self, user):
        """Whether ``user`` (None or anonymous: a visitor who is not signed in) may chat with this
        assistant: the one rule the API, the job and the widget apply. ``LOGIN_REQUIRED`` is
        checked apart, for every assistant."""
        if self.access == self.Access.PUBLIC:
            return True
        if user is None or not user.is_authenticated or not user.is_active:
            return False
        if self.access == self.Access.SIGNED_IN:
            return True
        # A site's own user model need not have Django's staff flag or permissions (AbstractBaseUser
        # has neither): such a user is neither staff nor holds a permission.
        if self.access == self.Access.STAFF:
            return bool(getattr(user, "is_staff", False))
        has_perm = getattr(user, "has_perm", None)
        return bool(self.access_permission) and has_perm is not None and has_perm(self.access_permission)

    def offers_handoff(self, how):
        """Whether a conversation with this assistant may be handed to a person ``how`` ("button":
        the visitor asks in the widget; "tool": the model calls ``hand_to_person``)."""
        ways = {self.HandoffWays.BUTTON, self.HandoffWays.BOTH} if how == "button" else {
            self.HandoffWays.TOOL, self.HandoffWays.BOTH}
        return self.active and self.handoff in ways

    def _access_errors(self):
        from django.contrib.auth.models import Permission

        if self.access != self.Access.PERMISSION:
            return []
        app_label, _dot, codename = self.access_permission.partition(".")
        if not Permission.objects.filter(content_type__app_label=app_label, codename=codename).exists():
            return [_("Name an existing permission as app_label.codename.")]
        return []

    def clean(self):
        """Refuse what cannot work, where it can be known before a turn: a provider or tool that
        does not exist, a model the provider refuses, an unknown credential, a prompt too long,
        clocks the system checks would refuse, a fallback with any of these (``assistants.problems``)."""
        from django.core.exceptions import ValidationError

        errors = {}
        for field, reason in problems(self):
            errors.setdefault(field or "__all__", []).append(reason)
        if self._access_errors():
            errors["access_permission"] = self._access_errors()
        if self.redact is not None and (not isinstance(self.redact, list) or redaction_problems(self.redact, ())):
            errors["redact"] = [_('A list of "card", "email" and "phone", or empty for the site\'s setting.')]
        if errors:
            raise ValidationError(errors)


class AssistantVersion(models.Model):
    """One configuration an assistant answered with, kept once per distinct fingerprint, so that a
    turn shows what answered it however the assistant has changed since."""

    assistant = models.ForeignKey(Assistant, on_delete=models.CASCADE, related_name="versions")
    fingerprint = models.CharField(max_length=12, help_text=_("The start of the configuration's SHA-256."))
    snapshot = models.JSONField(help_text=_("Prompt, provider, model, endpoint, credential name, tools, limits, "
                                            "fallbacks."))
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = _("assistant version")
        verbose_name_plural = _("assistant versions")
        constraints = [models.UniqueConstraint(fields=["assistant", "fingerprint"],
                                               name="conversations_assistantversion_unique")]

    def __str__(self):
        return f"{self.assistant_id and self.assistant.slug}@{self.fingerprint}"


def user_label(user):
    """A user as the admin names an owner: the login name and email (whatever the user model's
    fields are), or "anonymous visitor" for None."""
    if user is None:
        return _("anonymous visitor")
    name = user.get_username()
    email = getattr(user, user.get_email_field_name(), "") or ""
    return f"{name} <{email}>" if email and email != name else name


class Conversation(models.Model):
    """A chat owned by a user, or by an anonymous visitor's session (through a random owner token)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="conversations"
    )
    # Random token kept in the visitor's session; survives login (the session key does not).
    owner_token = models.CharField(max_length=64, blank=True, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    # The assistant that answers every turn of the conversation; None: the site's settings.
    assistant = models.ForeignKey(Assistant, null=True, blank=True, on_delete=models.PROTECT,
                                  related_name="conversations")

    class Handoff(models.TextChoices):
        NONE = "", _("with the assistant")
        WAITING = "waiting", _("waiting for a person")
        TAKEN = "taken", _("answered by a person")
        RETURNED = "returned", _("handed back to the assistant")
        CLOSED = "closed", _("closed by staff")

    # Held by staff (waiting or taken): the assistant does not answer; the fields are on the
    # conversation, not in a model of their own, because the row start() locks is then the one
    # that says whether a turn may start, and taking it is one conditional UPDATE of it.
    HELD = frozenset({Handoff.WAITING, Handoff.TAKEN})
    handoff = models.CharField(_("handoff"), max_length=10, choices=Handoff.choices, blank=True,
                               default=Handoff.NONE, db_index=True)
    handoff_requested_at = models.DateTimeField(_("person asked for at"), null=True, blank=True)
    handoff_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+", verbose_name=_("taken by"))
    handoff_taken_at = models.DateTimeField(_("taken at"), null=True, blank=True)
    # Counts every change of the handoff state (a message for or from staff too), in the transaction
    # that makes it: the version of the state the widget polls, so that an older read never replaces
    # a newer one in the cache and an ETag never stands for two contents (engine/handoff.py).
    handoff_version = models.PositiveIntegerField(default=0, editable=False)
    # A test run's conversation (evals), not a visitor's: left out of the overview's figures.
    internal = models.BooleanField(_("test run's"), default=False, editable=False)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = _("conversation")
        verbose_name_plural = _("conversations")
        permissions = [("answer_handoff", _("Can answer conversations handed to a person"))]

    def __str__(self):
        return str(self.id)

    @property
    def owner_label(self):
        """Who owns this conversation, as the admin shows it (``user_label``)."""
        return user_label(self.user)


class Turn(models.Model):
    """One visitor message and everything the assistant did to answer it."""

    class Status(models.TextChoices):
        QUEUED = "queued", _("queued")
        RUNNING = "running", _("running")
        COMPLETED = "completed", _("completed")
        INCOMPLETE = "incomplete", _("incomplete")
        FAILED = "failed", _("failed")
        CANCELLED = "cancelled", _("cancelled")
        # A tool call waits for a person's approval (``ToolApproval``): no job runs the turn meanwhile.
        WAITING = "waiting_approval", _("waiting for an approval")

    class Rating(models.TextChoices):
        UP = "up", _("thumbs up")
        DOWN = "down", _("thumbs down")

    ACTIVE_STATUSES = frozenset({Status.QUEUED, Status.RUNNING, Status.WAITING})
    DONE_STATUSES = frozenset({Status.COMPLETED, Status.INCOMPLETE, Status.FAILED, Status.CANCELLED})

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="turns")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED, db_index=True)
    provider = models.CharField(max_length=100, blank=True)
    model = models.CharField(max_length=200, blank=True)
    enqueued_at = models.DateTimeField(null=True, blank=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    job_id = models.CharField(max_length=100, blank=True, db_index=True)
    job_timeout = models.FloatField(null=True, blank=True, help_text=_("Seconds RQ allowed the job."))
    deadline_margin = models.FloatField(null=True, blank=True)
    deadline_at = models.DateTimeField(null=True, blank=True, help_text=_("The job's own deadline."))
    # Seconds left before the RQ job timeout when the final state was written.
    margin_left = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True)
    model_calls = models.PositiveIntegerField(default=0)
    tool_calls = models.PositiveIntegerField(default=0)
    input_tokens = models.PositiveIntegerField(null=True, blank=True)
    output_tokens = models.PositiveIntegerField(null=True, blank=True)
    # Some of the tokens are an estimate: a call ended (a Stop, a stream cut off or timed out)
    # before the provider sent its usage, which OpenAI-compatible APIs send only at the end.
    usage_estimated = models.BooleanField(_("usage estimated"), default=False)
    cancel_requested = models.BooleanField(default=False)
    # Times a new job continued the turn after its work horse died or its worker shut down.
    resumes = models.PositiveSmallIntegerField(default=0)
    idempotency_key = models.CharField(max_length=200, blank=True)
    # What answered: the conversation's assistant (None: the site's settings) and the version of its
    # configuration the job ran with (None until the job starts, or when it could not be built).
    assistant = models.ForeignKey(Assistant, null=True, blank=True, on_delete=models.PROTECT, related_name="turns")
    assistant_version = models.ForeignKey(AssistantVersion, null=True, blank=True, on_delete=models.PROTECT,
                                          related_name="turns")
    # A test run's turn of a draft (evals): it answers with the draft's configuration; a
    # visitor's turn never has one.
    draft = models.ForeignKey("conversations.AssistantDraft", null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="turns", editable=False)
    # Input and output tokens at CONVERSATIONS["PRICES"] when the final state was written (costs.py).
    cost = models.DecimalField(max_digits=14, decimal_places=8, null=True, blank=True)
    # The visitor's rating of the answer: one per turn, changeable.
    rating = models.CharField(max_length=4, choices=Rating.choices, blank=True, db_index=True)
    rating_comment = models.CharField(max_length=500, blank=True)
    rated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-enqueued_at"]
        verbose_name = _("turn")
        verbose_name_plural = _("turns")
        indexes = [models.Index(fields=["assistant", "enqueued_at"], name="conv_turn_assistant_day")]
        constraints = [
            models.UniqueConstraint(
                fields=["conversation", "idempotency_key"],
                condition=~models.Q(idempotency_key=""),
                name="conversations_turn_idempotency_key",
            )
        ]

    def __str__(self):
        return f"{self.id} ({self.status})"

    @property
    def done(self):
        return self.status in self.DONE_STATUSES

    def answering_assistant(self):
        """The assistant configuration this turn answers with: its assistant's, or for a test
        run's turn of a draft, the draft's changes over it (never a visitor's turn)."""
        if self.draft_id is not None and self.assistant_id is not None:
            return self.draft.applied(self.assistant)
        return self.assistant

    @property
    def duration(self):
        if self.started_at and self.finished_at:
            return (self.finished_at - self.started_at).total_seconds()
        return None


class Message(models.Model):
    """One entry of the transcript, in conversation order (ascending id)."""

    class Role(models.TextChoices):
        USER = "user", _("user")
        ASSISTANT = "assistant", _("assistant")
        TOOL = "tool", _("tool")
        STAFF = "staff", _("staff")

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="messages")
    # None for the messages of a handoff (the visitor's while staff hold it, and staff's own):
    # no turn answers them.
    turn = models.ForeignKey(Turn, null=True, blank=True, on_delete=models.CASCADE, related_name="messages")
    # The staff member who wrote a staff message.
    author = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="+")
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField(blank=True)
    # Assistant messages that ask for tools: [{"id", "name", "arguments"}].
    tool_calls = models.JSONField(default=list, blank=True)
    # Tool results: which call they answer.
    tool_call_id = models.CharField(max_length=200, blank=True)
    tool_name = models.CharField(max_length=200, blank=True)
    is_error = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        verbose_name = _("message")
        verbose_name_plural = _("messages")
        indexes = [models.Index(fields=["conversation", "id"])]

    def __str__(self):
        return f"{self.role}: {self.content[:60]}"


class WaitingConversation(Conversation):
    """The admin's inbox: conversations handed to a person (a proxy, so that the inbox has a
    changelist of its own beside every conversation's)."""

    class Meta:
        proxy = True
        verbose_name = _("conversation for a person")
        verbose_name_plural = _("conversations for a person")


class ToolApproval(models.Model):
    """A tool call the model asked for that runs only once a person approves it: bound to its turn,
    its call id and the SHA-256 of its exact arguments; decided once (one conditional UPDATE of
    ``status`` from pending), and run at most once (``run_started_at``, set by the same kind of UPDATE)."""

    class Status(models.TextChoices):
        PENDING = "pending", _("waiting")
        APPROVED = "approved", _("approved")
        DECLINED = "declined", _("declined")
        EXPIRED = "expired", _("expired")
        REFUSED = "refused", _("not run: the turn ended")

    class Approver(models.TextChoices):
        VISITOR = "visitor", _("the visitor")
        STAFF = "staff", _("staff")

    turn = models.ForeignKey(Turn, on_delete=models.CASCADE, related_name="approvals")
    call_id = models.CharField(_("call id"), max_length=200)
    tool_name = models.CharField(_("tool"), max_length=200)
    arguments = models.JSONField(_("arguments"), default=dict)
    arguments_sha256 = models.CharField(_("arguments SHA-256"), max_length=64)
    summary = models.CharField(_("summary"), max_length=300, blank=True)
    approver = models.CharField(_("who may approve"), max_length=10, choices=Approver.choices,
                                default=Approver.VISITOR)
    status = models.CharField(_("status"), max_length=10, choices=Status.choices, default=Status.PENDING,
                              db_index=True)
    requested_at = models.DateTimeField(_("asked at"), auto_now_add=True)
    expires_at = models.DateTimeField(_("expires at"))
    decided_at = models.DateTimeField(_("decided at"), null=True, blank=True)
    # The staff member who decided; None with ``decided_by_visitor`` for the conversation's owner.
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+", verbose_name=_("decided by"))
    decided_by_visitor = models.BooleanField(_("decided by the visitor"), default=False)
    run_started_at = models.DateTimeField(_("run started at"), null=True, blank=True)
    result = models.TextField(_("result"), blank=True)

    class Meta:
        ordering = ["requested_at", "id"]
        verbose_name = _("tool call approval")
        verbose_name_plural = _("tool call approvals")
        permissions = [("approve_toolcall", _("Can approve or decline tool calls that need staff approval"))]
        constraints = [models.UniqueConstraint(fields=["turn", "call_id"], name="conversations_toolapproval_call")]

    def __str__(self):
        return f"{self.tool_name} ({self.status})"

    @property
    def decider_label(self):
        """Who decided, as the admin shows it."""
        if self.decided_by_id:
            return user_label(self.decided_by)
        if self.decided_by_visitor:
            return _("the visitor")
        return "—"


class StaffApproval(ToolApproval):
    """The admin's list of calls waiting for staff approval (a proxy, like the handoff inbox)."""

    class Meta:
        proxy = True
        verbose_name = _("call for staff approval")
        verbose_name_plural = _("calls for staff approval")


class CallRecord(models.Model):
    """One provider call attempt or tool run of a turn: where the time budget went."""

    class Kind(models.TextChoices):
        MODEL = "model", _("model call")
        TOOL = "tool", _("tool run")
        RESUME = "resume", _("resumed")
        APPROVAL = "approval", _("approval")

    Outcome = Outcome  # defined with the call types, which must not import models

    turn = models.ForeignKey(Turn, on_delete=models.CASCADE, related_name="calls")
    kind = models.CharField(max_length=8, choices=Kind.choices)
    name = models.CharField(max_length=200, blank=True, help_text=_("Model or tool name."))
    attempt = models.PositiveSmallIntegerField(default=1)
    started_offset = models.FloatField(help_text=_("Seconds after the turn started."))
    timeout = models.FloatField(null=True, blank=True, help_text=_("Seconds the call was allowed."))
    remaining_before = models.FloatField(null=True, blank=True, help_text=_("Seconds left before the deadline."))
    duration = models.FloatField(default=0)
    outcome = models.CharField(max_length=20, choices=Outcome.choices)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    detail = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["turn", "started_offset", "id"]
        verbose_name = _("call")
        verbose_name_plural = _("calls")

    def __str__(self):
        return f"{self.kind} {self.name} #{self.attempt}: {self.outcome}"


class Erasure(models.Model):
    """The audit entry of one erasure (``engine.privacy.erase``): when, by whom, what was asked
    and how many rows and cached copies of each kind went. Never the erased content, and the
    person only as a salted hash (``subject_digest``), which the site can recompute to answer
    "was this person erased?" but which names nobody by itself."""

    class Kind(models.TextChoices):
        USER = "user", _("a user")
        VISITOR = "visitor", _("a visitor")
        CONVERSATION = "conversation", _("a conversation")
        VISITOR_REQUEST = "visitor_request", _("the visitor's own request")
        RETENTION = "retention", _("retention")

    created_at = models.DateTimeField(_("erased at"), auto_now_add=True, db_index=True)
    by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                           related_name="+", verbose_name=_("erased by"))
    kind = models.CharField(_("what was asked"), max_length=20, choices=Kind.choices)
    subject_digest = models.CharField(_("person (salted hash)"), max_length=64, blank=True)
    counts = models.JSONField(_("what went"), default=dict)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = _("erasure")
        verbose_name_plural = _("erasures")
        default_permissions = ("view",)
        permissions = [("erase_conversations", _("Can erase a person's conversations everywhere"))]

    def __str__(self):
        return f"{self.get_kind_display()} {self.created_at:%Y-%m-%d %H:%M}"


class RetainedTotal(models.Model):
    """What retention keeps of the turns it deletes when ``RETENTION_KEEP_TOTALS`` is on: per day
    and assistant, how many turns, ratings and tokens, and what they cost. No conversation, owner,
    turn or word: nothing here leads back to a person."""

    day = models.DateField(_("day"))
    assistant = models.ForeignKey(Assistant, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    turns = models.PositiveIntegerField(_("turns"), default=0)
    rated_up = models.PositiveIntegerField(_("thumbs up"), default=0)
    rated_down = models.PositiveIntegerField(_("thumbs down"), default=0)
    input_tokens = models.PositiveBigIntegerField(_("input tokens"), default=0)
    output_tokens = models.PositiveBigIntegerField(_("output tokens"), default=0)
    cost = models.DecimalField(_("cost"), max_digits=16, decimal_places=8, default=0)

    class Meta:
        ordering = ["-day"]
        verbose_name = _("retained total")
        verbose_name_plural = _("retained totals")
        # One row per day and assistant, the site's default one (None) included: the purge adds to
        # it under a lock (purge_conversations runs one at a time), as a unique constraint could not
        # on every database for a None.
        indexes = [models.Index(fields=["day", "assistant"], name="conv_retained_total_day")]

    def __str__(self):
        return f"{self.day} {self.assistant_id or '-'}: {self.turns} turns"


from .evals.models import AssistantDraft, TestQuestion, TestResult, TestRun, TestSet  # noqa: E402,F401  (test sets)
