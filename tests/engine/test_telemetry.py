"""OpenTelemetry: one trace per turn, from the POST that enqueues it through RQ's job to each
provider attempt and tool run, with the GenAI attributes, timed as the admin's timeline times
them; and the metrics an operator graphs. Real Redis, real workers of both classes, fake provider
servers on 127.0.0.1, the SDK's in-memory exporter and metric reader, and a small OTLP/HTTP
receiver for the spans made in other processes (a forking worker's work horses)."""

import datetime
import json
import os
import signal
import threading
import time

import django_rq
import pytest
from django.core.cache import cache
from django.utils import timezone

from conversations.infra import lease
from conversations.models import CallRecord, Turn
from conversations.tools import tool
from tests.support.fake_stream import openai_stream, streaming
from tests.support.fakes import FakeProvider, hang, http_error, openai_text, unavailable
from tests.support.helpers import (CONCURRENT, FORKING, api_post, make_client, make_worker, poll_until_done,
                                   run_worker, start_turn, wait_for)

otel = pytest.importorskip("tests.support.otel", reason="the otel extra is not installed")

pytestmark = pytest.mark.django_db(transaction=True)

QUESTION = "How long do refunds take for order ZQ-4411?"
ANSWER = "Refunds take 30 days for order ZQ-4411."
SECRET_WORDS = ("refunds", "zq-4411", "30 days")  # lower case; no word a hex id could hold


@tool(idempotent=True)
def look_up_order(order: str) -> str:
    """A read-only tool; under a test that kills its process, it waits to be let go (``test:answer``)."""
    cache.set("test:tool-pid", os.getpid())
    deadline = time.monotonic() + 20
    while cache.get("test:hold") and not cache.get("test:answer") and time.monotonic() < deadline:
        time.sleep(0.05)
    return f"order {order}: refunded, 30 days"


@pytest.fixture
def receiver():
    with otel.OtlpReceiver() as running:
        yield running


@pytest.fixture
def telemetry(receiver):
    """The SDK in this process, recording for this test only; spans from forked work horses
    reach ``receiver`` through the OTLP exporter they inherit."""
    recorder = otel.Telemetry.get()
    recorder.start(forward_to=receiver.url)
    yield recorder
    recorder.stop()


@pytest.fixture
def chain(conversations_settings):
    """A primary that is down (503 every time) and a fallback that streams; each model call is
    two attempts at the primary (a retry), then the fallback."""
    with FakeProvider(default=unavailable(503)) as primary, FakeProvider() as fallback:
        conversations_settings.update(
            PROVIDER="openai", BASE_URL=primary.url, API_KEY="sk-primary", MODEL="primary-model",
            FALLBACKS=[{"PROVIDER": "openai", "BASE_URL": fallback.url, "API_KEY": "sk-fallback",
                        "MODEL": "fallback-model"}],
            TOOLS=[f"{__name__}.look_up_order"], STREAM=True, MAX_ATTEMPTS=2, BACKOFF_BASE=0.01, BACKOFF_MAX=0.02,
            JOB_TIMEOUT=30, DEADLINE_MARGIN=4, CALL_TIMEOUT=8, FALLBACK_RESERVE=3, MIN_CALL_BUDGET=1,
            MAX_RESUMES=2, BREAKER_FAILURES=50)
        fallback.add(streaming(openai_stream(calls=[("call_1", "look_up_order", {"order": "ZQ-4411"})])),
                     streaming(openai_stream(ANSWER)))
        yield primary, fallback


def by_name(spans, prefix):
    return [s for s in spans if s["name"].startswith(prefix)]


def as_dict(span):
    """An SDK ``ReadableSpan`` in the receiver's shape."""
    return {"name": span.name, "trace_id": f"{span.context.trace_id:032x}", "span_id": f"{span.context.span_id:016x}",
            "parent_id": f"{span.parent.span_id:016x}" if span.parent else None, "kind": span.kind.name,
            "start": span.start_time, "end": span.end_time,
            "attributes": {k: list(v) if isinstance(v, tuple) else v for k, v in span.attributes.items()},
            "events": [{"name": event.name, "attributes": dict(event.attributes)} for event in span.events],
            "status": span.status.status_code.value}


def settled(telemetry, receiver=None, jobs=1):
    """The spans once ``jobs`` job spans have ended: a job's span ends, and its last step's call
    spans are made, after the final state the test polled for is published."""
    wait_for(lambda: len(by_name(collected(telemetry, receiver), "conversations.turn.job")) == jobs, timeout=10,
             what=f"{jobs} job spans")
    return collected(telemetry, receiver)


def collected(telemetry, receiver=None):
    """Every span of the test, once each: this process's (in memory) and the other processes' (OTLP)."""
    spans = {s["span_id"]: s for s in (receiver.spans if receiver is not None else [])}
    spans.update({s["span_id"]: s for s in map(as_dict, telemetry.spans.get_finished_spans())})
    return list(spans.values())


def assert_no_message_text(spans):
    for span in spans:
        text = json.dumps(span["attributes"]).lower() + span["name"].lower()
        for words in SECRET_WORDS:
            assert words not in text, (span["name"], words)


def assert_matches_timeline(spans, turn):
    """Each call record of the turn has one span with its kind, name, attempt, outcome and duration (±1 ms)."""
    records = list(CallRecord.objects.filter(turn=turn).exclude(kind="resume").order_by("id"))
    calls = by_name(spans, "chat ") + by_name(spans, "execute_tool ")
    assert len(calls) == len(records)
    story = sorted((("chat " if r.kind == "model" else "execute_tool ") + r.name, r.attempt, r.outcome,
                    round(r.duration * 1000)) for r in records)
    told = sorted((s["name"], s["attributes"]["conversations.call.attempt"],
                   s["attributes"]["conversations.call.outcome"], round((s["end"] - s["start"]) / 1e6))
                  for s in calls)
    for (name, attempt, outcome, ms), (t_name, t_attempt, t_outcome, t_ms) in zip(story, told):
        assert (name, attempt, outcome) == (t_name, t_attempt, t_outcome)
        assert abs(ms - t_ms) <= 1


def test_a_streamed_tool_turn_with_a_retry_and_a_fallback_is_one_trace(chain, telemetry, receiver, worker_class):
    primary, fallback = chain
    client = make_client()
    started = start_turn(client, QUESTION)
    run_worker(worker_class)
    final = poll_until_done(client, started["poll_url"])
    assert (final["status"], final["messages"][-1]["content"]) == ("completed", ANSWER)
    turn = Turn.objects.get(pk=started["id"])

    wait_for(lambda: len(by_name(collected(telemetry, receiver), "conversations.turn.job")) == 1, timeout=10,
             what="the job's span")
    spans = collected(telemetry, receiver)
    assert len({s["trace_id"] for s in spans}) == 1  # one trace, from the POST to the last call
    (post,) = by_name(spans, "conversations.turn.enqueue")
    (job,) = by_name(spans, "conversations.turn.job")
    assert post["kind"] == "PRODUCER" and post["parent_id"] is None
    assert post["attributes"]["conversations.turn.id"] == str(turn.id)
    assert (job["kind"], job["parent_id"]) == ("CONSUMER", post["span_id"])
    assert job["attributes"]["conversations.turn.status"] == "completed"
    assert abs(job["attributes"]["conversations.turn.margin_left"] - turn.margin_left) < 1e-6
    chats = sorted(by_name(spans, "chat "), key=lambda s: s["start"])
    tools = by_name(spans, "execute_tool ")
    assert all(s["parent_id"] == job["span_id"] for s in chats + tools)
    # Each model call: the primary twice (attempt 1, then the retry), then the fallback.
    assert [(s["attributes"]["gen_ai.request.model"], s["attributes"]["conversations.call.attempt"],
             s["attributes"]["conversations.call.fallback"], s["attributes"].get("error.type")) for s in chats] == [
        ("primary-model", 1, 0, "http_error"), ("primary-model", 2, 0, "http_error"), ("fallback-model", 1, 1, None),
    ] * 2
    answered = [s for s in chats if s["attributes"]["conversations.call.fallback"] == 1]
    for span in chats:
        assert span["kind"] == "CLIENT"
        assert span["attributes"]["gen_ai.operation.name"] == "chat"
        assert span["attributes"]["gen_ai.provider.name"] == "openai"
        assert span["attributes"]["conversations.breaker.state"] == "closed"
    assert [s["attributes"]["gen_ai.response.finish_reasons"] for s in answered] == [["tool_calls"], ["stop"]]
    assert all(s["attributes"]["gen_ai.response.model"] == "fake-model" for s in answered)
    assert [(s["attributes"]["gen_ai.usage.input_tokens"], s["attributes"]["gen_ai.usage.output_tokens"])
            for s in answered] == [(11, 7), (11, 7)]
    assert [s["attributes"]["http.response.status_code"] for s in chats if s not in answered] == [503] * 4
    (tool_span,) = tools
    assert tool_span["attributes"]["gen_ai.tool.name"] == "look_up_order"
    assert tool_span["attributes"]["conversations.call.outcome"] == "ok"
    assert_matches_timeline(spans, turn)
    assert_no_message_text(spans)


def test_the_metrics_count_the_turn_its_calls_tokens_and_polls(chain, telemetry, worker_class):
    client = make_client()
    started = start_turn(client, QUESTION)
    run_worker(worker_class)
    final = poll_until_done(client, started["poll_url"])
    assert final["status"] == "completed"
    etag = client.get(started["poll_url"])["ETag"]
    assert client.get(started["poll_url"], HTTP_IF_NONE_MATCH=etag).status_code == 304
    if worker_class == FORKING:
        return  # the horse's own readings leave with it (exported over OTLP: the soak test counts them)
    settled(telemetry)  # the job has left perform_turn: its turn is out of the in-flight count
    points = telemetry.metric_points()

    def total(name, **attributes):
        return sum(getattr(p, "count", None) or getattr(p, "value", 0) for p in points.get(name, [])
                   if all(p.attributes.get(k) == v for k, v in attributes.items()))

    assert total("conversations.turns", **{"conversations.turn.status": "completed",
                                           "conversations.assistant": "default"}) == 1
    assert total("gen_ai.client.operation.duration", **{"error.type": "http_error"}) == 4
    assert total("gen_ai.client.operation.duration", **{"gen_ai.request.model": "fallback-model"}) == 2
    assert total("conversations.provider.errors", **{"error.type": "http_error"}) == 4
    usage = [p for p in points["gen_ai.client.token.usage"] if p.attributes["gen_ai.token.type"] == "output"]
    assert sum(p.sum for p in usage) == 14
    assert total("conversations.turn.time_to_first_word") == 1
    assert total("conversations.turn.duration") == 1
    assert total("conversations.turn.deadline_margin") == 1
    assert total("conversations.queue.wait") == 1
    assert total("conversations.poll.duration", **{"http.response.status_code": 304}) >= 1
    assert total("conversations.poll.duration", **{"http.response.status_code": 200}) >= 1
    breakers = {p.attributes["conversations.provider"]: p.value for p in points["conversations.breaker.state"]}
    assert breakers == {"openai:primary-model": 0, "openai:fallback-model": 0}  # both closed
    in_flight = points["conversations.turns.in_flight"]  # each worker this process ran: one in, one out
    assert in_flight and all(p.value == 0 for p in in_flight)


@pytest.mark.slow
def test_a_forking_workers_parent_sends_the_metrics_its_horse_measured(chain, telemetry, receiver,
                                                                       worker_process, monkeypatch):
    """A ``manage.py rqworker`` with the forking ``Worker`` and TELEMETRY="otlp": each work horse
    measures at the end of its job, after the turn's final write, and hands what it measured to the
    worker's parent, which exports it every ``OTEL_METRIC_EXPORT_INTERVAL``; the operator receives the
    same counts as from a long-lived process."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
    worker_process(1, worker_class=FORKING, TELEMETRY="otlp")
    client = make_client()
    started = start_turn(client, QUESTION)
    assert poll_until_done(client, started["poll_url"], timeout=40)["status"] == "completed"
    wait_for(lambda: "conversations.turns" in receiver.metric_points, timeout=15, what="the horse's metrics")
    time.sleep(1)  # anything sent late would be counted too

    def total(name, **attributes):
        return sum(p.get("count", p.get("as_int", 0)) for p in receiver.metric_points.get(name, [])
                   if all(p["attributes"].get(k) == v for k, v in attributes.items()))

    assert total("conversations.turns", **{"conversations.turn.status": "completed"}) == 1
    assert total("gen_ai.client.operation.duration", **{"error.type": "http_error"}) == 4
    assert total("gen_ai.client.operation.duration", **{"gen_ai.request.model": "fallback-model"}) == 2
    assert total("conversations.provider.errors") == 4
    assert total("conversations.queue.wait") == total("conversations.turn.time_to_first_word") == 1
    assert total("conversations.turn.duration") == total("conversations.turn.deadline_margin") == 1
    in_flight = receiver.metric_points["conversations.turns.in_flight"]  # counted by the parent: out at the end
    assert in_flight[-1]["as_int"] == 0 and all("conversations.worker.name" in p["attributes"] for p in in_flight)


@pytest.mark.parametrize("sigkill", [False, True], ids=["ends", "sigkilled"])
def test_a_forking_workers_parent_counts_the_turn_its_horse_runs_in_flight(chain, telemetry, sigkill,
                                                                           conversations_settings):
    """The parent of a forking ``Worker`` lives through the whole turn, its horse only measures as
    its job ends: the parent counts the turn in flight from the fork to the horse's end, however
    the horse ends (here SIGKILLed while its tool runs, the turn continued by a second horse)."""
    conversations_settings.update(TOOL_TIMEOUT=15, TOOL_RESERVE=1)
    cache.set("test:hold", True)
    client = make_client()
    started = start_turn(client, QUESTION)
    worker = make_worker(FORKING)
    level = lambda: {p.attributes["conversations.worker.name"]: p.value  # noqa: E731
                     for p in telemetry.metric_points().get("conversations.turns.in_flight", [])}.get(worker.name)
    during, failed = [], []

    def meanwhile():  # the burst runs in the main thread (RQ's signals): this reads while the horse runs
        try:
            wait_for(lambda: cache.get("test:tool-pid"), timeout=30, what="the tool to run")
            during.append(level())
            if sigkill:
                os.kill(cache.get("test:tool-pid"), signal.SIGKILL)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failed.append(exc)
        finally:
            cache.set("test:answer", True)

    reader = threading.Thread(target=meanwhile)
    reader.start()
    worker.work(burst=True)
    reader.join()
    assert not failed, failed
    final = poll_until_done(client, started["poll_url"])
    assert (final["status"], Turn.objects.get(pk=started["id"]).resumes) == ("completed", int(sigkill))
    assert during == [1]
    assert level() == 0


def _turn_held_in_its_tool(worker_class, receiver, worker_process, monkeypatch, conversations_settings):
    """A ``manage.py rqworker`` of ``worker_class`` exporting over OTLP to ``receiver``, and a turn
    started in it whose tool is running and held (``test:hold``) until the test answers it;
    returns (client, the started turn)."""
    conversations_settings.update(TOOL_TIMEOUT=15, TOOL_RESERVE=1)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    cache.set("test:hold", True)
    worker_process(1, worker_class=worker_class, TELEMETRY="otlp")
    client = make_client()
    started = start_turn(client, QUESTION)
    wait_for(lambda: cache.get("test:tool-pid"), timeout=30, what="the tool to run")
    return client, started


@pytest.mark.slow
def test_a_forking_workers_parent_exports_the_turn_in_flight_while_its_horse_runs(chain, receiver, worker_process,
                                                                                  monkeypatch, conversations_settings):
    """With TELEMETRY="otlp" the parent exports every ``OTEL_METRIC_EXPORT_INTERVAL`` while its horse
    runs too, so that a backend reads 1 turn in flight during the turn, and 0 after it."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
    client, started = _turn_held_in_its_tool(FORKING, receiver, worker_process, monkeypatch, conversations_settings)
    level = lambda: [p["as_int"] for p in  # noqa: E731 - the last point exported
                     receiver.metric_points.get("conversations.turns.in_flight", [])][-1:]
    wait_for(lambda: level() == [1], timeout=10, what="one turn in flight exported")
    time.sleep(0.5)  # more exports while the horse still runs: still 1
    assert level() == [1]
    cache.set("test:answer", True)
    assert poll_until_done(client, started["poll_url"], timeout=40)["status"] == "completed"
    wait_for(lambda: level() == [0], timeout=10, what="no turn in flight exported")


def test_the_hand_overs_waiting_are_a_gauge(telemetry):
    from conversations.models import Conversation

    Conversation.objects.create(handoff=Conversation.Handoff.WAITING)
    Conversation.objects.create(handoff=Conversation.Handoff.TAKEN)
    Conversation.objects.create()
    (point,) = telemetry.metric_points()["conversations.handoffs.waiting"]
    assert point.value == 1


def test_turns_run_side_by_side_in_a_concurrent_worker_keep_their_traces_apart(conversations_settings, telemetry):
    with FakeProvider() as fake:
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="k", MODEL="m", STREAM=True,
                                      TOOLS=[f"{__name__}.look_up_order"], MAX_ATTEMPTS=1)
        for _ in range(3):  # each reply streams for ~0.3 s: the three turns' calls overlap
            fake.add(streaming(openai_stream(calls=[("call_1", "look_up_order", {"order": "1"})]), interval=0.05))
        for _ in range(3):
            fake.add(streaming(openai_stream("Done, it is refunded."), interval=0.05))
        posted = [start_turn(make_client(), QUESTION) for _ in range(3)]
        run_worker(CONCURRENT)
    # A job's span ends as its thread leaves the job, which may be a moment after the burst returns.
    wait_for(lambda: len(by_name(collected(telemetry), "conversations.turn.job")) == 3, timeout=10,
             what="the three jobs' spans")
    spans = collected(telemetry)
    assert len({s["trace_id"] for s in spans}) == 3
    for started in posted:
        assert Turn.objects.get(pk=started["id"]).status == "completed"
        (post,) = [s for s in by_name(spans, "conversations.turn.enqueue")
                   if s["attributes"]["conversations.turn.id"] == started["id"]]
        mine = [s for s in spans if s["trace_id"] == post["trace_id"]]
        (job,) = by_name(mine, "conversations.turn.job")
        assert job["parent_id"] == post["span_id"] and job["attributes"]["conversations.turn.id"] == started["id"]
        calls = by_name(mine, "chat ") + by_name(mine, "execute_tool ")
        assert len(calls) == CallRecord.objects.filter(turn_id=started["id"]).count() == 3
        assert all(s["parent_id"] == job["span_id"] for s in calls)
    jobs = sorted(by_name(spans, "conversations.turn.job"), key=lambda s: s["start"])
    assert jobs[1]["start"] < jobs[0]["end"] and jobs[2]["start"] < jobs[0]["end"]  # they did run side by side


def test_message_text_goes_in_a_span_only_when_the_site_turns_it_on(chain, telemetry, receiver,
                                                                     conversations_settings):
    conversations_settings.update(TELEMETRY_CONTENT=True)
    client = make_client()
    started = start_turn(client, QUESTION)
    run_worker(CONCURRENT)
    assert poll_until_done(client, started["poll_url"])["status"] == "completed"
    spans = settled(telemetry, receiver)
    outputs = [s["attributes"].get("gen_ai.output.messages") for s in spans if s["name"].startswith("chat ")]
    assert any(o and ANSWER in o for o in outputs)


@pytest.mark.slow
def test_a_turn_resumed_after_sigkill_is_still_one_trace(chain, telemetry, receiver, worker_class, worker_process,
                                                        conversations_settings, monkeypatch):
    """``manage.py rqworker`` processes export over OTLP (TELEMETRY="otlp", the SDK's own OTEL_*
    variables); the tool's process (the forking worker's work horse, or a whole concurrent worker)
    is SIGKILLed while the tool runs, and the turn goes on in a new job."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "conversations-worker")
    client, started = _turn_held_in_its_tool(worker_class, receiver, worker_process, monkeypatch,
                                             conversations_settings)
    if worker_class == CONCURRENT:  # the survivor, whose reaper continues the dead process's turn
        worker_process(1, worker_class=worker_class, TELEMETRY="otlp")
        wait_for(lambda: len(lease.holders(django_rq.get_connection())) == 2, timeout=30, what="the second lease")
    wait_for(lambda: len(by_name(receiver.spans, "chat ")) == 3, timeout=10, what="the first job's call spans")
    os.kill(cache.get("test:tool-pid"), signal.SIGKILL)
    cache.set("test:answer", True)
    final = poll_until_done(client, started["poll_url"], timeout=40)
    assert (final["status"], final["messages"][-1]["content"]) == ("completed", ANSWER)
    turn = Turn.objects.get(pk=started["id"])
    assert turn.resumes == 1

    wait_for(lambda: len(by_name(collected(telemetry, receiver), "conversations.turn.job")) == 1, timeout=10,
             what="the continuation's span")
    spans = collected(telemetry, receiver)
    assert len({s["trace_id"] for s in spans}) == 1
    (post,) = by_name(spans, "conversations.turn.enqueue")
    (resume,) = by_name(spans, "conversations.turn.resume")
    (job,) = by_name(spans, "conversations.turn.job")  # the killed job's span never ended: it is lost with it
    assert resume["parent_id"] == post["span_id"]
    assert resume["attributes"]["conversations.resume.from_job"] == f"conversations-turn-{turn.id}"
    assert resume["attributes"]["messaging.message.id"] == turn.job_id
    assert job["parent_id"] == resume["span_id"] and job["attributes"]["conversations.turn.status"] == "completed"
    # The continuation's span tells what the killed job's own span can no longer say.
    (previous,) = [e for e in job["events"] if e["name"] == "conversations.job.previous_attempt"]
    assert previous["attributes"]["conversations.resume.previous_job_died"] is True
    assert previous["attributes"]["conversations.resume.from_job"] == f"conversations-turn-{turn.id}"
    assert previous["attributes"]["conversations.resume.cause"] == resume["attributes"]["conversations.resume.cause"]
    assert previous["attributes"]["conversations.resume.number"] == 1
    ids = {s["span_id"] for s in spans}
    first, second = [s for s in by_name(spans, "chat ") if s["parent_id"] not in ids], \
        [s for s in by_name(spans, "chat ") if s["parent_id"] == job["span_id"]]
    assert len(first) == 3 and len({s["parent_id"] for s in first}) == 1  # under the dead job's (lost) span
    assert len(second) == 3
    (tool_span,) = by_name(spans, "execute_tool ")  # the killed run saved no record: only the second run
    assert tool_span["parent_id"] == job["span_id"]
    assert_matches_timeline(spans, turn)
    assert CallRecord.objects.filter(turn=turn, kind="resume").count() == 1
    assert_no_message_text(spans)


def test_a_call_that_times_out_names_its_phase_and_the_turn_fails_in_the_trace(conversations_settings, telemetry):
    with FakeProvider(default=hang) as fake:
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="k", MODEL="slow-model",
                                      STREAM=False, MAX_ATTEMPTS=1, CALL_TIMEOUT=1)
        client = make_client()
        started = start_turn(client, QUESTION)
        run_worker(CONCURRENT)
    assert poll_until_done(client, started["poll_url"])["status"] == "failed"
    spans = settled(telemetry)
    (call,) = by_name(spans, "chat ")
    assert call["attributes"]["error.type"] == "timeout" and call["status"] == 2  # StatusCode.ERROR
    assert call["attributes"]["conversations.call.phase"] == "first_byte"
    (record,) = CallRecord.objects.filter(turn_id=started["id"])
    assert record.outcome == "timeout" and "conversations.call.detail" not in call["attributes"]  # content off
    assert abs((call["end"] - call["start"]) / 1e9 - record.duration) < 0.001
    (job,) = by_name(spans, "conversations.turn.job")
    assert job["attributes"]["conversations.turn.status"] == "failed" and job["status"] == 2


@pytest.mark.parametrize("content", [False, True], ids=["content-off", "content-on"])
def test_a_provider_error_that_quotes_the_visitor_is_in_a_span_only_with_content_on(conversations_settings, telemetry,
                                                                                      content):
    """A provider's error body may echo the request: by default its span tells the failure by what
    cannot carry text (error kind, HTTP status); the timeline's line only when the site turns content on.
    The record hides a quote of the sent text of 24 characters or more (``redaction.hide_quoted``),
    not a shorter piece, as a content filter may quote: this one."""
    quoted = "order ZQ-4411"
    echo = f"Invalid request: '{quoted}' was flagged"
    with FakeProvider(default=http_error(400, echo)) as fake:
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="sk-echoed", MODEL="strict-model",
                                      STREAM=False, MAX_ATTEMPTS=1, TELEMETRY_CONTENT=content)
        client = make_client()
        started = start_turn(client, QUESTION)
        run_worker(CONCURRENT)
    assert poll_until_done(client, started["poll_url"])["status"] == "failed"
    spans = settled(telemetry)
    (record,) = CallRecord.objects.filter(turn_id=started["id"])
    assert quoted in record.detail  # the timeline keeps the provider's line for the site owner
    (call,) = by_name(spans, "chat ")
    assert (call["attributes"]["error.type"], call["attributes"]["http.response.status_code"]) == ("http_error", 400)
    if content:
        assert call["attributes"]["conversations.call.detail"] == record.detail
    else:
        assert "conversations.call.detail" not in call["attributes"]
        assert_no_message_text(spans)


@pytest.mark.parametrize("content", [False, True], ids=["content-off", "content-on"])
def test_an_exception_escaping_a_job_is_named_in_its_span_and_quoted_only_with_content_on(telemetry, content):
    from conversations.infra import telemetry as app_telemetry

    with pytest.raises(ValueError), app_telemetry.job_span(None, content=content):
        raise ValueError(f"could not save {QUESTION!r}")
    (job,) = by_name(collected(telemetry), "conversations.turn.job")
    (event,) = job["events"]
    assert (event["name"], event["attributes"]["exception.type"], job["status"]) == ("exception", "ValueError", 2)
    assert ("exception.message" in event["attributes"]) is content
    if not content:
        assert_no_message_text([{"name": event["name"], "attributes": event["attributes"]}])


# -- every ending counted once (``lifecycle.ended``) ------------------------------------------------


@pytest.fixture
def answering(conversations_settings):
    with FakeProvider(default=openai_text("Hello!")) as fake:
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="k", MODEL="m", STREAM=False)
        yield fake


def test_a_queued_turn_stopped_is_counted_once_cancelled(answering, telemetry):
    client = make_client()
    started = start_turn(client, QUESTION)
    assert api_post(client, started["cancel_url"]).json()["status"] == "cancelled"
    assert api_post(client, started["cancel_url"]).json()["status"] == "cancelled"  # pressed again
    run_worker(CONCURRENT)  # its job finds it ended

    assert answering.requests == []
    assert otel.turns_counted(telemetry.metric_points()) == ({"cancelled": 1}, 1, 0)  # no job: no margin


def test_a_turn_no_worker_took_in_time_is_counted_once_failed(answering, telemetry, conversations_settings):
    conversations_settings.update(QUEUE_WAIT=1)
    client = make_client()
    started = start_turn(client, QUESTION)
    assert poll_until_done(client, started["poll_url"], timeout=20)["status"] == "failed"
    client.get(started["poll_url"])  # polled again
    conversations_settings.update(QUEUE_WAIT=30)
    api_post(client, f"/api/conversations/{started['conversation']}/turns/", {"content": "Hello again"})
    run_worker(CONCURRENT)  # the late job leaves the first turn as it ended, and runs the second

    assert otel.turns_counted(telemetry.metric_points()) == ({"failed": 1, "completed": 1}, 2, 1)


def test_a_turn_whose_job_started_past_queue_wait_is_counted_once_failed(answering, telemetry):
    client = make_client()
    started = start_turn(client, QUESTION)
    Turn.objects.filter(pk=started["id"]).update(enqueued_at=timezone.now() - datetime.timedelta(seconds=31))
    run_worker(CONCURRENT)

    assert answering.requests == []
    assert client.get(started["poll_url"]).json()["status"] == "failed"
    assert otel.turns_counted(telemetry.metric_points()) == ({"failed": 1}, 1, 0)


def test_a_running_turn_whose_job_is_gone_is_counted_once_when_stop_ends_it(answering, telemetry):
    client = make_client()
    started = start_turn(client, QUESTION)
    turn = Turn.objects.get(pk=started["id"])
    Turn.objects.filter(pk=turn.pk).update(status="running", started_at=timezone.now())  # claimed by a job...
    django_rq.get_queue("default").fetch_job(turn.job_id).delete()  # ...that is gone since

    assert api_post(client, started["cancel_url"]).json()["status"] == "cancelled"  # finalize() ends it
    assert api_post(client, started["cancel_url"]).json()["status"] == "cancelled"
    assert otel.turns_counted(telemetry.metric_points()) == ({"cancelled": 1}, 1, 0)


def test_a_turn_its_job_ended_is_counted_once_with_its_margin(answering, telemetry):
    client = make_client()
    started = start_turn(client, QUESTION)
    run_worker(CONCURRENT)
    assert poll_until_done(client, started["poll_url"])["status"] == "completed"
    assert api_post(client, started["cancel_url"]).json()["status"] == "completed"  # Stop after the end
    settled(telemetry)

    assert otel.turns_counted(telemetry.metric_points()) == ({"completed": 1}, 1, 1)


@pytest.mark.slow
def test_a_turn_a_forking_workers_parent_ends_is_counted_once(chain, receiver, worker_process, monkeypatch,
                                                              conversations_settings):
    """The horse is SIGKILLed and the turn may not resume: the worker's parent ends it failed. Its
    parent exports only when it measures, so the horses it forks afterwards do not inherit that
    reading and send it again with theirs."""
    conversations_settings.update(MAX_RESUMES=0, TOOL_TIMEOUT=15, TOOL_RESERVE=1)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
    cache.set("test:hold", True)
    worker_process(1, worker_class=FORKING, TELEMETRY="otlp")
    client = make_client()
    killed = start_turn(client, QUESTION)
    wait_for(lambda: cache.get("test:tool-pid"), timeout=30, what="the tool to run")
    os.kill(cache.get("test:tool-pid"), signal.SIGKILL)
    assert poll_until_done(client, killed["poll_url"], timeout=40)["status"] == "failed"
    cache.delete("test:hold")
    _primary, fallback = chain
    for _ in range(2):  # two more turns, two more horses
        fallback.add(streaming(openai_stream(calls=[("call_1", "look_up_order", {"order": "ZQ-4411"})])),
                     streaming(openai_stream(ANSWER)))
        started = start_turn(client, QUESTION)
        assert poll_until_done(client, started["poll_url"], timeout=40)["status"] == "completed"

    def counted():
        totals = {}
        for point in receiver.metric_points.get("conversations.turns", []):
            status = point["attributes"]["conversations.turn.status"]
            totals[status] = totals.get(status, 0) + point["as_int"]
        return totals

    wait_for(lambda: counted().get("completed") == 2, timeout=15, what="the two horses' metrics")
    time.sleep(1)  # anything sent late would be counted too
    assert counted() == {"failed": 1, "completed": 2}


@pytest.mark.slow
def test_a_forking_workers_horses_make_their_own_tracer_provider_as_one_instance(answering, receiver, worker_process,
                                                                                monkeypatch):
    """The parent of a forking worker makes no tracer or meter provider (the SDK's at-fork handlers
    would run in every horse, and each gave its horse a ``service.instance.id`` of its own): each
    horse makes its own at its job's start, with the resource the parent made once, so that a
    backend sees one instance per worker, not one per turn; the spans and metrics still arrive."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
    worker_process(1, worker_class=FORKING, TELEMETRY="otlp")
    client = make_client()
    for _ in range(2):
        started = start_turn(client, QUESTION)
        assert poll_until_done(client, started["poll_url"], timeout=40)["status"] == "completed"
    wait_for(lambda: len(by_name(receiver.spans, "conversations.turn.job")) == 2, timeout=15, what="two job spans")
    jobs = by_name(receiver.spans, "conversations.turn.job")
    assert len({s["instance"] for s in jobs}) == 1 and None not in {s["instance"] for s in jobs}
    wait_for(lambda: sum(p["as_int"] for p in receiver.metric_points.get("conversations.turns", [])) == 2,
             timeout=15, what="both horses' counts")


@pytest.mark.slow
def test_a_forking_worker_forked_from_the_process_that_set_up_the_sdk_sends_each_reading_once(
        answering, receiver, worker_process, monkeypatch):
    """``manage.py rqworker-pool`` sets the SDK up in the pool's process and forks each worker from
    it. Such a worker's parent is set up as one started alone is: no thread of it exports metrics
    every ``OTEL_METRIC_EXPORT_INTERVAL`` (one collecting at the moment of a fork would leave the
    SDK's locks held in the horse for ever, and it sent the hand-overs' gauge every time); what its
    horse measured is sent once, and nothing after it."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
    worker_process(1, worker_class=FORKING, pool=True, TELEMETRY="otlp")
    client = make_client()
    started = start_turn(client, QUESTION)
    assert poll_until_done(client, started["poll_url"], timeout=60)["status"] == "completed"
    wait_for(lambda: sum(p["as_int"] for p in receiver.metric_points.get("conversations.turns", [])) == 1,
             timeout=15, what="the horse's count")
    sent = receiver.requests
    time.sleep(2)  # ten export intervals
    assert receiver.requests == sent
    assert "conversations.handoffs.waiting" not in receiver.metric_points  # the long-lived processes' gauge
    assert sum(p["as_int"] for p in receiver.metric_points["conversations.turns"]) == 1
