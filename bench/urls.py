"""The project's URLs plus a bare view: the baseline the poll view is measured against.

``bare_poll`` returns the same cached state, serialised to the same JSON bytes, with nothing
else: no DRF, no session, no ownership check, no ETag. Whatever the poll view costs beyond it
is the price of those.

``bare_enqueue`` (in ``bench.bare``) is the turn-overhead benchmark's baseline for the POST
that starts a turn: it only enqueues the bare job. ``seed_enqueue`` is the design's own view,
plainly written: the floor a turn's POST is measured against.
"""

import json

from django.http import HttpResponse
from django.urls import path

from bench.bare import bare_enqueue, seed_enqueue
from chatproject.urls import urlpatterns as site_urlpatterns
from conversations.infra import state
from conversations.api.base import public_state


def bare_poll(request, turn_id):
    data = state.read(turn_id)
    if data is None:
        return HttpResponse(status=404)
    body = json.dumps(public_state(data), separators=(",", ":"), ensure_ascii=False).encode()
    return HttpResponse(body, content_type="application/json")


def bare_poll_with_session(request, turn_id):
    """The bare view plus the one thing the poll view cannot skip: reading the visitor's session."""
    request.session.get("conversations_owner")
    return bare_poll(request, turn_id)


# The bench's views first (the poll tries them, and fails them, before the site's), then the
# site's patterns themselves, as a site lists its own at the root: through ``include("")`` every
# URL of the site would be one level deeper here than in the site, a level (a resolver's match and
# its bookkeeping) that only the poll would pay.
urlpatterns = [
    path("bench/bare/<uuid:turn_id>/", bare_poll),
    path("bench/bare-session/<uuid:turn_id>/", bare_poll_with_session),
    path("bench/bare-job/", bare_enqueue),
    path("bench/seed-job/", seed_enqueue),
    *site_urlpatterns,
]
