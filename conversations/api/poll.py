"""The poll view: what every widget asks for while a turn runs, so the common case costs one or
two Redis round trips and no SQL, and no more Python than its checks (see ``TurnDetailView.as_view``)."""

import functools
import time

from django.contrib.auth import get_user
from django.http import HttpResponse, HttpResponseNotModified
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.exceptions import AuthenticationFailed, NotFound, PermissionDenied
from rest_framework.permissions import AllowAny
from rest_framework.utils import encoders
from rest_framework.views import APIView

from ..infra import state, telemetry
from ..infra.state import owner_dict
from ..engine import recovery
from ..conf import get_config
from ..models import Turn
from ..owners import owner_matches, owner_token, owns_state, request_visitor, stamp_matches
from . import serializers
from .authentication import VisitorTokenAuthentication, verified_visitor, visitor_user
from .cors import CorsMixin, is_preflight
from .permissions import LoginNotRequiredMixin, may_chat, sign_in_message
from .sessions import UNAVAILABLE_ERRORS, check_session_store
from .base import RedisDownMixin, other_assistant_message, owned_conversation, public_state, with_another_assistant
from .schema import CONVERSATION_ID, NOT_FOUND, POLL_MISSES, SIGN_IN, TURN_ID, UNAVAILABLE
from .throttling import PollMissLimit


# Where the poll's first look (``FirstLook``) waits on the request for DRF's path.
FIRST_LOOK = "conversations_poll_first_look"
# The state's JSON as DRF would render it, with one encoder for the process (it keeps no state
# between calls, as json.dumps's own default encoder).
_JSON = encoders.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


class FirstLook:
    """What a poll learns before DRF's path, with plain Django: the token's visitor (or why the
    token is refused), the state and the session read in one round trip (or the Redis error that
    read raised), and, when the state is fresh and the caller's, the answer itself (``response``).
    DRF's path goes on from it (``TurnDetailView.initial``) without reading anything again."""

    __slots__ = ("visitor", "refused", "cached", "unreachable", "response")

    def __init__(self, request, conversation_id, turn_id):
        self.visitor = self.refused = self.cached = self.unreachable = self.response = None
        try:
            self.visitor = verified_visitor(request)
        except AuthenticationFailed as exc:
            self.refused = exc
            return
        if request.method != "GET" or conversation_id is None or turn_id is None:
            return
        try:
            self.cached = data, session = state.read_with_session(turn_id, request)
        except UNAVAILABLE_ERRORS as exc:
            self.unreachable = exc
            return
        if data is not None and not TurnDetailView.is_stale(data) and TurnDetailView.serves(
                data, session, conversation_id, self.visitor):
            self.response = TurnDetailView.respond(request, data)


class TurnDetailView(PollMissLimit, CorsMixin, LoginNotRequiredMixin, RedisDownMixin, APIView):
    """The poll view. A state in the cache is served with no SQL query (ownership is in the state);
    a missing or stale one is rebuilt from the database, and a turn whose job died is ended.

    Who the caller is comes from the visitor token, else the session, in both paths, not from
    DRF's authentication (none is configured, so that the fast path skips nothing DRF would do):
    the fast path trusts a token's visitor (checked with no I/O), and a user (the token's or the
    session's) only while the app has verified them since the user was last saved (the auth stamp); the slow path asks Django
    (``verified_user``), which also checks the hash and ``is_active``.
    """

    authentication_classes = []
    permission_classes = [AllowAny]
    throttle_classes = []  # not a site's DEFAULT_THROTTLE_CLASSES, which the fast path would skip

    @classmethod
    def as_view(cls, **initkwargs):
        """The view the URL calls. Every widget polls here, so the common case, a fresh cached state
        that the caller owns, is answered by ``FirstLook`` with plain Django: one Redis round trip
        (two for a logged-in owner), no view instance, no DRF request, negotiation or renderer,
        the CORS headers added as DRF's path adds them. Anything else (a missing, stale or foreign
        state, a refused token, an unverified session, a malformed id, a method other than GET)
        goes to DRF's view (``get``), which finds the first look on the request. A preflight goes
        straight to DRF's view, which answers it (``CorsMixin``). Every poll but a preflight is
        measured for the metrics: how many by status (200, 304, ...) and how fast."""
        drf_view = super().as_view(**initkwargs)  # CORS, csrf_exempt and login_not_required included

        @functools.wraps(drf_view)  # keeps what the schema and the middleware read of the view
        def poll(request, *args, **kwargs):
            if is_preflight(request):
                return drf_view(request, *args, **kwargs)
            started = time.perf_counter()
            look = FirstLook(request, kwargs.get("conversation_id"), kwargs.get("turn_id"))
            if look.response is not None:
                response = look.response
                cls.add_cors_headers(request, response, False)
            else:
                setattr(request, FIRST_LOOK, look)
                response = drf_view(request, *args, **kwargs)
            telemetry.poll_answered(response.status_code, time.perf_counter() - started)
            return response

        return poll

    def initial(self, request, *args, **kwargs):
        look = getattr(request, FIRST_LOOK, None) or FirstLook(request, kwargs.get("conversation_id"),
                                                               kwargs.get("turn_id"))
        self.visitor, self.cached = look.visitor, look.cached  # read by ``get``, not read again
        if look.refused is not None:
            raise look.refused
        if look.unreachable is not None:
            raise look.unreachable
        check_session_store(request)
        super().initial(request, *args, **kwargs)

    def get_authenticate_header(self, request):
        """A refused visitor token is a 401 here too, as on the views with authentication classes."""
        return VisitorTokenAuthentication().authenticate_header(request)

    @staticmethod
    def serves(data, session, conversation_id, visitor=None):
        """Whether ``data`` is a state of ``conversation_id`` owned by the holder of ``session``, or
        by ``visitor`` (a token's), as far as the cache can tell (a user's session only while its
        auth hash is verified; a token's user for as long as the token lasts)."""
        if data["conversation"] != str(conversation_id):
            return False
        if visitor is not None:
            if not owner_matches(data["owner"], visitor.user_id, visitor.owner_token, visitor):
                return False
        elif not owns_state(session, data["owner"]):
            return False
        user_id = data["owner"].get("user")
        if user_id is None:  # an anonymous visitor's state: theirs, unless only users may chat
            return not get_config()["LOGIN_REQUIRED"]
        stamp = state.read_auth_stamp(user_id)
        if visitor is not None:  # a token's user, checked active since the user was last saved
            return stamp is not None
        return stamp_matches(stamp, session)

    def verified_user(self, request):
        """The caller's user: a token's (checked active), or as Django's authentication sees it
        (session auth hash and ``is_active`` checked; a session whose hash is stale is flushed),
        remembered for the fast path."""
        if self.visitor is not None:
            user = visitor_user(self.visitor)  # 401 once the host site deactivated or deleted them
            if user.is_authenticated:
                state.write_auth_stamp(user)
            return user
        # Not request.user: with no authentication classes DRF sets it (and the Django request's
        # user, which AuthenticationMiddleware had made) to AnonymousUser.
        user = get_user(request._request)
        if user.is_authenticated:
            state.write_auth_stamp(user)
        return user

    @staticmethod
    def respond(request, data):
        """The state as JSON with its ETag, or ``304`` when the caller already has this version."""
        etag = f'"{data["id"]}-{data["version"]}"'
        if etag in request.META.get("HTTP_IF_NONE_MATCH", ""):
            response = HttpResponseNotModified()
        else:  # bytes: Django would look for a charset in the content type to encode a str
            response = HttpResponse(_JSON.encode(public_state(data)).encode(), content_type="application/json")
        response["ETag"] = etag
        response["Cache-Control"] = "private, no-cache"
        return response

    @extend_schema(
        parameters=[CONVERSATION_ID, TURN_ID,
                    OpenApiParameter("If-None-Match", OpenApiTypes.STR, OpenApiParameter.HEADER, required=False,
                                     description="The ETag of the state the client already has.")],
        responses={200: serializers.TurnStateSerializer,
                   304: OpenApiResponse(description="The state has not changed since the ETag sent."),
                   403: SIGN_IN, 404: NOT_FOUND, 429: POLL_MISSES, 503: UNAVAILABLE},
        summary="Poll a turn until done is true",
    )
    def get(self, request, conversation_id, turn_id):
        user = self.verified_user(request)
        if not may_chat(user):
            raise PermissionDenied(sign_in_message())
        if conversation_id is None or turn_id is None:  # not a UUID (see urls.AnyUUIDConverter)
            raise NotFound()
        data, _session = self.cached or state.read_with_session(turn_id, request)
        if data is None or self.is_stale(data):
            data = self.rebuild(request, user, conversation_id, turn_id, data)
        visitor = request_visitor(request)
        if visitor is not None and "assistant" not in data["owner"]:
            # Published before states named their assistant (by an older worker): the row says it.
            data = {**data, "owner": owner_dict(owned_conversation(request, conversation_id, user=user))}
        user_id = user.pk if user.is_authenticated else None
        if data["conversation"] != str(conversation_id) or not owner_matches(data["owner"], user_id,
                                                                             owner_token(request), visitor):
            if with_another_assistant(request, user, conversation_id):
                raise NotFound(other_assistant_message())
            raise NotFound()
        return self.respond(request, data)

    @staticmethod
    def is_stale(data):
        """Whether ``data`` must be checked against the database: a state not done that has not
        changed for ``STALE_AFTER`` seconds, or a queued one older than ``QUEUE_WAIT`` (its turn
        may have to end unrun)."""
        if data["done"]:
            return False
        if data["status"] == Turn.Status.WAITING:  # no job to die: checked again once a call may have expired
            return time.time() > min((a["expires_at"] for a in data.get("approvals") or []), default=0)
        cfg, age = get_config(), time.time() - data.get("updated_at", 0)
        return age > cfg["STALE_AFTER"] or (data["status"] == Turn.Status.QUEUED and age > cfg["QUEUE_WAIT"])

    def rebuild(self, request, user, conversation_id, turn_id, cached):
        """For a missing or stale ``cached`` state: 404 unless the caller owns the turn; end the
        turn if no worker picked it up within ``QUEUE_WAIT`` or its job died; else the cached
        state, or one rebuilt from the database when there is none or the row says the turn
        ended and the cache does not (a write the cache missed)."""
        conversation = owned_conversation(request, conversation_id, user=user)
        turn = get_object_or_404(conversation.turns.select_related("conversation"), pk=turn_id)
        repaired = recovery.repair(turn)
        if repaired is not None:
            return repaired
        if cached is None or (turn.done and not cached["done"]):  # once a turn is done, its row is the truth
            return state.publish(state.state_from_db(turn))
        return cached
