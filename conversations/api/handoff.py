"""``…/handoff/``: the visitor asks for a person (``POST``) and polls what staff do (``GET``,
cheap: the cached state, ETag/304); ``…/handoff/back/`` goes back to the assistant when no
one took it. The rules are in ``engine.handoff``; this is their HTTP face."""

import time

from django.http import HttpResponseNotModified
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.response import Response

from ..engine import handoff
from ..infra import state
from ..owners import owner_matches, owner_token, request_visitor
from .base import Conflict, ConversationAPIView, owned_conversation
from .schema import (CONVERSATION_ID, POLL_MISSES, CSRF_OR_SIGN_IN, ERROR, NOT_FOUND, NOT_JSON, RETRY_AFTER, SIGN_IN, TOO_LARGE,
                     UNAVAILABLE)
from .throttling import PollMissLimit, TurnIPThrottle, TurnOwnerThrottle

HANDOFF_STATE = OpenApiResponse(OpenApiTypes.OBJECT, description=(
    '{"conversation", "state": ""|"waiting"|"taken"|"returned"|"closed", "by": the staff member\'s name '
    'or null, "messages": the messages written while staff held it (staff ones with "author"), '
    '"version", "expired": waited past HANDOFF_WAIT with no one taking it, "wait": HANDOFF_WAIT}'))


def current(conversation):
    """The conversation's handoff state published now from its row (read from the row alone
    when the cache cannot be written)."""
    return handoff.publish(conversation.pk) or handoff.state_from_db(conversation)


def answer(request, data):
    """The public state with its ETag, or 304 when the caller has this version (and the same ``expired``)."""
    body = handoff.public(data, time.time())
    # The version is the row's count of changes: it never restarts, so an ETag names one content. (The
    # letter is not the "h" of the Redis counter before it, whose ETags a widget may still send.)
    etag = f'"c{body["version"]}-{int(body["expired"])}"'
    if etag in request.headers.get("If-None-Match", ""):
        response = HttpResponseNotModified()
    else:
        response = Response(body)
    response["ETag"] = etag
    response["Cache-Control"] = "private, no-cache"
    return response


class HandoffView(PollMissLimit, ConversationAPIView):
    """``GET``: the conversation's handoff state. ``POST``: ask for a person (the widget's button)."""

    def get_throttles(self):
        if self.request.method == "POST":  # as a message is: each request reaches staff
            return [TurnOwnerThrottle(), TurnIPThrottle()]
        return []

    @extend_schema(parameters=[CONVERSATION_ID, OpenApiParameter(
                       "If-None-Match", OpenApiTypes.STR, OpenApiParameter.HEADER, required=False)],
                   responses={200: HANDOFF_STATE, 304: OpenApiResponse(description="Unchanged since the ETag."),
                              403: SIGN_IN, 404: NOT_FOUND, 429: POLL_MISSES, 503: UNAVAILABLE},
                   summary="Poll a conversation handed to a person")
    def get(self, request, conversation_id):
        if conversation_id is None:
            raise NotFound()
        data = state.read_person(conversation_id)
        visitor = request_visitor(request)
        # Never published, expired from the cache, or published before states named their
        # assistant (which a token's caller is checked against): the row says it.
        if data is None or (visitor is not None and "assistant" not in data["owner"]):
            data = current(owned_conversation(request, conversation_id))
        user_id = request.user.pk if request.user.is_authenticated else None
        if data["conversation"] != str(conversation_id) or not owner_matches(data["owner"], user_id,
                                                                             owner_token(request), visitor):
            raise NotFound()
        return answer(request, data)

    @extend_schema(parameters=[CONVERSATION_ID, RETRY_AFTER], request=None,
                   responses={202: HANDOFF_STATE, 403: OpenApiResponse(ERROR, description=(
                       "CSRF check failed, the caller is anonymous while LOGIN_REQUIRED is on, or the "
                       "conversation's assistant does not offer a person (Assistant.handoff).")),
                              404: NOT_FOUND, 409: OpenApiResponse(ERROR, description=(
                                  "A person was already asked for, or the conversation is closed.")),
                              413: TOO_LARGE, 415: NOT_JSON,
                              429: OpenApiResponse(ERROR, description=(
                                  "Too many requests: the rates of messages (TURN_RATE_PER_OWNER, "
                                  "TURN_RATE_PER_IP); see Retry-After.")),
                              503: UNAVAILABLE},
                   summary="Ask for a person: the assistant stops answering, staff reply")
    def post(self, request, conversation_id):
        conversation = owned_conversation(request, conversation_id)
        try:
            handoff.request(conversation.pk, "button")
        except handoff.NotOffered as exc:
            raise PermissionDenied(exc.message) from None
        except handoff.Refused as exc:
            raise Conflict(exc.message) from None
        response = answer(request, current(conversation))
        response.status_code = status.HTTP_202_ACCEPTED
        return response


class HandoffBackView(ConversationAPIView):
    """``POST``: the visitor stops waiting for a person and writes to the assistant again."""

    @extend_schema(parameters=[CONVERSATION_ID], request=None,
                   responses={200: HANDOFF_STATE, 403: CSRF_OR_SIGN_IN, 404: NOT_FOUND,
                              409: OpenApiResponse(ERROR, description="A person took it, or it is not waiting."),
                              413: TOO_LARGE, 415: NOT_JSON, 503: UNAVAILABLE},
                   summary="Go back to the assistant instead of waiting for a person")
    def post(self, request, conversation_id):
        conversation = owned_conversation(request, conversation_id)
        try:
            handoff.back_to_assistant(conversation.pk)
        except handoff.Refused as exc:
            raise Conflict(exc.message) from None
        return answer(request, current(conversation))
