"""The OpenAPI pieces the API's views share: error answers and path parameters."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse

from . import serializers


ERROR = serializers.ErrorSerializer


NOT_FOUND = OpenApiResponse(ERROR, description="Not found, or not yours (the API never says which).")

POLL_MISSES = OpenApiResponse(ERROR, description="This client address's polls were answered 404 too often "
                                                 "(POLL_MISS_RATE_PER_IP); Retry-After says when to try again.")


TOO_LARGE = OpenApiResponse(ERROR, description="The body is larger than MAX_REQUEST_BYTES; it was not read.")


NOT_JSON = OpenApiResponse(ERROR, description="The body is not application/json.")


SIGN_IN = OpenApiResponse(ERROR, description="The caller is anonymous while LOGIN_REQUIRED is on: "
                                             "\"Please sign in to chat with the assistant.\"")


CSRF_OR_SIGN_IN = OpenApiResponse(ERROR, description="CSRF check failed (send the csrftoken cookie and "
                                                     "X-CSRFToken), or the caller is anonymous while LOGIN_REQUIRED "
                                                     "is on.")


UNAVAILABLE = OpenApiResponse(ERROR, description="Redis (the cache, the sessions kept there, or the queue) is "
                                                 "unreachable; nothing was changed. Try again later.")


CONVERSATION_ID = OpenApiParameter("conversation_id", OpenApiTypes.UUID, OpenApiParameter.PATH)


TURN_ID = OpenApiParameter("turn_id", OpenApiTypes.UUID, OpenApiParameter.PATH)


RETRY_AFTER = OpenApiParameter("Retry-After", OpenApiTypes.INT, OpenApiParameter.HEADER, response=[429],
                               description="Seconds to wait before trying again.")
