"""Erasure of one person: after a full life in the app (streamed turns, a tool turn that searched
the site's knowledge, a turn resumed after its work horse died, a rating, a handoff answered by
staff, a CSV export made earlier), ``erase`` leaves nothing of theirs in any table, any Redis key
or the captured logs, but the audit entry, which names neither them nor what they said."""

import logging
import os
import signal
import threading
import time

import django_rq
import pytest
from django.apps import apps
from django.contrib.auth.models import User
from django.db import connections
from django.urls import reverse

from conversations.models import Assistant, Conversation, Erasure, Message, Turn
from conversations.privacy import erase, subject_digest
from tests.support.fake_stream import openai_stream, streaming
from tests.support.fakes import FakeProvider, hang
from tests.support.helpers import (Poller, api_post, logged_in_client, poll_until_done, redis_values, run_worker,
                                   staff, wait_for)

pytestmark = pytest.mark.django_db(transaction=True)

SEARCH_SITE = "conversations.knowledge.tool.search_site"
# What the person wrote, and what was written to them: each must be gone after the erasure.
WORDS = ["Quillfeather-7731", "Marzipan Lane 42", "Grumbleton parcel", "Oxbridge-knitting",
         "Violetcomb-staff-reply", "Thistledown-rating-note", "Ploverhaven-answer"]


@pytest.fixture
def life(conversations_settings):
    with FakeProvider() as fake:
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="k", MODEL="m",
                                      TOOLS=[SEARCH_SITE], STREAM=True, MAX_RESUMES=2, JOB_TIMEOUT=20,
                                      DEADLINE_MARGIN=4, CALL_TIMEOUT=10, MAX_ATTEMPTS=1)
        yield fake


def stream(text="", calls=()):
    return streaming(openai_stream(text, calls=calls))


def turn(client, conversation, content):
    response = api_post(client, f"/api/conversations/{conversation}/turns/", {"content": content})
    assert response.status_code == 202, response.content
    return response.json()


def run_killing_the_horse_once(fake, requests):
    """Run the queue in a forking worker, SIGKILLing its work horse once the fake provider has
    had ``requests`` requests: the turn is resumed by a continuation job."""
    connections.close_all()
    worker = django_rq.get_worker("default")
    killed = threading.Event()

    def kill():
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (len(fake.requests) >= requests and worker.horse_pid):
            time.sleep(0.01)
        os.kill(worker.horse_pid, signal.SIGKILL)
        killed.set()

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    worker.work(burst=True)
    thread.join(5)
    connections.close_all()
    assert killed.is_set()


def full_life(fake):
    """A signed-in person's life in the app; returns (their client, what names their data)."""
    Assistant.objects.create(slug="support", name="Help desk", system_prompt="Help.", provider="demo",
                             handoff=Assistant.HandoffWays.BOTH)
    person = logged_in_client("quill")
    conversation = api_post(person, "/api/conversations/").json()["id"]

    # 1. Two streamed turns, the second watched while it streams.
    fake.add(stream("Hello Quillfeather-7731, Ploverhaven-answer."), stream("Marzipan Lane 42 noted."))
    first = turn(person, conversation, "I am Quillfeather-7731, hello")
    run_worker()
    poll_until_done(person, first["poll_url"])
    second = turn(person, conversation, "Send it to Marzipan Lane 42")
    with Poller(person, second["poll_url"]):
        run_worker()
    # 2. A tool turn: the model searches the site's knowledge with the visitor's words.
    fake.add(stream(calls=[("call_1", "search_site", {"query": "Grumbleton parcel"})]),
             stream("Nothing about a Grumbleton parcel."))
    third = turn(person, conversation, "Where is my Grumbleton parcel?")
    run_worker()
    assert poll_until_done(person, third["poll_url"])["status"] == "completed"
    # 3. A turn resumed after its work horse died in the middle of a model call.
    fake.add(hang, stream("Oxbridge-knitting is back."))
    fourth = turn(person, conversation, "Tell me about Oxbridge-knitting")
    run_killing_the_horse_once(fake, len(fake.requests) + 1)
    assert poll_until_done(person, fourth["poll_url"])["status"] == "completed"
    assert Turn.objects.get(pk=fourth["id"]).resumes == 1
    # 4. A rating with a comment.
    rated = api_post(person, f"/api/conversations/{conversation}/turns/{first['id']}/rating/",
                     {"value": "down", "comment": "Thistledown-rating-note"})
    assert rated.status_code == 201
    # 5. A CSV export made earlier by staff: the file is the site's once downloaded.
    admin = staff("root", superuser=True)
    export = admin.post(reverse("admin:conversations_turn_changelist"),
                        {"action": "export_rated_csv", "_selected_action": [first["id"]]})
    assert b"Thistledown-rating-note" in export.content
    # 6. A handoff: the person asks for someone, writes to them, and staff reply.
    handed = api_post(person, "/api/conversations/", {"assistant": "support"}).json()["id"]
    assert api_post(person, f"/api/conversations/{handed}/handoff/").status_code in (200, 201, 202)
    assert turn_or_kept(person, handed, "Quillfeather-7731 wants a person")
    ana = staff("ana", "answer_handoff")
    page = ana.post(reverse("admin:conversations_waitingconversation_change", args=[handed]),
                    {"action": "reply", "content": "Violetcomb-staff-reply"}, follow=True)
    assert page.status_code == 200
    assert person.get(f"/api/conversations/{handed}/handoff/").json()["messages"][-1]["content"] == \
        "Violetcomb-staff-reply"

    turn_ids = [str(pk) for pk in Turn.objects.filter(conversation__user=person.user).values_list("pk", flat=True)]
    ids = [conversation, handed, *turn_ids, *(f"conversations-turn-{pk}" for pk in turn_ids)]
    tokens = list(Conversation.objects.filter(user=person.user).values_list("owner_token", flat=True))
    person.staff = ana
    return person, admin, ids, tokens


def turn_or_kept(client, conversation, content):
    """Post a message to a conversation staff hold: kept for them, with no turn."""
    response = api_post(client, f"/api/conversations/{conversation}/turns/", {"content": content})
    return response.status_code in (200, 201, 202)


def rows_holding(needles, *, skip=()):
    """Every (model, column, needle) of every table of every installed app where a column's value
    holds one of ``needles``."""
    found = []
    for model in apps.get_models():
        if model in skip or not model._meta.managed or model._meta.proxy:
            continue
        columns = [field.attname for field in model._meta.concrete_fields]
        for row in model._base_manager.values_list(*columns):
            for column, value in zip(columns, row):
                text = "" if value is None else str(value)
                found += [(model.__name__, column, needle) for needle in needles if needle in text]
    return found


def redis_holding(needles):
    encoded = [needle.encode() for needle in needles]
    return sorted({needle.decode() for value in redis_values() for needle in encoded
                   if isinstance(value, bytes) and needle in value})


def test_erasing_a_person_after_a_full_life_leaves_nothing_of_theirs_but_the_audit_entry(life, caplog, log_file):
    caplog.set_level(logging.DEBUG)
    person, admin, ids, tokens = full_life(life)
    needles = WORDS + ids
    # Everything is there before: the test looks where the data really is.
    assert {n for _m, _c, n in rows_holding(needles)} == set(needles)
    assert set(redis_holding(needles)) >= set(ids[:2]) | {"Quillfeather-7731", "Violetcomb-staff-reply"}

    inbox = reverse("admin:conversations_waitingconversation_changelist")
    assert ids[1] in person.staff.get(inbox).content.decode()  # the handoff waits in staff's inbox

    entry = erase(user=person.user, by=admin.user)

    assert ids[1] not in person.staff.get(inbox).content.decode()

    assert rows_holding(needles + tokens, skip={Erasure}) == []
    assert redis_holding(needles) == []
    user_keys = [f"user-{person.user.pk}", f"conversations:auth:{person.user.pk}"]
    assert redis_holding(user_keys) == []
    logged = "\n".join(f"{record.getMessage()} {record.__dict__}" for record in caplog.records)
    logged += log_file.read_text()
    assert "conversation turn" in logged and "provider call" in logged  # the work horses' lines are there
    assert [word for word in WORDS + tokens + [person.user.username] if word in logged] == []
    # The audit entry: who erased, when, how many of what, the person as a salted hash only.
    row = Erasure.objects.get()
    assert (row.pk, row.by, row.kind) == (entry.pk, admin.user, "user")
    assert row.subject_digest == subject_digest("user", person.user.pk)
    assert {key: row.counts[key] for key in ("conversations", "turns", "ratings", "messages_staff")} == {
        "conversations": 2, "turns": 4, "ratings": 1, "messages_staff": 1}
    assert row.counts["messages_user"] == 5 and row.counts["jobs"] >= 4 and row.counts["cached"] > 0
    assert rows_holding(needles + tokens + [person.user.username], skip={User}) == []
    # The person's account is the site's: it is still there, and they may start again.
    assert User.objects.filter(pk=person.user.pk).exists()
    assert User.objects.filter(pk=person.user.pk).exists() and not Message.objects.exists()
    listed = person.get("/api/conversations/").json()
    assert listed == [] or listed.get("results") == []


def test_a_turn_in_flight_is_stopped_before_its_rows_go_and_writes_nothing_after(life, worker_process, worker_class):
    life.add(streaming(openai_stream(" ".join(["Quillfeather-7731"] * 200)), interval=0.05))
    person = logged_in_client("quill")
    conversation = api_post(person, "/api/conversations/").json()["id"]
    started = turn(person, conversation, "Marzipan Lane 42, please write a lot")
    worker_process(worker_class=worker_class)
    wait_for(lambda: "Quillfeather-7731" in str(person.get(started["poll_url"]).json()["messages"]),
             what="the answer streaming")

    began = time.monotonic()
    entry = erase(conversation=conversation)

    assert time.monotonic() - began < 8  # stopped, not left to run its 200 words to the end
    assert entry.counts["turns"] == 1 and entry.kind == "conversation" and entry.by is None
    time.sleep(1.5)  # what the stopped job might still have written would be there by now
    ids = [conversation, started["id"]]
    assert rows_holding(ids + ["Quillfeather-7731", "Marzipan Lane 42"], skip={Erasure}) == []
    assert redis_holding(ids + ["Quillfeather-7731", "Marzipan Lane 42"]) == []
    assert person.get(started["poll_url"]).status_code == 404


def test_an_embedded_widgets_visitor_is_erased_by_their_visitor_id_and_nobody_else(conversations_settings):
    from conversations.owners import visitor_owner_token

    assistant = Assistant.objects.create(slug="shop", name="Shop", system_prompt="Help.", provider="demo")
    visitor_id, origin = "a-widgets-visitor-id-0001", "https://shop.example.com"
    theirs = [Conversation.objects.create(owner_token=visitor_owner_token(origin, assistant.pk, visitor_id),
                                          assistant=assistant),
              Conversation.objects.create(owner_token=visitor_owner_token(origin, None, visitor_id))]
    for conversation in theirs:
        Message.objects.create(conversation=conversation, role="user", content="Quillfeather-7731")
    other_site = Conversation.objects.create(owner_token=visitor_owner_token("https://other.example", None,
                                                                             visitor_id))
    someone_else = Conversation.objects.create(owner_token=visitor_owner_token(origin, None, "another-visitor-id-0002"))

    entry = erase(visitor=visitor_id, origin=origin)

    assert entry.counts["conversations"] == 2 and entry.counts["messages_user"] == 2
    assert set(Conversation.objects.values_list("pk", flat=True)) == {other_site.pk, someone_else.pk}
    assert entry.subject_digest == subject_digest("visitor", visitor_id) and visitor_id not in str(entry.counts)


def test_erase_must_be_told_exactly_one_person():
    from conversations.privacy import Ambiguous

    with pytest.raises(Ambiguous):
        erase()
    with pytest.raises(Ambiguous):
        erase(user=1, conversation="x")
    assert not Erasure.objects.exists()
