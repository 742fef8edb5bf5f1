import functools
import uuid

from django.urls import path, register_converter

from . import approvals, handoff, poll, ratings, tokens, views


def uuid_or_none(value):
    """``value`` as a ``uuid.UUID``, or None when it is not one."""
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


# The path segments parsed lately, each to its UUID or None: a widget polls the same two ids every
# second or so, and parsing one costs a poll more than this look-up (a UUID is immutable, so the
# requests can share it). Segments of a UUID's length at most ("urn:uuid:" and 36): some 4,096 x
# 200 bytes whatever ids clients make up.
_recent_uuids = functools.lru_cache(maxsize=4096)(uuid_or_none)
_LONGEST_UUID = len("urn:uuid:") + 36


class AnyUUIDConverter:
    """Matches any path segment; a valid UUID becomes a ``uuid.UUID``, anything else None.

    Django's own ``uuid`` converter makes a malformed id fall through to the site's HTML 404
    page; with this one the view answers it as it answers an unknown id, with the API's JSON 404.
    """

    regex = "[^/]+"

    def to_python(self, value):
        return _recent_uuids(value) if len(value) <= _LONGEST_UUID else uuid_or_none(value)

    def to_url(self, value):
        return str(value)


register_converter(AnyUUIDConverter, "anyuuid")

app_name = "conversations"

urlpatterns = [
    # First: every widget polls it while a turn runs, and Django tries the patterns in order.
    path("conversations/<anyuuid:conversation_id>/turns/<anyuuid:turn_id>/", poll.TurnDetailView.as_view(),
         name="turn-detail"),
    path("widget-token/", tokens.WidgetTokenView.as_view(), name="widget-token"),
    path("conversations/", views.ConversationListView.as_view(), name="conversation-list"),
    path("conversations/<anyuuid:conversation_id>/", views.ConversationDetailView.as_view(),
         name="conversation-detail"),
    path("conversations/<anyuuid:conversation_id>/handoff/", handoff.HandoffView.as_view(), name="handoff"),
    path("conversations/<anyuuid:conversation_id>/handoff/back/", handoff.HandoffBackView.as_view(),
         name="handoff-back"),
    path("conversations/<anyuuid:conversation_id>/turns/", views.TurnListView.as_view(), name="turn-list"),
    path("conversations/<anyuuid:conversation_id>/turns/<anyuuid:turn_id>/cancel/", views.TurnCancelView.as_view(),
         name="turn-cancel"),
    path("conversations/<anyuuid:conversation_id>/turns/<anyuuid:turn_id>/rating/", ratings.RatingView.as_view(),
         name="turn-rating"),
    path("conversations/<anyuuid:conversation_id>/turns/<anyuuid:turn_id>/approval/",
         approvals.ApprovalView.as_view(), name="turn-approval"),
]
