"""The running turn's statements sent as raw SQL (``engine.statements``): the fence still refuses a
write to a turn that is no longer the job's, names come from the models' ``_meta`` (a ``db_table``
and a ``db_column`` of a site's own), values are stored as the ORM stores them, and a model whose
saves have receivers is still saved through them."""

import datetime
import decimal
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from django.db import connection, models
from django.db.models.signals import post_save
from django.test.utils import CaptureQueriesContext, isolate_apps
from django.utils import timezone

from conversations.core.budget import TurnClock
from conversations.core.types import ModelReply
from conversations.engine import lifecycle, statements
from conversations.engine.runner import TurnRunner
from conversations.infra import dbconn, state
from conversations.models import CallRecord, Conversation, Message, Turn
from conversations.providers import BaseProvider

pytestmark = pytest.mark.django_db


class OneAnswer(BaseProvider):
    name = "scripted"

    def __init__(self, before=None):
        super().__init__({})
        self.before = before

    def complete(self, messages, tools):
        if self.before is not None:
            self.before()
        return ModelReply(text="Refunds take 30 days.")


def queued_turn(**fields):
    conversation = Conversation.objects.create(owner_token="t")
    turn = Turn.objects.create(conversation=conversation, job_id="job-1", **fields)
    Message.objects.create(conversation=conversation, turn=turn, role="user", content="How do refunds work?")
    return turn


def runner_for(turn, provider, conversations_settings):
    from conversations.conf import get_config

    conversations_settings.update(TOOLS=[], STREAM=False)
    return TurnRunner(turn, clock=TurnClock(60, 10), config=get_config(), provider=provider)


def test_the_final_write_of_a_turn_another_job_took_over_writes_nothing(conversations_settings):
    """While the model answered, another job continued the turn (its row names that job now): this
    job's final write is refused by the fence, its answer is not saved, the turn is left to the other."""
    turn = queued_turn()

    def taken_over():
        Turn.objects.filter(pk=turn.pk).update(job_id="job-2")

    runner = runner_for(turn, OneAnswer(before=taken_over), conversations_settings)
    runner.run()

    row = Turn.objects.get(pk=turn.pk)
    assert (row.status, row.job_id, row.finished_at) == (Turn.Status.RUNNING, "job-2", None)
    assert list(row.messages.values_list("role", flat=True)) == ["user"]
    assert not row.calls.exists()


def test_the_fenced_update_matches_only_an_unended_turn_of_that_job():
    turn = queued_turn()
    values = {"model_calls": 2, "margin_left": 4.5}

    assert lifecycle.update_unended(turn.pk, values, job_id="job-2") is False  # another job's
    assert lifecycle.update_unended(turn.pk, values, job_id="job-1") is True
    assert Turn.objects.filter(pk=turn.pk).values_list("model_calls", "margin_left").get() == (2, 4.5)
    Turn.objects.filter(pk=turn.pk).update(status=Turn.Status.COMPLETED)
    assert lifecycle.update_unended(turn.pk, {"model_calls": 3}, job_id="job-1") is False  # ended
    assert Turn.objects.get(pk=turn.pk).model_calls == 2


def test_a_claim_takes_only_a_queued_turn():
    turn = queued_turn()
    assert lifecycle.claim(turn, model="m") is True
    assert (turn.status, Turn.objects.get(pk=turn.pk).status) == (Turn.Status.RUNNING, Turn.Status.RUNNING)
    again = Turn.objects.get(pk=turn.pk)
    assert lifecycle.claim(again, model="other") is False
    assert Turn.objects.get(pk=turn.pk).model == "m"


def test_rows_and_values_are_stored_as_the_orm_stores_them():
    """A UUID key (text on SQLite), a JSON column, an aware datetime, a decimal, a boolean and an
    ``auto_now_add`` written raw read back through the ORM as they were written."""
    turn = queued_turn()
    finished = timezone.now().replace(microsecond=123456)
    lifecycle.update_unended(turn.pk, {"finished_at": finished, "cost": decimal.Decimal("0.00012345"),
                                       "usage_estimated": True, "input_tokens": None}, job_id="job-1")
    row = Turn.objects.get(pk=turn.pk)
    assert (row.finished_at, row.cost, row.usage_estimated, row.input_tokens) == (
        finished, decimal.Decimal("0.00012345"), True, None)

    calls = [{"id": "c1", "name": "look_up", "arguments": {"query": "ünïcode", "n": [1, 2]}}]
    message = statements.insert(Message(conversation_id=turn.conversation_id, turn=turn, role="assistant",
                                        tool_calls=calls))
    assert message.pk is not None and not message._state.adding
    stored = Message.objects.get(pk=message.pk)
    assert (stored.turn_id, stored.tool_calls, stored.content, stored.is_error) == (turn.pk, calls, "", False)
    assert stored.created_at == message.created_at and stored.created_at is not None

    records = [CallRecord(turn=turn, kind="tool", name=f"t{n}", started_offset=n / 10, outcome="ok")
               for n in range(3)]
    statements.insert_many(records)
    assert list(turn.calls.order_by("id").values_list("name", "started_offset", "attempt")) == [
        ("t0", 0.0, 1), ("t1", 0.1, 1), ("t2", 0.2, 1)]
    if connection.features.can_return_rows_from_bulk_insert:
        assert [r.pk for r in records] == list(turn.calls.order_by("id").values_list("pk", flat=True))


def test_statements_sent_together_each_give_their_own_result():
    """``send()``: an ``INSERT`` of several rows, one of one row, and a fenced ``UPDATE`` sent
    together (one string on PostgreSQL) give back, in order, the rows with their keys and the
    count the ``UPDATE`` matched, and an ``UPDATE`` that matched nothing says 0 after others."""
    turn = queued_turn()
    records = [CallRecord(turn=turn, kind="tool", name=f"t{n}", started_offset=n, outcome="ok") for n in range(2)]
    message = Message(conversation_id=turn.conversation_id, turn=turn, role="assistant", content="a; b")
    with CaptureQueriesContext(connection) as queries:
        saved, row, matched = statements.send(
            *statements.insert_statements(records), statements.insert_statement(message),
            lifecycle.update_unended_statement(turn.pk, {"model_calls": 1}, job_id="job-1"))
    assert (saved, row, matched) == (records, message, 1)
    assert Message.objects.get(pk=message.pk).content == "a; b"
    if connection.features.can_return_rows_from_bulk_insert:
        assert [r.pk for r in records] == list(turn.calls.order_by("id").values_list("pk", flat=True))
    assert len(queries.captured_queries) == (1 if dbconn.binds_on_client(connection) else 3)

    again = Message(conversation_id=turn.conversation_id, turn=turn, role="assistant", content="b")
    assert statements.send(statements.insert_statement(again),
                           lifecycle.update_unended_statement(turn.pk, {"model_calls": 2}, job_id="job-2"))[1] == 0
    assert Turn.objects.get(pk=turn.pk).model_calls == 1


def test_a_message_whose_saves_have_receivers_is_saved_through_them():
    """A site (or the knowledge index) listening to a model's saves still hears of each row."""
    turn = queued_turn()
    heard = []

    def listener(sender, instance, created, **kwargs):
        heard.append((instance.content, created))

    post_save.connect(listener, sender=Message, dispatch_uid="test_statements_listener")
    try:
        statements.insert(Message(conversation_id=turn.conversation_id, turn=turn, role="assistant", content="hi"))
    finally:
        post_save.disconnect(sender=Message, dispatch_uid="test_statements_listener")
    assert heard == [("hi", True)]


@pytest.mark.django_db(transaction=True)  # the table is created and dropped outside a test's transaction
@isolate_apps("conversations")
def test_a_table_and_a_column_of_their_own_names_are_used():
    """Table and column names come from ``_meta``: a model with a ``db_table`` and a ``db_column``
    of its own is inserted into and updated raw, and reads back through the ORM."""

    class Renamed(models.Model):
        key = models.UUIDField(default=uuid.uuid4, db_column="renamed_key")
        label = models.CharField(max_length=20, db_column="Label Text")
        status = models.CharField(max_length=10, default="open")
        at = models.DateTimeField(auto_now_add=True, db_column="stamped")

        class Meta:
            app_label = "conversations"
            db_table = "statements test renamed"

    with connection.schema_editor() as editor:
        editor.create_model(Renamed)
    try:
        row = statements.insert(Renamed(label="first"))
        other = statements.insert(Renamed(label="second"))
        assert statements.update(Renamed, {"label": "changed"}, pk=row.pk, status__in=["open", "shut"]) == 1
        assert statements.update(Renamed, {"label": "never"}, pk=other.pk, status="shut") == 0
        stored = {r.pk: r for r in Renamed.objects.all()}
        assert (stored[row.pk].label, stored[row.pk].key) == ("changed", row.key)
        assert stored[other.pk].label == "second"
        assert isinstance(stored[row.pk].at, datetime.datetime)
    finally:
        with connection.schema_editor() as editor:
            editor.delete_model(Renamed)


def test_the_state_of_a_turn_written_raw_is_published_with_its_rows(conversations_settings):
    """End to end: the rows written raw are those the published state and the database show."""
    turn = queued_turn()
    runner_for(turn, OneAnswer(), conversations_settings).run()
    final = state.read(turn.id)
    rows = list(Message.objects.filter(turn=turn).order_by("id"))
    assert (final["done"], final["status"]) == (True, "completed")
    assert [(m["id"], m["content"]) for m in final["messages"]] == [(r.id, r.content) for r in rows]
    assert Turn.objects.get(pk=turn.pk).status == Turn.Status.COMPLETED


def field_values(instance):
    return {f.attname: getattr(instance, f.attname) for f in type(instance)._meta.concrete_fields}


def test_a_job_loads_its_turn_as_select_related_would():
    """The job's first read, raw: the turn with its conversation, that conversation's user and the
    turn's assistant, every column as the ORM reads it, each related row cached (no query more)."""
    from django.contrib.auth import get_user_model

    from conversations.models import Assistant

    user = get_user_model().objects.create_user("reader", email="reader@example.com")
    assistant = Assistant.objects.create(slug="raw", name="Raw", system_prompt="Be brief.", tools=["a", "b"],
                                         suggestions=[{"x": 1}])
    conversation = Conversation.objects.create(user=user, owner_token="t", assistant=assistant)
    turn = Turn.objects.create(conversation=conversation, assistant=assistant, job_id="job-1", enqueued_at=timezone.now(),
                               cost=decimal.Decimal("1.5"), usage_estimated=True, job_timeout=30.5)
    bare = queued_turn()  # no user, no assistant
    related = ("conversation", "conversation__user", "assistant")

    for pk in (turn.pk, str(bare.pk)):
        expected = Turn.objects.select_related(*related).get(pk=pk)
        loaded = statements.get(Turn, pk, related=related)
        with CaptureQueriesContext(connection) as queries:
            got = (loaded.conversation, loaded.conversation.user, loaded.assistant)
        assert queries.captured_queries == []  # every related row is cached, as select_related caches it
        assert field_values(loaded) == field_values(expected)
        assert field_values(got[0]) == field_values(expected.conversation)
        assert (got[1] and field_values(got[1])) == (expected.conversation.user and
                                                     field_values(expected.conversation.user))
        assert (got[2] and field_values(got[2])) == (expected.assistant and field_values(expected.assistant))
        assert not loaded._state.adding and loaded._state.db == "default"
    with pytest.raises(Turn.DoesNotExist):
        statements.get(Turn, uuid.uuid4(), related=related)


def test_a_turns_transcript_is_its_own_rows_and_the_ended_turns_rows():
    """The runner's transcript, raw: the conversation's rows of this turn, of its ended turns and of
    no turn (a handoff's), in order, not those of another turn still active; as the ORM reads them."""
    from django.db.models import Q

    earlier = queued_turn()
    conversation = earlier.conversation
    Turn.objects.filter(pk=earlier.pk).update(status=Turn.Status.COMPLETED)
    Message.objects.create(conversation=conversation, turn=earlier, role="assistant", content="Earlier answer.",
                           tool_calls=[{"id": "c", "name": "n", "arguments": {}}])
    Message.objects.create(conversation=conversation, role="staff", content="A person wrote this.")
    other = Turn.objects.create(conversation=conversation, status=Turn.Status.RUNNING, job_id="job-9")
    Message.objects.create(conversation=conversation, turn=other, role="user", content="Not this one.")
    current = Turn.objects.create(conversation=conversation, job_id="job-2")
    Message.objects.create(conversation=conversation, turn=current, role="user", content="This one.")
    Message.objects.create(conversation=Conversation.objects.create(), role="user", content="Elsewhere.")

    rows = statements.transcript(conversation.pk, current.pk)
    expected = Message.objects.filter(Q(turn_id=current.pk) | ~Q(turn__status__in=Turn.ACTIVE_STATUSES),
                                      conversation_id=conversation.pk).order_by("id")
    assert [field_values(r) for r in rows] == [field_values(m) for m in expected]
    assert [r.content for r in rows] == ["How do refunds work?", "Earlier answer.", "A person wrote this.", "This one."]
    # Read by the turn alone (its conversation found by the statement), as the job reads it with the turn.
    (found,) = statements.send(statements.transcript_statement(str(current.pk)))
    assert [field_values(r) for r in found] == [field_values(m) for m in expected]


def test_a_foreign_key_given_its_row_stores_the_rows_key():
    """As ``QuerySet.update`` does: a claim names the assistant's version as a row (``claim`` passes
    ``turn.assistant_version``), and its key is stored."""
    from conversations.models import Assistant, AssistantVersion

    assistant = Assistant.objects.create(slug="versioned", name="V", system_prompt="Be brief.")
    version = AssistantVersion.objects.create(assistant=assistant, fingerprint="abc", snapshot={})
    turn = queued_turn()
    assert lifecycle.claim(turn, assistant_version=version) is True
    assert Turn.objects.get(pk=turn.pk).assistant_version_id == version.pk


def orm_turn_counts(conversation_id, *, here, owner, owners_active, since):
    """What ``limits.TurnCounts`` counted through the ORM before ``statements.turn_counts``: the reference."""
    from django.db.models import Count, Q, Sum
    from django.db.models.functions import Coalesce

    from conversations.owners import owned_by

    active = Q(status__in=Turn.ACTIVE_STATUSES)
    wanted = {"here_active": Count("pk", filter=Q(conversation_id=conversation_id) & active)}
    if here:
        wanted["here"] = Count("pk", filter=Q(conversation_id=conversation_id))
    read, owners = Q(conversation_id=conversation_id), Q()
    if owners_active:
        wanted["owners_active"] = Count("pk", filter=active)
        owners |= active
    if since is not None:
        today = Q(enqueued_at__gte=since)
        wanted["tokens_today"] = (Coalesce(Sum("input_tokens", filter=today), 0)
                                  + Coalesce(Sum("output_tokens", filter=today), 0))
        owners |= today
    if owner is not None and owners:
        read = owned_by(*owner, "conversation__") & (read | owners)
    found = Turn.objects.filter(read).aggregate(**wanted)
    return (found["here_active"], found.get("here", 0), found.get("owners_active", 0), found.get("tokens_today", 0))


OWNERS = [(0, ""), (None, "tok-a"), (0, "tok-a"), (1, ""), (None, "tok-b"), (1, "tok-b")]  # (user index, token)


@given(turns=st.lists(st.tuples(st.sampled_from(range(len(OWNERS))), st.sampled_from(sorted(Turn.Status.values)),
                                st.sampled_from([None, -2, 0, 1]), st.none() | st.integers(0, 5000),
                                st.none() | st.integers(0, 5000)), max_size=12),
       asked=st.sampled_from(range(len(OWNERS))), here=st.booleans(), owners_active=st.booleans(),
       budget=st.booleans())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_posts_turn_counts_are_the_orms(django_user_model, turns, asked, here, owners_active, budget):
    """Whatever turns the owners have (each owner by user, by session token or both; statuses,
    enqueued yesterday, today or never; tokens or none), the raw count of a POST reads what the
    ORM's aggregate read, for every shape of the site's limits."""
    from conversations.engine.limits import start_of_day

    Turn.objects.all().delete()
    Conversation.objects.all().delete()
    users = [django_user_model.objects.get_or_create(username=f"owner-{i}")[0] for i in range(2)]
    conversations = [Conversation.objects.create(user=None if u is None else users[u], owner_token=token)
                     for u, token in OWNERS]
    now = timezone.now()
    for index, status, days, tokens_in, tokens_out in turns:
        Turn.objects.create(conversation=conversations[index], status=status, input_tokens=tokens_in,
                            output_tokens=tokens_out,
                            enqueued_at=None if days is None else now + datetime.timedelta(days=days, hours=-1))
    conversation = conversations[asked]
    owner = (conversation.user_id, conversation.owner_token) if (conversation.user_id or conversation.owner_token) \
        else None
    since = start_of_day(now) if budget else None
    shape = dict(here=here, owner=owner, owners_active=owners_active and owner is not None,
                 since=since if owner is not None else None)
    assert statements.turn_counts(conversation.pk, **shape) == orm_turn_counts(conversation.pk, **shape)
