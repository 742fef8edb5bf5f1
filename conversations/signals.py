import datetime

from django.contrib.auth.signals import user_logged_in
from django.dispatch import receiver
from django.utils import timezone

from . import state
from .conf import get_config
from .models import Conversation, Turn
from .owners import SESSION_KEY


@receiver(user_logged_in, dispatch_uid="conversations_claim_on_login")
def claim_on_login(sender, request, user, **kwargs):
    """A visitor who chatted anonymously keeps those conversations when they log in.

    Login keeps the session's data, so the owner token is still there. The claimed
    conversations become the user's (readable from any of their sessions), and the cached
    states of their turns are republished naming the user, so that polls keep working.
    """
    session = getattr(request, "session", None)
    token = session.get(SESSION_KEY) if session is not None else None
    if not token:
        return
    claimed = list(Conversation.objects.filter(user__isnull=True, owner_token=token).values_list("pk", flat=True))
    if not claimed:
        return
    Conversation.objects.filter(pk__in=claimed).update(user=user)
    # Only turns recent enough to still have a cached state.
    recent = timezone.now() - datetime.timedelta(seconds=get_config()["STATE_TTL"])
    turns = Turn.objects.filter(conversation_id__in=claimed, enqueued_at__gte=recent).select_related("conversation")
    for turn in turns:
        cached = state.read(turn.id)
        if cached is not None:
            state.publish({**cached, "owner": state.owner_dict(turn.conversation)})
