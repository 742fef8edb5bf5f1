import logging

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import ValidationError
from django.middleware.csrf import REASON_NO_CSRF_COOKIE
from django.utils.translation import gettext as _
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BaseAuthentication, CSRFCheck, SessionAuthentication
from rest_framework.exceptions import AuthenticationFailed, PermissionDenied

from .. import visitors
from ..conf import get_config
from ..endpoints import origin
from ..owners import VISITOR_ATTRIBUTE

logger = logging.getLogger("conversations.api")


def csrf_refusal(reason):
    """The sentence a visitor reads for Django's CSRF failure ``reason`` (never Django's own text,
    which speaks of tokens and cookies to someone who only typed a message)."""
    if reason == REASON_NO_CSRF_COOKIE:
        # The usual cause on a real site: the browser keeps cookies from a chat on another site
        # (third-party cookies blocked), or cookies are off altogether.
        return _("Your browser did not send this site's cookie, so the message could not be accepted. If it blocks "
                 "cookies (some browsers do for a chat on another site), allow them for this site and reload the "
                 "page.")
    return _("This page has expired, so the message could not be accepted. Please reload the page and try again.")


class CsrfSessionAuthentication(SessionAuthentication):
    """Session authentication that checks CSRF for anonymous visitors as well.

    DRF's ``SessionAuthentication`` enforces CSRF only for logged-in users, but an
    anonymous visitor's conversation is theirs too: without the check, another site could
    post messages into it (and spend the site owner's API budget).
    """

    def authenticate(self, request):
        result = super().authenticate(request)
        if result is None:
            self.enforce_csrf(request)
        return result

    def enforce_csrf(self, request):
        """DRF's check, refused with a sentence of the app's own; Django's reason goes to the log."""
        check = CSRFCheck(lambda request: None)
        check.process_request(request)  # puts the cookie's token where process_view() looks for it
        reason = check.process_view(request, None, (), {})
        if reason:
            logger.warning("CSRF check failed for %s %s: %s", request.method, request.path, reason)
            raise PermissionDenied(csrf_refusal(reason))


class CsrfSessionScheme(OpenApiAuthenticationExtension):
    """Describes ``CsrfSessionAuthentication`` in the OpenAPI schema: the session cookie."""

    target_class = CsrfSessionAuthentication
    name = "sessionCookie"

    def get_security_requirement(self, auto_schema):
        """The session cookie, optional (``{}``) unless ``LOGIN_REQUIRED``: an anonymous visitor's
        first request has no session yet. (The views' permission is not DRF's ``AllowAny``, from
        which drf-spectacular would infer that itself.)"""
        requirement = {self.name: []}
        return requirement if get_config()["LOGIN_REQUIRED"] else [requirement, {}]

    def get_security_definition(self, auto_schema):
        """The OpenAPI security scheme: an API key in the session cookie."""
        return {"type": "apiKey", "in": "cookie", "name": settings.SESSION_COOKIE_NAME,
                "description": "Django's session cookie. Every POST also needs the csrftoken cookie and the "
                               "same value in an X-CSRFToken header."}


# -- visitor tokens: a widget embedded on a page of another site (api.tokens issues them) --------

SCHEME = "Bearer"


def refusal_message(reason):
    """The sentence a visitor reads for a ``visitors.Refused`` reason."""
    return {
        "invalid": _("This chat could not verify its access. Please reload the page."),
        "expired": _("This chat's access has expired. Please reload the page."),
        "origin": _("This chat's access was given to another site. Please reload the page."),
        "assistant": _("This chat's access was given for another assistant. Please reload the page."),
        "identity_off": _("This site cannot sign you in to the chat: it is not set up for signed-in users."),
        "identity_forged": _("Your sign-in could not be verified. Please reload the page."),
        "identity_expired": _("Your sign-in has expired. Please reload the page."),
        "identity_replayed": _("Your sign-in was already used. Please reload the page."),
        # Reloading signs the same account in again: only the site can switch it back on.
        "identity_inactive": _("Your account can no longer use this chat: the site has switched it off. Please "
                               "contact the site if you think this is a mistake."),
    }[reason]


def bearer(request):
    """The token of the request's ``Authorization: Bearer`` header, or None when it has none.
    (Read from ``META``, as every header on the poll's path: ``request.headers`` first copies every
    header of the request, a sizeable part of a poll's own work.)"""
    scheme, _space, token = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    return token.strip() if scheme.lower() == SCHEME.lower() else None


# What a page without an origin of its own is: "null" is what browsers send for a sandboxed frame
# or a file: page, of any site. No token and no allowed origin names it (they are http(s) origins).
OPAQUE_ORIGIN = "null"


def request_origin(request):
    """The origin of the page that made the request: its ``Origin`` header (every browser sends
    one on a request to another origin); ``OPAQUE_ORIGIN`` for a header that names none ("null",
    or one no browser sends); the site's own only without the header (a page of the site itself)."""
    header = request.META.get("HTTP_ORIGIN")
    if header is None:
        return origin(request.build_absolute_uri("/"))
    return origin(header) or OPAQUE_ORIGIN


def verified_visitor(request):
    """The ``visitors.Visitor`` the request's token names, now the request's owner (see
    ``owners.owner_token``); None without a token. 401 with a sentence for a token that is not
    this site's, has expired, or comes from a page of another origin than the one it names."""
    token = bearer(request)
    if token is None:
        return None
    try:
        visitor = visitors.read(token)
        if visitor.origin != request_origin(request):
            raise visitors.Refused("origin")
    except visitors.Refused as refused:
        raise AuthenticationFailed(refusal_message(refused.reason)) from None
    # On Django's request, where owners reads it (DRF's request reads its attributes through).
    setattr(getattr(request, "_request", request), VISITOR_ATTRIBUTE, visitor)
    return visitor


def visitor_user(visitor):
    """The user a token names (active), or ``AnonymousUser``; 401 when that user is gone or inactive
    (each with its own sentence),
    or named otherwise than as the user model writes its key (``06``, ``+6`` or ``6 `` for user 6:
    one user, one spelling, so one identity, one owner and one replay record)."""
    if visitor.user_id is None:
        return AnonymousUser()
    model = get_user_model()
    try:
        pk = model._meta.pk.to_python(visitor.user_id)
        user = model._default_manager.filter(pk=pk).first() if str(pk) == str(visitor.user_id) else None
    except (TypeError, ValueError, ValidationError):  # not an id of this user model's (ValidationError: a UUID pk)
        user = None
    if user is None:
        raise AuthenticationFailed(refusal_message("identity_forged"))
    if not getattr(user, "is_active", True):
        raise AuthenticationFailed(refusal_message("identity_inactive"))
    return user


def check_assistant(request, assistant):
    """401 when the request's token was issued for another assistant than ``assistant`` (None:
    the site's default); nothing for a request without a token."""
    visitor = getattr(request, VISITOR_ATTRIBUTE, None)
    if visitor is not None and visitor.assistant_id != (assistant.pk if assistant is not None else None):
        raise AuthenticationFailed(refusal_message("assistant"))


class VisitorTokenAuthentication(BaseAuthentication):
    """A visitor token in ``Authorization: Bearer …``: the caller is the visitor it names (the user
    the host site vouched for, or an anonymous visitor). Without the header, the next class
    (the session's) decides."""

    def authenticate(self, request):
        """``(user, visitor)``, or None without a token; 401 for a token that cannot be taken."""
        visitor = verified_visitor(request)
        if visitor is None:
            return None
        return visitor_user(visitor), visitor

    def authenticate_header(self, request):
        """What makes DRF answer a refused token 401 (not 403)."""
        return f'{SCHEME} realm="conversations"'


class VisitorTokenScheme(OpenApiAuthenticationExtension):
    """Describes ``VisitorTokenAuthentication`` in the OpenAPI schema."""

    target_class = VisitorTokenAuthentication
    name = "visitorToken"

    def get_security_definition(self, auto_schema):
        """The OpenAPI security scheme: a bearer token from ``POST widget-token/``."""
        return {"type": "http", "scheme": "bearer",
                "description": "A visitor token from POST widget-token/, for a widget embedded on another site "
                               "(sent from a page of the origin it was issued to; no cookie, no CSRF token)."}
