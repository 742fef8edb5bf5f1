"""``POST …/turns/<turn_id>/approval/``: the visitor approves or declines a tool call their turn
waits for (``engine.approvals``). Only the conversation's owner may (404 for anyone else, as
everywhere in the API: the attempt is recorded in the turn's timeline); the body names the call id
and the SHA-256 of the arguments the state showed, and nothing else; every refusal is a 409 with a
sentence, and the call is not run."""

from django.http import Http404
from django.shortcuts import get_object_or_404
from django.utils.translation import gettext_lazy
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from ..engine import approvals
from ..models import Turn
from . import serializers
from .base import Conflict, ConversationAPIView, owned_conversation
from .schema import (CONVERSATION_ID, CSRF_OR_SIGN_IN, ERROR, NOT_FOUND, NOT_JSON, RETRY_AFTER, TOO_LARGE, TURN_ID,
                     UNAVAILABLE)
from .throttling import ApprovalIPThrottle, ApprovalOwnerThrottle


class ApprovalView(ConversationAPIView):
    """Approve or decline one waiting tool call. The checks, in order: body size (413), CSRF or sign
    in (403), rate limits (429), the body (400), ownership (404), the call and the turn (409)."""

    throttle_classes = [ApprovalOwnerThrottle, ApprovalIPThrottle]
    throttle_message = gettext_lazy("You are answering too quickly. Please wait a moment and try again.")

    @extend_schema(
        parameters=[CONVERSATION_ID, TURN_ID, RETRY_AFTER],
        request=serializers.ApprovalCreateSerializer,
        responses={
            200: OpenApiResponse(serializers.ApprovalSerializer, description="Decided: the turn goes on (the call "
                                                                             "runs once, or the model is told it "
                                                                             "was declined); keep polling."),
            400: serializers.ValidationErrorSerializer,
            403: CSRF_OR_SIGN_IN,
            404: NOT_FOUND,
            409: OpenApiResponse(ERROR, description="Refused, nothing run: no such call waits in this turn, it "
                                                    "was decided already, expired, the turn was stopped or "
                                                    "ended, the arguments' hash differs, or only staff may "
                                                    "approve it."),
            413: TOO_LARGE,
            415: NOT_JSON,
            429: OpenApiResponse(ERROR, description="Too many answers (APPROVAL_RATE_PER_OWNER, "
                                                    "APPROVAL_RATE_PER_IP); see Retry-After."),
            503: UNAVAILABLE,
        },
        summary="Approve or decline a tool call the turn waits for",
    )
    def post(self, request, conversation_id, turn_id):
        serializer = serializers.ApprovalCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        if turn_id is None:
            raise NotFound()
        try:
            conversation = owned_conversation(request, conversation_id)
            turn = get_object_or_404(conversation.turns.select_related("conversation"), pk=turn_id)
        except (NotFound, Http404):
            other = Turn.objects.filter(pk=turn_id).first()
            if other is not None:  # recorded where its staff will see it; the caller reads a plain 404
                approvals.refuse_stranger(other, "sent through a conversation the caller does not own, or "
                                                 "another conversation than the turn's")
            raise
        try:
            approval = approvals.decide(turn, data["call_id"], data["arguments_sha256"],
                                        data["decision"] == "approve")
        except approvals.Refused as exc:
            raise Conflict(exc.message) from None
        return Response({"call_id": approval.call_id, "status": approval.status, "decided_at": approval.decided_at},
                        status=status.HTTP_200_OK)
