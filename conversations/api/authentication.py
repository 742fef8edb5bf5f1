import logging

from django.conf import settings
from django.middleware.csrf import REASON_NO_CSRF_COOKIE
from django.utils.translation import gettext as _
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import CSRFCheck, SessionAuthentication
from rest_framework.exceptions import PermissionDenied

from ..conf import get_config

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
