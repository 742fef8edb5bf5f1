"""A visitor rates an answer: thumbs up or down and a short comment, once per answer and
changeable, only their own (404 otherwise) and only once it has finished (409)."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from conversations.models import Turn
from tests.support.helpers import api_post, make_client, poll_until_done, start_turn

pytestmark = pytest.mark.django_db


def rating_url(turn):
    return f"/api/conversations/{turn['conversation']}/turns/{turn['id']}/rating/"


def finished_turn(client, worker):
    turn = start_turn(client, "How do refunds work?")
    worker()
    poll_until_done(client, turn["poll_url"])
    return turn


@pytest.mark.django_db(transaction=True)
def test_the_owner_rates_an_answer_changes_it_and_sees_it_in_the_conversation(visitor, worker):
    turn = finished_turn(visitor, worker)

    first = api_post(visitor, rating_url(turn), {"value": "down", "comment": "  Too vague.\x00 "})
    changed = api_post(visitor, rating_url(turn), {"value": "up"})

    assert first.status_code == 201
    assert first.json() == {"turn": turn["id"], "value": "down", "comment": "Too vague.",
                            "rated_at": first.json()["rated_at"]}
    assert changed.status_code == 200 and changed.json()["value"] == "up" and changed.json()["comment"] == ""
    row = Turn.objects.get(pk=turn["id"])
    assert (row.rating, row.rating_comment) == ("up", "") and row.rated_at is not None
    detail = visitor.get(f"/api/conversations/{turn['conversation']}/").json()
    assert detail["ratings"] == {turn["id"]: {"value": "up", "comment": ""}}


@pytest.mark.django_db(transaction=True)
def test_someone_elses_answer_is_not_found(worker):
    owner, stranger = make_client(), make_client()
    turn = finished_turn(owner, worker)

    response = api_post(stranger, rating_url(turn), {"value": "down"})

    assert response.status_code == 404
    assert Turn.objects.get(pk=turn["id"]).rating == ""
    bad_id = rating_url({"conversation": turn["conversation"], "id": "not-a-uuid"})
    assert api_post(owner, bad_id, {"value": "up"}).status_code == 404


def test_an_unfinished_answer_cannot_be_rated_yet():
    client = make_client()
    turn = start_turn(client, "Hello")  # queued: no worker runs it

    response = api_post(client, rating_url(turn), {"value": "up"})

    assert response.status_code == 409
    assert response.json() == {"detail": "Only a finished answer can be rated. Wait for it to finish."}


def test_bad_ratings_are_refused_with_a_sentence():
    client = make_client()
    turn = start_turn(client, "Hello")
    Turn.objects.filter(pk=turn["id"]).update(status="completed")

    def refused(body):
        response = api_post(client, rating_url(turn), body)
        assert response.status_code == 400, response.content
        return response.json()

    assert refused({}) == {"value": ["Rate the answer “up” or “down”."]}
    assert refused({"value": "meh"}) == {"value": ["Rate the answer “up” or “down”."]}
    assert refused({"value": "up", "comment": "x" * 501}) == {
        "comment": ["The comment is too long: at most 500 characters are allowed."]}
    # The limit is on the comment as sent (as the schema's maxLength says), before control characters go.
    assert refused({"value": "up", "comment": "x" * 500 + "\u0092"}) == {
        "comment": ["The comment is too long: at most 500 characters are allowed."]}
    assert refused({"value": "up", "comment": 5}) == {"comment": ["The comment must be text."]}
    assert api_post(client, rating_url(turn), {"value": "up", "comment": "x" * 500}).status_code == 201
    no_csrf = client.post(rating_url(turn), '{"value": "up"}', content_type="application/json")
    assert no_csrf.status_code == 403


def test_ratings_are_throttled_per_owner(conversations_settings):
    conversations_settings.update(RATING_RATE_PER_OWNER="2/min")
    client = make_client()
    turn = start_turn(client, "Hello")
    Turn.objects.filter(pk=turn["id"]).update(status="completed")

    answers = [api_post(client, rating_url(turn), {"value": "up"}) for _ in range(3)]

    assert [a.status_code for a in answers] == [201, 200, 429]
    assert answers[2].json()["detail"].startswith("You are rating answers too quickly. Please wait a moment")
    assert int(answers[2]["Retry-After"]) > 0


def test_ratings_are_throttled_per_client_address_across_owners(conversations_settings):
    conversations_settings.update(RATING_RATE_PER_OWNER="", RATING_RATE_PER_IP="2/min")

    def rate(**extra):
        client = make_client()  # a new owner each time: cookies thrown away
        turn = start_turn(client, "Hello")
        Turn.objects.filter(pk=turn["id"]).update(status="completed")
        return api_post(client, rating_url(turn), {"value": "up"}, **extra)

    answers = [rate() for _ in range(3)]

    assert [a.status_code for a in answers] == [201, 201, 429]
    assert answers[2].json()["detail"].startswith("You are rating answers too quickly.")
    assert rate(REMOTE_ADDR="10.1.2.3").status_code == 201  # another address is not slowed down


def test_ratings_from_one_ipv6_network_share_the_per_address_limit(conversations_settings):
    conversations_settings.update(RATING_RATE_PER_IP="2/min", RATING_RATE_PER_OWNER="")
    clients = [make_client() for _ in range(4)]
    turns = [start_turn(client, "Hello") for client in clients]
    Turn.objects.update(status="completed")

    answers = [api_post(client, rating_url(turn), {"value": "up"}, REMOTE_ADDR=f"2001:db8:5:6::{n + 1}").status_code
               for n, (client, turn) in enumerate(zip(clients, turns))]

    assert answers == [201, 201, 429, 429]


@pytest.mark.django_db(transaction=True)
def test_the_turn_summary_and_the_transcript_say_where_to_rate_the_answer(visitor, worker):
    turn = finished_turn(visitor, worker)
    assert turn["rating_url"] == rating_url(turn)
    response = api_post(visitor, turn["rating_url"], {"value": "up"})
    assert response.status_code == 201 and response.json()["value"] == "up"
    detail = visitor.get(f"/api/conversations/{turn['conversation']}/").json()
    assert detail["rating_urls"] == {turn["id"]: turn["rating_url"]}


def test_the_transcript_reads_its_turns_in_one_query_however_many_there_are():
    client = make_client()
    conversation = api_post(client, "/api/conversations/").json()["id"]
    url = f"/api/conversations/{conversation}/"

    def read():
        with CaptureQueriesContext(connection) as queries:
            detail = client.get(url).json()
        turns = [q["sql"] for q in queries if '"conversations_turn"' in q["sql"].split(" WHERE ")[0]]
        return detail, (len(turns), len(queries))

    statuses = [Turn.Status.COMPLETED, Turn.Status.FAILED, Turn.Status.CANCELLED]
    now = timezone.now()
    rows = [Turn.objects.create(conversation_id=conversation, status=status, error="Sorry." if status == "failed"
                                else "", rating="up" if status == "completed" else "", rating_comment="Clear.",
                                enqueued_at=now - timedelta(minutes=10 - n), finished_at=now)
            for n, status in enumerate(statuses)]
    few, few_queries = read()
    active = Turn.objects.create(conversation_id=conversation, status=Turn.Status.RUNNING, enqueued_at=now)
    for n in range(20):
        Turn.objects.create(conversation_id=conversation, status=Turn.Status.COMPLETED, enqueued_at=now,
                            finished_at=now)
    many, many_queries = read()

    # One query reads the turns (the active one, the endings, the ratings), and the page's total
    # does not grow with them.
    assert few_queries == many_queries and few_queries[0] == 1
    completed, failed, cancelled = (str(row.pk) for row in rows)
    assert few["endings"] == {cancelled: {"status": "cancelled", "error": None},
                              failed: {"status": "failed", "error": "Sorry."},
                              completed: {"status": "completed", "error": None}}
    assert few["ratings"] == {completed: {"value": "up", "comment": "Clear."}}
    assert set(few["rating_urls"]) == {completed, failed, cancelled} and few["active_turn"] is None
    assert many["active_turn"]["id"] == str(active.pk) and many["active_turn"]["status"] == "running"
    assert len(many["endings"]) == len(many["rating_urls"]) == 23 and many["ratings"] == few["ratings"]
