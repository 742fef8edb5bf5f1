"""A conversation handed to a person: the visitor's button or the assistant's tool asks for one,
staff answer from the admin's inbox (one at a time), the visitor's poll shows every reply, and
handing back lets the assistant answer again, with the staff's words in its history."""

import threading
import time

import django_rq
import pytest
from django.contrib.auth.models import Permission, User
from django.core import mail
from django.core.cache import cache
from django.db import connections
from django.db.models import F
from django.test import Client
from django.urls import reverse

from conversations.engine import handoff
from conversations.infra import state
from conversations.models import Assistant, Conversation, Message, Turn
from conversations.signals import handoff_requested, handoff_taken
from tests.support.fakes import FakeProvider, openai_text, openai_tool_calls
from tests.support.helpers import api_post, at_once, local_key, make_client, poll_until_done

INBOX = "/admin/conversations/waitingconversation/"


def make_assistant(slug="support", **fields):
    values = {"name": "Help desk", "system_prompt": "You are the help desk.", "provider": "demo",
              "handoff": Assistant.HandoffWays.BOTH}
    return Assistant.objects.create(slug=slug, **{**values, **fields})


def staff_member(username="ana", first_name="Ana", *, allowed=True):
    """A logged-in staff client (not a superuser), with ``answer_handoff`` when ``allowed``."""
    user = User.objects.create_user(username, first_name=first_name, is_staff=True)
    if allowed:
        user.user_permissions.add(Permission.objects.get(codename="answer_handoff"))
    client = Client()
    client.force_login(user)
    client.user = user
    return client


def new_conversation(client, assistant="support"):
    response = api_post(client, "/api/conversations/", {"assistant": assistant})
    assert response.status_code == 201, response.content
    return response.json()["id"]


def waiting_for_a_person():
    """The "support" assistant, a visitor, and their conversation waiting for a person (the
    visitor pressed the button); returns the visitor's client and the conversation's id."""
    make_assistant()
    visitor = make_client()
    conversation = new_conversation(visitor)
    api_post(visitor, handoff_url(conversation))
    return visitor, conversation


def handoff_url(conversation_id):
    return f"/api/conversations/{conversation_id}/handoff/"


def send(client, conversation_id, content):
    return api_post(client, f"/api/conversations/{conversation_id}/turns/", {"content": content})


def answer_page(conversation_id):
    return reverse("admin:conversations_waitingconversation_change", args=[conversation_id])


def act(staff, conversation_id, action, content=""):
    return staff.post(answer_page(conversation_id), {"action": action, "content": content}, follow=True)


class Received:
    """Every ``signal`` sent while the test runs, in this process or a forked work horse (which
    inherits the receiver): each is kept in the cache, as ``{"conversation": id, …}``."""

    def __init__(self, signal):
        self.signal, self.key = signal, f"test-received-{id(self)}"
        signal.connect(self.receive, dispatch_uid=self.key)

    def receive(self, sender, conversation, **kwargs):
        values = {key: getattr(value, "username", value) for key, value in kwargs.items() if key != "signal"}
        cache.set(self.key, cache.get(self.key, []) + [{"conversation": str(conversation.pk), **values}])

    @property
    def calls(self):
        return cache.get(self.key, [])

    def close(self):
        self.signal.disconnect(dispatch_uid=f"test-{id(self)}")


@pytest.fixture
def received():
    made = []

    def listen(signal):
        made.append(Received(signal))
        return made[-1]
    yield listen
    for each in made:
        each.close()


@pytest.mark.django_db(transaction=True)
def test_the_button_hands_over_and_what_the_visitor_writes_meanwhile_is_kept_with_no_turn(
        conversations_settings, received):
    conversations_settings.update(HANDOFF_EMAILS=["support@example.com"])
    make_assistant()
    requested = received(handoff_requested)
    visitor = make_client()
    conversation = new_conversation(visitor)

    asked = api_post(visitor, handoff_url(conversation))
    kept = [send(visitor, conversation, text) for text in ("Hello?", "I was charged twice.", "Order 1234.")]

    assert asked.status_code == 202 and asked.json()["state"] == "waiting" and asked.json()["expired"] is False
    assert [r.status_code for r in kept] == [202, 202, 202]
    assert kept[0].json()["handoff"] == "waiting" and kept[0].json()["message"]["content"] == "Hello?"
    # No turn, no job: the assistant does not answer a conversation staff hold.
    assert not Turn.objects.filter(conversation_id=conversation).exists()
    assert django_rq.get_queue("default").count == 0
    polled = visitor.get(handoff_url(conversation))
    assert [m["content"] for m in polled.json()["messages"]] == ["Hello?", "I was charged twice.", "Order 1234."]
    unchanged = visitor.get(handoff_url(conversation), HTTP_IF_NONE_MATCH=polled["ETag"])
    assert unchanged.status_code == 304
    # The signal and the mail went out once, with where to answer it.
    assert [(c["conversation"], c["how"]) for c in requested.calls] == [(conversation, "button")]
    assert len(mail.outbox) == 1 and mail.outbox[0].to == ["support@example.com"]
    assert answer_page(conversation) in mail.outbox[0].body and "Help desk" in mail.outbox[0].subject
    # Someone else's conversation is not found.
    assert make_client().get(handoff_url(conversation)).status_code == 404


@pytest.mark.django_db(transaction=True)
def test_the_assistant_hands_over_with_its_tool_and_stops_answering(worker, conversations_settings, received):
    conversations_settings.update(CREDENTIALS={"key": local_key("sk-test")})
    requested = received(handoff_requested)
    with FakeProvider() as api:
        api.add(openai_tool_calls(("hand_to_person", {"reason": "A refund dispute."})))
        make_assistant(provider="openai", base_url=api.url, credential="key", handoff=Assistant.HandoffWays.TOOL)
        visitor = make_client()
        conversation = new_conversation(visitor)
        turn = send(visitor, conversation, "I want to talk to a human about my refund.").json()
        worker()
        final = poll_until_done(visitor, turn["poll_url"])
        later = send(visitor, conversation, "Are you there?")

    assert final["status"] == "completed" and final["messages"][-1]["content"] == handoff.HANDED_OVER
    assert [t["function"]["name"] for t in api.requests[0]["json"]["tools"]] == ["hand_to_person"]
    assert Conversation.objects.get(pk=conversation).handoff == "waiting"
    assert [(c["how"], c["reason"]) for c in requested.calls] == [("tool", "A refund dispute.")]
    assert later.status_code == 202 and later.json()["handoff"] == "waiting"
    assert Turn.objects.filter(conversation_id=conversation).count() == 1 and len(api.requests) == 1
    # The button is not offered by this assistant: refused with a sentence.
    refused = api_post(visitor, handoff_url(new_conversation(visitor)))
    assert refused.status_code == 403
    assert refused.json() == {"detail": "This assistant cannot hand the conversation to a person."}


@pytest.mark.django_db(transaction=True)
def test_two_staff_members_cannot_both_take_it(received):
    make_assistant()
    taken = received(handoff_taken)
    visitor = make_client()
    conversation = new_conversation(visitor)
    api_post(visitor, handoff_url(conversation))
    ana, ben = staff_member("ana", "Ana"), staff_member("ben", "Ben")

    results = at_once(lambda: act(ana, conversation, "take"), lambda: act(ben, conversation, "take"))

    pages = [r.content.decode() for r in results]
    winners = [page for page in pages if "You are answering this conversation." in page]
    losers = [page for page in pages if "is already answering this conversation." in page]
    assert len(winners) == 1 and len(losers) == 1
    row = Conversation.objects.get(pk=conversation)
    assert row.handoff == "taken" and row.handoff_by.username in losers[0]
    assert [c["user"] for c in taken.calls] == [row.handoff_by.username]  # once
    # The one who did not take it cannot reply; what they wrote stays on their page.
    loser = ben if row.handoff_by.username == "ana" else ana
    page = act(loser, conversation, "reply", "I can help!").content.decode()
    assert "Nothing was sent" in page and "I can help!" in page
    assert not Message.objects.filter(role="staff").exists()
    # The visitor's poll says who joined.
    assert visitor.get(handoff_url(conversation)).json()["by"] == f"{row.handoff_by.first_name} from support"


@pytest.mark.django_db(transaction=True)
def test_a_staff_reply_reaches_the_visitors_poll_and_the_transcript_as_text(conversations_settings):
    conversations_settings.update(HANDOFF_STAFF_NAME="{first_name} of the shop")
    visitor, conversation = waiting_for_a_person()
    send(visitor, conversation, "Is anyone there?")
    ana = staff_member()
    before = visitor.get(handoff_url(conversation))

    inbox = ana.get(INBOX).content.decode()
    page = act(ana, conversation, "reply", "Hi, Ana here. <b>Let me check.</b>").content.decode()

    assert "Is anyone there?" in inbox and "Help desk" in inbox
    assert "Your reply was sent." in page and "&lt;b&gt;Let me check.&lt;/b&gt;" in page
    polled = visitor.get(handoff_url(conversation), HTTP_IF_NONE_MATCH=before["ETag"])
    assert polled.status_code == 200
    assert polled.json()["state"] == "taken" and polled.json()["by"] == "Ana of the shop"
    assert polled.json()["messages"][-1] == {"id": polled.json()["messages"][-1]["id"], "role": "staff",
                                             "content": "Hi, Ana here. <b>Let me check.</b>", "turn": None,
                                             "author": "Ana of the shop"}
    staff_row = Message.objects.get(role="staff")
    assert staff_row.author == ana.user
    # After a reload the widget reads the same from the conversation.
    detail = visitor.get(f"/api/conversations/{conversation}/").json()
    assert detail["handoff"] == "taken"
    assert [(m["role"], m["content"]) for m in detail["messages"]] == [
        ("user", "Is anyone there?"), ("staff", "Hi, Ana here. <b>Let me check.</b>")]
    # Without the permission, neither the inbox nor the page.
    stranger = staff_member("carl", "Carl", allowed=False)
    assert stranger.get(INBOX).status_code == 403
    assert stranger.get(answer_page(conversation)).status_code == 403


@pytest.mark.django_db(transaction=True)
def test_handing_back_lets_the_assistant_answer_with_the_staff_messages_in_its_history(
        worker, conversations_settings):
    conversations_settings.update(CREDENTIALS={"key": local_key("sk-test")})
    with FakeProvider() as api:
        api.add(openai_text("Your refund is on its way, as Ana said."))
        make_assistant(provider="openai", base_url=api.url, credential="key")
        visitor = make_client()
        conversation = new_conversation(visitor)
        api_post(visitor, handoff_url(conversation))
        send(visitor, conversation, "Where is my refund?")
        ana = staff_member()
        act(ana, conversation, "reply", "I have sent it today.")
        handed = act(ana, conversation, "hand_back").content.decode()
        turn = send(visitor, conversation, "Thanks! When will it arrive?")
        assert turn.status_code == 202 and "poll_url" in turn.json(), turn.content
        worker()
        final = poll_until_done(visitor, turn.json()["poll_url"])

    assert "Handed back to the assistant." in handed
    assert final["status"] == "completed"
    sent = api.requests[0]["json"]["messages"]
    assert sent[1:] == [
        {"role": "user", "content": "Where is my refund?"},
        {"role": "assistant", "content": "[A person from the site's staff wrote to the visitor:] I have sent it today."},
        {"role": "user", "content": "Thanks! When will it arrive?"}]
    assert visitor.get(handoff_url(conversation)).json()["state"] == "returned"
    # Handed back, staff cannot reply any more: refused, nothing saved.
    page = act(ana, conversation, "reply", "One more thing").content.decode()
    assert "This conversation is back with the assistant; nothing was sent." in page
    assert Message.objects.filter(role="staff").count() == 1


@pytest.mark.django_db(transaction=True)
def test_bad_requests_are_refused_with_a_sentence_and_nothing_is_lost():
    visitor, conversation = waiting_for_a_person()

    twice = api_post(visitor, handoff_url(conversation))
    ana = staff_member()
    empty = act(ana, conversation, "reply", "   ").content.decode()
    too_long = act(ana, conversation, "reply", "x" * 4001).content.decode()
    closed = act(ana, conversation, "close").content.decode()
    after_close = act(ana, conversation, "reply", "Hello again").content.decode()
    written = send(visitor, conversation, "Wait, one more question")
    asked_again = api_post(visitor, handoff_url(conversation))

    assert twice.status_code == 409
    assert twice.json() == {"detail": "A person has already been asked for: they will reply here."}
    assert "Write a reply first; nothing was sent." in empty
    assert "A reply may have at most 4000 characters; nothing was sent." in too_long
    assert "The conversation is closed." in closed
    assert "This conversation is closed; nothing was sent." in after_close and "Hello again" in after_close
    assert written.status_code == 409 and asked_again.status_code == 409
    assert written.json() == {"detail": "This conversation was closed by our staff. Please start a new one to write "
                                        "again."}
    assert not Message.objects.exists() and not Turn.objects.exists()
    assert ana.get(answer_page("not-a-uuid")).status_code == 404


@pytest.mark.django_db(transaction=True)
def test_a_visitor_no_one_answered_in_time_is_told_and_goes_back_to_the_assistant(conversations_settings):
    conversations_settings.update(HANDOFF_WAIT=0)
    make_assistant()
    visitor = make_client()
    conversation = new_conversation(visitor)
    asked = api_post(visitor, handoff_url(conversation))
    Conversation.objects.filter(pk=conversation).update(  # counted as a change, as the app counts its own
        handoff_requested_at=Conversation.objects.get(pk=conversation).handoff_requested_at.replace(year=2020),
        handoff_version=F("handoff_version") + 1)
    handoff.publish(conversation)

    polled = visitor.get(handoff_url(conversation), HTTP_IF_NONE_MATCH=asked["ETag"])
    back = api_post(visitor, f"/api/conversations/{conversation}/handoff/back/")
    again = api_post(visitor, f"/api/conversations/{conversation}/handoff/back/")
    turn = send(visitor, conversation, "OK, you then.")

    assert polled.status_code == 200 and polled.json()["expired"] is True
    assert back.status_code == 200 and back.json()["state"] == "returned" and back.json()["expired"] is False
    assert again.status_code == 409 and again.json() == {"detail": "This conversation is not waiting for a person."}
    assert turn.status_code == 202 and "poll_url" in turn.json()
    # The inbox lists only what staff hold, the longest wait first.
    older, newer = new_conversation(visitor), new_conversation(visitor)
    for each in (older, newer):
        api_post(visitor, handoff_url(each))
    assert [c.pk for c in handoff.waiting()] == [Conversation.objects.get(pk=older).pk,
                                                  Conversation.objects.get(pk=newer).pk]


def test_handoff_settings_that_cannot_work_stop_the_check_with_a_sentence(conversations_settings):
    from conversations.checks import check_config

    conversations_settings.update(HANDOFF_STAFF_NAME="{first_name} ({email})", HANDOFF_WAIT=0,
                                  HANDOFF_EMAILS=["support@example.com", "support"])

    found = [m.msg for m in check_config() if m.id == "conversations.E044"]

    assert found == [
        "HANDOFF_STAFF_NAME '{first_name} ({email})' names 'email', which is not {first_name}, {last_name} or "
        "{username}.",
        "HANDOFF_WAIT is 0: a visitor would be told no one is free at once.",
        "HANDOFF_EMAILS has 'support', which is not an e-mail address."]
    # A name the check refuses never breaks a page: staff are "Our staff" meanwhile.
    assert handoff.staff_name(User(username="ana", first_name="Ana")) == "Our staff"
    conversations_settings.update(HANDOFF_STAFF_NAME="{first_name")
    assert [m.msg for m in check_config() if m.id == "conversations.E044"] == [
        "HANDOFF_STAFF_NAME '{first_name' expected '}' before end of string.",
        "HANDOFF_WAIT is 0: a visitor would be told no one is free at once.",
        "HANDOFF_EMAILS has 'support', which is not an e-mail address."]


@pytest.mark.django_db(transaction=True)
def test_the_admins_rerun_starts_no_turn_while_staff_hold_the_conversation():
    from conversations.admin.turns import rerun_turn

    make_assistant()
    visitor = make_client()
    conversation = new_conversation(visitor)
    first = send(visitor, conversation, "Hello").json()
    Turn.objects.filter(pk=first["id"]).update(status="completed")
    api_post(visitor, handoff_url(conversation))

    new, reason = rerun_turn(Turn.objects.get(pk=first["id"]))

    assert new is None
    assert reason == "its conversation is with a person (or closed by them); hand it back to the assistant first"
    assert Turn.objects.count() == 1



@pytest.mark.django_db(transaction=True)
def test_a_message_sent_again_with_its_idempotency_key_is_kept_once():
    visitor, conversation = waiting_for_a_person()
    url = f"/api/conversations/{conversation}/turns/"

    first = api_post(visitor, url, {"content": "Are you there?"}, HTTP_IDEMPOTENCY_KEY="msg-1")
    again = api_post(visitor, url, {"content": "Are you there?"}, HTTP_IDEMPOTENCY_KEY="msg-1")
    other = api_post(visitor, url, {"content": "Something else"}, HTTP_IDEMPOTENCY_KEY="msg-1")

    assert first.status_code == 202 and again.status_code == 200 and again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert other.status_code == 422
    assert list(Message.objects.values_list("content", flat=True)) == ["Are you there?"]


@pytest.mark.django_db(transaction=True)
def test_a_conversation_whose_staff_member_left_is_taken_by_another_and_a_superuser_may_take_one_over():
    visitor, conversation = waiting_for_a_person()
    ana, ben, carl = staff_member("ana", "Ana"), staff_member("ben", "Ben"), staff_member("carl", "Carl")
    act(ana, conversation, "take")

    # While Ana is here, the conversation is hers.
    refused = act(ben, conversation, "take").content.decode()
    assert "Nothing was sent: ana is already answering this conversation." in refused
    # Ana is deactivated: Ben takes it, and the visitor reads him.
    ana.user.is_active = False
    ana.user.save()
    assert 'value="take"' in ben.get(answer_page(conversation)).content.decode()
    assert "You are answering this conversation." in act(ben, conversation, "take").content.decode()
    assert "Your reply was sent." in act(ben, conversation, "reply", "Ben here, I will help.").content.decode()
    polled = visitor.get(handoff_url(conversation)).json()
    assert polled["by"] == "Ben from support" and polled["messages"][-1]["content"] == "Ben here, I will help."
    # Ben's account is deleted: Carl may answer and hand it back at once.
    ben.user.delete()
    assert "Handed back to the assistant." in act(carl, conversation, "hand_back").content.decode()
    assert visitor.get(handoff_url(conversation)).json()["state"] == "returned"

    # A superuser takes one over from a colleague who is still here (naming the one the page showed).
    api_post(visitor, handoff_url(conversation))
    act(carl, conversation, "take")
    boss = User.objects.create_superuser("dora", first_name="Dora")
    dora = Client()
    dora.force_login(boss)
    page = dora.get(answer_page(conversation)).content.decode()
    assert "carl is answering this conversation: only they may reply." in page and 'value="take"' in page
    refused = act(dora, conversation, "reply", "Dora here.").content.decode()
    assert "Nothing was sent: carl is already answering this conversation." in refused
    taken = dora.post(answer_page(conversation), {"action": "take", "holder": str(carl.user.pk)}, follow=True)
    assert "You are answering this conversation." in taken.content.decode()
    assert visitor.get(handoff_url(conversation)).json()["by"] == "Dora from support"
    # Carl, not a superuser, cannot take it back.
    again = carl.post(answer_page(conversation), {"action": "take", "holder": str(boss.pk)}, follow=True)
    assert "Nothing was sent: dora is already answering this conversation." in again.content.decode()


def died_in_the_tool(conversation, turn_id, *calls):
    """The state a job leaves when its work horse died while ``hand_to_person`` ran: the model's
    reply asking for ``calls`` saved, the person asked for (committed), no tool result yet."""
    from django.utils import timezone

    Turn.objects.filter(pk=turn_id).update(status="running", started_at=timezone.now(), model_calls=1,
                                           deadline_at=timezone.now() + timezone.timedelta(seconds=14))
    Message.objects.create(conversation_id=conversation, turn_id=turn_id, role="assistant", content="",
                           tool_calls=[{"id": f"call_{n}", "name": name, "arguments": arguments}
                                       for n, (name, arguments) in enumerate(calls, start=1)])
    handoff.request(conversation, "tool", reason="Wants a human.")
    django_rq.get_queue("default").empty()  # the job is gone


@pytest.mark.django_db(transaction=True)
def test_a_turn_resumed_after_its_worker_died_in_hand_to_person_reads_it_succeeded(
        worker, conversations_settings, received):
    from conversations.engine.recovery import resume_or_fail

    conversations_settings.update(CREDENTIALS={"key": local_key("sk-test")}, MAX_RESUMES=2)
    requested = received(handoff_requested)
    with FakeProvider() as api:
        api.add(openai_text("A person will reply here."))
        make_assistant(provider="openai", base_url=api.url, credential="key", handoff=Assistant.HandoffWays.TOOL)
        visitor = make_client()
        conversation = new_conversation(visitor)
        turn = send(visitor, conversation, "I want a human.").json()
        died_in_the_tool(conversation, turn["id"], ("hand_to_person", {"reason": "Wants a human."}))

        assert resume_or_fail(Turn.objects.get(pk=turn["id"]), "job gone") is not None
        worker()
        final = poll_until_done(visitor, turn["poll_url"])

    result = final["messages"][2]
    assert (result["name"], result["is_error"]) == ("hand_to_person", False)
    assert result["content"] == handoff.HANDED_OVER
    assert Conversation.objects.get(pk=conversation).handoff == "waiting"
    assert len(requested.calls) == 1  # asked for once, by the job that died
    assert api.requests == []  # and the turn ended there, as it would have


@pytest.mark.django_db(transaction=True)
def test_once_the_tool_hands_the_conversation_to_a_person_the_turn_ends_and_the_model_does_nothing_more(
        worker, conversations_settings):
    conversations_settings.update(CREDENTIALS={"key": local_key("sk-test")})
    with FakeProvider() as api:
        api.add(openai_tool_calls(("hand_to_person", {"reason": "Wants a human."}),
                                  ("current_time", {"city": "Tokyo"})),
                openai_tool_calls(("current_time", {"city": "Paris"})),
                openai_text("It is noon in Paris. Anything else?"))
        make_assistant(provider="openai", base_url=api.url, credential="key", handoff=Assistant.HandoffWays.TOOL,
                       tools=["current_time"])
        visitor = make_client()
        conversation = new_conversation(visitor)
        turn = send(visitor, conversation, "A human, please. And what time is it in Tokyo?").json()
        worker()
        final = poll_until_done(visitor, turn["poll_url"])

    # The visitor reads that a person will reply, and nothing the model did after asking for one.
    assert (final["status"], final["error"]) == ("completed", None)
    assert [(m["role"], m.get("name")) for m in final["messages"]] == [
        ("user", None), ("assistant", None), ("tool", "hand_to_person")]
    assert (final["messages"][-1]["content"], final["messages"][-1]["is_error"]) == (handoff.HANDED_OVER, False)
    assert len(api.requests) == 1  # no call after the handoff
    assert visitor.get(handoff_url(conversation)).json()["state"] == "waiting"


@pytest.mark.django_db(transaction=True)
def test_a_turn_resumed_after_its_worker_died_just_after_handing_over_ends_without_running_the_rest(
        worker, conversations_settings):
    from conversations.engine.recovery import resume_or_fail

    conversations_settings.update(CREDENTIALS={"key": local_key("sk-test")}, MAX_RESUMES=2)
    with FakeProvider() as api:
        api.add(openai_text("It is noon in Tokyo."))
        make_assistant(provider="openai", base_url=api.url, credential="key", handoff=Assistant.HandoffWays.TOOL,
                       tools=["current_time"])
        visitor = make_client()
        conversation = new_conversation(visitor)
        turn = send(visitor, conversation, "A human, please. And the time in Tokyo?").json()
        died_in_the_tool(conversation, turn["id"], ("hand_to_person", {"reason": "Wants a human."}),
                         ("current_time", {"city": "Tokyo"}))
        Message.objects.create(conversation_id=conversation, turn_id=turn["id"], role="tool", tool_call_id="call_1",
                               tool_name="hand_to_person", content=handoff.HANDED_OVER)  # saved before it died

        assert resume_or_fail(Turn.objects.get(pk=turn["id"]), "job gone") is not None
        worker()
        final = poll_until_done(visitor, turn["poll_url"])

    assert (final["status"], final["error"]) == ("completed", None)
    assert [m.get("name") for m in final["messages"] if m["role"] == "tool"] == ["hand_to_person"]
    assert api.requests == []


def expire_handoff_state(conversation_id):
    """What ``STATE_TTL`` does to a conversation's cached handoff state nothing changed for that
    long: every key of it goes."""
    client = cache._cache.get_client(write=True)
    for key in client.scan_iter(match=f"*conversations:conversation:{conversation_id}:handoff*"):
        client.delete(key)


@pytest.mark.django_db(transaction=True)
def test_a_staff_reply_is_not_hidden_by_an_older_state_written_after_it(monkeypatch):
    visitor, conversation = waiting_for_a_person()
    ana = staff_member()
    act(ana, conversation, "take")
    written, raced = state.publish_person, []

    def late(data):
        """The publish of the visitor's message has read the database; Ana's reply commits and is
        published before that publish writes what it read."""
        if not raced:
            raced.append("replying")
            raced[:] = at_once(lambda: act(ana, conversation, "reply", "Ana here, one moment."))
        return written(data)

    monkeypatch.setattr(state, "publish_person", late)
    send(visitor, conversation, "Hello?")

    assert "Your reply was sent." in raced[0].content.decode()
    polled = visitor.get(handoff_url(conversation)).json()
    assert [m["content"] for m in polled["messages"]] == ["Hello?", "Ana here, one moment."]


@pytest.mark.django_db(transaction=True)
def test_the_poll_answers_304_only_for_what_the_visitor_has_even_after_the_cache_forgot_the_state():
    visitor, conversation = waiting_for_a_person()
    expire_handoff_state(conversation)
    waiting = visitor.get(handoff_url(conversation))  # read again from the row
    ana = staff_member()
    act(ana, conversation, "take")
    expire_handoff_state(conversation)

    act(ana, conversation, "reply", "Ana here.")
    polled = visitor.get(handoff_url(conversation), HTTP_IF_NONE_MATCH=waiting["ETag"])

    assert waiting.json()["state"] == "waiting"
    assert polled.status_code == 200
    assert polled.json()["state"] == "taken" and polled.json()["messages"][-1]["content"] == "Ana here."
    assert polled["ETag"] != waiting["ETag"]


@pytest.mark.django_db(transaction=True)
def test_a_visitor_who_logs_in_while_waiting_for_a_person_reads_the_handoff_at_once_from_any_session():
    make_assistant()
    vera = User.objects.create_user("vera", password="pw-123456789")
    visitor = make_client()
    conversation = new_conversation(visitor)
    api_post(visitor, handoff_url(conversation))
    send(visitor, conversation, "Hello?")
    assert visitor.get(handoff_url(conversation)).status_code == 200

    visitor.login(username="vera", password="pw-123456789")  # the conversation becomes Vera's
    elsewhere = make_client()  # her phone, say
    elsewhere.force_login(vera)

    for client in (visitor, elsewhere):
        polled = client.get(handoff_url(conversation))
        assert polled.status_code == 200
        assert polled.json()["state"] == "waiting" and polled.json()["messages"][-1]["content"] == "Hello?"


@pytest.fixture
def sites_framework(settings):
    """``django.contrib.sites`` installed, its table made (the suite's database has none), with
    the current site at ``shop.example.com``."""
    from django.db import connection

    settings.INSTALLED_APPS = [*settings.INSTALLED_APPS, "django.contrib.sites"]
    settings.SITE_ID = 1
    from django.contrib.sites.models import Site

    with connection.schema_editor() as editor:
        editor.create_model(Site)
    Site.objects.create(pk=1, domain="shop.example.com", name="Shop")
    Site.objects.clear_cache()
    yield
    with connection.schema_editor() as editor:
        editor.delete_model(Site)
    # Installing the app ran the admin's autodiscover again, which registered Site with the admin:
    # left there, every admin page after this test would look for the app it no longer has.
    from django.contrib import admin

    if admin.site.is_registered(Site):
        admin.site.unregister(Site)


@pytest.mark.django_db(transaction=True)
def test_the_handoff_mail_keeps_the_models_words_out_and_links_the_page_in_full(
        conversations_settings, sites_framework):
    conversations_settings.update(HANDOFF_EMAILS=["support@example.com"])
    make_assistant()
    visitor = make_client()
    conversation = new_conversation(visitor)
    turn = send(visitor, conversation, "My card 4242 was charged twice!").json()
    reason = "The visitor says: my card 4242 was charged twice."
    Message.objects.create(conversation_id=conversation, turn_id=turn["id"], role="assistant", content="",
                           tool_calls=[{"id": "call_1", "name": "hand_to_person", "arguments": {"reason": reason}}])
    handoff.request(conversation, "tool", reason=reason)  # what the tool does (here, not in a work horse)

    (sent,) = mail.outbox
    assert "4242" not in sent.body and "charged" not in sent.body
    assert f"Answer it: https://shop.example.com{answer_page(conversation)}" in sent.body
    # The reason is on the answer page, behind its permission.
    assert "my card 4242 was charged twice." in staff_member().get(answer_page(conversation)).content.decode()


def test_a_staff_member_without_a_first_name_is_never_shown_to_the_visitor_by_their_login(conversations_settings):
    """A login is often an e-mail address: the visitor, who may be anyone, reads it only where the
    site's HANDOFF_STAFF_NAME asks for {username}."""
    no_first_name = User(username="ana.lopez@shop.example", first_name="", last_name="Lopez")

    assert handoff.staff_name(no_first_name) == "Our staff"
    assert handoff.staff_name(User(username="ana.lopez@shop.example", first_name="Ana")) == "Ana from support"
    conversations_settings.update(HANDOFF_STAFF_NAME="{first_name} {last_name}")
    assert handoff.staff_name(no_first_name) == "Our staff"
    assert handoff.staff_name(User(username="x", first_name="Ana", last_name="")) == "Ana"
    conversations_settings.update(HANDOFF_STAFF_NAME="{username}")
    assert handoff.staff_name(no_first_name) == "ana.lopez@shop.example"


@pytest.mark.django_db(transaction=True)
def test_a_take_that_waited_for_anothers_lock_sees_who_took_it():
    """On PostgreSQL a take waits on the row lock of a take in progress, then reads the row as it
    was committed; the staff member it names must be read then too. Joined in the locking query,
    they were read as they were before the wait (nobody), so the second take saw a conversation
    whose staff member had left, and took it from the first (CI saw two winners)."""
    import threading
    import time

    from django.db import connection, connections, transaction

    if connection.vendor != "postgresql":
        pytest.skip("SQLite takes its write lock when the transaction begins: the second take reads after the first")
    visitor, conversation = waiting_for_a_person()
    ana, ben = staff_member("ana", "Ana").user, staff_member("ben", "Ben").user
    locked, ben_waits, outcome = threading.Event(), threading.Event(), []

    def ana_takes_slowly():
        try:
            with transaction.atomic():
                handoff.take(conversation, ana)
                locked.set()
                ben_waits.wait(5)
                time.sleep(0.5)  # ben's take is waiting on the row lock by now
        finally:
            connections.close_all()

    def ben_takes():
        locked.wait(5)
        ben_waits.set()
        try:
            handoff.take(conversation, ben)
            outcome.append("taken")
        except handoff.Refused as refused:
            outcome.append(str(refused.message))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=ana_takes_slowly), threading.Thread(target=ben_takes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)

    assert outcome == ["Nothing was sent: ana is already answering this conversation."]
    assert Conversation.objects.get(pk=conversation).handoff_by == ana


@pytest.mark.django_db(transaction=True)
def test_a_reply_that_takes_a_waiting_conversation_is_one_change_published_once(received, monkeypatch):
    """Replying to a conversation that waits takes it too: staff are told once that it was taken,
    and the visitor's state is published once, with one new version, not once for each."""
    visitor, conversation = waiting_for_a_person()
    taken = received(handoff_taken)
    before = Conversation.objects.get(pk=conversation).handoff_version
    published = []
    publish = state.publish_person
    monkeypatch.setattr(state, "publish_person", lambda data: published.append(data["version"]) or publish(data))
    ana = staff_member()

    page = act(ana, conversation, "reply", "Hello, Ana here.").content.decode()

    assert "Your reply was sent." in page
    assert [c["user"] for c in taken.calls] == ["ana"]
    assert published == [before + 1]
    assert visitor.get(handoff_url(conversation)).json()["messages"][-1]["content"] == "Hello, Ana here."


@pytest.mark.django_db(transaction=True)
def test_a_visitor_whose_staff_member_left_reads_no_one_answering_and_may_go_back_to_the_assistant(
        conversations_settings):
    conversations_settings.update(HANDOFF_WAIT=0)
    visitor, conversation = waiting_for_a_person()
    ana = staff_member()
    act(ana, conversation, "take")
    act(ana, conversation, "reply", "Ana here, one moment.")
    taken = visitor.get(handoff_url(conversation))
    refused = api_post(visitor, f"/api/conversations/{conversation}/handoff/back/")

    ana.user.is_active = False  # she left: her account deactivated from the admin
    ana.user.save()
    left = visitor.get(handoff_url(conversation), HTTP_IF_NONE_MATCH=taken["ETag"])
    back = api_post(visitor, f"/api/conversations/{conversation}/handoff/back/")
    turn = send(visitor, conversation, "Then the assistant, please.")

    assert taken.json()["state"] == "taken" and taken.json()["by"] == "Ana from support"
    assert refused.status_code == 409 and refused.json() == {"detail": "A person has joined: they will reply here."}
    # No one answers any more: the visitor reads that, with the way back, and keeps what Ana wrote.
    assert left.status_code == 200
    assert left.json()["state"] == "waiting" and left.json()["by"] is None and left.json()["expired"] is True
    assert left.json()["messages"][-1] == {**left.json()["messages"][-1], "content": "Ana here, one moment.",
                                           "author": "Ana from support"}
    assert back.status_code == 200 and back.json()["state"] == "returned"
    assert turn.status_code == 202


@pytest.mark.django_db(transaction=True)
def test_a_staff_member_deleted_or_renamed_is_what_the_visitor_reads_at_the_next_poll():
    visitor, conversation = waiting_for_a_person()
    ana = staff_member()
    act(ana, conversation, "take")
    act(ana, conversation, "reply", "Ana here.")
    before = visitor.get(handoff_url(conversation))

    ana.user.first_name = "Anna"
    ana.user.save()
    renamed = visitor.get(handoff_url(conversation), HTTP_IF_NONE_MATCH=before["ETag"])
    ana.user.save(update_fields=["last_login"])  # a login: nothing the visitor reads changed
    same = visitor.get(handoff_url(conversation), HTTP_IF_NONE_MATCH=renamed["ETag"])
    ana.user.delete()
    deleted = visitor.get(handoff_url(conversation), HTTP_IF_NONE_MATCH=renamed["ETag"])

    assert before.json()["by"] == "Ana from support"
    assert renamed.status_code == 200
    assert renamed.json()["by"] == "Anna from support" and renamed.json()["messages"][-1]["author"] == "Anna from support"
    assert same.status_code == 304
    assert deleted.status_code == 200
    assert deleted.json()["state"] == "waiting" and deleted.json()["by"] is None
    assert deleted.json()["messages"][-1]["author"] == "Our staff"


@pytest.mark.django_db(transaction=True)
def test_a_colleague_cannot_hand_back_or_close_a_conversation_another_answers_by_posting_the_action():
    visitor, conversation = waiting_for_a_person()
    ana, ben = staff_member("ana", "Ana"), staff_member("ben", "Ben")
    act(ana, conversation, "take")
    # Ben's page offers neither; he posts them all the same.
    for action in ("hand_back", "close"):
        page = act(ben, conversation, action).content.decode()
        assert "Nothing was sent: ana is already answering this conversation." in page
    row = Conversation.objects.get(pk=conversation)
    assert (row.handoff, row.handoff_by.username) == ("taken", "ana")
    assert visitor.get(handoff_url(conversation)).json()["state"] == "taken"
    assert send(visitor, conversation, "Still with me?").json()["handoff"] == "taken"


@pytest.mark.django_db(transaction=True)
def test_asking_for_a_person_with_the_button_stops_the_running_turn_so_no_answer_lands_after_it(
        worker, conversations_settings):
    """The visitor presses "Talk to a person" while the assistant's turn runs (its model call
    under way): the turn stops before its next step, and nothing of the assistant's reaches a
    conversation staff now hold."""
    conversations_settings.update(CREDENTIALS={"key": local_key("sk-test")})
    pressed = threading.Event()

    def model_answers_after_the_button(handler):
        pressed.wait(20)
        handler.send_json(200, openai_tool_calls(("current_time", {"city": "Tokyo"})))

    with FakeProvider() as api:
        api.add(model_answers_after_the_button, openai_text("The assistant's late answer."))
        make_assistant(provider="openai", base_url=api.url, credential="key", tools=["current_time"])
        visitor = make_client()
        conversation = new_conversation(visitor)
        turn = send(visitor, conversation, "What time is it in Tokyo?").json()

        def press_the_button():
            until(lambda: len(api.requests) == 1)
            try:
                assert api_post(visitor, handoff_url(conversation)).status_code == 202
            finally:
                pressed.set()
                connections.close_all()

        button = threading.Thread(target=press_the_button)
        button.start()
        worker()
        button.join(20)
        final = poll_until_done(visitor, turn["poll_url"])

    assert final["status"] == "cancelled" and len(api.requests) == 1
    assert not Message.objects.filter(conversation_id=conversation, role__in=["assistant", "tool"],
                                      content__contains="late answer").exists()
    assert not Message.objects.filter(conversation_id=conversation, role="tool").exists()
    assert Conversation.objects.get(pk=conversation).handoff == "waiting"


def until(condition, timeout=20):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.django_db(transaction=True)
def test_the_handoff_mail_links_the_page_on_the_sites_address_where_no_sites_framework_names_it(
        conversations_settings):
    from django.apps import apps
    from django.core.checks import Warning as CheckWarning

    from conversations.checks import check_config

    assert not apps.is_installed("django.contrib.sites")
    conversations_settings.update(HANDOFF_EMAILS=["support@example.com"])
    assert [m.id for m in check_config() if isinstance(m, CheckWarning)] == ["conversations.W046"]
    conversations_settings.update(SITE_URL="https://help.example.org/")
    assert "conversations.W046" not in [m.id for m in check_config()]
    _visitor, conversation = waiting_for_a_person()

    (sent,) = mail.outbox
    assert f"Answer it: https://help.example.org{answer_page(conversation)}\n" in sent.body + "\n"
    conversations_settings.update(SITE_URL="help.example.org")
    assert [m.id for m in check_config() if "SITE_URL" in m.msg] == ["conversations.E044"]
