from django.contrib.auth.signals import user_logged_in
from django.dispatch import receiver

from .models import Conversation
from .owners import SESSION_KEY


@receiver(user_logged_in, dispatch_uid="conversations_claim_on_login")
def claim_on_login(sender, request, user, **kwargs):
    """A visitor who chatted anonymously keeps those conversations when they log in.

    Login keeps the session's data, so the owner token is still there; states already in
    the cache name the token and stay readable until they expire.
    """
    session = getattr(request, "session", None)
    token = session.get(SESSION_KEY) if session is not None else None
    if token:
        Conversation.objects.filter(user__isnull=True, owner_token=token).update(user=user)
