"""Visitor tokens, what a widget embedded on another site sends instead of cookies, and the signed
identities a host site vouches for its signed-in users with.

A visitor token is Django's ``signing.dumps`` of the page's origin, the assistant, the random
visitor id the widget keeps in the page's storage and, for a vouched-for user, their id; it is
timestamped and good for ``WIDGET_TOKEN_TTL`` seconds, and stateless: nothing is stored when
one is issued, so any web process can check it with the site's ``SECRET_KEY``. The API accepts
it only from a page of the origin it names (``api.tokens``). A token renewed is one more of its
chain: it keeps when the first was issued, and a chain is renewed for ``WIDGET_TOKEN_MAX_AGE``
seconds from then (``check_renewal``), so that a token taken once does not live for ever.

A signed identity is ``user_id:timestamp:nonce:signature``, the signature HMAC-SHA256 of the
first three parts with ``IDENTITY_SECRET``, made by the host site's server (``sign_identity``;
docs/widget.md has the same in a few lines of any language). It is good for
``IDENTITY_MAX_AGE`` seconds and once: its nonce is kept in the cache until then. It is checked
in two steps: ``verify_identity`` (signature and age) first, ``spend_identity`` (the nonce) only
once every other check of the request has passed.
"""

import dataclasses
import hashlib
import hmac
import re
import secrets
import time

from django.core import signing
from django.core.cache import caches

from .conf import get_config
from .owners import visitor_owner_token

SALT = "conversations.visitors.token"
# What the widget generates (crypto.getRandomValues, URL-safe): long enough not to be guessed.
VISITOR_ID = re.compile(r"^[A-Za-z0-9_-]{22,64}$")
NONCE = re.compile(r"^[A-Za-z0-9_-]{16,64}$")
# Seconds since the epoch in ASCII digits (str.isdigit() also takes "²", which int() refuses).
STAMP = re.compile(r"^[0-9]{1,12}$")
# A signature from a host whose clock runs this much ahead is still taken.
CLOCK_SKEW = 60


class Refused(Exception):
    """A token or identity that cannot be taken; ``reason`` says why (``REASONS``)."""

    REASONS = ("invalid", "expired", "origin", "assistant", "identity_off", "identity_forged",
               "identity_expired", "identity_replayed", "identity_inactive")

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class Visitor:
    """Who a valid visitor token names: pages of ``origin``, the assistant ``assistant_id`` (None:
    the site's default), the widget's ``visitor_id``, when the host site vouched for them, its
    user ``user_id``, and when the first token of its chain was issued, ``started`` (seconds since
    the epoch; None for a visitor whose first token is yet to be issued)."""

    origin: str
    assistant_id: int | None
    visitor_id: str
    user_id: str | None = None
    started: float | None = None

    @property
    def owner_token(self):
        """The owner token of the conversations this visitor starts (see ``owners``)."""
        return visitor_owner_token(self.origin, self.assistant_id, self.visitor_id)


def issue(visitor):
    """A visitor token naming ``visitor``, good for ``WIDGET_TOKEN_TTL`` seconds from now: the first
    of a chain, or (a renewal, ``visitor.started`` set) one more of the chain begun then."""
    started = int(time.time()) if visitor.started is None else visitor.started
    claims = {"o": visitor.origin, "a": visitor.assistant_id, "v": visitor.visitor_id, "u": visitor.user_id,
              "t": started}
    return signing.dumps(claims, salt=SALT, compress=False)


def check_renewal(visitor, now=None):
    """``Refused("expired")`` once the chain of ``visitor``'s token began more than
    ``WIDGET_TOKEN_MAX_AGE`` seconds ago: it gets no more renewals (an anonymous visitor's widget
    then asks for a new chain for its visitor id; a signed-in user's needs a new signature)."""
    now = time.time() if now is None else now
    if visitor.started is not None and now - visitor.started > get_config()["WIDGET_TOKEN_MAX_AGE"]:
        raise Refused("expired")


def read(token):
    """The ``Visitor`` that ``token`` names; ``Refused("expired")`` past its lifetime,
    ``Refused("invalid")`` for anything this site did not sign (tampered with, truncated)."""
    try:
        claims = signing.loads(str(token), salt=SALT, max_age=get_config()["WIDGET_TOKEN_TTL"])
    except signing.SignatureExpired:
        raise Refused("expired") from None
    except signing.BadSignature:
        raise Refused("invalid") from None
    try:
        # A token issued before chains were dated has no "t": its chain begins at its next renewal.
        started = claims.get("t")
        return Visitor(origin=str(claims["o"]), assistant_id=claims["a"], visitor_id=str(claims["v"]),
                       user_id=None if claims["u"] is None else str(claims["u"]),
                       started=None if started is None else float(started))
    except (KeyError, TypeError, ValueError, AttributeError):  # signed by this site, but not as a visitor token
        raise Refused("invalid") from None


def sign_identity(user_id, secret, now=None):
    """A signed identity for ``user_id`` with ``secret`` (the site's ``IDENTITY_SECRET``), as a
    host site's server makes one for each page it serves to a signed-in user."""
    message = f"{user_id}:{int(time.time() if now is None else now)}:{secrets.token_hex(16)}"
    signature = hmac.new(str(secret).encode(), message.encode(), hashlib.sha256).hexdigest()
    return f"{message}:{signature}"


@dataclasses.dataclass(frozen=True)
class Identity:
    """A signed identity whose signature and age are good (``verify_identity``): the user
    ``user_id`` it vouches for, and the ``nonce`` that ``spend_identity`` uses up."""

    user_id: str
    nonce: str


def verify_identity(value, now=None):
    """The ``Identity`` a signed identity vouches for, not yet used up (``spend_identity``);
    ``Refused`` when identities are off (no ``IDENTITY_SECRET``), or it is forged or expired."""
    cfg = get_config()
    if not cfg["IDENTITY_SECRET"]:
        raise Refused("identity_off")
    parts = str(value).rsplit(":", 3)
    if len(parts) != 4 or not parts[0] or not NONCE.match(parts[2]) or not STAMP.fullmatch(parts[1]):
        raise Refused("identity_forged")
    user_id, stamp, nonce, signature = parts
    expected = hmac.new(cfg["IDENTITY_SECRET"].encode(), f"{user_id}:{stamp}:{nonce}".encode(),
                        hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected.encode(), signature.lower().encode()):  # str compares ASCII only
        raise Refused("identity_forged")
    now = time.time() if now is None else now
    age = now - int(stamp)
    if age > cfg["IDENTITY_MAX_AGE"] or age < -CLOCK_SKEW:
        raise Refused("identity_expired")
    return Identity(user_id=user_id, nonce=nonce)


def spend_identity(identity):
    """Use ``identity`` up; ``Refused("identity_replayed")`` when it was used before. Called last,
    right before a token is issued with it: a request refused for anything else (a page of an
    origin not allowed, an assistant the user may not use) leaves it to the page it was made for."""
    cfg = get_config()
    # Kept until the signature could no longer be taken anyway; add() is atomic, so of two requests
    # with one signature only the first gets through.
    key = "conversations:identity:" + hashlib.sha256(f"{identity.user_id}:{identity.nonce}".encode()).hexdigest()
    if not caches[cfg["CACHE_ALIAS"]].add(key, 1, timeout=cfg["IDENTITY_MAX_AGE"] + CLOCK_SKEW + 1):
        raise Refused("identity_replayed")
