"""A visitor's turn end to end: API → RQ job in a real forking worker → cache state → poll view."""

import time

import django_rq
import pytest
from django.db import transaction

from conversations.engine.lifecycle import enqueue_turn
from conversations.models import Conversation, Message, Turn
from tests.support.helpers import Poller, api_post, make_client, start_turn
from tests.support.fakes import FakeProvider, openai_text, openai_tool_calls

pytestmark = pytest.mark.django_db(transaction=True)


def test_demo_turn_shows_each_step_before_the_final_answer(worker):
    client = make_client()
    turn = start_turn(client, "What time is it in Tokyo, and how do refunds work?")
    assert turn["status"] == "queued" and turn["done"] is False

    with Poller(client, turn["poll_url"]) as poller:
        worker()

    states = poller.states
    final = states[-1]
    assert final["done"] is True and final["status"] == "completed" and final["error"] is None
    # Before the final write the poller saw the turn running, with its tool steps already there.
    in_progress = [s for s in states if not s["done"]]
    assert any(any(m["role"] == "tool" for m in s["messages"]) for s in in_progress)
    assert [s["version"] for s in states] == sorted(set(s["version"] for s in states))
    roles = [m["role"] for m in final["messages"]]
    assert roles[0] == "user" and roles[-1] == "assistant"
    tool_messages = [m for m in final["messages"] if m["role"] == "tool"]
    # The demo searches the site first and, finding nothing there (this site indexes no pages), the FAQ.
    assert [m["name"] for m in tool_messages] == ["current_time", "search_site", "search_faq"]
    assert "Tokyo" in final["messages"][-1]["content"]
    assert "refund" in final["messages"][-1]["content"].lower()

    # The transcript is in the database, in order, each row linked to the turn.
    rows = list(Message.objects.filter(turn_id=turn["id"]).order_by("id"))
    assert [r.role for r in rows] == roles
    saved = Turn.objects.get(pk=turn["id"])
    assert saved.status == "completed" and saved.model_calls == 3 and saved.tool_calls == 3
    assert saved.started_at and saved.finished_at and saved.deadline_at
    assert saved.job_timeout == 10 and 0 < saved.margin_left <= 10


def test_openai_compatible_provider_runs_a_tool_and_answers(worker, conversations_settings):
    with FakeProvider() as fake:
        fake.add(openai_tool_calls(("search_faq", {"query": "refunds"})), openai_text("Refunds take 30 days."))
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="sk-test-key", MODEL="gpt-test")
        client = make_client()
        turn = start_turn(client, "How do refunds work?")
        worker()
        final = client.get(turn["poll_url"]).json()

    assert final["done"] is True and final["status"] == "completed"
    assert final["messages"][-1] == {"id": final["messages"][-1]["id"], "role": "assistant",
                                     "content": "Refunds take 30 days."}
    assert final["messages"][1]["tool_calls"] == [{"id": "call_1", "name": "search_faq",
                                                   "arguments": {"query": "refunds"}}]
    assert "30 days of delivery" in final["messages"][2]["content"]

    first, second = fake.requests
    assert first["path"] == "/v1/chat/completions"
    assert first["headers"]["Authorization"] == "Bearer sk-test-key"
    assert first["json"]["model"] == "gpt-test"
    assert first["json"]["messages"][-1] == {"role": "user", "content": "How do refunds work?"}
    assert {t["function"]["name"] for t in first["json"]["tools"]} == {"current_time", "search_faq", "search_site",
                                                                 "email_answer"}
    tool_result = second["json"]["messages"][-1]
    assert tool_result["role"] == "tool" and tool_result["tool_call_id"] == "call_1"
    assert "30 days of delivery" in tool_result["content"]
    saved = Turn.objects.get(pk=turn["id"])
    assert (saved.input_tokens, saved.output_tokens) == (13 + 11, 5 + 7)


def test_enqueue_inside_a_transaction_happens_at_commit():
    conversation = Conversation.objects.create(owner_token="t")
    queue = django_rq.get_queue("default")
    with transaction.atomic():
        turn = Turn.objects.create(conversation=conversation)
        Message.objects.create(conversation=conversation, turn=turn, role="user", content="hi")
        job_id = enqueue_turn(turn)
        assert queue.count == 0  # django-rq waits for the commit
    assert queue.job_ids == [job_id]
    assert Turn.objects.get(pk=turn.pk).job_id == job_id


def test_second_message_continues_the_conversation(worker):
    client = make_client()
    first = start_turn(client, "What time is it in London?")
    worker()
    conversation = first["conversation"]
    second = api_post(client, f"/api/conversations/{conversation}/turns/", {"content": "Thanks!"})
    assert second.status_code == 202
    worker()
    transcript = client.get(f"/api/conversations/{conversation}/").json()
    assert [m["role"] for m in transcript["messages"]][:1] == ["user"]
    assert transcript["messages"][-1]["role"] == "assistant"
    assert transcript["active_turn"] is None
    assert Turn.objects.filter(conversation_id=conversation, status="completed").count() == 2


def test_a_message_sent_while_the_queue_is_unreachable_is_kept_and_its_turn_ends_with_a_clear_error(
        unreachable_queue):
    client = make_client()
    conversation = api_post(client, "/api/conversations/").json()["id"]
    unreachable_queue()

    response = api_post(client, f"/api/conversations/{conversation}/turns/", {"content": "Are you there?"},
                        HTTP_IDEMPOTENCY_KEY="first-try")

    assert response.status_code == 503
    assert response.json()["detail"] == "The assistant is unavailable right now. Please try again in a minute."
    turn = Turn.objects.get()
    assert Message.objects.get(turn=turn).content == "Are you there?"
    assert turn.status == "failed" and turn.done
    # The widget, polling the turn, is told it ended and why; the next message is accepted.
    unreachable_queue(False)
    state = client.get(f"/api/conversations/{conversation}/turns/{turn.id}/").json()
    assert state["done"] is True and state["status"] == "failed"
    assert state["error"] == "The assistant is unavailable right now. Please try again in a minute."
    assert [m["content"] for m in state["messages"]] == ["Are you there?"]
    # The widget sends the same text again with the same key: a new turn starts (no replay of the failed one).
    again = api_post(client, f"/api/conversations/{conversation}/turns/", {"content": "Are you there?"},
                     HTTP_IDEMPOTENCY_KEY="first-try")
    assert again.status_code == 202 and again.json()["id"] != str(turn.id) and again.json()["status"] == "queued"


@pytest.fixture
def cache_down_db_sessions(unreachable_cache, settings):
    """``unreachable_cache``, with sessions in the database (as a site may keep them), so that
    nothing the visitor does touches the Redis that is down."""
    settings.SESSION_ENGINE = "django.contrib.sessions.backends.db"
    return unreachable_cache


def test_cancelling_a_queued_turn_while_redis_is_down_still_cancels_it(worker, cache_down_db_sessions,
                                                                      conversations_settings):
    client = make_client()
    turn = start_turn(client)
    cache_down_db_sessions()

    response = api_post(client, turn["cancel_url"])

    assert response.status_code == 202
    assert response.json()["status"] == "cancelled" and response.json()["done"] is True
    cache_down_db_sessions(False)
    worker()  # the job finds its turn already ended and leaves it alone
    saved = Turn.objects.get(pk=turn["id"])
    assert saved.status == "cancelled" and saved.model_calls == 0
    assert [m.role for m in saved.messages.all()] == ["user"]
    # The cache still holds the "queued" state; once it is stale, the poll serves the row's end.
    conversations_settings.update(STALE_AFTER=0)
    state = client.get(turn["poll_url"]).json()
    assert state["done"] is True and state["status"] == "cancelled"


def test_stopping_a_running_turn_while_redis_is_down_answers_503(cache_down_db_sessions):
    client = make_client()
    turn = start_turn(client)
    Turn.objects.filter(pk=turn["id"]).update(status="running")
    cache_down_db_sessions()

    response = api_post(client, turn["cancel_url"])

    assert response.status_code == 503
    assert response.json()["detail"] == "The assistant is unavailable right now. Please try again in a minute."
    assert Turn.objects.get(pk=turn["id"]).cancel_requested is True


def test_each_round_trip_publishes_one_state_and_the_answer_comes_with_the_final_one(any_worker,
                                                                                   conversations_settings):
    """Three round trips (a model call asking for a tool, the tool, the model's answer): the widget
    gets the running state, one state per round trip, and the answer already in the final
    ``done`` state, not first in a state of its own; the answer's row is in the database."""
    with FakeProvider() as fake:
        fake.add(openai_tool_calls(("search_faq", {"query": "refunds"})), openai_text("Refunds take 30 days."))
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="sk-test-key", MODEL="gpt-test")
        client = make_client()
        turn = start_turn(client, "How do refunds work?")
        with Poller(client, turn["poll_url"]) as poller:
            any_worker()
        final = poller.final

    assert final["done"] is True and final["status"] == "completed"
    assert [m["role"] for m in final["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert final["messages"][-1]["content"] == "Refunds take 30 days."
    # queued (the POST), running, the model's tool call, the tool's result, the final state with the answer
    assert final["version"] == 5, [(s["version"], s["status"], s["done"], len(s["messages"])) for s in poller.states]
    assert not any(s["messages"][-1]["content"] == "Refunds take 30 days." for s in poller.states if not s["done"])
    saved = Turn.objects.get(pk=turn["id"])
    assert saved.model_calls == 2 and saved.tool_calls == 1 and saved.provider == "openai"
    assert list(saved.messages.order_by("id").values_list("role", "content"))[-1] == ("assistant",
                                                                                       "Refunds take 30 days.")
    assert final["messages"][-1]["id"] == saved.messages.order_by("id").last().id


def test_an_idle_worker_process_starts_a_turn_at_once_and_leaves_at_once_when_stopped(worker_process, worker_class):
    """A real ``manage.py rqworker`` of each class, idle in its blocking dequeue: a turn posted
    now starts within moments (no polling interval, no slot hand-off waits), and SIGTERM (a
    deploy's warm shutdown) ends the idle process in seconds."""
    from rq import Worker as RQWorker
    from rq.job import Job

    from conversations.infra.queue import get_queue
    from tests.support.helpers import poll_until_done, wait_for, wait_for_exit

    [process] = worker_process(worker_class=worker_class)
    wait_for(lambda: RQWorker.count(queue=get_queue()) == 1, what="the worker to register")
    time.sleep(1.5)  # past its first dequeue: waiting in Redis for a job
    client = make_client()
    turn = start_turn(client, "Hello?")
    assert poll_until_done(client, turn["poll_url"], timeout=20)["status"] == "completed"

    job = Job.fetch(Turn.objects.get(pk=turn["id"]).job_id, connection=get_queue().connection)
    assert (job.started_at - job.enqueued_at).total_seconds() < 0.5  # a few ms unloaded; slack for a busy machine
    stopped = time.monotonic()
    process.terminate()
    wait_for_exit(process, 90)
    assert time.monotonic() - stopped < 8


def test_a_web_process_slow_to_publish_the_queued_state_never_hides_the_answer(worker_process, monkeypatch,
                                                                                 conversations_settings):
    """On a loaded machine the web process that saved a turn may be held up between its commit and
    its publish of the turn's first (queued) state, while an idle ConcurrentWorker runs the whole
    turn in milliseconds. That late queued state must not land over the answer: the widget reads
    the answer within moments, not a queued turn until QUEUE_WAIT."""
    from rq import Worker as RQWorker

    from conversations.infra import state
    from conversations.infra.queue import get_queue
    from tests.support.helpers import CONCURRENT, poll_until_done, wait_for

    conversations_settings.update(QUEUE_WAIT=30)
    worker_process(1, worker_class=CONCURRENT)
    wait_for(lambda: RQWorker.count(queue=get_queue()) == 1, what="the worker to register")
    published = state.publish

    def held_up(data, **kwargs):
        if data["status"] == Turn.Status.QUEUED:
            time.sleep(2)  # the turn takes a few milliseconds once its job has started
        return published(data, **kwargs)

    monkeypatch.setattr(state, "publish", held_up)
    client = make_client()
    turn = start_turn(client, "Hello?")
    monkeypatch.undo()

    answered = time.monotonic()
    final = poll_until_done(client, turn["poll_url"], timeout=30)
    assert final["status"] == "completed"
    assert time.monotonic() - answered < 5  # a few milliseconds unloaded; slack for a busy machine


def test_a_connection_another_thread_holds_open_loses_none_of_the_work_horses_writes(worker, conversations_settings):
    """Another thread of this process has the database open when the work horse forks (here one
    that has ended, whose connection Django's wrapper keeps until the garbage collector gets to it).
    SQLite's bookkeeping of that connection's locks is copied into the horse, which then takes none
    of its own on the database file; when the connection was closed here while the horse ran, this
    process, finding no other connection open, checkpointed and deleted the write-ahead log under
    the horse: the turn's final write was lost (its row still "running" after its job had logged
    the write, the visitor shown the answer). The suite's forking worker forks no horse with one open."""
    import threading

    from django.db import connections

    held = []

    def read_and_leave_open():
        Turn.objects.count()
        held.append(connections["default"])  # as a reference cycle keeps it until the collector runs

    reader = threading.Thread(target=read_and_leave_open)
    reader.start()
    reader.join()

    def answer_once_closed(handler):  # in this process, while the horse waits for the answer
        if held[0].connection is not None:
            held[0].connection.close()  # as the collector does when it frees the wrapper
        time.sleep(0.2)
        handler.send_json(200, openai_text("Written."))

    with FakeProvider() as fake:
        fake.add(answer_once_closed)
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="sk-test", MODEL="m", STREAM=False)
        client = make_client()
        started = start_turn(client, "Hello?")
        worker()

    turn = Turn.objects.get(pk=started["id"])
    assert (turn.status, [m.content for m in Message.objects.filter(turn=turn, role="assistant")]) == (
        "completed", ["Written."])
