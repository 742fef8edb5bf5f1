"""Who owns what: a conversation belongs to a user, or to an anonymous visitor's session.

An anonymous visitor is identified by a random owner token kept in their session (not the
session key, which Django rotates at login). When they log in, ``claim_on_login`` hands
their anonymous conversations to the user.
"""

import secrets

from django.db.models import Q

SESSION_KEY = "conversations_owner"


def owner_token(request, *, create=False):
    """The visitor's owner token, created (and the session saved) when ``create`` is true."""
    token = request.session.get(SESSION_KEY, "")
    if not token and create:
        token = secrets.token_urlsafe(24)
        request.session[SESSION_KEY] = token
    return token


def session_user_id(session):
    """The logged-in user's id read from the session data alone (no SQL), as a string, or None."""
    from django.contrib.auth import SESSION_KEY as AUTH_SESSION_KEY

    value = session.get(AUTH_SESSION_KEY)
    return str(value) if value is not None else None


def owned_filter(request):
    """A Q selecting the conversations the caller owns (empty when they own nothing yet)."""
    user = getattr(request, "user", None)
    token = owner_token(request)
    condition = Q(pk__in=[])
    if user is not None and user.is_authenticated:
        condition |= Q(user_id=user.pk)
    if token:
        condition |= Q(user__isnull=True, owner_token=token)
    return condition


def owns_state(session, owner):
    """Whether the holder of ``session`` (session data: a dict or ``request.session``) owns a cached
    state's ``owner`` dict. No SQL."""
    if owner.get("user") is not None:
        return session_user_id(session) == str(owner["user"])
    token = owner.get("token")
    return bool(token) and secrets.compare_digest(token, session.get(SESSION_KEY) or "")
