"""``POST …/turns/<turn_id>/rating/``: the visitor's thumbs up or down, and a short comment, on
one answer. One rating per turn, changed by posting again; only the conversation's owner may
rate (404 for anyone else, as everywhere in the API), and only a finished turn (409)."""

from django.shortcuts import get_object_or_404
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from ..models import Turn
from . import serializers
from .throttling import RatingIPThrottle, RatingOwnerThrottle
from .base import Conflict, ConversationAPIView, owned_conversation
from .schema import (CONVERSATION_ID, CSRF_OR_SIGN_IN, ERROR, NOT_FOUND, NOT_JSON, RETRY_AFTER, TOO_LARGE, TURN_ID,
                     UNAVAILABLE)


class RatingView(ConversationAPIView):
    """Rate a finished answer. The checks, in order: body size (413), CSRF or sign-in (403), rate
    limits (429), the body (400), ownership (404), the turn finished (409); 503 when Redis is down."""

    throttle_classes = [RatingOwnerThrottle, RatingIPThrottle]
    throttle_message = gettext_lazy("You are rating answers too quickly. Please wait a moment and try again.")

    @extend_schema(
        parameters=[CONVERSATION_ID, TURN_ID, RETRY_AFTER],
        request=serializers.RatingCreateSerializer,
        responses={
            201: OpenApiResponse(serializers.RatingSerializer, description="The answer's first rating."),
            200: OpenApiResponse(serializers.RatingSerializer, description="The rating replaced the earlier one."),
            400: serializers.ValidationErrorSerializer,
            403: CSRF_OR_SIGN_IN,
            404: NOT_FOUND,
            409: OpenApiResponse(ERROR, description="The turn is still queued or running: only a finished answer "
                                                    "can be rated."),
            413: TOO_LARGE,
            415: NOT_JSON,
            429: OpenApiResponse(ERROR, description="Too many ratings (RATING_RATE_PER_OWNER, RATING_RATE_PER_IP); "
                                                    "see Retry-After."),
            503: UNAVAILABLE,
        },
        summary="Rate an answer: thumbs up or down, with an optional comment",
    )
    def post(self, request, conversation_id, turn_id):
        serializer = serializers.RatingCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        value, comment = serializer.validated_data["value"], serializer.validated_data["comment"]
        conversation = owned_conversation(request, conversation_id)
        if turn_id is None:
            raise NotFound()
        turn = get_object_or_404(conversation.turns, pk=turn_id)
        rated_at = timezone.now()
        # Conditional on the row, not on what was read: a turn that has not ended is never rated.
        updated = Turn.objects.filter(pk=turn.pk, status__in=Turn.DONE_STATUSES).update(
            rating=value, rating_comment=comment, rated_at=rated_at)
        if not updated:
            raise Conflict(_("Only a finished answer can be rated. Wait for it to finish."))
        return Response({"turn": str(turn.id), "value": value, "comment": comment, "rated_at": rated_at},
                        status=status.HTTP_200_OK if turn.rating else status.HTTP_201_CREATED)
