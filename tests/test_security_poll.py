"""A poll whose state is cached costs no SQL query, for anonymous visitors and logged-in users:
the session is in the cache and ownership is checked against the cached state."""

import pytest
from django.contrib.auth import get_user_model

from tests.helpers import make_client, poll_until_done, start_turn

pytestmark = pytest.mark.django_db(transaction=True)


def logged_in_client():
    client = make_client()
    client.force_login(get_user_model().objects.create_user("poller", password="pw-123456789"))
    client.get("/")
    client.csrf = client.cookies["csrftoken"].value
    return client


@pytest.fixture(params=["anonymous", "logged_in"])
def visitor(request):
    return make_client() if request.param == "anonymous" else logged_in_client()


def test_polling_a_queued_turn_makes_no_sql_query(visitor, django_assert_num_queries):
    started = start_turn(visitor)
    with django_assert_num_queries(0):
        response = visitor.get(started["poll_url"])
    assert response.status_code == 200 and response.json()["status"] == "queued"


def test_polling_a_finished_turn_and_a_304_make_no_sql_query(visitor, worker, django_assert_num_queries):
    started = start_turn(visitor, "Hello")
    worker()
    poll_until_done(visitor, started["poll_url"])
    with django_assert_num_queries(0):
        response = visitor.get(started["poll_url"])
        not_modified = visitor.get(started["poll_url"], HTTP_IF_NONE_MATCH=response["ETag"])
    assert response.json()["done"] is True
    assert not_modified.status_code == 304


def test_a_strangers_poll_of_a_cached_turn_is_refused_without_sql(visitor, django_assert_num_queries):
    started = start_turn(visitor)
    stranger = make_client()
    with django_assert_num_queries(0):
        assert stranger.get(started["poll_url"]).status_code == 404


def test_the_poll_view_has_no_drf_check_that_its_fast_path_would_skip():
    """``TurnDetailView.dispatch`` answers a fresh cached state with plain Django, before DRF's
    ``initial()`` authenticates, checks permissions and throttles. A throttle, a permission
    other than AllowAny, or an authentication that is not the session's (which the fast path
    reads itself, in ``owns_state``) would then guard only the slow path: most polls would
    pass it unchecked. Whoever adds one must make the fast path apply it, then change this test."""
    from rest_framework.authentication import SessionAuthentication
    from rest_framework.permissions import AllowAny

    from conversations.api.views import TurnDetailView

    view = TurnDetailView()
    assert view.get_throttles() == []
    assert [type(p) for p in view.get_permissions()] == [AllowAny]
    assert all(isinstance(a, SessionAuthentication) for a in view.get_authenticators())
