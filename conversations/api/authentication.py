from django.conf import settings
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import SessionAuthentication

from ..conf import get_config


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
