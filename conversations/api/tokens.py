"""The endpoint a widget embedded on another site gets its visitor token from (the
authentication that takes one is ``authentication.VisitorTokenAuthentication``).

The endpoint issues a token only to a page of an allowed origin (the ``Origin`` its browser
sends; ``ALLOWED_ORIGINS``, the assistant's own) and answers a token it is sent with a fresh one
for the same visitor (renewal). A request with a token carries no cookie, so it needs no CSRF
token: a page of another site cannot read the token (the browser keeps each origin's storage
apart) and the token is taken only from a page of its own origin. What a token grants, and
for how long, is in SECURITY.md.
"""

from django.core.validators import ProhibitNullCharactersValidator, slug_re
from django.templatetags.static import static
from django.urls import reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers as fields
from rest_framework.exceptions import AuthenticationFailed, NotFound, PermissionDenied, ValidationError
from rest_framework.permissions import AllowAny
from rest_framework.response import Response

from .. import assistants, visitors
from ..assistants import settings_for
from ..conf import get_config
from ..core.rules import WIDGET_GIVE_UP_MARGIN
from ..models import Assistant, Turn
from ..templatetags.conversations import retention_note, widget_strings
from .authentication import (OPAQUE_ORIGIN, VisitorTokenAuthentication, refusal_message, request_origin,
                             verified_visitor, visitor_user)
from .base import ConversationAPIView
from .cors import page_origin_allowed
from .permissions import may_chat, sign_in_message
from .schema import ERROR, NOT_JSON, RETRY_AFTER, TOO_LARGE, UNAVAILABLE
from .throttling import TokenIPThrottle


class AnyText(fields.CharField):
    """Text taken as sent, NUL and all: what it must be is checked by what reads it (a slug that names
    no assistant is a 404, a signed identity that does not verify a 401), so that the schema's plain
    string is the whole rule and no string it allows is a 400."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.validators = [v for v in self.validators if not isinstance(v, ProhibitNullCharactersValidator)]


class TokenRequestSerializer(fields.Serializer):
    assistant = AnyText(required=False, allow_blank=True, max_length=50,
                                 help_text="The assistant's slug; empty: the site's default.")
    visitor = fields.RegexField(visitors.VISITOR_ID.pattern,
                                help_text="The random id the widget keeps in the page's storage (22-64 URL-safe "
                                          "characters). To renew a token, the body is the same and the token "
                                          "in Authorization decides.")
    identity = AnyText(required=False, allow_blank=True, max_length=500,
                                help_text="A signed identity from the host site's server (user_id:timestamp:"
                                          "nonce:hmac), for a signed-in user.")


class TokenSerializer(fields.Serializer):
    token = fields.CharField()
    expires_in = fields.IntegerField(help_text="Seconds the token is good for.")
    widget = fields.DictField(help_text="What the widget needs to draw itself: its URLs, strings, limits.")


def widget_settings(request, assistant):
    """What an embedded widget is given (as the ``{% chat_widget %}`` tag gives it on a page of the
    site): the API's URLs, the strings in the visitor's language, the assistant's words, limits."""
    cfg = settings_for(assistant)
    strings = widget_strings()
    strings["retention"] = retention_note(cfg)
    if assistant is not None:
        strings["title"] = assistant.name
    return {
        "api_url": request.build_absolute_uri(reverse("conversations:conversation-list")),
        "token_url": request.build_absolute_uri(reverse("conversations:widget-token")),
        "css_url": request.build_absolute_uri(static("conversations/widget.css")),
        "script_url": request.build_absolute_uri(static("conversations/widget.js")),
        "strings": strings,
        "greeting": assistant.greeting if assistant is not None else "",
        "suggestions": list(assistant.suggestions) if assistant is not None else [],
        "job_timeout": cfg["JOB_TIMEOUT"],
        "max_length": cfg["MAX_MESSAGE_LENGTH"],
        "give_up_margin": WIDGET_GIVE_UP_MARGIN,
        "comment_max_length": Turn._meta.get_field("rating_comment").max_length,
        # The "Talk to a person" button, where the assistant offers it, as the tag's data-handoff.
        "handoff": "button" if assistant is not None and assistant.offers_handoff("button") else "",
    }


class WidgetTokenView(ConversationAPIView):
    """``POST``: a visitor token for a widget embedded on a page of another site (see the module).

    Refusals: 413, 429 (tokens per client address), 400 (no valid visitor id), 404 (no such
    active assistant), 401 (a token to renew, or a signed identity, that cannot be taken), 403
    (the visitor may not chat with the assistant; the page's origin may not embed it)."""

    authentication_classes = []  # a token to renew is read here; no cookie is ever looked at
    permission_classes = [AllowAny]  # who may chat is checked in post(), with the token's user
    throttle_classes = [TokenIPThrottle]
    throttle_message = gettext_lazy("This chat was opened too many times from your address. Please wait a moment "
                                    "and reload the page.")
    # A page of a site that is not allowed must still be able to read why it gets no token.
    cors_any_origin = True

    def get_authenticate_header(self, request):
        """A refused token to renew, or signed identity, is a 401, as on the other views."""
        return VisitorTokenAuthentication().authenticate_header(request)

    @extend_schema(
        request=TokenRequestSerializer, parameters=[RETRY_AFTER],
        responses={200: TokenSerializer, 400: OpenApiResponse(ERROR, description="No valid visitor id."),
                   401: OpenApiResponse(ERROR, description="The token to renew or the signed identity cannot be "
                                                           "taken: forged, expired, replayed, another origin's; "
                                                           "or the token's chain of renewals began more than "
                                                           "WIDGET_TOKEN_MAX_AGE ago."),
                   403: OpenApiResponse(ERROR, description="The caller is anonymous while LOGIN_REQUIRED is on, "
                                                           "the assistant's access policy does not allow them, or "
                                                           "the page's origin may not embed this assistant."),
                   404: OpenApiResponse(ERROR, description="No such active assistant."),
                   413: TOO_LARGE, 415: NOT_JSON,
                   429: OpenApiResponse(ERROR, description="Too many tokens for this address (TOKEN_RATE_PER_IP)."),
                   503: UNAVAILABLE},
        summary="A visitor token for a widget embedded on another site, or a renewed one",
    )
    def post(self, request):
        page_origin = request_origin(request)
        renewed, identity = verified_visitor(request), None
        if renewed is not None:
            try:
                visitors.check_renewal(renewed)
            except visitors.Refused as refused:
                raise AuthenticationFailed(refusal_message(refused.reason)) from None
            assistant = self.assistant(renewed.assistant_id)
            visitor_user(renewed)  # a user gone or made inactive since gets no new token
            visitor = renewed
        else:
            serializer = TokenRequestSerializer(data=request.data)
            if not serializer.is_valid():
                raise ValidationError({"detail": _("The chat could not start on this page. Please reload it.")})
            data = serializer.validated_data
            slug = data.get("assistant", "")
            # Not every string is a slug, and PostgreSQL refuses a NUL in a query: such a slug names nothing.
            assistant = (Assistant.objects.filter(slug=slug, active=True).first()
                         if slug and slug_re.match(slug) else None)
            if slug and assistant is None:
                raise NotFound(_("This assistant is not available."))
            if data.get("identity"):
                try:
                    identity = visitors.verify_identity(data["identity"])
                except visitors.Refused as refused:
                    raise AuthenticationFailed(refusal_message(refused.reason)) from None
            visitor = visitors.Visitor(origin=page_origin, assistant_id=assistant.pk if assistant else None,
                                       visitor_id=data["visitor"], user_id=identity.user_id if identity else None)
        user = visitor_user(visitor)
        if not may_chat(user):
            raise PermissionDenied(sign_in_message())
        if assistant is not None and not assistant.allows(user if user.is_authenticated else None):
            raise PermissionDenied(assistants.access_refused_message(assistant, user))
        if page_origin == OPAQUE_ORIGIN:
            raise PermissionDenied(_("This assistant cannot be used on this page."))
        if not page_origin_allowed(page_origin, assistant):
            raise PermissionDenied(_("This assistant cannot be used on pages of %(origin)s.") % {"origin": page_origin})
        if identity is not None:
            try:
                visitors.spend_identity(identity)  # last: a request refused above leaves it to its page
            except visitors.Refused as refused:
                raise AuthenticationFailed(refusal_message(refused.reason)) from None
        return Response({"token": visitors.issue(visitor), "expires_in": self.lifetime(),
                         "widget": widget_settings(request, assistant)})

    @staticmethod
    def assistant(assistant_id):
        """The active assistant a token names (None: the default); 404 once it is gone or inactive."""
        if assistant_id is None:
            return None
        found = Assistant.objects.filter(pk=assistant_id, active=True).first()
        if found is None:
            raise NotFound(_("This assistant is not available."))
        return found

    @staticmethod
    def lifetime():
        return get_config()["WIDGET_TOKEN_TTL"]
