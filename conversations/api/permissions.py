"""Who may use the chat API: everyone, or with ``CONVERSATIONS["LOGIN_REQUIRED"]`` logged-in users only.

The API views are exempt from Django's ``LoginRequiredMiddleware`` (``LoginNotRequiredMixin``):
it would answer the widget's anonymous requests with a redirect to an HTML login page, which
a script cannot show. ``LOGIN_REQUIRED`` says who may chat instead, and an anonymous caller is
told so in JSON (403 with a sentence), on every endpoint.
"""

from django.contrib.auth.decorators import login_not_required
from django.utils.translation import gettext as _
from rest_framework.permissions import BasePermission

from ..conf import get_config


def sign_in_message():
    return _("Please sign in to chat with the assistant.")


def may_chat(user):
    """Whether ``user`` (a user or ``AnonymousUser``, or None) may use the API under ``LOGIN_REQUIRED``."""
    return not get_config()["LOGIN_REQUIRED"] or bool(user is not None and user.is_authenticated)


class SignedInIfRequired(BasePermission):
    """Refuses anonymous callers while ``LOGIN_REQUIRED`` is on; lets everyone in otherwise."""

    def has_permission(self, request, view):
        """True when the caller may chat (``may_chat``); DRF answers False with 403 and ``message``."""
        return may_chat(request.user)

    @property
    def message(self):
        return sign_in_message()


class LoginNotRequiredMixin:
    """For API views: exempt from ``LoginRequiredMiddleware`` (see the module's docstring). DRF
    3.16 and later exempt every APIView themselves; this keeps 3.15, which pyproject.toml allows."""

    @classmethod
    def as_view(cls, **initkwargs):
        return login_not_required(super().as_view(**initkwargs))
