"""The poll's common case, a fresh cached state the caller owns, is answered with plain Django
(``api.poll.FirstLook``), with no view instance and nothing of DRF's; every other poll goes on
through DRF's path with what the first look read. What both must say: the state's JSON with its
ETag, a 304 for that ETag, the CORS ``Vary``, a stranger's 404 (counted as a miss), and a stale
state left to the safety nets."""

import json
import uuid
from types import SimpleNamespace

import django_rq
import pytest
from rq.job import Job

from conversations.api.base import public_state
from conversations.api.poll import TurnDetailView
from conversations.core.sentences import crashed_message
from conversations.infra import state, telemetry
from conversations.models import Turn
from tests.support.helpers import make_client, start_turn

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def no_view_instance(monkeypatch):
    """Fail any poll that makes a ``TurnDetailView`` (DRF's path); returns how many were refused."""
    made = []

    def refuse(self, **kwargs):
        made.append(self)
        raise AssertionError("DRF's path was taken")

    monkeypatch.setattr(TurnDetailView, "__init__", refuse)
    return made


def test_a_fresh_poll_is_the_states_json_with_its_etag_and_a_304_for_that_etag_with_no_view(visitor,
                                                                                             no_view_instance):
    started = start_turn(visitor)
    cached = state.read(started["id"])
    etag = f'"{cached["id"]}-{cached["version"]}"'

    response = visitor.get(started["poll_url"])
    not_modified = visitor.get(started["poll_url"], HTTP_IF_NONE_MATCH=etag)
    among_others = visitor.get(started["poll_url"], HTTP_IF_NONE_MATCH=f'W/"other", {etag}')
    older = visitor.get(started["poll_url"], HTTP_IF_NONE_MATCH=f'"{cached["id"]}-{cached["version"] - 1}"')

    assert response.status_code == 200 and no_view_instance == []
    assert response.content == json.dumps(public_state(cached), ensure_ascii=False, separators=(",", ":")).encode()
    assert (response["ETag"], response["Cache-Control"], response["Content-Type"]) == (
        etag, "private, no-cache", "application/json")
    assert "Origin" in response["Vary"]
    assert (not_modified.status_code, not_modified.content) == (304, b"")
    assert (not_modified["ETag"], not_modified["Cache-Control"]) == (etag, "private, no-cache")
    assert "Origin" in not_modified["Vary"] and not not_modified.has_header("Content-Type")
    assert among_others.status_code == 304
    assert older.status_code == 200 and older.content == response.content


def test_a_strangers_poll_of_a_cached_turn_goes_to_drfs_path_and_counts_as_a_miss(conversations_settings):
    conversations_settings.update(POLL_MISS_RATE_PER_IP="2/min")
    owner = make_client()
    started = start_turn(owner)
    stranger = make_client()

    answers = [stranger.get(started["poll_url"]) for _ in range(3)]

    assert [a.status_code for a in answers] == [404, 404, 429]
    assert answers[0].json()["detail"].startswith("This conversation is no longer available.")
    assert "Origin" in answers[0]["Vary"]
    assert owner.get(started["poll_url"]).status_code == 200  # hits are not counted


def test_a_stale_state_is_left_to_the_dead_job_net_and_the_next_poll_is_fresh_again(visitor,
                                                                                    conversations_settings):
    started = start_turn(visitor, "Hello")
    Job.fetch(Turn.objects.get(pk=started["id"]).job_id, connection=django_rq.get_connection()).delete()
    conversations_settings.update(STALE_AFTER=0)

    ended = visitor.get(started["poll_url"])
    again = visitor.get(started["poll_url"], HTTP_IF_NONE_MATCH=ended["ETag"])

    assert (ended.json()["done"], ended.json()["status"], ended.json()["error"]) == (True, "failed",
                                                                                     crashed_message())
    assert again.status_code == 304  # a done state is never stale: the fast path answers it


def test_a_malformed_id_and_a_refused_token_still_take_drfs_path():
    client = make_client()
    assert client.get(f"/api/conversations/not-a-uuid/turns/{uuid.uuid4()}/").status_code == 404
    refused = client.get(f"/api/conversations/{uuid.uuid4()}/turns/{uuid.uuid4()}/",
                         HTTP_AUTHORIZATION="Bearer not-a-token")
    assert refused.status_code == 401 and refused["WWW-Authenticate"].startswith("Bearer")


def test_a_poll_is_measured_only_once_a_meter_provider_keeps_it(monkeypatch):
    """The API's proxy instrument drops what it is given until a provider is set: a poll then
    skips the measurement altogether; from then on it is made. (Needs the otel extra's SDK, which
    the newest test pair leaves out.)"""
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.metrics._internal.instrument import _ProxyHistogram
    from opentelemetry.sdk.metrics import MeterProvider

    proxy = _ProxyHistogram("conversations.poll.duration", unit="s")
    monkeypatch.setattr(telemetry, "_instruments", SimpleNamespace(polls=proxy))
    measured = []
    monkeypatch.setattr(telemetry, "_measure", lambda *args: measured.append(args))

    telemetry.poll_answered(304, 0.001)
    assert measured == []
    proxy.on_meter_set(MeterProvider().get_meter("test"))
    telemetry.poll_answered(304, 0.001)
    assert measured == [("polls", 0.001, {"http.response.status_code": 304})]


def test_the_ids_in_a_poll_url_are_parsed_once_and_read_as_before(client):
    """The API's id converter keeps the segments it parsed lately (a widget polls the same two):
    the same UUID for the same text, None for what is not one, however long."""
    from conversations.api.urls import AnyUUIDConverter

    converter, turn = AnyUUIDConverter(), uuid.uuid4()

    assert converter.to_python(str(turn)) == turn and converter.to_python(str(turn)) is converter.to_python(str(turn))
    assert converter.to_python(str(turn).upper()) == turn and converter.to_python(turn.hex) == turn
    assert converter.to_python("urn:uuid:" * 20 + str(turn)) == turn  # as uuid.UUID reads it, uncached
    assert converter.to_python("not-a-uuid") is None and converter.to_python("x" * 5000) is None
