"""Retention: conversations are deleted ``RETENTION_DAYS`` days after they started or after their
last message (``RETENTION_FROM``; an assistant's own values for its conversations), by
``manage.py purge_conversations`` (cron, docs/privacy.md).

The purge finds what is due in one read, then deletes it in short transactions,
``RETENTION_PAUSE`` seconds apart, so that a visitor's turn never waits long behind it. On SQLite,
where a transaction takes the database's one write lock, each is boxed by its time, not by a
number of rows (``BatchSize``): the first deletes a few messages, and the next ones more while a
transaction holds its locks for less than ``RETENTION_BATCH_TIME`` seconds, fewer when one took
longer (a loaded machine, a slow disk), ``RETENTION_BATCH`` messages at most; with row locks
(PostgreSQL), each deletes ``RETENTION_BATCH`` messages. On PostgreSQL and SQLite a transaction
reads nothing: what it needs (the batch's conversations, the totals of their turns) is read
before it begins, and its first statement deletes the conversations of the batch that are still
due, checked in that ``DELETE``'s own ``WHERE`` (no new message, no turn in flight, not held by
staff; on PostgreSQL, not locked by anyone: ``SKIP LOCKED``), returning which it deleted; the
rows that point at them go next. So it holds its locks (on SQLite, the database's only write
lock) for its writes alone, and its SQL is built before it begins (built again inside, for those
it deleted, when some were no longer due). Elsewhere (MySQL, MariaDB), or when a relation asks
for what plain statements cannot do, the ORM's collector deletes, reading first
(``deletion_plan``). It can add the deleted turns' ratings, tokens and costs
to anonymous daily totals (``RetainedTotal``); each run that deleted anything leaves one
``Erasure`` audit entry saying how many of what.
"""

import contextlib
import dataclasses
import datetime
import logging
import time

from django.apps import apps
from django.db import connection, transaction
from django.db.models import CASCADE, DO_NOTHING, SET_NULL, Count, Q, Sum
from django.db.models.deletion import get_candidate_relations_to_delete
from django.db.models.functions import TruncDate
from django.utils import timezone

from .. import assistants
from ..conf import get_config
from ..models import Assistant, CallRecord, Conversation, Erasure, Message, RetainedTotal, Turn

logger = logging.getLogger("conversations.retention")


@dataclasses.dataclass(frozen=True)
class Policy:
    """How long the conversations of one assistant (None: the site's default one) are kept."""

    assistant_id: object
    days: int
    since: str

    def cutoff(self, now):
        return now - datetime.timedelta(days=self.days)


def policies():
    """The policies that delete anything: the site's, and each assistant's (its own values or
    the site's), leaving out those that keep conversations until erased (0 days)."""
    site = get_config()
    found = [Policy(None, site["RETENTION_DAYS"], site["RETENTION_FROM"])]
    for assistant in Assistant.objects.all():
        cfg = assistants.settings_for(assistant)
        found.append(Policy(assistant.pk, cfg["RETENTION_DAYS"], cfg["RETENTION_FROM"]))
    return [policy for policy in found if policy.days > 0]


def due(policy, now):
    """The conversations ``policy`` says are due at ``now``: old enough, without a turn in
    flight and not held by staff."""
    cutoff = policy.cutoff(now)
    rows = Conversation.objects.filter(created_at__lt=cutoff).exclude(handoff__in=Conversation.HELD)
    rows = rows.filter(assistant__isnull=True) if policy.assistant_id is None else rows.filter(
        assistant_id=policy.assistant_id)
    rows = rows.exclude(turns__status__in=Turn.ACTIVE_STATUSES)
    if policy.since == "last_message":
        rows = rows.exclude(messages__created_at__gte=cutoff)
    return rows


@dataclasses.dataclass
class Purge:
    """What one run did: counts per kind, the batches, how long each transaction held its locks
    (seconds, ``held``; the longest is ``longest``) and how many messages it was given (``sizes``)."""

    counts: dict = dataclasses.field(default_factory=dict)
    batches: int = 0
    held: list = dataclasses.field(default_factory=list)
    sizes: list = dataclasses.field(default_factory=list)

    @property
    def longest(self):
        return max(self.held, default=0.0)

    def add(self, kind, number):
        self.counts[kind] = self.counts.get(kind, 0) + number


def timing_problems(batch, batch_time, pause, names=("RETENTION_BATCH", "RETENTION_BATCH_TIME", "RETENTION_PAUSE")):
    """Why a purge's ``batch`` (messages at most per transaction), ``batch_time`` (the seconds a
    transaction aims at) or ``pause`` (seconds between two) cannot work, each named as ``names``
    say: a list of sentences (the system check's ``conversations.E086``, the command's errors)."""
    problems = []
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        problems.append(f"{names[0]} is {batch!r}, not a whole number of messages of at least 1")
    for name, value, lowest, highest in ((names[1], batch_time, None, 1), (names[2], pause, 0, 60)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            problems.append(f"{name} is {value!r}, not a number of seconds")
        elif lowest is None and not 0 < value <= highest:
            problems.append(f"{name} is {value!r} seconds, not more than 0 and at most {highest}")
        elif lowest is not None and not lowest <= value <= highest:
            problems.append(f"{name} is {value!r} seconds, not from {lowest} to {highest}")
    return problems


class BatchSize:
    """How many messages the purge's next transaction deletes: it starts at ``START`` (or
    ``maximum``, if smaller) and follows how long each transaction held its locks (``took``), so
    that one lasts about ``target`` seconds: twice as many at most after one that was quick, a
    quarter as many at least after one that was slow, between 1 and ``maximum``. Without a
    ``target``, always ``maximum``.

    Why time and not rows: what a batch of rows costs depends on the machine's load and disk, and
    on SQLite every visitor's write waits for the whole of it (the database's one write lock)."""

    START = 10

    def __init__(self, maximum, target=None):
        self.maximum, self.target = maximum, target
        self.size = max(1, maximum if target is None else min(maximum, self.START))

    def took(self, seconds, messages):
        """Note that a transaction deleting ``messages`` held its locks ``seconds``; returns the next size."""
        if messages and self.target is not None:
            factor = min(2.0, max(0.25, self.target / max(seconds, 1e-6)))
            self.size = max(1, min(self.maximum, int(messages * factor)))
        return self.size


def purge(*, now=None, batch=None, batch_time=None, pause=None, keep_totals=None, dry_run=False):
    """Delete every conversation that is due (see the module); returns a ``Purge``. ``batch``
    (messages per transaction at most), ``batch_time`` (the seconds a transaction aims at) and
    ``pause`` default to the site's settings. With ``dry_run``, nothing is deleted and the counts
    say what would be."""
    cfg = get_config()
    now = now or timezone.now()
    batch = cfg["RETENTION_BATCH"] if batch is None else batch
    batch_time = cfg["RETENTION_BATCH_TIME"] if batch_time is None else batch_time
    pause = cfg["RETENTION_PAUSE"] if pause is None else pause
    keep_totals = cfg["RETENTION_KEEP_TOTALS"] if keep_totals is None else keep_totals
    problems = timing_problems(batch, batch_time, pause)
    if problems:
        raise ValueError("; ".join(problems))
    # Boxed by time where a transaction locks the whole database for writing (SQLite), so that
    # every visitor's write waits for it. With row locks (PostgreSQL) a visitor's write waits only
    # for a conversation it holds, which the batch leaves (SKIP LOCKED), and there batches of 10
    # messages (where a commit's flush took the 10 ms) made a purge six times as long for nothing.
    sizes = BatchSize(batch, batch_time if connection.vendor == "sqlite" else None)
    result, plan = Purge(), deletion_plan()
    with _checkpointing_each_batch() as checkpoint:
        _purge_due(now, pause, keep_totals, dry_run, sizes, result, plan, checkpoint)
    if result.counts.get("conversations") and not dry_run:
        Erasure.objects.create(kind=Erasure.Kind.RETENTION, counts=result.counts)
        logger.info("Retention deleted %s", ", ".join(f"{n} {k}" for k, n in sorted(result.counts.items())))
    return result


def _purge_due(now, pause, keep_totals, dry_run, sizes, result, plan, checkpoint):
    """``purge``'s loop over the policies and their batches; ``checkpoint`` runs after each batch."""
    for policy in policies():
        candidates = list(due(policy, now).annotate(size=Count("messages")).values_list("pk", "size"))
        if dry_run:
            result.add("conversations", len(candidates))
            result.add("messages", sum(size for _pk, size in candidates))
            continue
        for chunk, messages in _chunks(candidates, sizes):
            # Built before the pause: on a busy machine a process just woken gets a core at once,
            # and should spend it holding the lock, not building SQL.
            compiled = _compile(policy, now, chunk, plan)
            if result.batches:
                time.sleep(pause)
            held = _delete_batch(policy, now, chunk, keep_totals, plan, result, compiled)
            checkpoint()
            result.held.append(held)
            result.sizes.append(messages)
            result.batches += 1
            sizes.took(held, messages)


@contextlib.contextmanager
def _checkpointing_each_batch():
    """On SQLite with a write-ahead log, the purge copies its own writes into the database after
    each batch (a ``PASSIVE`` checkpoint, which never waits for a writer and holds no write lock)
    and makes none at its commits; yields the function that does it (a no-op elsewhere).

    Why: SQLite checkpoints when a commit leaves more than ``wal_autocheckpoint`` pages (1,000) in
    the log, inside that ``COMMIT`` statement, after its write lock is released. A purge deletes
    enough to trigger one every few batches, and its batch then seemed to take several times as
    long: the time box (``BatchSize``) shrank the next batches for a lock it no longer held.
    Measured at 100,000 messages on a quiet machine (docs/benchmarks.md): the longest transaction
    21 ms against 41, 501 transactions against 788, the purge 113 s against 172."""
    if connection.vendor != "sqlite" or connection.in_atomic_block:  # in a transaction: it commits at its end
        yield lambda: None
        return
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        wal = cursor.fetchone()[0].lower() == "wal"
        cursor.execute("PRAGMA wal_autocheckpoint")
        pages = cursor.fetchone()[0]
        if wal:
            cursor.execute("PRAGMA wal_autocheckpoint = 0")

    def checkpoint():
        if wal:
            with connection.cursor() as cursor:
                cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")

    try:
        yield checkpoint
    finally:
        if wal:
            with connection.cursor() as cursor:
                cursor.execute(f"PRAGMA wal_autocheckpoint = {int(pages)}")


def _chunks(candidates, sizes):
    """``candidates`` ((pk, messages)) in chunks of about ``sizes.size`` messages, read as each
    chunk is cut (a bigger conversation goes alone): (pks, messages) each."""
    chunk, size = [], 0
    for pk, messages in candidates:
        if chunk and size + messages > sizes.size:
            yield chunk, size
            chunk, size = [], 0
        chunk.append(pk)
        size += messages
    if chunk:
        yield chunk, size


# What each deleted model counts as in a purge's counts (and its audit entry).
KINDS = {Conversation: "conversations", Turn: "turns", Message: "messages", CallRecord: "calls"}


def deletion_plan():
    """The SQL statements that delete, or set to NULL, every row that points at deleted
    conversations, as the models' ``on_delete`` say, children first; each is (model, sql) with
    ``{ids}`` where the conversations' ids go. They run after the conversations themselves are
    deleted (the guarded ``DELETE`` of ``_compile``; the foreign keys are checked at the commit),
    so the conversations' own children name those ids, never the conversation table. None when a
    relation asks for anything else (PROTECT, a callable), when one points at a conversation by
    another column than its key, or on a database other than PostgreSQL and SQLite (3.35 or
    later, for ``RETURNING``): then the ORM's collector deletes, honouring it.

    Why not the ORM's ``delete()``: it first reads every row of every related table it will
    delete, in Python, while the write transaction is open; on SQLite that transaction holds the
    database's one write lock, which every visitor's message waits for."""
    # The conversations go first, so their children's foreign keys must be checked at the commit
    # (PostgreSQL, SQLite; MySQL and MariaDB check each statement's at once), and the database
    # must say which rows a DELETE deleted (RETURNING; Oracle's takes another form).
    features = connection.features
    if not (connection.vendor in ("postgresql", "sqlite") and features.can_defer_constraint_checks
            and features.can_return_columns_from_insert):
        return None
    quote = connection.ops.quote_name
    statements = []

    def cascade(model, pointed_by):
        """The statements for the rows pointing at ``model``'s rows, whose keys (for a field
        pointing at ``column``) ``pointed_by(column)`` selects; False when one cannot be planned."""
        for relation in get_candidate_relations_to_delete(model._meta):
            field, child = relation.field, relation.related_model
            pointed = pointed_by(field.target_field.column)
            if pointed is None:
                return False
            child_table, column = quote(child._meta.db_table), quote(field.column)
            child_where = f"{column} IN ({pointed})"
            if field.remote_field.on_delete is CASCADE:
                if not cascade(child, lambda target, where=child_where, table=child_table:
                               f"SELECT {quote(target)} FROM {table} WHERE {where}"):
                    return False
                statements.append((child, f"DELETE FROM {child_table} WHERE {child_where}"))
            elif field.remote_field.on_delete is SET_NULL:
                statements.append((child, f"UPDATE {child_table} SET {column} = NULL WHERE {child_where}"))
            elif field.remote_field.on_delete is not DO_NOTHING:
                return False
        return True

    key = Conversation._meta.pk.column
    return statements if cascade(Conversation, lambda column: "{ids}" if column == key else None) else None


def _delete_batch(policy, now, chunk, keep_totals, plan, result, compiled=None):
    """Delete the conversations of ``chunk`` still due, in one transaction; returns how long it
    held its locks (seconds): from the moment it had begun (on SQLite in ``IMMEDIATE`` mode, once
    it holds the write lock) to the end of its commit. Every statement is compiled (``_compile``;
    ``compiled`` if given) and the totals are read before the transaction begins, so that it
    holds the write lock (the database's only one, on SQLite) for its writes alone."""
    guard, totals, deletes = compiled or _compile(policy, now, chunk, plan)
    if deletes is None:
        return _delete_with_collector(guard, totals, chunk, keep_totals, result)
    with connection.cursor() as cursor:
        cursor.execute(*totals)
        groups = cursor.fetchall()
    with transaction.atomic():
        began = time.monotonic()
        with connection.cursor() as cursor:
            cursor.execute(*guard)
            # Those that changed since they were read (a new message, a turn started, or, on
            # PostgreSQL, a visitor's request holds the row) wait for the next run.
            gone = [row[0] for row in cursor.fetchall()]
            if len(gone) < len(chunk):
                deletes = _statements(plan, gone)
            if gone:
                result.add("conversations", len(gone))
                for model, sql, params in deletes:
                    cursor.execute(sql, params)
                    if model in KINDS and sql.startswith("DELETE"):
                        result.add(KINDS[model], cursor.rowcount)
                _count_totals(cursor, groups, gone, keep_totals, result)
    return time.monotonic() - began  # its commit included: the locks are held until it ends


def _delete_with_collector(recheck, totals, chunk, keep_totals, result):
    """``_delete_batch`` for the relations only the ORM's collector can honour (``deletion_plan``
    is None): it checks what is still due and reads inside its transaction, and the ORM reads
    every related row before it deletes."""
    pk = Conversation._meta.pk
    with transaction.atomic():
        began = time.monotonic()
        with connection.cursor() as cursor:
            cursor.execute(*recheck)
            gone = [row[0] for row in cursor.fetchall()]
            if gone:
                cursor.execute(*totals)
                _count_totals(cursor, cursor.fetchall(), gone, keep_totals, result)
                keys = [pk.to_python(key) for key in gone]
                for model, number in Conversation.objects.filter(pk__in=keys).delete()[1].items():
                    kind = KINDS.get(apps.get_model(model))
                    if kind:
                        result.add(kind, number)
    return time.monotonic() - began


def _statements(plan, ids):
    """The plan's statements (``deletion_plan``) for the conversations ``ids``, as the database gave them."""
    holes = ", ".join(["%s"] * len(ids))
    return [(model, sql.format(ids=holes), list(ids)) for model, sql in plan]


def _compile(policy, now, chunk, plan):
    """The SQL of one batch: the guarded ``DELETE`` of the conversations still due, returning
    their ids (with no plan, the ``SELECT`` of them), the totals of their turns per conversation,
    and the statements for the rows that point at them."""
    recheck = due(policy, now).filter(pk__in=chunk).order_by().values_list("pk").query.sql_with_params()
    if connection.features.has_select_for_update_skip_locked:
        # A conversation a visitor's turn is starting in is left for the next run.
        recheck = (f"{recheck[0]} {connection.ops.for_update_sql(skip_locked=True)}", recheck[1])
    totals = (Turn.objects.filter(conversation_id__in=chunk).annotate(day=TruncDate("enqueued_at"))
              .values("conversation_id", "day", "assistant_id").order_by()
              .annotate(turns=Count("pk"), up=Count("pk", filter=Q(rating=Turn.Rating.UP)),
                        down=Count("pk", filter=Q(rating=Turn.Rating.DOWN)), input=Sum("input_tokens"),
                        output=Sum("output_tokens"), cost=Sum("cost"), rated=Count("pk", filter=~Q(rating="")))
              .values_list("conversation_id", "day", "assistant_id", "turns", "up", "down", "input", "output",
                           "cost", "rated")
              .query.sql_with_params())
    if plan is None:
        return recheck, totals, None
    quote = connection.ops.quote_name
    table, key = quote(Conversation._meta.db_table), quote(Conversation._meta.pk.column)
    guard = (f"DELETE FROM {table} WHERE {key} IN ({recheck[0]}) RETURNING {key}", recheck[1])
    ids = [Conversation._meta.pk.get_db_prep_value(pk, connection) for pk in chunk]
    return guard, totals, _statements(plan, ids)


def _count_totals(cursor, groups, gone, keep_totals, result):
    """Count the ratings of the turns of the conversations ``gone`` (their ids as the database
    gave them) among ``groups`` (rows of ``_compile``'s totals), and add their totals to the
    anonymous daily ones when the site keeps them."""
    pk = Conversation._meta.pk
    gone = {pk.to_python(key) for key in gone}
    sums = {}
    for conversation_id, day, assistant_id, *numbers in groups:
        if pk.to_python(conversation_id) in gone:
            kept = sums.setdefault((day, assistant_id), [0] * len(numbers))
            for index, number in enumerate(numbers):
                kept[index] += number or 0
    result.add("ratings", sum(numbers[-1] for numbers in sums.values()))
    if keep_totals:
        _add_totals(cursor, [(day, assistant_id, *numbers) for (day, assistant_id), numbers in sums.items()])


def _add_totals(cursor, groups):
    """Add the turns' totals (rows of ``_compile``'s totals query) to the anonymous daily totals,
    per day and assistant (turns never enqueued have no day, and no tokens or cost)."""
    fields = {name: RetainedTotal._meta.get_field(name) for name in
              ("day", "assistant", "turns", "rated_up", "rated_down", "input_tokens", "output_tokens", "cost")}
    quote = connection.ops.quote_name
    table = quote(RetainedTotal._meta.db_table)
    added = ("turns", "rated_up", "rated_down", "input_tokens", "output_tokens", "cost")
    for day, assistant_id, *numbers, _rated in groups:
        if day is None:
            continue
        day = fields["day"].get_db_prep_value(fields["day"].to_python(day), connection)
        values = [fields[name].get_db_prep_value(fields[name].to_python(number or 0), connection)
                  for name, number in zip(added, numbers)]
        assistant = quote(fields["assistant"].column)
        same = f"{quote(fields['day'].column)} = %s AND " + (
            f"{assistant} IS NULL" if assistant_id is None else f"{assistant} = %s")
        key = [day] if assistant_id is None else [day, assistant_id]
        sums = ", ".join(f"{column} = {column} + %s" for column in (quote(fields[name].column) for name in added))
        cursor.execute(f"UPDATE {table} SET {sums} WHERE {same}", values + key)
        if not cursor.rowcount:
            columns = ", ".join(quote(fields[name].column) for name in ("day", "assistant", *added))
            cursor.execute(f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * 8)})",
                           [day, assistant_id, *values])


def purge_job():
    """``purge()`` as an RQ job (``conversations.jobs.purge_conversations``, for RQ's cron):
    returns the counts. A job stopped at its timeout leaves every finished batch deleted; the
    next run goes on from there."""
    return purge().counts
