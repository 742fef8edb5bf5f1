"""Questions from real turns: a visitor's message (a badly rated answer's, above all) added to a
test set of its assistant, with the conversation before it, so that the next change is run
against it. The checks a good answer needs are the owner's to add; until then the question
checks that the turn ends completed."""

from django.db import transaction

from ..models import Message
from .models import TestQuestion, TestSet


def from_turns_name(assistant):
    return f"{assistant.slug}-from-turns"[:100]


def add_turns(turns):
    """Add each turn's visitor message (turns of an assistant, not of a test run) to the test set
    ``<slug>-from-turns`` of its assistant, created when missing. Returns ``{test set: added}``."""
    added = {}
    with transaction.atomic():
        for turn in turns.filter(assistant__isnull=False, conversation__internal=False).select_related(
                "assistant", "conversation").order_by("enqueued_at"):
            asked = turn.messages.filter(role=Message.Role.USER).order_by("id").first()
            if asked is None or not asked.content.strip():
                continue
            test_set, _created = TestSet.objects.get_or_create(name=from_turns_name(turn.assistant),
                                                               defaults={"assistant": turn.assistant})
            earlier = [{"role": m.role, "content": m.content} for m in Message.objects.filter(
                conversation_id=turn.conversation_id, id__lt=asked.id, role__in=["user", "assistant"]).order_by("id")
                if m.content]
            last = test_set.questions.order_by("-position").values_list("position", flat=True).first() or 0
            TestQuestion.objects.create(
                test_set=test_set, position=last + 1, question=asked.content[:TestQuestion.MAX_LENGTH],
                earlier_messages=earlier, visitor=(TestQuestion.Visitor.SIGNED_IN if turn.conversation.user_id
                                                   else TestQuestion.Visitor.ANONYMOUS))
            added[test_set] = added.get(test_set, 0) + 1
    return added
