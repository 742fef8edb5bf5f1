"""Retention: ``purge_conversations`` deletes the conversations whose time has run out (site-wide,
or an assistant's own), in short batches, never one with a turn in flight or held by staff, and
keeps anonymous daily totals of their ratings and costs when the site asks."""

import datetime
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from conversations.engine.retention import purge
from conversations.models import Assistant, CallRecord, Conversation, Erasure, Message, RetainedTotal, Turn

pytestmark = pytest.mark.django_db

NOW = timezone.now()


def ago(days):
    return NOW - datetime.timedelta(days=days)


def conversation(started, last=None, *, assistant=None, status="completed", rating="", cost="0.01", **fields):
    """A conversation started ``started`` days ago with one turn, its last message ``last`` days ago."""
    row = Conversation.objects.create(owner_token="t", assistant=assistant, **fields)
    turn = Turn.objects.create(conversation=row, status=status, rating=rating, input_tokens=100, output_tokens=20,
                               cost=Decimal(cost), assistant=assistant)
    CallRecord.objects.create(turn=turn, kind="model", started_offset=0, outcome="ok")
    for role in ("user", "assistant"):
        Message.objects.create(conversation=row, turn=turn, role=role, content="words")
    Conversation.objects.filter(pk=row.pk).update(created_at=ago(started))
    Turn.objects.filter(pk=turn.pk).update(enqueued_at=ago(started))
    Message.objects.filter(conversation=row).update(created_at=ago(started if last is None else last))
    return row.pk


def left():
    return set(Conversation.objects.values_list("pk", flat=True))


def test_conversations_are_deleted_days_after_their_last_message_and_no_sooner(conversations_settings):
    conversations_settings.update(RETENTION_DAYS=30, RETENTION_FROM="last_message")
    gone = conversation(40, 35)
    came_back = conversation(40, 5)
    recent = conversation(3)
    in_flight = conversation(40, 35, status="running")
    held = conversation(40, 35, handoff=Conversation.Handoff.WAITING)

    done = purge(now=NOW)

    assert left() == {came_back, recent, in_flight, held}
    assert gone not in left() and not Message.objects.filter(conversation_id=gone).exists()
    assert done.counts == {"conversations": 1, "turns": 1, "messages": 2, "calls": 1, "ratings": 0}
    assert Erasure.objects.get().kind == "retention" and Erasure.objects.get().counts == done.counts
    assert purge(now=NOW).counts == {}  # a second run finds nothing
    assert Erasure.objects.count() == 1


def test_an_assistants_own_retention_replaces_the_sites(conversations_settings):
    conversations_settings.update(RETENTION_DAYS=30, RETENTION_FROM="last_message")
    week = Assistant.objects.create(slug="week", name="Week", system_prompt=".", provider="demo", retention_days=7,
                                    retention_from="created")
    forever = Assistant.objects.create(slug="forever", name="Forever", system_prompt=".", provider="demo",
                                       retention_days=0)
    site_rule = Assistant.objects.create(slug="site", name="Site", system_prompt=".", provider="demo")
    week_old = conversation(10, 1, assistant=week)
    week_new = conversation(5, assistant=week)
    kept_forever = conversation(400, assistant=forever)
    site_old = conversation(40, assistant=site_rule)
    site_new = conversation(20, assistant=site_rule)

    purge(now=NOW)

    assert left() == {week_new, kept_forever, site_new}
    assert not {week_old, site_old} & left()


def test_the_ratings_and_costs_of_what_is_deleted_are_kept_as_anonymous_daily_totals(conversations_settings):
    conversations_settings.update(RETENTION_DAYS=30, RETENTION_FROM="created", RETENTION_BATCH=2)
    shop = Assistant.objects.create(slug="shop", name="Shop", system_prompt=".", provider="demo")
    for rating in ("up", "up", "down", ""):
        conversation(45, assistant=shop, rating=rating, cost="0.25")
    conversation(45, rating="down")

    done = purge(now=NOW, pause=0)

    assert done.batches == 5 and done.counts["conversations"] == 5 and done.counts["ratings"] == 4
    totals = {(t.assistant_id, t.day): (t.turns, t.rated_up, t.rated_down, t.input_tokens, t.output_tokens, t.cost)
              for t in RetainedTotal.objects.all()}
    day = timezone.localtime(ago(45)).date()
    assert totals == {(shop.pk, day): (4, 2, 1, 400, 80, Decimal("1.00")),
                      (None, day): (1, 0, 1, 100, 20, Decimal("0.01"))}
    assert not Conversation.objects.exists()


def test_totals_are_not_kept_when_the_site_says_so(conversations_settings):
    conversations_settings.update(RETENTION_DAYS=30, RETENTION_KEEP_TOTALS=False)
    conversation(45, rating="up")
    purge(now=NOW)
    assert not RetainedTotal.objects.exists() and not Conversation.objects.exists()


def test_nothing_is_deleted_unless_the_site_sets_a_retention(conversations_settings):
    conversation(4000)
    assert purge(now=NOW).counts == {} and len(left()) == 1


def test_the_command_says_what_it_would_delete_and_then_deletes_it(conversations_settings):
    conversations_settings.update(RETENTION_DAYS=30)
    conversation(45)
    conversation(50)

    dry, real = StringIO(), StringIO()
    call_command("purge_conversations", "--dry-run", stdout=dry)
    assert dry.getvalue().strip() == "Would delete 2 conversations, 4 messages."
    assert len(left()) == 2
    call_command("purge_conversations", "--batch", "2", "--pause", "0", stdout=real)
    assert real.getvalue().startswith("Deleted 2 conversations, 2 turns, 4 messages, 2 calls, 0 ratings in 2 "
                                      "transactions")
    assert not left()


@pytest.mark.django_db(transaction=True)
def test_the_purge_runs_as_an_rq_job_in_either_worker_class(conversations_settings, any_worker):
    import django_rq
    from rq.job import Job

    conversations_settings.update(RETENTION_DAYS=30, RETENTION_PAUSE=0)
    gone, kept = conversation(45), conversation(3)
    job = django_rq.get_queue("default").enqueue("conversations.jobs.purge_conversations", job_timeout=600)

    any_worker()

    assert left() == {kept} and gone not in left()
    finished = Job.fetch(job.id, connection=django_rq.get_connection("default"))
    assert finished.get_status() == "finished" and finished.return_value()["conversations"] == 1


@pytest.mark.django_db(transaction=True)
def test_a_due_conversation_goes_with_its_tool_approvals_and_leaves_its_test_result(conversations_settings):
    """Every row that points at a deleted turn goes with it, or lets go of it, as the models say
    (a tool approval is deleted; a test run's result keeps its score without its turn)."""
    from conversations.evals.models import TestQuestion, TestResult, TestRun, TestSet
    from conversations.models import ToolApproval

    conversations_settings.update(RETENTION_DAYS=30, RETENTION_PAUSE=0)
    shop = Assistant.objects.create(slug="shop", name="Shop", system_prompt=".", provider="demo")
    gone = conversation(45, assistant=shop)
    turn = Turn.objects.get(conversation_id=gone)
    ToolApproval.objects.create(turn=turn, call_id="c1", tool_name="refund", arguments_sha256="0" * 64,
                                status="approved", expires_at=ago(44))
    question = TestQuestion.objects.create(test_set=TestSet.objects.create(name="shop-set", assistant=shop),
                                           position=1, question="Where is my parcel?")
    result = TestResult.objects.create(run=TestRun.objects.create(test_set=question.test_set), question=question,
                                       side="live", turn=turn, judge_turn=turn, scored=True, passed=True)

    done = purge(now=NOW)

    assert done.counts["conversations"] == 1 and not left()
    assert not ToolApproval.objects.exists() and not Turn.objects.exists()
    result.refresh_from_db()
    assert result.turn_id is None and result.judge_turn_id is None and result.passed is True


@pytest.mark.django_db(transaction=True)
def test_a_purge_reads_nothing_while_it_holds_its_locks_and_keeps_a_conversation_that_changed_since_its_read(
        conversations_settings):
    """Everything the purge reads (what is due, the turns' totals) it reads before its write
    transaction, which only writes: on SQLite that transaction holds the database's one write lock,
    which every visitor's message waits for. Each of its DELETEs carries its own check, so a turn
    that starts between the read and the write (here, as the transaction begins) keeps its
    conversation, whose totals are not counted; the rest of the batch goes."""
    conversations_settings.update(RETENTION_DAYS=30, RETENTION_FROM="created", RETENTION_PAUSE=0)
    gone, busy = conversation(45, rating="up"), conversation(45, rating="down")
    under_lock, started = [], []

    def visitor_starts_a_turn_as_the_purge_takes_its_locks(execute, sql, params, many, context):
        if connection.in_atomic_block and not started:
            started.append(sql)
            Turn.objects.create(conversation_id=busy, status="running")
        elif connection.in_atomic_block:
            under_lock.append(sql.split(None, 1)[0].upper())
        return execute(sql, params, many, context)

    with connection.execute_wrapper(visitor_starts_a_turn_as_the_purge_takes_its_locks):
        done = purge(now=NOW)

    assert started and "SELECT" not in under_lock and "DELETE" in under_lock
    assert left() == {busy} and Turn.objects.filter(conversation_id=busy).count() == 2
    assert Message.objects.filter(conversation_id=busy).count() == 2 and not CallRecord.objects.filter(
        turn__conversation_id=gone).exists()
    assert done.counts == {"conversations": 1, "turns": 1, "messages": 2, "calls": 1, "ratings": 1}
    assert [(t.turns, t.rated_up, t.rated_down) for t in RetainedTotal.objects.all()] == [(1, 1, 0)]


def test_a_purge_with_a_tiny_time_target_still_purges_everything_due_and_keeps_what_is_not(conversations_settings):
    """Every transaction takes longer than a target of a microsecond: the batches shrink to one
    conversation each, and the purge still goes through everything that is due, keeping the
    totals of all of it, and leaves what is not due."""
    conversations_settings.update(RETENTION_DAYS=30, RETENTION_FROM="last_message")
    gone = {conversation(45, rating="up" if n % 3 == 0 else "") for n in range(12)}
    kept = {conversation(45, 2), conversation(5), conversation(45, status="running")}

    done = purge(now=NOW, batch_time=0.000001, pause=0)

    assert left() == kept and not gone & left()
    assert not Message.objects.filter(conversation_id__in=gone).exists()
    assert done.counts == {"conversations": 12, "turns": 12, "messages": 24, "calls": 12, "ratings": 4}
    if connection.vendor == "sqlite":  # 5 conversations first, then one (2 messages) each
        assert done.batches == 8 and done.sizes == [10] + [2] * 7
    else:  # row locks: no visitor waits for the batch, which is RETENTION_BATCH messages whatever it takes
        assert done.batches == 1 and done.sizes == [24]
    assert sum(total.turns for total in RetainedTotal.objects.all()) == 12


def test_the_batches_grow_while_each_transaction_is_quick_and_never_past_retention_batch(conversations_settings):
    """On SQLite, where the batch holds the database's one write lock; with row locks, each is
    RETENTION_BATCH messages."""
    conversations_settings.update(RETENTION_DAYS=30, RETENTION_BATCH=60)
    for _ in range(80):
        conversation(45)  # 2 messages each: 160 in all

    done = purge(now=NOW, batch_time=1.0, pause=0)  # a second: every transaction is quick

    assert done.sizes == ([10, 20, 40, 60, 30] if connection.vendor == "sqlite" else [60, 60, 40])
    assert done.counts["messages"] == 160 and not left()


def test_a_batch_size_follows_the_time_its_transaction_held_its_locks():
    from conversations.engine.retention import BatchSize

    sizes = BatchSize(maximum=500, target=0.01)
    assert sizes.size == 10  # a few messages first
    assert sizes.took(0.002, 10) == 20  # quick: twice as many at most
    assert sizes.took(0.008, 20) == 25  # nearly the target: a little more
    assert sizes.took(0.05, 25) == 6  # five times too long: a quarter as many, the most it shrinks at once
    assert sizes.took(1.0, 6) == 1  # never less than one
    assert BatchSize(maximum=3, target=0.01).size == 3
    fixed = BatchSize(maximum=500)  # no target (row locks): always the maximum
    assert fixed.size == 500 and fixed.took(1.0, 500) == 500


def test_timing_settings_that_cannot_work_stop_the_check_with_a_sentence(conversations_settings):
    from django.core.management.base import SystemCheckError

    conversations_settings.update(RETENTION_BATCH=0, RETENTION_BATCH_TIME=0, RETENTION_PAUSE=-1)
    with pytest.raises(SystemCheckError) as failed:
        call_command("check")

    report = str(failed.value)
    assert report.count("conversations.E086") == 3
    assert "RETENTION_BATCH is 0, not a whole number of messages of at least 1." in report
    assert "RETENTION_BATCH_TIME is 0 seconds, not more than 0 and at most 1." in report
    assert "RETENTION_PAUSE is -1 seconds, not from 0 to 60." in report


def test_the_command_refuses_a_batch_time_or_pause_that_cannot_work_and_deletes_nothing(conversations_settings):
    from django.core.management.base import CommandError

    conversations_settings.update(RETENTION_DAYS=30)
    conversation(45)
    with pytest.raises(CommandError, match=r"^--batch-time is 0.0 seconds, not more than 0 and at most 1\.$"):
        call_command("purge_conversations", "--batch-time", "0")
    with pytest.raises(CommandError, match=r"^--batch is 0, .*; --pause is -1.0 seconds, not from 0 to 60\.$"):
        call_command("purge_conversations", "--batch", "0", "--pause", "-1")
    assert len(left()) == 1


def test_a_database_that_checks_foreign_keys_at_once_gets_no_plan(monkeypatch):
    """The plan deletes the conversations before the rows that point at them, which only a
    database that checks foreign keys at the commit accepts (MySQL and MariaDB check each
    statement's): any other purges through the ORM's collector."""
    from django.db import connection

    from conversations.engine import retention

    assert retention.deletion_plan() is not None
    monkeypatch.setattr(connection.features, "can_defer_constraint_checks", False)
    assert retention.deletion_plan() is None


def test_without_a_plan_the_orms_collector_deletes_what_is_still_due(conversations_settings, monkeypatch):
    """A relation the plan cannot honour (PROTECT, a callable) sends the purge through the ORM's
    collector, with the same result: what is due goes, with its totals; what is not stays."""
    from conversations.engine import retention

    monkeypatch.setattr(retention, "deletion_plan", lambda: None)
    conversations_settings.update(RETENTION_DAYS=30, RETENTION_FROM="last_message", RETENTION_PAUSE=0)
    gone = {conversation(45, rating="up"), conversation(45)}
    kept = {conversation(45, 2), conversation(45, status="running")}

    done = purge(now=NOW)

    assert left() == kept and not Message.objects.filter(conversation_id__in=gone).exists()
    assert done.counts == {"conversations": 2, "turns": 2, "messages": 4, "calls": 2, "ratings": 1}
    assert [(t.turns, t.rated_up) for t in RetainedTotal.objects.all()] == [(2, 1)]


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's write-ahead log")
@pytest.mark.django_db(transaction=True)
def test_on_sqlite_a_purge_copies_its_writes_from_the_log_after_each_batch_not_inside_its_commits(
        conversations_settings):
    """SQLite checkpoints inside a ``COMMIT`` that leaves more than ``wal_autocheckpoint`` pages
    in the log, after the write lock is released; the purge's time box took that for a lock held
    and shrank its batches. Here the site checkpoints at every commit (1 page): the purge turns
    that off for its own commits, checkpoints (``PASSIVE``) after each batch, outside it, and
    leaves the connection's setting as it found it."""
    from django.test.utils import CaptureQueriesContext

    conversations_settings.update(RETENTION_DAYS=30, RETENTION_BATCH=4)
    for _ in range(6):
        conversation(45)  # 2 messages each: 3 batches of 2 conversations
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone()[0] == "wal"  # the demo's settings
        cursor.execute("PRAGMA wal_autocheckpoint = 1")
    try:
        with CaptureQueriesContext(connection) as queries:
            done = purge(now=NOW, pause=0)
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA wal_autocheckpoint")
            assert cursor.fetchone()[0] == 1
            cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")
            busy, log, copied = cursor.fetchone()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA wal_autocheckpoint = 1000")

    assert done.batches == 3 and not left()
    sql = [query["sql"] for query in queries.captured_queries]
    commits = [n for n, text in enumerate(sql) if text == "COMMIT"]
    checkpoints = [n for n, text in enumerate(sql) if text == "PRAGMA wal_checkpoint(PASSIVE)"]
    assert len(commits) >= 3 and len(checkpoints) == done.batches
    assert sql.index("PRAGMA wal_autocheckpoint = 0") < commits[0]
    for checkpoint in checkpoints:  # each right after its batch's commit, outside any transaction
        assert sql[checkpoint - 1] == "COMMIT"
    assert (busy, log) == (0, copied)  # nothing of the purge is left in the log
