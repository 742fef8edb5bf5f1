"""Publishing a draft: promoting it makes its changes the assistant's own (visitors get them at
their next turn, and the version its run was scored with), recorded with the run that
justified it; rolling back restores what the last promotion replaced. Each is one transaction
on the assistant's row."""

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from ..assistants import CONFIGURE_FIELDS
from ..models import Assistant
from .models import DRAFT_FIELDS, AssistantDraft, TestRun


def changes_configuration(draft):
    """Whether ``draft`` changes where the assistant's calls go or with which key: only a user who
    may configure providers may save or promote it."""
    return any(name in (draft.changes or {}) for name in CONFIGURE_FIELDS)


def newest(assistant):
    """``assistant``'s newest draft not promoted yet (what a run "with the draft" runs), or None."""
    return assistant.drafts.filter(promoted_at__isnull=True).order_by("-created_at").first()


def promote(draft, run, user=None):
    """Make ``draft``'s changes the live assistant's, justified by ``run`` (a finished run of this
    draft). Raises ``ValidationError`` when that cannot be, or the result could not answer."""
    if draft.promoted_at is not None:
        raise ValidationError(_("This draft is already promoted."))
    if run is None or run.draft_id != draft.pk or run.status != TestRun.Status.FINISHED:
        raise ValidationError(_("Promote a draft with a finished test run of that draft."))
    with transaction.atomic():
        assistant = Assistant.objects.select_for_update().get(pk=draft.assistant_id)
        changes = {name: value for name, value in (draft.changes or {}).items() if name in DRAFT_FIELDS}
        replaced = {name: getattr(assistant, name) for name in changes}
        for name, value in changes.items():
            setattr(assistant, name, value)
        assistant.clean()
        assistant.save()
        AssistantDraft.objects.filter(pk=draft.pk).update(promoted_at=timezone.now(), promoted_by=user,
                                                         promoted_run=run, replaced=replaced)
    draft.refresh_from_db()
    return assistant


def rollback(assistant, user=None):
    """Restore what the latest promotion of ``assistant`` (not yet rolled back) replaced. Returns
    that draft; raises ``ValidationError`` when there is none."""
    with transaction.atomic():
        assistant = Assistant.objects.select_for_update().get(pk=assistant.pk)
        draft = assistant.drafts.filter(promoted_at__isnull=False, rolled_back_at__isnull=True).order_by(
            "-promoted_at").first()
        if draft is None:
            raise ValidationError(_("No promoted draft to roll back."))
        for name, value in draft.replaced.items():
            setattr(assistant, name, value)
        assistant.save()
        draft.rolled_back_at = timezone.now()
        draft.save(update_fields=["rolled_back_at"])
    return draft
