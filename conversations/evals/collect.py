"""Questions from real turns: a visitor's message (a badly rated answer's, above all) added to a
test set of its assistant (one the staff member picks, or ``<slug>-from-turns``), with the
conversation before it and the kind of visitor who asked, so that the next change is run
against it. The checks a good answer needs are the owner's to add; until then the question
checks that the turn ends completed."""

from django.db import transaction

from ..conf import get_config
from ..models import Message
from .models import TestQuestion, TestSet


def visitor_kind(user):
    """What kind of visitor ``user`` (None: anonymous) is for a test question: a member when in
    one of the ``TEST_MEMBER_GROUPS``, else signed in."""
    if user is None:
        return TestQuestion.Visitor.ANONYMOUS
    names = get_config()["TEST_MEMBER_GROUPS"]
    if names and hasattr(user, "groups") and user.groups.filter(name__in=names).exists():
        return TestQuestion.Visitor.MEMBER
    return TestQuestion.Visitor.SIGNED_IN


def from_turns_name(assistant):
    return f"{assistant.slug}-from-turns"[:100]


def add_turns(turns, test_set=None):
    """Add each turn's visitor message (turns of an assistant, not of a test run) to ``test_set``,
    or, with None, to the test set ``<slug>-from-turns`` of its assistant, created when missing.
    A turn of another assistant than ``test_set``'s is left out. Returns ``{test set: added}``."""
    added = {}
    chosen = turns.filter(assistant__isnull=False, conversation__internal=False)
    if test_set is not None:
        chosen = chosen.filter(assistant_id=test_set.assistant_id)
    with transaction.atomic():
        for turn in chosen.select_related("assistant", "conversation__user").order_by("enqueued_at"):
            asked = turn.messages.filter(role=Message.Role.USER).order_by("id").first()
            if asked is None or not asked.content.strip():
                continue
            target = test_set
            if target is None:
                target, _created = TestSet.objects.get_or_create(name=from_turns_name(turn.assistant),
                                                                 defaults={"assistant": turn.assistant})
            earlier = [{"role": m.role, "content": m.content} for m in Message.objects.filter(
                conversation_id=turn.conversation_id, id__lt=asked.id, role__in=["user", "assistant"]).order_by("id")
                if m.content]
            last = target.questions.order_by("-position").values_list("position", flat=True).first() or 0
            TestQuestion.objects.create(
                test_set=target, position=last + 1, question=asked.content[:TestQuestion.MAX_LENGTH],
                earlier_messages=earlier, visitor=visitor_kind(turn.conversation.user))
            added[target] = added.get(target, 0) + 1
    return added
