"""Who owns what: a conversation belongs to a user, or to an anonymous visitor's session, or to
the visitor an embedded widget's token names.

An anonymous visitor is identified by a random owner token kept in their session (not the
session key, which Django rotates at login). When they log in, ``claim_on_login`` hands
their recent anonymous conversations to the user. A widget embedded on another site has no
session (its requests carry no cookie): the visitor token it sends (``visitors``) names a
random visitor id, and the owner token is derived from that id, the page's origin and the
assistant (``visitor_owner_token``), so one id read on another site or for another assistant
owns nothing here. Whichever way, ``owner_token`` is the caller's token.

A logged-in owner's poll is answered from the session data alone (no SQL) only while the
session's auth hash equals the one the app last verified for that user (``auth_stamp``):
Django's own check, which loads the user, runs whenever there is no such stamp, and the stamp
is dropped whenever the user is saved (a password change, ``is_active`` turned off).
"""

import hashlib
import secrets

from django.contrib.auth import HASH_SESSION_KEY
from django.contrib.auth import SESSION_KEY as AUTH_SESSION_KEY
from django.db.models import Q

SESSION_KEY = "conversations_owner"
# Where the API puts the ``visitors.Visitor`` a request's token names (on Django's request, which
# DRF's request reads through).
VISITOR_ATTRIBUTE = "conversations_visitor"


def visitor_owner_token(origin, assistant_id, visitor_id):
    """The owner token of visitor ``visitor_id`` on pages of ``origin``, talking to the assistant
    ``assistant_id`` (None: the site's default), as stored on their conversations. A prefix no
    session's token has (those are URL-safe base64) keeps the two kinds apart."""
    digest = hashlib.sha256(f"{origin}\n{assistant_id or ''}\n{visitor_id}".encode()).hexdigest()
    return f"v:{digest[:48]}"


def request_visitor(request):
    """The visitor a request's (already verified) visitor token names, or None."""
    return getattr(request, VISITOR_ATTRIBUTE, None)


def owner_token(request, *, create=False):
    """The caller's owner token: their visitor token's, else their session's, created (and the
    session saved) when ``create`` is true. A visitor token's caller never gets a session."""
    visitor = request_visitor(request)
    if visitor is not None:
        return visitor.owner_token
    token = request.session.get(SESSION_KEY, "")
    if not token and create:
        token = secrets.token_urlsafe(24)
        request.session[SESSION_KEY] = token
    return token


def session_user_id(session):
    """The logged-in user's id read from the session data alone (no SQL), as a string, or None."""
    value = session.get(AUTH_SESSION_KEY)
    return str(value) if value is not None else None


def has_owner(user_id, token):
    """Whether a visitor with ``user_id`` (None: anonymous) and owner ``token`` ("" when none) owns
    anything at all: ``owned_by`` matches nothing otherwise."""
    return user_id is not None or bool(token)


def owned_by(user_id, token, prefix=""):
    """A Q selecting the rows that belong to a visitor: their user's (``user_id``; None when
    anonymous) and the anonymous ones of their session's owner ``token`` ("" when none), which a
    logged-in visitor keeps reading from that browser (``claim_on_login``). Matches nothing when
    they own nothing yet (``has_owner``). ``prefix`` reaches the conversation from another model
    (``"conversation__"`` for turns). The one rule of ownership: the API's listings and locks
    (``owned_filter``) and the limits per owner (``engine.limits``) select the same rows, but
    for a visitor token's caller, who reads and writes only those with its assistant."""
    condition = Q(**{f"{prefix}pk__in": []})
    if user_id is not None:
        condition |= Q(**{f"{prefix}user_id": user_id})
    if token:
        condition |= Q(**{f"{prefix}user__isnull": True, f"{prefix}owner_token": token})
    return condition


def owned_by_sql(user_id, token, user_column, token_column):
    """``owned_by`` in SQL, for a raw statement (``engine.statements``): ``(condition, params)`` over
    the conversation's ``user_column`` and ``token_column`` (quoted, with their table's alias),
    ``user_id`` and ``token`` already prepared for the database by their fields; None when the
    visitor owns nothing (``has_owner``). The same rule as ``owned_by``, kept beside it so that a
    change to one is made to both (tests/engine/test_statements.py compares them)."""
    conditions, params = [], []
    if user_id is not None:
        conditions.append(f"{user_column} = %s")
        params.append(user_id)
    if token:
        conditions.append(f"({user_column} IS NULL AND {token_column} = %s)")
        params.append(token)
    return (f"({' OR '.join(conditions)})", params) if conditions else None


def owned_filter(request, user=None, *, every_assistant=False):
    """A Q selecting the conversations the caller owns (``owned_by``); for a visitor token's
    caller, only those with the token's assistant (``visitor_scope``), unless ``every_assistant``
    (the rows the limits per owner count, which a lock must hold).

    ``user`` is the caller's verified user when the request's own ``user`` is not it (the poll
    view runs without DRF authentication)."""
    user = user if user is not None else getattr(request, "user", None)
    condition = owned_by(user.pk if user is not None and user.is_authenticated else None, owner_token(request))
    visitor = request_visitor(request)
    if visitor is not None and not every_assistant:
        condition &= visitor_scope(visitor)
    return condition


def visitor_scope(visitor):
    """A Q selecting the conversations with the assistant a visitor token names (None: the site's
    default, ``assistant IS NULL``). A token is given to pages allowed for one assistant, so a user
    it names owns there only that assistant's conversations of theirs, not every one they have on
    the site (an assistant embedded nowhere stays on the site's own pages)."""
    if visitor.assistant_id is None:
        return Q(assistant__isnull=True)
    return Q(assistant_id=visitor.assistant_id)


def owns_state(session, owner):
    """Whether the holder of ``session`` (session data: a dict or ``request.session``) owns a cached
    state's ``owner`` dict, by what the session says alone. No SQL; for a user's state the caller
    must also check the session's auth hash (``stamp_matches``)."""
    return owner_matches(owner, session_user_id(session), session.get(SESSION_KEY) or "")


def owner_matches(owner, user_id, token, visitor=None):
    """Whether a state's ``owner`` dict is the user ``user_id`` (None: not logged in) or, for an
    anonymous visitor's state, the holder of owner ``token``; for a visitor token's caller
    (``visitor``), only a state of a conversation with the token's assistant (``visitor_scope``).
    A state published before states named their assistant names none: not a token's caller's
    by the cache alone (the caller then asks the database)."""
    if visitor is not None and ("assistant" not in owner or owner["assistant"] != visitor.assistant_id):
        return False
    if owner.get("user") is not None:
        return user_id is not None and str(user_id) == str(owner["user"])
    return bool(owner.get("token")) and secrets.compare_digest(owner["token"], token or "")

def auth_stamp_key(user_id):
    return f"conversations:auth:{user_id}"


def session_auth_hash(session):
    """The auth hash Django stored in the session at login ("" when there is none)."""
    return session.get(HASH_SESSION_KEY) or ""


def stamp_matches(stamp, session):
    """Whether ``stamp`` (the verified auth hash of the state's user, or None when unknown) is the
    one in ``session``: then the session is still the user's without asking the database."""
    return stamp is not None and secrets.compare_digest(stamp, session_auth_hash(session))
