"""The shared circuit breaker, pinned against two fake provider servers and the real Redis:
what opens it (outages seen by more than one visitor, never a request's own error), what closes
it (only the probe), how the half-open state is probed (one call), the window and the cool-down,
and that a Redis it cannot read never fails a turn."""

import threading
import time

import pytest
from django.db import connections

from conversations.infra.breaker import CircuitBreaker, provider_key
from conversations.conf import get_config
from conversations.providers.chain import provider_health
from conversations.infra.queue import get_queue
from conversations.models import Conversation
from tests.support.fake_gateway import wrapped_refusal
from tests.support.fake_stream import streaming
from tests.support.fake_wire import run_turn_here
from tests.support.fakes import FakeProvider, openai_text, unavailable
from tests.support.helpers import at_once, make_client, poll_until_done, start_turn

pytestmark = pytest.mark.django_db(transaction=True)

FALLBACK = "From the fallback."
PRIMARY = "From the primary."


@pytest.fixture
def chain(conversations_settings):
    """A primary and a fallback OpenAI-compatible server; the fallback always answers."""
    with FakeProvider(default=unavailable(500)) as primary, FakeProvider(default=openai_text(FALLBACK)) as fallback:
        conversations_settings.update(
            PROVIDER="openai", BASE_URL=primary.url, API_KEY="sk-primary", MODEL="primary-model", TOOLS=[],
            FALLBACKS=[{"PROVIDER": "openai", "BASE_URL": fallback.url, "API_KEY": "sk-fallback",
                        "MODEL": "fallback-model"}],
            CALL_TIMEOUT=5, FALLBACK_RESERVE=3, MIN_CALL_BUDGET=1, MAX_ATTEMPTS=1, STREAM=False,
            BREAKER_FAILURES=3, BREAKER_WINDOW=60, BREAKER_COOLDOWN=1)
        yield primary, fallback


def primary_state():
    """The primary's breaker as ``manage.py provider_health`` and the admin read it."""
    health = provider_health(get_config(), get_queue().connection)
    # Labelled by what it calls and its place in the chain: "openai:primary-model at 127.0.0.1:… (the site's primary)".
    return next(state for label, state in health if label.startswith("openai:primary-model at ")
                and label.endswith("(the site's primary)"))


def turn_of(owner, content="Hello?"):
    """A turn of the visitor ``owner`` (an anonymous owner token), run in this process."""
    conversation = Conversation.objects.create(owner_token=f"token-of-{owner}")
    return run_turn_here(content, conversation=conversation)


def held(reply, released):
    """A behaviour: answer ``reply`` once ``released`` is set (within 5 s)."""
    def behaviour(handler):
        released.wait(5)
        handler.send_json(200, reply)
    return behaviour


def error_event(message, type="invalid_request_error", code=None):
    """An OpenAI-compatible stream whose only event is an error, as gateways report request errors."""
    import json

    return streaming([(None, json.dumps({"error": {"message": message, "type": type, "code": code}}))])


# -- what opens it (issue 22, item 5) -----------------------------------------------------

def test_one_visitors_request_errors_in_a_stream_never_open_the_circuit_for_everyone(chain, worker,
                                                                                     conversations_settings):
    primary, fallback = chain
    conversations_settings.update(STREAM=True)
    for message in ["Your request was flagged by our moderation system.", "Invalid 'messages': too many items.",
                    "This model's maximum context length is 128000 tokens.", "Prompt rejected by the gateway policy.",
                    "Unsupported parameter."]:
        primary.add(error_event(message))
    attacker = make_client()
    for number in range(5):
        started = start_turn(attacker, f"Attack {number}")
        worker()
        assert poll_until_done(attacker, started["poll_url"])["status"] == "failed"
    assert primary_state()["state"] == "closed" and primary_state()["recent_failures"] == 0
    assert fallback.requests == []  # a request's own error is not an outage: no failing over either

    primary.add(openai_text(PRIMARY))
    innocent = make_client()
    started = start_turn(innocent, "An honest question")
    worker()
    final = poll_until_done(innocent, started["poll_url"])
    assert (final["status"], final["messages"][-1]["content"]) == ("completed", PRIMARY)


@pytest.mark.parametrize("streamed", [True, False], ids=["stream asked", "unstreamed"])
def test_refusals_a_gateway_wraps_in_a_500_never_open_the_circuit_however_many_visitors_send_them(
        chain, worker, conversations_settings, streamed):
    primary, fallback = chain
    conversations_settings.update(STREAM=streamed, MAX_ATTEMPTS=2)
    primary.default = wrapped_refusal()
    # Six anonymous visitors, each from an address of its own.
    visitors = [turn_from(f"198.51.100.{number + 1}", "Refused") for number in range(6)]
    worker()
    for visitor, started in visitors:
        final = poll_until_done(visitor, started["poll_url"])
        assert (final["status"], final["error"]) == ("failed", "The assistant could not answer this request.")
    assert primary_state() == {"state": "closed", "recent_failures": 0, "open_for": 0}
    assert len(primary.requests) == 6 and fallback.requests == []


def test_outages_seen_only_from_one_address_do_not_open_the_circuit_whatever_owners_it_makes(
        chain, worker, conversations_settings):
    primary, fallback = chain
    # However slowly the loaded machine runs the worker.
    conversations_settings.update(BREAKER_WINDOW=600, BREAKER_COOLDOWN=600)
    visitors = [turn_from("203.0.113.9") for _ in range(6)]
    worker()
    for visitor, started in visitors:
        assert poll_until_done(visitor, started["poll_url"])["status"] == "completed"  # by the fallback
    assert primary_state() == {"state": "closed", "recent_failures": 6, "open_for": 0}

    turn_from("192.0.2.44")  # the same provider down for a visitor elsewhere: now it is an outage
    worker()
    assert primary_state()["state"] == "open"


def turn_from(address, content="Hello?"):
    """A new anonymous visitor asking from ``address``: ``(their client, the 202 body)``."""
    visitor = make_client()
    return visitor, start_turn(visitor, content, REMOTE_ADDR=address)


def test_another_site_sharing_the_redis_keeps_breakers_and_address_counts_of_its_own(chain, conversations_settings,
                                                                                    monkeypatch):
    """Two sites on one Redis database, each with its own queue (as RQ requires): the provider an
    outage opened for one is still closed for the other, and a turn's address is its site's."""
    from conversations.engine.limits import AddressTurns, turn_address

    primary, fallback = chain
    for owner in ("a", "b", "c"):
        turn_of(owner)
    assert primary_state()["state"] == "open"
    conversation = Conversation.objects.create(owner_token="token-of-d")
    turn = conversation.turns.create()
    AddressTurns("203.0.113.9").add(turn)
    assert turn_address(turn) == "203.0.113.9"

    import django_rq.settings

    queues = django_rq.settings.QUEUES
    conversations_settings.update(QUEUE="the-other-site")
    monkeypatch.setitem(django_rq.settings.QUEUES, "the-other-site", next(iter(queues.values())))  # the same Redis
    assert primary_state() == {"state": "closed", "recent_failures": 0, "open_for": 0}
    assert turn_address(turn) == ""


def test_outage_events_in_a_stream_count_like_the_status_they_stand_for(chain, conversations_settings):
    primary, fallback = chain
    conversations_settings.update(STREAM=True)
    primary.add(error_event("The server had an error", type="server_error"),
                error_event("Rate limit reached", type="requests", code="rate_limit_exceeded"),
                error_event("The server had an error", type="server_error"))
    for owner in ("a", "b", "c"):
        assert turn_of(owner).status == "completed"  # answered by the fallback
    assert primary_state()["state"] == "open"


def test_outages_seen_by_one_visitor_alone_do_not_open_the_circuit(chain):
    primary, fallback = chain
    for _ in range(4):
        assert turn_of("only-one").status == "completed"
    assert primary_state() == {"state": "closed", "recent_failures": 4, "open_for": 0}
    assert len(primary.requests) == 4

    turn_of("another")  # the same provider down for a second visitor: now it is an outage
    assert primary_state()["state"] == "open"


def test_a_call_sent_before_the_circuit_opened_does_not_close_it_by_answering(chain, conversations_settings):
    primary, fallback = chain
    conversations_settings.update(BREAKER_FAILURES=2, BREAKER_COOLDOWN=30)
    released = threading.Event()  # the early call answers only once the circuit is open, however slow the machine
    primary.add(held(openai_text(PRIMARY), released))
    early = {}

    def slow_turn():
        try:
            early["turn"] = turn_of("early")
        finally:
            connections.close_all()

    thread = threading.Thread(target=slow_turn)
    thread.start()
    deadline = time.monotonic() + 5
    while not primary.requests and time.monotonic() < deadline:
        time.sleep(0.01)
    turn_of("b")
    turn_of("c")
    assert primary_state()["state"] == "open"
    released.set()
    thread.join(10)

    assert early["turn"].messages.filter(role="assistant").get().content == PRIMARY
    assert primary_state()["state"] == "open"  # only the probe closes it
    sent = len(primary.requests)
    assert turn_of("d").status == "completed" and len(primary.requests) == sent


# -- how it is probed and timed (issue 29, items 1-4) ------------------------------------

def open_the_circuit(primary):
    for owner in ("a", "b", "c"):
        turn_of(owner)
    assert primary_state()["state"] == "open"
    time.sleep(get_config()["BREAKER_COOLDOWN"] + 0.1)
    assert primary_state()["state"] == "half-open"
    return len(primary.requests)


def test_in_the_half_open_state_exactly_one_call_probes_even_when_several_ask_at_once(chain):
    primary, fallback = chain
    sent = open_the_circuit(primary)
    passed_over = len(fallback.requests)

    def probe_answers_last(handler):
        # The probe is answered once the three others have asked (and gone to the fallback), so
        # that none of them can come after the circuit closed, however slow the machine.
        deadline = time.monotonic() + 2.5
        while len(fallback.requests) < passed_over + 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        handler.send_json(200, openai_text(PRIMARY))

    primary.add(probe_answers_last)

    turns = at_once(*[lambda number=number: turn_of(f"visitor-{number}") for number in range(4)])

    assert len(primary.requests) == sent + 1
    answers = sorted(t.messages.filter(role="assistant").get().content for t in turns)
    assert answers == [FALLBACK, FALLBACK, FALLBACK, PRIMARY]
    assert primary_state()["state"] == "closed"  # the probe's answer closed it


def test_a_failed_probe_opens_the_circuit_for_another_cool_down(chain):
    primary, fallback = chain
    sent = open_the_circuit(primary)

    assert turn_of("prober").status == "completed"  # the probe failed; the fallback answered
    assert len(primary.requests) == sent + 1
    state = primary_state()
    assert state["state"] == "open" and state["open_for"] >= 1
    assert turn_of("next").status == "completed" and len(primary.requests) == sent + 1


def test_a_success_forgets_the_failures_before_it(chain):
    primary, fallback = chain
    primary.add(unavailable(500), openai_text(PRIMARY), unavailable(500), unavailable(500))
    for owner in ("a", "b", "c", "d"):
        assert turn_of(owner).status == "completed"

    assert primary_state() == {"state": "closed", "recent_failures": 2, "open_for": 0}
    primary.add(openai_text(PRIMARY))
    assert turn_of("e").messages.filter(role="assistant").get().content == PRIMARY


def test_failures_older_than_the_window_do_not_count(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(CircuitBreaker, "clock", staticmethod(lambda: now[0]))
    breaker = CircuitBreaker(provider_key({"PROVIDER": "openai", "MODEL": "windowed"}), failures=3, window=60,
                             cooldown=30, probe_timeout=5, connection=get_queue().connection)
    assert breaker.failed("a") == breaker.failed("b") == "closed"
    now[0] += 61  # both are now older than the window
    assert breaker.failed("c") == "closed"
    assert breaker.state() == {"state": "closed", "recent_failures": 1, "open_for": 0}
    now[0] += 30
    breaker.failed("d")
    assert breaker.failed("e") == "open"  # three within the window, from three owners


# -- when Redis cannot be read (issue 29, item 5) ----------------------------------------

def test_when_redis_cannot_be_read_the_breaker_lets_every_call_through(chain, unreachable_queue):
    primary, fallback = chain
    unreachable_queue()
    primary.add(openai_text(PRIMARY), unavailable(500), openai_text(PRIMARY))

    answers = [turn_of(owner) for owner in ("a", "b", "c")]
    assert [t.status for t in answers] == ["completed"] * 3
    assert [t.messages.filter(role="assistant").get().content for t in answers] == [PRIMARY, FALLBACK, PRIMARY]
    assert len(primary.requests) == 3
