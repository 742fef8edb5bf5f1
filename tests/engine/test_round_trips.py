"""What a running turn asks of Redis per round trip: one publish, with its stop flags read in the
same round trip. Real Redis (its own command counts), the turn's real loop and database, a model
in process (no HTTP call, whose watchdog would read the flags on its own)."""

import re
import uuid

import pytest

from conversations.core.budget import TurnClock
from conversations.core.types import Finish, ModelReply, ToolCall
from conversations.engine.runner import TurnRunner
from conversations.infra import state
from conversations.models import Conversation, Message, Turn
from conversations.providers import BaseProvider
from conversations.tools import tool

pytestmark = pytest.mark.django_db


STOP_DURING_TOOL = []  # the turn whose visitor presses Stop while the tool runs
TAKEN_DURING_TOOL = []  # the turn another job continues while the tool runs


@tool
def look_up(query: str) -> str:
    """Looks ``query`` up; the visitor of a turn in ``STOP_DURING_TOOL`` presses Stop meanwhile,
    and a turn in ``TAKEN_DURING_TOOL`` is continued by another job."""
    for turn_id in STOP_DURING_TOOL:
        state.request_cancel(turn_id)
    if TAKEN_DURING_TOOL:
        Turn.objects.filter(pk__in=TAKEN_DURING_TOOL).update(job_id="the-other-job")
    return f"found {query}"


class TwoStepModel(BaseProvider):
    """Asks for ``look_up`` on its first call, answers on its second."""

    name = "scripted"

    def __init__(self):
        super().__init__({})
        self.calls = 0

    def complete(self, messages, tools):
        self.calls += 1
        if self.calls == 1:
            return ModelReply(tool_calls=[ToolCall("c1", "look_up", {"query": "refunds"})], finish=Finish.TOOL_CALLS)
        return ModelReply(text="Refunds take 30 days.")


def count_round_trips(monkeypatch):
    """Count each request this process sends Redis (a pipeline or a script is one), by command."""
    from redis.connection import AbstractConnection

    sent = []
    original = AbstractConnection.send_packed_command

    def send(self, command, *args, **kwargs):
        first = command[0] if isinstance(command, list) else command
        sent.append(bytes(first).split(b"\r\n")[2].decode().lower())  # the first command's name
        return original(self, command, *args, **kwargs)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", send)
    return sent


def run_turn(conversations_settings):
    from conversations.conf import get_config

    conversations_settings.update(TOOLS=[f"{__name__}.look_up"], STREAM=False)
    conversation = Conversation.objects.create(owner_token="t")
    turn = Turn.objects.create(conversation=conversation)
    Message.objects.create(conversation=conversation, turn=turn, role="user", content="How do refunds work?")
    model = TwoStepModel()
    runner = TurnRunner(turn, clock=TurnClock(60, 10), config=get_config(), provider=model)
    return turn, model, runner


def test_each_round_trip_is_one_redis_round_trip_that_also_reads_the_stop_flags(conversations_settings,
                                                                                 monkeypatch):
    """Three round trips (a call asking for a tool, the tool, the answer) publish four states
    (running, two steps, the final one), each in one Redis round trip (the first too: its version
    is one of two it can be), and no look of its own at the stop flags before a call or a tool."""
    turn, model, runner = run_turn(conversations_settings)
    sent = count_round_trips(monkeypatch)
    runner.run()
    monkeypatch.undo()

    final = state.read(turn.id)
    assert (final["done"], final["status"], final["version"]) == (True, "completed", 4)
    assert [m["content"] for m in final["messages"]][-1] == "Refunds take 30 days."
    assert model.calls == 2
    assert sent == ["eval"] * 4, sent  # four scripts (the first state was written again before: five)


def test_a_jobs_first_state_after_its_posts_queued_state_is_one_round_trip(conversations_settings, monkeypatch):
    """The POST publishes the turn's queued state (version 1) before its job runs: the job's first
    state follows it as version 2 in one Redis round trip, and the visitor reads it."""
    turn, model, runner = run_turn(conversations_settings)
    state.publish(state.state_from_db(turn, list(Message.objects.filter(turn=turn))), first=True)
    sent = count_round_trips(monkeypatch)
    runner.publish()
    monkeypatch.undo()

    assert sent == ["eval"], sent
    assert (state.read(turn.id)["version"], state.read(turn.id)["status"]) == (2, "queued")
    runner.publish()
    assert state.read(turn.id)["version"] == 3


def test_a_first_state_that_guessed_its_version_wrong_still_gets_the_next_one(conversations_settings):
    """Other writers took versions 1 to 3 before the job's first publish (a poll view's repairs):
    its state is written again with the version the counter gave it, never an older one."""
    turn, model, runner = run_turn(conversations_settings)
    for _ in range(3):
        state.publish(state.state_from_db(turn, list(Message.objects.filter(turn=turn))))
    runner.publish()

    assert state.read(turn.id)["version"] == 4
    assert runner.published.state["version"] == 4


def test_a_stop_pressed_during_a_tool_ends_the_turn_before_the_next_model_call(conversations_settings):
    """The flags a publish read are the ones the next look would: a Stop pressed while a tool runs
    is seen right after its row is saved, and the model is not called again."""
    turn, model, runner = run_turn(conversations_settings)
    STOP_DURING_TOOL.append(str(turn.id))
    try:
        runner.run()
    finally:
        STOP_DURING_TOOL.clear()

    final = state.read(turn.id)
    assert (final["done"], final["status"]) == (True, "cancelled")
    assert model.calls == 1
    assert [m["role"] for m in final["messages"]] == ["user", "assistant", "tool"]


def test_a_version_taken_by_another_writer_meanwhile_is_never_reused(conversations_settings):
    """Another writer (the poll view's repair, a growing answer) takes a version between two of
    the job's publishes: the job's next state gets a newer one, never the same number twice."""
    turn, model, runner = run_turn(conversations_settings)
    runner.start()
    first = state.read(turn.id)["version"]
    taken = state.publish({**state.read(turn.id), "resuming": False})["version"]
    runner.publish()

    assert taken == first + 1
    assert state.read(turn.id)["version"] == taken + 1


@pytest.mark.django_db(transaction=True)  # a transaction of its own, as in a worker (not inside a test's)
def test_a_turns_own_round_trip_commits_do_not_wait_for_the_disk(conversations_settings):
    """A turn commits after every round-trip, and each commit that waited for a disk flush cost
    milliseconds, more than the round-trip's own statements: inside a step's transaction the
    database does not wait (PostgreSQL: ``synchronous_commit`` off for that transaction only;
    SQLite: the demo's write-ahead log with ``synchronous=NORMAL``), and outside it every other
    commit of the site is as the site set it."""
    from django.db import connection

    from conversations.infra import dbconn

    def setting():
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SHOW synchronous_commit")
                return cursor.fetchone()[0]
            cursor.execute("PRAGMA journal_mode")
            journal = cursor.fetchone()[0]
            cursor.execute("PRAGMA synchronous")
            return journal, cursor.fetchone()[0]

    from django.test.utils import CaptureQueriesContext

    from conversations.engine import statements

    site = setting()
    with CaptureQueriesContext(connection) as queries, dbconn.step():
        statements.update(Turn, {"error": ""}, pk=uuid.uuid4())  # a round trip's statement (matching nothing)
        inside = setting()
    after = setting()
    with CaptureQueriesContext(connection) as alone, dbconn.step():  # a step that sent no statement of its own
        pass

    def sent(captured):  # the statements, without the transaction's own BEGIN and COMMIT (logged or not)
        return [q["sql"] for q in captured.captured_queries if q["sql"].split()[0] not in ("BEGIN", "COMMIT")]

    if connection.vendor == "postgresql":
        assert (site, inside, after) == ("on", "off", "on")
        # The SET LOCAL went with the step's statement, in the same round trip; without one, on its own.
        update, show = sent(queries)
        assert update.startswith("UPDATE ") and update.endswith("; SET LOCAL synchronous_commit TO OFF")
        assert show == "SHOW synchronous_commit"
        assert sent(alone) == ["SET LOCAL synchronous_commit TO OFF"]
    else:
        assert inside == site == after == ("wal", 1)  # 1: NORMAL, no flush at a commit in WAL mode
        assert sent(alone) == []


@pytest.mark.django_db(transaction=True)  # no transaction around it, as in a worker (not inside a test's)
def test_a_claim_is_one_statement_that_commits_alone_without_waiting_for_the_disk():
    """The job's claim is one UPDATE sent alone: no BEGIN and COMMIT of its own (two round trips
    of three). On PostgreSQL it still does not wait for the disk: the step's SET LOCAL goes in the
    same string, which the server runs as one implicit transaction and accepts (outside one it
    warns that SET LOCAL has no effect). A turn no longer queued is not claimed, and not changed."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from conversations.engine.lifecycle import claim

    conversation = Conversation.objects.create(owner_token="t")
    turn = Turn.objects.create(conversation=conversation)
    stopped = Turn.objects.create(conversation=conversation, status=Turn.Status.CANCELLED)
    connection.ensure_connection()
    notices = []

    def heard(notice):
        notices.append(notice.message_primary)

    if connection.vendor == "postgresql":
        connection.connection.add_notice_handler(heard)
    try:
        with CaptureQueriesContext(connection) as queries:
            claimed = claim(turn, provider="openai")
    finally:
        if connection.vendor == "postgresql":
            connection.connection.remove_notice_handler(heard)

    assert claimed and Turn.objects.get(pk=turn.pk).status == Turn.Status.RUNNING
    sent = [q["sql"] for q in queries.captured_queries]
    assert len(sent) == 1 and sent[0].startswith("UPDATE "), sent
    if connection.vendor == "postgresql":
        assert sent[0].endswith("; SET LOCAL synchronous_commit TO OFF"), sent
    assert notices == []
    assert not claim(stopped, provider="openai")
    assert Turn.objects.get(pk=stopped.pk).status == Turn.Status.CANCELLED


@pytest.mark.django_db(transaction=True)  # a transaction of its own, as in a worker (not inside a test's)
def test_each_round_trip_is_one_transaction_of_its_own_rows_and_nothing_is_read_again(conversations_settings):
    """What a running turn asks of the database, pinned so that a regression shows: its claim is one
    UPDATE that commits alone, with no BEGIN and COMMIT of its own; each round trip one transaction
    with its new row and the turn's counters (and the tool's call record; a model called over HTTP
    has one too); the final write one more. On PostgreSQL each of those transactions is one string
    sent alone, which the server runs as a transaction of its own: one network round trip, no BEGIN
    and COMMIT (the turn's fenced UPDATE inside a WITH that fails when it matches no row). Nothing
    is read that the runner already holds, and nothing else is written outside those transactions.
    Counted on the runner's own connection (a tool runs on another)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from conversations.infra import dbconn

    turn, model, runner = run_turn(conversations_settings)
    with CaptureQueriesContext(connection) as queries:
        runner.run()

    transactions, alone, sends, current = [], [], [], None
    for query in queries.captured_queries:
        verb = query["sql"].split()[0].upper()
        # Several statements sent as one string (PostgreSQL): each one's verb, in order, but for
        # the SET LOCAL synchronous_commit of a round trip's transaction.
        verbs = [v for v in re.findall(r"(?:^|; )(INSERT|UPDATE|SET|SELECT|DELETE|WITH) ", query["sql"]) if v != "SET"]
        if verb == "BEGIN":
            current = []
            sends.append(0)
        elif verb == "COMMIT":
            transactions.append(current)
            current = None
        elif current is None:  # a statement committed alone
            alone.append((len(transactions), verbs))
        else:
            sends[-1] += 1
            current += verbs
    steps = [
        ["INSERT", "UPDATE"],  # the reply asking for the tool: its row, counters
        ["INSERT", "INSERT", "UPDATE"],  # the tool's result: its call record, its row, counters
        ["INSERT", "UPDATE"],  # the final write: the answer, the turn's end
    ]
    if dbconn.binds_on_client(connection):  # PostgreSQL (psycopg 3): each one string, a transaction of its own
        assert transactions == [], transactions
        fenced = [[verb.replace("WITH", "UPDATE") for verb in verbs] for _, verbs in alone[1:]]
        assert alone[0] == (0, ["UPDATE"]) and fenced == steps, alone
        assert all(verbs[-1] == "WITH" for _, verbs in alone[1:]), alone
    else:
        assert alone == [(0, ["UPDATE"])], alone  # the claim, before any transaction
        assert transactions == steps, transactions
    assert state.read(turn.id)["status"] == "completed"


@pytest.mark.django_db(transaction=True)  # a transaction of its own, as in a worker (not inside a test's)
def test_a_turns_transactions_only_send_statements_built_before_they_begin(conversations_settings, monkeypatch):
    """A running turn's claim, round trips and final write each build all their statements (their
    values prepared, the final write's rows made and its cost priced) before their transaction
    begins: on SQLite the ``BEGIN`` takes the database's one write lock (the demo's ``IMMEDIATE``),
    and every other writer, a visitor's POST among them, waits while it is held. Inside each
    transaction the runner only sends what it built; each transaction is the one its statements
    were built for, and the turn ends as before."""
    import threading

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from conversations.core import pricing
    from conversations.engine import statements

    turn, model, runner = run_turn(conversations_settings)
    events = []  # ("built" | "priced", how many queries were logged by then), in order
    runner_thread = threading.get_ident()

    def note(kind):
        if threading.get_ident() == runner_thread:  # a tool runs in a thread (and connection) of its own
            events.append((kind, len(connection.queries_log)))

    class Built(statements.Statement):
        def __new__(cls, *args):
            note("built")
            return super().__new__(cls, *args)

    priced = pricing.turn_cost

    def turn_cost(*args, **kwargs):
        note("priced")
        return priced(*args, **kwargs)

    monkeypatch.setattr(statements, "Statement", Built)
    monkeypatch.setattr(pricing, "turn_cost", turn_cost)
    with CaptureQueriesContext(connection) as queries:
        runner.run()
    monkeypatch.undo()

    logged = [q["sql"].split()[0].upper() for q in connection.queries_log]
    inside = []
    for kind, position in events:
        edges = [verb for verb in logged[queries.initial_queries:position] if verb in ("BEGIN", "COMMIT", "ROLLBACK")]
        if edges and edges[-1] == "BEGIN":
            inside.append((kind, position))
    assert [kind for kind, _ in events].count("built") == 8 and ("priced" in [kind for kind, _ in events])
    assert inside == [], f"built or priced inside a transaction: {inside}"
    # Each transaction sent what was built just before it: the claim's UPDATE (alone, it commits by
    # itself: ``dbconn.lone_step``); each round trip's rows.
    sent = [verb for verb in logged[queries.initial_queries:queries.final_queries] if verb in (
        "BEGIN", "COMMIT", "INSERT", "UPDATE")]
    assert sent == ["UPDATE", "BEGIN", "INSERT", "UPDATE", "COMMIT",
                    "BEGIN", "INSERT", "INSERT", "UPDATE", "COMMIT", "BEGIN", "INSERT", "UPDATE", "COMMIT"] \
        or connection.vendor == "postgresql", sent  # PostgreSQL sends each transaction's as one string
    final = state.read(turn.id)
    assert (final["done"], final["status"], final["messages"][-1]["content"]) == (True, "completed",
                                                                                  "Refunds take 30 days.")
    turn.refresh_from_db()
    assert (turn.status, turn.model_calls, turn.tool_calls) == ("completed", 2, 1)


@pytest.mark.django_db(transaction=True)
def test_a_post_that_starts_a_turn_reads_the_visitors_session_once(conversations_settings, monkeypatch):
    """The POST's Redis round trips, pinned: the session read once (its load is the check that the
    store answers), the enqueue with the look for a worker listening on the queue (one: RQ's own
    enqueue made two, the look one more), the queued state (two), the turn's address; never an
    EXISTS before the session's GET."""
    from tests.support.helpers import api_post, make_client

    conversations_settings.update(TURN_RATE_PER_OWNER="", TURN_RATE_PER_IP="", CONVERSATION_RATE_PER_OWNER="",
                                  CONVERSATION_RATE_PER_IP="", DAILY_TOKEN_BUDGET=0, MAX_ACTIVE_TURNS_PER_OWNER=0)
    client = make_client()
    for _ in range(2):  # the connections made, and the session saved, before counting
        conversation = api_post(client, "/api/conversations/").json()
        api_post(client, f"/api/conversations/{conversation['id']}/turns/", {"content": "Hi"})
    conversation = api_post(client, "/api/conversations/").json()
    sent = count_round_trips(monkeypatch)
    response = api_post(client, f"/api/conversations/{conversation['id']}/turns/", {"content": "Hello?"})
    monkeypatch.undo()

    assert response.status_code == 202
    assert "exists" not in sent and sent.count("get") == 1, sent
    assert "smembers" not in sent and "scard" not in sent, sent  # the look for a worker went with the enqueue
    assert len(sent) <= 5, sent


@pytest.mark.django_db(transaction=True)
def test_a_turns_job_is_enqueued_at_the_commit_in_one_redis_round_trip(conversations_settings, monkeypatch):
    """The job of a turn started in a transaction reaches the queue at its commit, not before (the
    visitor's message is saved by then), in one Redis round trip, the queue's name among RQ's
    queues; a transaction rolled back enqueues nothing."""
    from django.db import transaction

    from conversations.engine import lifecycle
    from conversations.infra import queue as turn_queue

    def lock(conversation):
        return lambda: Conversation.objects.select_for_update().get(pk=conversation.pk)

    rq_queue = turn_queue.get_queue()
    first, _message = lifecycle._start(lock(Conversation.objects.create(owner_token="s")), "Hi", lifecycle.ensure_idle,
                                       "")  # the connection made (and RQ's look at the server's version)
    conversation = Conversation.objects.create(owner_token="t")
    with transaction.atomic():
        sent = count_round_trips(monkeypatch)
        turn, message = lifecycle._start(lock(conversation), "Hello?", lifecycle.ensure_idle, "")
        queued_inside = list(sent)
        del sent[:]
    monkeypatch.undo()

    assert queued_inside == [], queued_inside  # nothing before the commit
    assert sent == ["multi"], sent  # at the commit: the job, in one pipeline
    assert rq_queue.get_job_ids() == [first.job_id, turn.job_id]
    assert list(rq_queue.fetch_job(turn.job_id).args) == [str(turn.id)]
    assert rq_queue.key.encode() in rq_queue.connection.smembers(rq_queue.redis_queues_keys)

    other = Conversation.objects.create(owner_token="u")
    with pytest.raises(RuntimeError), transaction.atomic():
        lifecycle._start(lock(other), "Hello?", lifecycle.ensure_idle, "")
        raise RuntimeError("rolled back")
    assert rq_queue.get_job_ids() == [first.job_id, turn.job_id]


@pytest.mark.django_db(transaction=True)
def test_a_post_that_starts_a_turn_reads_its_conversation_with_the_lock_and_the_active_turns_once(
        conversations_settings):
    """The POST's reads, pinned, with every limit per owner on: one statement reads the conversation
    posted to (on PostgreSQL it locks its row, after the owner's advisory lock, the two sent as one
    string: one round trip); one more, once the
    lock is held, counts what the turn is admitted on (the conversation's turns and its active
    ones, the owner's active turns and tokens of the day). They were seven: the lock, the
    conversation, one turn at a time, and a query for each limit (the owner's active turns twice)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tests.support.helpers import api_post, make_client

    conversations_settings.update(TURN_RATE_PER_OWNER="", TURN_RATE_PER_IP="", CONVERSATION_RATE_PER_OWNER="",
                                  CONVERSATION_RATE_PER_IP="", MAX_ACTIVE_TURNS_PER_ADDRESS=0,
                                  DAILY_TOKEN_BUDGET=200000, TURN_TOKEN_RESERVE=4000, MAX_TURNS_PER_CONVERSATION=50,
                                  MAX_ACTIVE_TURNS_PER_OWNER=2)
    client = make_client()
    conversation = api_post(client, "/api/conversations/").json()
    with CaptureQueriesContext(connection) as queries:
        response = api_post(client, f"/api/conversations/{conversation['id']}/turns/", {"content": "Hello?"})

    assert response.status_code == 202
    reads = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT")]
    if connection.vendor == "postgresql":  # the owner's lock first, in the read's string (SQLite's is the file's)
        owner_lock, reads[0] = reads[0].split("; ", 1)
        assert owner_lock.startswith("SELECT pg_advisory_xact_lock(") and "FROM" not in owner_lock, owner_lock
    assert len(reads) == 2, reads
    conversations, turns = (Conversation._meta.db_table, Turn._meta.db_table)
    assert reads[0].endswith("FOR UPDATE") or connection.vendor == "sqlite", reads[0]
    assert f'FROM "{conversations}"' in reads[0] and f'FROM "{turns}"' in reads[1], reads


@pytest.mark.django_db(transaction=True)  # the job closes the connection it found, as in a worker
def test_a_job_reads_its_turn_and_its_transcript_in_one_send(conversations_settings):
    """Before its claim, a job reads its turn (with its conversation and assistant) and the
    conversation's transcript, and nothing else; on PostgreSQL both reads go to the server as one
    string (one network round trip, not two). The model is sent the conversation's earlier turn
    and this turn's message, as before."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from conversations.engine.job import perform_turn
    from conversations.infra import dbconn
    from tests.support.fakes import FakeProvider, openai_text

    conversation = Conversation.objects.create(owner_token="t")
    earlier = Turn.objects.create(conversation=conversation, status=Turn.Status.COMPLETED)
    Message.objects.create(conversation=conversation, turn=earlier, role="user", content="Hello")
    Message.objects.create(conversation=conversation, turn=earlier, role="assistant", content="Hi! How can I help?")
    turn = Turn.objects.create(conversation=conversation)
    Message.objects.create(conversation=conversation, turn=turn, role="user", content="How do refunds work?")
    with FakeProvider() as fake:
        fake.add(openai_text("Refunds take 30 days."))
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="sk-test-key", MODEL="gpt-test")
        with CaptureQueriesContext(connection) as queries:
            perform_turn(str(turn.pk))

    sent = [q["sql"] for q in queries.captured_queries]
    claim = next(i for i, sql in enumerate(sent) if sql.startswith("UPDATE "))
    reads = [re.findall(r"(?:^|; )(SELECT) ", sql) for sql in sent[:claim]]
    assert sum(reads, []) == ["SELECT", "SELECT"], sent[:claim]
    if dbconn.binds_on_client(connection):
        assert len(reads) == 1, sent[:claim]
    assert [(m["role"], m["content"]) for m in fake.requests[0]["json"]["messages"] if m["role"] != "system"] == [
        ("user", "Hello"), ("assistant", "Hi! How can I help?"), ("user", "How do refunds work?")]
    assert state.read(turn.id)["messages"][-1]["content"] == "Refunds take 30 days."


@pytest.mark.django_db(transaction=True)
def test_a_turns_model_calls_parse_each_url_once(conversations_settings, monkeypatch):
    """Where a model call goes (its endpoint, the origins its key and proxies are checked for) is
    read from the provider's URL by one parse (``endpoints.locate``): a turn of two model calls and
    a tool parses each URL it uses once, where each call parsed them six times; the turn's
    answer is the same."""
    from conversations import endpoints
    from conversations.engine.job import perform_turn
    from tests.support.fakes import FakeProvider, openai_text, openai_tool_calls

    parsed = []
    real = endpoints.parse_url

    def parse_url(text):
        parsed.append(text)
        return real(text)

    conversation = Conversation.objects.create(owner_token="t")
    turn = Turn.objects.create(conversation=conversation)
    Message.objects.create(conversation=conversation, turn=turn, role="user", content="How do refunds work?")
    with FakeProvider() as fake:
        fake.add(openai_tool_calls(("search_faq", {"query": "refunds"})), openai_text("Refunds take 30 days."))
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="sk-test-key", MODEL="gpt-test")
        endpoints._locate.cache_clear()
        monkeypatch.setattr(endpoints, "parse_url", parse_url)
        perform_turn(str(turn.pk))
        monkeypatch.undo()

    assert state.read(turn.id)["messages"][-1]["content"] == "Refunds take 30 days."
    assert len(fake.requests) == 2
    assert parsed and len(parsed) == len(set(parsed)), parsed


@pytest.mark.django_db(transaction=True)  # the job closes the connection it found, as in a worker
def test_a_turns_model_calls_prepare_their_request_and_read_the_providers_signature_once(
        conversations_settings, monkeypatch):
    """Per model call, the HTTP client's CPU went first to what is the same for each of a turn's
    calls: requests' preparation of the request (the URL parsed, checked and quoted, the session's
    headers merged) and the provider's signature read (whether its ``complete`` takes ``on_text``).
    A three-call turn now prepares its request once and reads the signature at most once (none
    when an earlier turn of the process read it), where it did both three times; its answer is
    the same, and each call still sent its own messages."""
    import inspect

    import requests

    from conversations.engine.job import perform_turn
    from tests.support.fakes import FakeProvider, openai_text, openai_tool_calls

    prepared, signatures = [], []
    prepare_url, signature = requests.PreparedRequest.prepare_url, inspect.signature

    def counted_prepare_url(self, url, params):
        prepared.append(url)
        return prepare_url(self, url, params)

    def counted_signature(function, *args, **kwargs):
        if getattr(function, "__name__", "") == "complete":
            signatures.append(function)
        return signature(function, *args, **kwargs)

    conversation = Conversation.objects.create(owner_token="t")
    turn = Turn.objects.create(conversation=conversation)
    Message.objects.create(conversation=conversation, turn=turn, role="user", content="Refunds, and returns?")
    with FakeProvider() as fake:
        fake.add(openai_tool_calls(("search_faq", {"query": "refunds"})),
                 openai_tool_calls(("search_faq", {"query": "returns"})), openai_text("Refunds take 30 days."))
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="sk-test-key", MODEL="gpt-test",
                                      STREAM=False)
        monkeypatch.setattr(requests.PreparedRequest, "prepare_url", counted_prepare_url)
        monkeypatch.setattr(inspect, "signature", counted_signature)
        perform_turn(str(turn.pk))
        monkeypatch.undo()

    assert state.read(turn.id)["messages"][-1]["content"] == "Refunds take 30 days."
    assert [len(request["json"]["messages"]) for request in fake.requests] == [2, 4, 6]
    assert prepared == [fake.url + "/chat/completions"]
    assert len(signatures) <= 1, signatures


@pytest.mark.django_db(transaction=True)  # no transaction around it, as in a worker (not inside a test's)
def test_a_round_trip_of_a_turn_another_job_took_saves_nothing_at_all(conversations_settings):
    """Each round trip's rows are saved only while the turn is still this job's: when another job
    continued it meanwhile (this one was frozen, or taken for dead), this job's tool result, the
    tool's call record and its counter are all left unwritten, the other job's state is kept, and
    this job ends without a final write. On PostgreSQL the round trip is one string with no
    transaction around it, whose fence must then roll back the statements sent before it in that
    string."""
    from conversations.models import CallRecord

    turn, model, runner = run_turn(conversations_settings)
    TAKEN_DURING_TOOL.append(turn.pk)
    try:
        runner.run()
    finally:
        TAKEN_DURING_TOOL.clear()

    turn.refresh_from_db()
    assert (turn.job_id, turn.status, turn.model_calls, turn.tool_calls) == ("the-other-job", "running", 1, 0)
    assert list(Message.objects.filter(turn=turn).values_list("role", flat=True)) == ["user", "assistant"]
    assert not CallRecord.objects.filter(turn=turn).exists()
    assert model.calls == 1
    assert state.read(turn.id)["done"] is False
