"""Request bodies are refused before they are parsed when they are larger than ``MAX_REQUEST_BYTES``,
and JSON nested too deeply for the parser is a 400, not a ``RecursionError``."""

import io

from django.utils.translation import gettext as _
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import JSONParser

from ..conf import get_config


class RequestTooLarge(APIException):
    """413: the body is larger than the API accepts."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "too_large"

    def __init__(self, limit):
        super().__init__(_("The request is too large: at most %(limit)d bytes are accepted.") % {"limit": limit})


def check_content_length(request):
    """Raise ``RequestTooLarge`` when the declared ``Content-Length`` is over the limit (nothing is read)."""
    limit = get_config()["MAX_REQUEST_BYTES"]
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if limit and length > limit:
        raise RequestTooLarge(limit)


class LimitedJSONParser(JSONParser):
    """``JSONParser`` that reads at most ``MAX_REQUEST_BYTES`` + 1 bytes, for bodies whose length
    was not declared (chunked) or was declared falsely; raises ``RequestTooLarge`` past it."""

    def parse(self, stream, media_type=None, parser_context=None):
        """Return the parsed JSON, after checking the size of the raw body."""
        limit = get_config()["MAX_REQUEST_BYTES"]
        if limit and stream is not None:
            raw = stream.read(limit + 1)
            if len(raw) > limit:
                raise RequestTooLarge(limit)
            stream = io.BytesIO(raw)
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            # Python's json module recurses once per bracket: a couple of kilobytes of "[[[…"
            # exhaust the stack. No request this API accepts is nested more than two levels.
            raise ParseError(_("The request body is nested too deeply to be read.")) from None
