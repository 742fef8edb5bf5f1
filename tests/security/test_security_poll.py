"""The poll answers a logged-in owner exactly as an anonymous one, in every path: a cached state
costs no SQL query (the session is in the cache and ownership is checked against the state), a
missing or stale one is rebuilt for its owner only, and a session whose user changed password
or was deactivated is refused at once."""

import django_rq
import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from rq.job import Job

from conversations.infra import state
from conversations.core.sentences import crashed_message
from conversations.models import Turn
from tests.support.fakes import FakeProvider, openai_text, openai_tool_calls
from tests.support.helpers import logged_in_client, make_client, poll_until_done, start_turn

pytestmark = pytest.mark.django_db(transaction=True)


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
    """``TurnDetailView.as_view`` answers a fresh cached state with plain Django, before DRF's
    ``initial()`` authenticates, checks permissions and throttles. A throttle, a permission
    other than AllowAny, or an authentication that is not the session's (which the fast path
    reads itself, in ``owns_state``) would then guard only the slow path: most polls would
    pass it unchecked. Whoever adds one must make the fast path apply it, then change this test."""
    from rest_framework.authentication import SessionAuthentication
    from rest_framework.permissions import AllowAny

    from conversations.api.poll import TurnDetailView

    view = TurnDetailView()
    assert view.get_throttles() == []
    assert [type(p) for p in view.get_permissions()] == [AllowAny]
    assert all(isinstance(a, SessionAuthentication) for a in view.get_authenticators())


# -- every path of the poll answers a logged-in owner as it answers an anonymous one ------------

def test_a_missing_state_is_rebuilt_for_its_owner(visitor, worker):
    started = start_turn(visitor, "Hello")
    worker()
    cache.delete(state.state_key(started["id"]))  # evicted, or Redis restarted

    data = visitor.get(started["poll_url"]).json()
    assert (data["done"], data["status"]) == (True, "completed")
    assert make_client().get(started["poll_url"]).status_code == 404


def test_a_turn_queued_past_stale_after_still_polls_for_its_owner(visitor, conversations_settings):
    started = start_turn(visitor, "Hello")
    conversations_settings.update(STALE_AFTER=0)  # every state is stale now
    response = visitor.get(started["poll_url"])
    assert response.status_code == 200 and response.json()["status"] == "queued"


def test_a_dead_turn_is_repaired_for_its_owner(visitor, conversations_settings):
    started = start_turn(visitor, "Hello")
    Job.fetch(Turn.objects.get(pk=started["id"]).job_id, connection=django_rq.get_connection()).delete()
    conversations_settings.update(STALE_AFTER=0)

    data = visitor.get(started["poll_url"]).json()
    assert (data["done"], data["status"], data["error"]) == (True, "failed", crashed_message())


def test_a_row_that_ended_wins_over_a_stale_cached_state_for_its_owner(visitor, conversations_settings):
    started = start_turn(visitor, "Hello")
    Turn.objects.filter(pk=started["id"]).update(status=Turn.Status.CANCELLED)
    conversations_settings.update(STALE_AFTER=0)
    data = visitor.get(started["poll_url"]).json()
    assert (data["done"], data["status"]) == (True, "cancelled")


# -- a session the user no longer stands behind stops polling ----------------------------------

def test_a_password_change_ends_polling_from_the_users_other_sessions(worker):
    owner = logged_in_client("changer")
    started = start_turn(owner, "Hello")
    worker()
    assert owner.get(started["poll_url"]).status_code == 200
    owner.user.is_staff = True  # so that the admin's password change view serves them
    owner.user.save()
    elsewhere = make_client()
    elsewhere.force_login(owner.user)  # the session that should stay in: it changes the password
    assert elsewhere.get(started["poll_url"]).status_code == 200

    response = elsewhere.post("/admin/password_change/", {"old_password": "pw-123456789",
                                                          "new_password1": "a-new-pw-987654",
                                                          "new_password2": "a-new-pw-987654"},
                              HTTP_X_CSRFTOKEN=elsewhere.cookies["csrftoken"].value)
    assert response.status_code in (200, 302)
    owner.user.refresh_from_db()
    assert owner.user.check_password("a-new-pw-987654")

    assert owner.get(started["poll_url"]).status_code == 404  # the old session is over
    assert owner.get(started["poll_url"]).status_code == 404
    assert elsewhere.get(started["poll_url"]).status_code == 200  # update_session_auth_hash kept this one


def test_a_deactivated_user_stops_polling_at_once(worker):
    owner = logged_in_client("leaving")
    started = start_turn(owner, "Hello")
    worker()
    assert owner.get(started["poll_url"]).status_code == 200
    owner.user.is_active = False
    owner.user.save()
    assert owner.get(started["poll_url"]).status_code == 404


def test_a_password_changed_outside_any_view_is_seen_after_the_save(worker):
    owner = logged_in_client("reset")
    started = start_turn(owner, "Hello")
    worker()
    owner.user.set_password("reset-by-an-admin-123")
    owner.user.save()
    assert owner.get(started["poll_url"]).status_code == 404


# -- a login in the middle of a turn ----------------------------------------------------------

def test_logging_in_while_a_turn_runs_keeps_the_users_other_sessions_polling(worker, conversations_settings):
    """The runner's publishes after the login must name the user, not the anonymous owner it
    loaded at the start, or the user's other sessions get 404 from then on."""
    visitor = make_client()
    started = start_turn(visitor, "What time is it in Tokyo?")
    user = get_user_model().objects.create_user("midturn", password="pw-123456789")

    def log_in_meanwhile(handler):
        assert visitor.login(username="midturn", password="pw-123456789")  # claims the conversation
        handler.send_json(200, openai_tool_calls(("current_time", {"city": "Tokyo"})))

    with FakeProvider() as fake:
        fake.add(log_in_meanwhile, openai_text("It is evening in Tokyo."))
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="k")
        worker()

    other_device = make_client()
    other_device.force_login(user)
    data = other_device.get(started["poll_url"]).json()
    assert (data["done"], data["status"]) == (True, "completed")
    assert data["messages"][-1]["content"] == "It is evening in Tokyo."


@pytest.mark.django_db(transaction=True)
def test_polls_that_keep_missing_are_refused_per_address_before_any_lookup(conversations_settings,
                                                                           django_assert_num_queries):
    """A miss costs lookups a hit does not: past POLL_MISS_RATE_PER_IP an address's polls get 429;
    hits are not counted, so the owner's widget keeps polling."""
    import uuid

    conversations_settings.update(POLL_MISS_RATE_PER_IP="3/min")
    owner = make_client()
    turn = start_turn(owner, "Hello")
    prober = make_client()
    misses = [prober.get(f"/api/conversations/{uuid.uuid4()}/turns/{uuid.uuid4()}/") for _ in range(3)]
    misses.append(prober.get(f"/api/conversations/{uuid.uuid4()}/handoff/"))
    with django_assert_num_queries(0):
        refused = prober.get(f"/api/conversations/{uuid.uuid4()}/turns/{uuid.uuid4()}/")
    handoff_refused = prober.get(f"/api/conversations/{uuid.uuid4()}/handoff/")

    assert [m.status_code for m in misses] == [404, 404, 404, 429]
    assert refused.status_code == 429 and handoff_refused.status_code == 429
    assert refused.json()["detail"].startswith("Too many requests from your address asked for chats that are not "
                                               "there. Please wait a moment and reload the page.")
    assert 1 <= int(refused["Retry-After"]) <= 60
    # Hits are not counted: the owner's widget (the same address here) polls on, from the cache.
    assert all(owner.get(turn["poll_url"]).status_code == 200 for _ in range(10))
