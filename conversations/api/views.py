"""The chat API. Every conversation and turn the caller does not own answers 404."""

import logging
import time

from django.db import transaction
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils.translation import gettext as _
from redis.exceptions import RedisError
from rest_framework import status
from rest_framework.exceptions import APIException, NotFound
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import jobs, state
from ..conf import get_config
from ..models import Conversation, Turn
from ..owners import owned_filter, owner_token, owns_state
from .authentication import CsrfSessionAuthentication
from .serializers import TurnCreateSerializer

logger = logging.getLogger("conversations.api")

PUBLIC_FIELDS = ("id", "conversation", "status", "done", "messages", "error", "version")


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"


class ServiceUnavailable(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "unavailable"


def poll_url(turn):
    return reverse("conversations:turn-detail", args=[turn.conversation_id, turn.id])


def turn_summary(turn):
    return {
        "id": str(turn.id),
        "conversation": str(turn.conversation_id),
        "status": turn.status,
        "done": turn.done,
        "poll_url": poll_url(turn),
        "cancel_url": reverse("conversations:turn-cancel", args=[turn.conversation_id, turn.id]),
    }


def public_state(data):
    return {key: data.get(key) for key in PUBLIC_FIELDS}


def owned_conversation(request, conversation_id, *, for_update=False):
    queryset = Conversation.objects.filter(owned_filter(request))
    if for_update:
        queryset = queryset.select_for_update()
    return get_object_or_404(queryset, pk=conversation_id)


class ConversationListView(APIView):
    """``POST``: start a conversation owned by the caller. ``GET``: the caller's conversations."""

    authentication_classes = [CsrfSessionAuthentication]
    permission_classes = [AllowAny]

    def get(self, request):
        conversations = Conversation.objects.filter(owned_filter(request)).order_by("-created_at")[:50]
        return Response([{"id": str(c.id), "created_at": c.created_at} for c in conversations])

    def post(self, request):
        user = request.user if request.user.is_authenticated else None
        token = owner_token(request, create=True)
        conversation = Conversation.objects.create(user=user, owner_token=token)
        return Response({"id": str(conversation.id), "created_at": conversation.created_at},
                        status=status.HTTP_201_CREATED)


class ConversationDetailView(APIView):
    """The whole transcript, and the turn still running if there is one (to resume polling)."""

    authentication_classes = [CsrfSessionAuthentication]
    permission_classes = [AllowAny]

    def get(self, request, conversation_id):
        conversation = owned_conversation(request, conversation_id)
        messages = list(conversation.messages.order_by("id"))
        active = conversation.turns.filter(status__in=[Turn.Status.QUEUED, Turn.Status.RUNNING]).first()
        return Response({
            "id": str(conversation.id),
            "created_at": conversation.created_at,
            "messages": [{**state.message_dict(m), "turn": str(m.turn_id)} for m in messages],
            "active_turn": turn_summary(active) if active else None,
        })


class TurnListView(APIView):
    """``POST {"content": "…"}``: save the visitor's message, enqueue the turn, answer 202 with its poll URL."""

    authentication_classes = [CsrfSessionAuthentication]
    permission_classes = [AllowAny]

    def post(self, request, conversation_id):
        serializer = TurnCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        with transaction.atomic():
            conversation = owned_conversation(request, conversation_id, for_update=True)
            if conversation.turns.filter(status__in=[Turn.Status.QUEUED, Turn.Status.RUNNING]).exists():
                raise Conflict(_("The assistant is still answering your previous message. "
                                 "Wait for it to finish or stop it first."))
            try:
                # Inside atomic(): django-rq enqueues at commit, after the message is saved.
                turn = jobs.create_turn(conversation, serializer.validated_data["content"])
            except RedisError:
                logger.exception("Could not enqueue turn %s", turn.id)
                transaction.set_rollback(True)
                raise ServiceUnavailable(_("The assistant is unavailable right now. Please try again in a minute."))
        try:
            state.publish(state.state_from_db(turn))
        except RedisError:
            logger.exception("Could not publish the queued state of turn %s", turn.id)
        return Response(turn_summary(turn), status=status.HTTP_202_ACCEPTED)


class TurnDetailView(APIView):
    """The poll view. A state in the cache is served with no SQL query (ownership is in the state);
    a missing or stale one is rebuilt from the database, and a turn whose job died is ended."""

    authentication_classes = []  # the owner is read from the session; see owners.owns_state
    permission_classes = [AllowAny]

    def get(self, request, conversation_id, turn_id):
        data = state.read(turn_id)
        if data is None or self.is_stale(data):
            data = self.rebuild(request, conversation_id, turn_id)
        if data["conversation"] != str(conversation_id) or not owns_state(request, data["owner"]):
            raise NotFound()
        etag = f'"{data["id"]}-{data["version"]}"'
        headers = {"ETag": etag, "Cache-Control": "private, no-cache"}
        if etag in request.headers.get("If-None-Match", ""):
            return Response(status=status.HTTP_304_NOT_MODIFIED, headers=headers)
        return Response(public_state(data), headers=headers)

    @staticmethod
    def is_stale(data):
        return not data["done"] and time.time() - data.get("updated_at", 0) > get_config()["STALE_AFTER"]

    def rebuild(self, request, conversation_id, turn_id):
        conversation = owned_conversation(request, conversation_id)
        turn = get_object_or_404(conversation.turns.select_related("conversation"), pk=turn_id)
        repaired = jobs.repair_if_dead(turn)
        if repaired is not None:
            return repaired
        cached = state.read(turn_id)
        return cached if cached is not None else state.publish(state.state_from_db(turn))


class TurnCancelView(APIView):
    """``POST``: stop a turn. A queued turn ends at once; a running one stops before its next call."""

    authentication_classes = [CsrfSessionAuthentication]
    permission_classes = [AllowAny]

    def post(self, request, conversation_id, turn_id):
        conversation = owned_conversation(request, conversation_id)
        turn = get_object_or_404(conversation.turns.select_related("conversation"), pk=turn_id)
        turn = jobs.cancel_turn(turn)
        return Response(turn_summary(turn), status=status.HTTP_202_ACCEPTED)
