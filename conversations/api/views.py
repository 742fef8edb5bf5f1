"""The chat API. Every conversation and turn the caller does not own answers 404."""

import logging
import re

from django.db import transaction
from django.middleware.csrf import get_token
from django.shortcuts import get_object_or_404
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import APIException, PermissionDenied, ValidationError
from rest_framework.response import Response

from .. import assistants
from ..engine import handoff, lifecycle, limits, privacy
from ..models import Conversation, Message, Turn
from ..owners import owned_filter, owner_token, request_visitor
from . import serializers
from .authentication import check_assistant
from .base import Conflict, ConversationAPIView, ServiceUnavailable, owned_conversation, rating_url, turn_summary
from .schema import (CONVERSATION_ID, CSRF_OR_SIGN_IN, ERROR, NOT_FOUND, NOT_JSON, RETRY_AFTER, SIGN_IN, TOO_LARGE,
                     TURN_ID, UNAVAILABLE)
from .throttling import (ConversationIPThrottle, ConversationOwnerThrottle, DeleteIPThrottle, DeleteOwnerThrottle,
                         TurnIPThrottle, TurnOwnerThrottle, client_key)
from ..core.sentences import unavailable_message

logger = logging.getLogger("conversations.api")


class LimitReached(APIException):
    """429 for a cost limit that lifts with time; ``wait`` becomes the ``Retry-After`` header."""

    status_code = status.HTTP_429_TOO_MANY_REQUESTS
    default_code = "limit_reached"

    def __init__(self, detail, wait):
        super().__init__(detail)
        self.wait = wait


class IdempotencyMismatch(APIException):
    status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
    default_code = "idempotency_mismatch"


IDEMPOTENCY_HEADER = "Idempotency-Key"
# Visible ASCII only, as long as the model field: the key is stored and compared as is.
IDEMPOTENCY_PATTERN = r"^[!-~]{1,200}$"
_IDEMPOTENCY_RE = re.compile(IDEMPOTENCY_PATTERN)


class ConversationListView(ConversationAPIView):
    """``POST``: start a conversation owned by the caller. ``GET``: the caller's conversations."""

    def get_throttles(self):
        """Only starting a conversation is limited (it writes a row, and a session for a new visitor)."""
        if self.request.method == "POST":
            return [ConversationOwnerThrottle(), ConversationIPThrottle()]
        return []

    throttle_message = gettext_lazy("You have started too many conversations. Please continue one of them or try "
                                    "again later.")

    @extend_schema(responses={200: serializers.ConversationSerializer(many=True), 403: SIGN_IN, 503: UNAVAILABLE},
                   summary="The caller's 50 most recent conversations")
    def get(self, request):
        if request_visitor(request) is None:  # a visitor token's caller gets no cookie
            get_token(request)  # sets the csrftoken cookie, for a widget on a page Django did not render
        conversations = Conversation.objects.filter(owned_filter(request)).order_by("-created_at")[:50]
        return Response([{"id": str(c.id), "created_at": c.created_at} for c in conversations])

    @extend_schema(request=serializers.ConversationCreateSerializer, parameters=[RETRY_AFTER],
                   responses={201: serializers.NewConversationSerializer,
                              403: OpenApiResponse(ERROR, description="CSRF check failed, the caller is anonymous "
                                                                      "while LOGIN_REQUIRED is on, or the assistant's "
                                                                      "access policy does not allow the caller."),
                              413: TOO_LARGE,
                              415: NOT_JSON, 400: serializers.ValidationErrorSerializer,
                              429: OpenApiResponse(ERROR, description="Too many new conversations (per owner or "
                                                                      "per IP); see Retry-After."),
                              503: UNAVAILABLE},
                   summary="Start a conversation owned by the caller (user, or anonymous session)")
    def post(self, request):
        serializer = serializers.ConversationCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        assistant = serializer.validated_data.get("assistant")
        check_assistant(request, assistant)
        user = request.user if request.user.is_authenticated else None
        if assistant is not None and not assistant.allows(user):
            raise PermissionDenied(assistants.access_refused_message(assistant, user))
        token = owner_token(request, create=True)
        conversation = Conversation.objects.create(user=user, owner_token=token, assistant=assistant)
        return Response({"id": str(conversation.id), "created_at": conversation.created_at,
                         "assistant": assistant.slug if assistant else None}, status=status.HTTP_201_CREATED)


class ConversationDetailView(ConversationAPIView):
    """``GET``: the whole transcript, and the turn still running if there is one (to resume
    polling). ``DELETE``: the owner erases it everywhere (``engine.privacy.erase``)."""

    throttle_message = gettext_lazy("You have deleted too many conversations. Please try again later.")

    def get_throttles(self):
        """Only deleting is limited: each one stops a turn and sweeps Redis."""
        if self.request.method == "DELETE":
            return [DeleteOwnerThrottle(), DeleteIPThrottle()]
        return []

    @extend_schema(parameters=[CONVERSATION_ID, RETRY_AFTER], request=None,
                   responses={204: OpenApiResponse(description="Erased: every message, turn, rating and cached "
                                                               "copy of it is gone."),
                              403: CSRF_OR_SIGN_IN, 404: NOT_FOUND,
                              429: OpenApiResponse(ERROR, description="Too many deletions (DELETE_RATE_PER_OWNER, "
                                                                      "DELETE_RATE_PER_IP); see Retry-After."),
                              503: UNAVAILABLE},
                   summary="Delete a conversation of the caller's everywhere (their own erasure request)")
    def delete(self, request, conversation_id):
        conversation = owned_conversation(request, conversation_id)
        privacy.erase(conversation=conversation.pk, kind="visitor_request", wait=privacy.VISITOR_STOP_WAIT)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(parameters=[CONVERSATION_ID],
                   responses={200: serializers.ConversationDetailSerializer, 403: SIGN_IN, 404: NOT_FOUND,
                              503: UNAVAILABLE},
                   summary="A conversation's transcript and its active turn")
    def get(self, request, conversation_id):
        conversation = owned_conversation(request, conversation_id)
        messages = list(conversation.messages.select_related("author").order_by("id"))
        # One query for every turn, newest first: the active one, the endings and the ratings.
        turns = list(conversation.turns.only("id", "conversation_id", "status", "error", "rating", "rating_comment"))
        active = next((turn for turn in turns if turn.status in Turn.ACTIVE_STATUSES), None)
        ended = [turn for turn in turns if turn.done]
        return Response({
            "id": str(conversation.id),
            "created_at": conversation.created_at,
            "assistant": conversation.assistant.slug if conversation.assistant_id else None,
            "messages": [handoff.message_json(m) for m in messages],
            # Whether staff hold it (the widget then polls the handoff, see api/handoff.py).
            "handoff": conversation.handoff,
            "active_turn": turn_summary(active) if active else None,
            # How each finished turn ended, so that a reloaded widget shows "You stopped this answer." or
            # the failure's sentence again, as the poll's last state did.
            "endings": {str(turn.pk): {"status": turn.status, "error": turn.error or None} for turn in ended},
            "ratings": {str(turn.pk): {"value": turn.rating, "comment": turn.rating_comment}
                        for turn in turns if turn.rating},
            # Where each finished turn's answer is rated (the same URL as its summary's rating_url).
            "rating_urls": {str(turn.pk): rating_url(conversation.id, turn.pk) for turn in ended},
        })


class TurnListView(ConversationAPIView):
    """``POST {"content": "…"}``: save the visitor's message, enqueue the turn, answer 202 with its poll URL.

    Refusals, in the order they are checked: 413 (body too large), 429 (rate limits), 400
    (bad ``Idempotency-Key`` or message), 404 (not the caller's conversation), 409 (a turn is
    still running), 403 (conversation full), 429 (too many turns running in the owner's other
    conversations, or daily token budget spent or held for them, or too many turns running
    from the client's address). A request whose
    ``Idempotency-Key`` was already used in this conversation gets the first turn back (200).
    """

    throttle_classes = [TurnOwnerThrottle, TurnIPThrottle]
    throttle_message = gettext_lazy("You are sending messages too quickly. Please wait a moment and try again.")

    @extend_schema(
        request=serializers.TurnCreateSerializer,
        parameters=[
            CONVERSATION_ID,
            OpenApiParameter(IDEMPOTENCY_HEADER, OpenApiTypes.STR, OpenApiParameter.HEADER, required=False,
                             pattern=IDEMPOTENCY_PATTERN,
                             description="Retrying a POST with the same key returns the same turn (200) "
                                         "instead of starting a second one."),
            RETRY_AFTER,
        ],
        responses={
            202: OpenApiResponse(serializers.TurnSummarySerializer, description=(
                'The turn started. While staff hold the conversation (a handoff, see …/handoff/) no turn '
                'starts: the message is saved for them and the body is {"handoff": "waiting"|"taken", '
                '"message": the saved message} instead (200 with that body for a retried Idempotency-Key).')),
            200: OpenApiResponse(serializers.TurnSummarySerializer, description="A retry: the turn this Idempotency-Key "
                                                                      "already started."),
            400: serializers.ValidationErrorSerializer,
            403: OpenApiResponse(ERROR, description="CSRF check failed, the conversation reached "
                                                    "MAX_TURNS_PER_CONVERSATION, or the caller is anonymous "
                                                    "while LOGIN_REQUIRED is on."),
            404: NOT_FOUND,
            409: OpenApiResponse(ERROR, description="A turn of this conversation is still queued or running, or "
                                                    "staff closed the conversation."),
            413: TOO_LARGE,
            415: NOT_JSON,
            422: OpenApiResponse(ERROR, description="The Idempotency-Key was used for a different message."),
            429: OpenApiResponse(ERROR, description="Too many turns (per owner or per IP), too many running at "
                                                    "once (MAX_ACTIVE_TURNS_PER_OWNER, "
                                                    "MAX_ACTIVE_TURNS_PER_ADDRESS), or the owner's "
                                                    "DAILY_TOKEN_BUDGET is spent or held for running turns; see "
                                                    "Retry-After."),
            503: OpenApiResponse(ERROR, description="Redis is unreachable. Nothing was saved, or, if the enqueue "
                                                    "itself failed, the message was saved and its turn ended "
                                                    "failed with this message; either way, send it again later."),
        },
        summary="Send a message: starts a turn and answers with its poll URL",
    )
    def post(self, request, conversation_id):
        key = self.idempotency_key(request)
        serializer = serializers.TurnCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        content = serializer.validated_data["content"]

        def admit(conversation):
            replayed = self.earlier_turn(conversation, key)
            if replayed is None:
                # Staff hold it: the message is kept for them below, and no turn starts.
                handoff.ensure_with_assistant(conversation)
                counts = limits.TurnCounts(conversation)  # one query for the next two lines
                lifecycle.ensure_idle(conversation, counts)
                self.refuse(limits.check_new_turn(conversation, counts=counts) or address.check())
            return replayed

        try:
            # The address's lock is taken first, then the owner's (start's lock).
            with limits.AddressTurns(client_key(request)) as address:
                turn, created = lifecycle.start(lambda: owned_conversation(request, conversation_id, for_update=True),
                                            content, admit=admit, idempotency_key=key)
                if created:
                    address.add(turn)
        except handoff.Held:
            return self.keep_for_staff(request, conversation_id, content, key)
        except handoff.Refused as exc:
            raise Conflict(exc.message) from None
        except lifecycle.TurnActive:
            raise Conflict(_("The assistant is still answering your previous message. "
                             "Wait for it to finish or stop it first.")) from None
        except lifecycle.QueueUnavailable:
            # The visitor's message may be saved, but its turn has ended failed: they are told to try again.
            logger.exception("Could not enqueue a turn of conversation %s", conversation_id)
            raise ServiceUnavailable(unavailable_message()) from None
        if not created:
            return self.replay(turn, content)
        return Response(turn_summary(turn), status=status.HTTP_202_ACCEPTED)

    @staticmethod
    def keep_for_staff(request, conversation_id, content, key):
        """202 ``{"handoff": …, "message": …}``: staff hold the conversation, so the message is saved
        for them (no turn, no job); 200 with the same body for a retried ``Idempotency-Key`` (422
        for another message); 409 when it went back to the assistant or closed meanwhile."""
        try:
            with transaction.atomic():
                conversation = owned_conversation(request, conversation_id, for_update=True)
                message, created = handoff.keep(conversation, content, key)
        except handoff.Refused as exc:
            raise Conflict(exc.message) from None
        if not created and message.content != content:
            raise IdempotencyMismatch(_("This Idempotency-Key was already used for a different message."))
        body = {"handoff": conversation.handoff, "message": handoff.message_json(message)}
        if not created:
            return Response(body, status=status.HTTP_200_OK, headers={"Idempotent-Replayed": "true"})
        return Response(body, status=status.HTTP_202_ACCEPTED)

    @staticmethod
    def idempotency_key(request):
        """The request's ``Idempotency-Key`` ("" when absent); 400 when it is not 1-200 visible ASCII characters."""
        key = request.headers.get(IDEMPOTENCY_HEADER)
        if key is None:
            return ""
        if not _IDEMPOTENCY_RE.match(key):
            raise ValidationError({"detail": _("The Idempotency-Key header must be 1 to 200 visible ASCII "
                                               "characters (no spaces).")})
        return key

    @staticmethod
    def earlier_turn(conversation, key):
        """The turn of ``conversation`` that ``key`` already started, or None."""
        if not key:
            return None
        return conversation.turns.select_related("conversation").filter(idempotency_key=key).first()

    @staticmethod
    def replay(turn, content):
        """The 200 response for a request whose ``Idempotency-Key`` already started ``turn``;
        422 when that turn was started for a different message."""
        first = turn.messages.filter(role=Message.Role.USER).order_by("id").first()
        if first is not None and first.content != content:
            raise IdempotencyMismatch(_("This Idempotency-Key was already used for a different message."))
        return Response(turn_summary(turn), status=status.HTTP_200_OK, headers={"Idempotent-Replayed": "true"})

    @staticmethod
    def refuse(refusal):
        """Raise the answer to a ``limits.Refusal`` (429 for a limit that lifts with time, else 403); None: go ahead."""
        if refusal is None:
            return
        if refusal.retry_after is not None:
            raise LimitReached(refusal.message, refusal.retry_after)
        raise PermissionDenied(refusal.message)


class TurnCancelView(ConversationAPIView):
    """``POST``: stop a turn. A queued turn ends at once, and a running one whose worker is found dead;
    a running one stops before its next call."""

    @extend_schema(parameters=[CONVERSATION_ID, TURN_ID],
                   request=None, responses={202: serializers.TurnSummarySerializer, 403: CSRF_OR_SIGN_IN,
                                            404: NOT_FOUND, 413: TOO_LARGE, 415: NOT_JSON,
                                            503: OpenApiResponse(ERROR, description="Redis is unreachable: the "
                                                                 "turn is running and cannot be asked to stop, or "
                                                                 "the caller's session cannot be read.")},
                   summary="Stop a turn")
    def post(self, request, conversation_id, turn_id):
        conversation = owned_conversation(request, conversation_id)
        turn = get_object_or_404(conversation.turns.select_related("conversation"), pk=turn_id)
        # Running, with Redis unreachable, the request to stop cannot reach it: RedisDownMixin's 503.
        return Response(turn_summary(lifecycle.stop(turn, end_orphaned=True)), status=status.HTTP_202_ACCEPTED)
