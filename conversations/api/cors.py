"""CORS for the API, done by the app for exactly its own views, so that a site owner lists the
origins whose pages embed the widget (``ALLOWED_ORIGINS``, an assistant's allowed origins) and
configures no headers or middleware.

A request from a page of an allowed origin gets ``Access-Control-Allow-Origin`` set to that
origin, the headers the widget reads exposed (``ETag`` for its polls' 304s, ``Retry-After`` for a
429), and a preflight the methods and headers the widget sends. Credentials are never allowed:
an embedded widget sends a visitor token, no cookie (``api.tokens``), so a page of another
site can never make the browser send a visitor's cookies and read what comes back. Every
answer says ``Vary: Origin``. Pages of the site itself need none of this.
"""

import functools
import time

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.http import HttpResponse
from django.utils.cache import patch_vary_headers

from ..conf import get_config
from ..endpoints import embed_origin_allowed, origin
from ..models import Assistant

ALLOWED_METHODS = "GET, POST, OPTIONS, DELETE"
# What the widget sends: its token, its JSON, the ETag of the state it has, a retry's key.
ALLOWED_HEADERS = "Authorization, Content-Type, If-None-Match, Idempotency-Key"
EXPOSED_HEADERS = "ETag, Retry-After"
# Seconds the assistants' origins are kept in each process: a poll from an embedded widget then
# costs no SQL. A change in the admin clears them at once in the process that saved it.
ORIGINS_TTL = 10
# Seconds a browser may reuse a preflight's answer, sending requests without asking again: no
# longer than the origins are kept, so that an origin taken off the list stops being sent
# from within 2 × ORIGINS_TTL (the price: one preflight per ORIGINS_TTL from a polling widget).
PREFLIGHT_MAX_AGE = ORIGINS_TTL

_memo = {}  # "origins": (good until, patterns); one for the process, its threads share it


def assistants_origins():
    """Every origin pattern an active assistant allows, read at most every ``ORIGINS_TTL`` seconds."""
    cached = _memo.get("origins")
    if cached is None or cached[0] < time.monotonic():
        rows = Assistant.objects.filter(active=True).values_list("allowed_origins", flat=True)
        patterns = tuple(p for row in rows if isinstance(row, list) for p in row if isinstance(p, str))
        cached = _memo["origins"] = (time.monotonic() + ORIGINS_TTL, patterns)
    return cached[1]


@receiver([post_save, post_delete], sender=Assistant, dispatch_uid="conversations_cors_forget_origins")
def forget_origins(**kwargs):
    """An assistant saved or deleted: its origins are read again on the next request."""
    _memo.pop("origins", None)


def page_origin_allowed(page_origin, assistant=None, *, any_assistant=False):
    """Whether pages of ``page_origin`` may embed ``assistant`` (None: the site's default one): the
    site's ``ALLOWED_ORIGINS`` and the assistant's own; with ``any_assistant``, any assistant's."""
    patterns = list(get_config()["ALLOWED_ORIGINS"])
    if any_assistant:
        patterns += assistants_origins()
    elif assistant is not None:
        patterns += [p for p in assistant.allowed_origins if isinstance(p, str)]
    return embed_origin_allowed(page_origin, patterns)


def is_preflight(request):
    return request.method == "OPTIONS" and "HTTP_ACCESS_CONTROL_REQUEST_METHOD" in request.META


class CorsMixin:
    """For API views: answers a CORS preflight before anything else runs (no authentication,
    no permission: a preflight carries neither) and adds the CORS headers to every answer, the
    poll view's fast path too. ``cors_any_origin``: answer pages of every origin (the token
    endpoint, whose refusal a page of a site not allowed must be able to read)."""

    cors_any_origin = False

    @classmethod
    def as_view(cls, **initkwargs):
        view = super().as_view(**initkwargs)

        @functools.wraps(view)  # keeps csrf_exempt, login_required and the cls the schema reads
        def view_with_cors(request, *args, **kwargs):
            preflight = is_preflight(request)
            response = HttpResponse(status=204) if preflight else view(request, *args, **kwargs)
            cls.add_cors_headers(request, response, preflight)
            return response

        return view_with_cors

    @classmethod
    def add_cors_headers(cls, request, response, preflight):
        if response.has_header("Vary"):
            patch_vary_headers(response, ["Origin"])
        else:  # the common case, a poll's: nothing to merge with
            response.headers["Vary"] = "Origin"
        header = request.META.get("HTTP_ORIGIN")
        page_origin = origin(header) if header else ""  # none: a page of the site, or no browser's
        if not page_origin or page_origin == origin(request.build_absolute_uri("/")):
            return  # the site's own page, or no browser's cross-origin request
        if not (cls.cors_any_origin or page_origin_allowed(page_origin, any_assistant=True)):
            return
        response["Access-Control-Allow-Origin"] = page_origin
        if preflight:
            response["Access-Control-Allow-Methods"] = ALLOWED_METHODS
            response["Access-Control-Allow-Headers"] = ALLOWED_HEADERS
            response["Access-Control-Max-Age"] = str(PREFLIGHT_MAX_AGE)
        else:
            response["Access-Control-Expose-Headers"] = EXPOSED_HEADERS
