"""Conversations, their turns, the messages of each turn and a record of every call a turn made."""

import uuid

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from .types import Outcome


class Conversation(models.Model):
    """A chat owned by a user, or by an anonymous visitor's session (through a random owner token)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="conversations"
    )
    # Random token kept in the visitor's session; survives login (the session key does not).
    owner_token = models.CharField(max_length=64, blank=True, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = _("conversation")
        verbose_name_plural = _("conversations")

    def __str__(self):
        return str(self.id)

    @property
    def owner_label(self):
        if self.user_id:
            return str(self.user)
        return _("anonymous visitor")


class Turn(models.Model):
    """One visitor message and everything the assistant did to answer it."""

    class Status(models.TextChoices):
        QUEUED = "queued", _("queued")
        RUNNING = "running", _("running")
        COMPLETED = "completed", _("completed")
        INCOMPLETE = "incomplete", _("incomplete")
        FAILED = "failed", _("failed")
        CANCELLED = "cancelled", _("cancelled")

    ACTIVE_STATUSES = frozenset({Status.QUEUED, Status.RUNNING})
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
    cancel_requested = models.BooleanField(default=False)
    # Times a new job continued the turn after its work horse died or its worker shut down.
    resumes = models.PositiveSmallIntegerField(default=0)
    idempotency_key = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["-enqueued_at"]
        verbose_name = _("turn")
        verbose_name_plural = _("turns")
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

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="messages")
    turn = models.ForeignKey(Turn, on_delete=models.CASCADE, related_name="messages")
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


class CallRecord(models.Model):
    """One provider call attempt or tool run of a turn: where the time budget went."""

    class Kind(models.TextChoices):
        MODEL = "model", _("model call")
        TOOL = "tool", _("tool run")
        RESUME = "resume", _("resumed")

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
