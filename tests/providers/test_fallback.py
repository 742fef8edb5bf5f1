"""Fallback providers and the shared circuit breaker, against two fake provider servers, with
real Redis and real forking workers: the turn is answered by the next provider when the first
is down, within the turn's clocks, and a provider that keeps failing is skipped by every
worker until it has cooled down."""

import itertools
import re
import time

import pytest
from django.core.checks import Error

from conversations.checks import check_config
from conversations.conf import get_config
from conversations.core.budget import Budget
from conversations.core.types import ChatMessage
from conversations.models import CallRecord, Turn
from conversations.providers.chain import build_provider
from conversations.providers.openai import OpenAIProvider
from tests.support.fake_stream import openai_stream, streaming
from tests.support.fakes import FakeProvider, hang, http_error, openai_text, retry_after, unavailable
from tests.support.helpers import local_key, make_client, poll_until_done, start_turn

pytestmark = pytest.mark.django_db(transaction=True)

UNAVAILABLE = "The AI service is unavailable right now. Please try again in a minute."


@pytest.fixture
def chain(conversations_settings):
    """A primary and a fallback OpenAI-compatible server, the site pointed at both."""
    with FakeProvider(default=unavailable(500)) as primary, FakeProvider() as fallback:
        conversations_settings.update(
            PROVIDER="openai", BASE_URL=primary.url, API_KEY="sk-primary", MODEL="primary-model", TOOLS=[],
            FALLBACKS=[{"PROVIDER": "openai", "BASE_URL": fallback.url, "API_KEY": "sk-fallback",
                        "MODEL": "fallback-model"}],
            JOB_TIMEOUT=12, DEADLINE_MARGIN=3, CALL_TIMEOUT=5, FALLBACK_RESERVE=3, MIN_CALL_BUDGET=1,
            MAX_ATTEMPTS=2, STREAM=False, BREAKER_FAILURES=3, BREAKER_WINDOW=60, BREAKER_COOLDOWN=1)
        yield primary, fallback


def visitor_address():
    """An address of its own for each visitor: failures from one address never open a circuit."""
    return f"198.51.100.{next(ADDRESSES)}"


ADDRESSES = itertools.count(1)


def run_one(worker, content="Hello?"):
    client = make_client()
    started = start_turn(client, content, REMOTE_ADDR=visitor_address())
    began = time.monotonic()
    worker()
    final = poll_until_done(client, started["poll_url"])
    return final, Turn.objects.get(pk=started["id"]), time.monotonic() - began


def calls(turn):
    return [(r.name, r.outcome) for r in CallRecord.objects.filter(turn=turn, kind="model").order_by("id")]


def test_a_primary_that_answers_500_is_replaced_by_the_fallback(chain, worker):
    primary, fallback = chain
    fallback.add(openai_text("Answered by the fallback."))
    final, turn, _ = run_one(worker)

    assert final["status"] == "completed" and final["messages"][-1]["content"] == "Answered by the fallback."
    assert (turn.provider, turn.model) == ("openai", "fallback-model")
    assert calls(turn) == [("primary-model", "http_error"), ("primary-model", "http_error"),
                           ("fallback-model", "ok")]
    assert fallback.requests[0]["headers"]["Authorization"] == "Bearer sk-fallback"


class OldStyleProvider(OpenAIProvider):
    """A custom provider written before streaming existed: its ``complete()`` takes no ``on_text``."""

    def complete(self, messages, tools):
        return super().complete(messages, tools)


def test_a_custom_provider_without_on_text_answers_as_a_fallback(chain, worker, conversations_settings):
    primary, fallback = chain
    conversations_settings["FALLBACKS"][0]["PROVIDER"] = "tests.providers.test_fallback.OldStyleProvider"
    fallback.add(openai_text("Answered the old way."))
    final, turn, _ = run_one(worker)

    assert final["status"] == "completed" and final["messages"][-1]["content"] == "Answered the old way."
    assert calls(turn)[-1] == ("fallback-model", "ok")


def test_a_primary_that_hangs_is_cut_off_so_the_fallback_answers_before_the_deadline(chain, worker,
                                                                                     conversations_settings):
    primary, fallback = chain
    conversations_settings.update(MAX_ATTEMPTS=1)
    primary.add(hang)
    fallback.add(openai_text("Still answered."))
    final, turn, elapsed = run_one(worker)

    assert final["status"] == "completed" and final["messages"][-1]["content"] == "Still answered."
    first = CallRecord.objects.filter(turn=turn, kind="model").order_by("id").first()
    # The primary was allowed CALL_TIMEOUT (5 s), not all of the 9 s budget less nothing.
    assert first.outcome == "timeout" and first.timeout == pytest.approx(5, abs=0.3)
    assert turn.margin_left >= 3 - 0.5 and elapsed < 12


def test_a_primary_whose_budget_leaves_only_the_reserve_is_capped_there(chain, worker, conversations_settings):
    primary, fallback = chain
    conversations_settings.update(MAX_ATTEMPTS=1, CALL_TIMEOUT=8, FALLBACK_RESERVE=4)
    primary.add(hang)
    fallback.add(openai_text("In time."))
    final, turn, _ = run_one(worker)
    first, second = CallRecord.objects.filter(turn=turn, kind="model").order_by("id")
    assert first.timeout == pytest.approx(9 - 4, abs=0.3)  # the 9 s budget less the 4 s reserve
    assert second.remaining_before >= 4 - 0.3 and final["status"] == "completed"


def test_a_primary_whose_share_of_the_budget_is_too_small_to_start_hands_the_call_to_the_fallback(
        chain, worker, conversations_settings):
    primary, fallback = chain
    # A 9 s budget less an 8.5 s reserve leaves the primary 0.5 s, under MIN_CALL_BUDGET (1 s).
    conversations_settings.update(FALLBACK_RESERVE=8.5, MIN_CALL_BUDGET=1)
    fallback.add(openai_text("Answered in the reserve."))
    final, turn, _ = run_one(worker)

    assert final["status"] == "completed" and final["messages"][-1]["content"] == "Answered in the reserve."
    assert primary.requests == [] and len(fallback.requests) == 1
    assert calls(turn) == [("primary-model", "skipped"), ("fallback-model", "ok")]


def test_a_429_with_a_long_retry_after_moves_on_at_once(chain, worker):
    primary, fallback = chain
    primary.add(retry_after(60))
    fallback.add(openai_text("No waiting."))
    final, turn, elapsed = run_one(worker)
    assert final["status"] == "completed" and elapsed < 4
    assert calls(turn) == [("primary-model", "http_error"), ("fallback-model", "ok")]


def test_a_used_up_allowance_fails_over_at_once_and_never_opens_the_circuit(chain, worker):
    """OpenAI's 429 insufficient_quota is no rate limit: not tried again (a minute will not help),
    the fallback answers, and the primary's circuit stays closed whatever number of turns meet it."""
    from django.core.management import call_command
    from io import StringIO

    primary, fallback = chain
    quota = http_error(429, "You exceeded your current quota, please check your plan and billing details.",
                       code="insufficient_quota")
    for number in range(4):  # past BREAKER_FAILURES (3), each from another owner and address
        primary.add(quota)
        fallback.add(openai_text(f"Answered by the fallback ({number})."))
        final, turn, _ = run_one(worker)
        assert (final["status"], final["messages"][-1]["content"]) == ("completed",
                                                                       f"Answered by the fallback ({number}).")
        assert calls(turn) == [("primary-model", "http_error"), ("fallback-model", "ok")]
    out = StringIO()
    call_command("provider_health", stdout=out)
    assert len(primary.requests) == 4 and "(the site's primary): circuit closed" in out.getvalue()


def test_a_used_up_allowance_without_a_fallback_says_so(conversations_settings):
    from tests.support.fake_wire import run_turn_here

    with FakeProvider() as only:
        conversations_settings.update(PROVIDER="openai", BASE_URL=only.url, API_KEY="sk-only", TOOLS=[],
                                      MAX_ATTEMPTS=3, STREAM=False)
        only.add(http_error(429, "You exceeded your current quota.", code="insufficient_quota"))
        turn = run_turn_here("Hello?")
    assert (turn.status, turn.error) == (
        "failed", "The assistant cannot answer for now: the site's allowance with its AI service is used up.")
    assert len(only.requests) == 1  # not tried again: it was no rate limit


def test_a_request_the_provider_refuses_does_not_fail_over(chain, worker):
    primary, fallback = chain
    primary.add(http_error(400, "bad request"))
    final, turn, _ = run_one(worker)
    assert final["status"] == "failed" and fallback.requests == []


@pytest.mark.parametrize("failover_on_auth", [False, True])
def test_a_rejected_key_fails_over_only_when_the_setting_says_so(chain, worker, conversations_settings,
                                                                 failover_on_auth):
    primary, fallback = chain
    conversations_settings.update(FAILOVER_ON_AUTH=failover_on_auth)
    primary.add(http_error(401, "bad key", code="invalid_api_key"))
    fallback.add(openai_text("With the other key."))
    final, _, _ = run_one(worker)
    assert final["status"] == ("completed" if failover_on_auth else "failed")
    assert len(fallback.requests) == (1 if failover_on_auth else 0)


def test_a_stream_cut_after_text_is_kept_not_asked_again_of_the_fallback(chain, worker, conversations_settings):
    primary, fallback = chain
    conversations_settings.update(STREAM=True, STREAM_IDLE_TIMEOUT=1)
    primary.add(streaming(openai_stream(pieces=["Half ", "of ", "it "], done=False)[:4], then="reset"))
    final, turn, _ = run_one(worker)
    assert final["status"] == "incomplete" and final["messages"][-1]["content"] == "Half of it "
    assert fallback.requests == []


def test_when_every_provider_is_down_the_turn_fails_within_its_deadline_with_one_sentence(chain, worker):
    primary, fallback = chain
    fallback.default = unavailable(503)
    final, turn, elapsed = run_one(worker)
    assert (final["status"], final["error"]) == ("failed", UNAVAILABLE)
    assert turn.margin_left >= 2 and elapsed < 12


def test_after_k_failing_turns_the_primary_is_skipped_until_its_cool_down_then_probed_once(chain, worker,
                                                                                         conversations_settings):
    primary, fallback = chain
    conversations_settings.update(BREAKER_COOLDOWN=3)
    fallback.default = openai_text("From the fallback.")
    for _ in range(2):  # BREAKER_FAILURES 3: each turn's primary attempts count as one failure
        run_one(worker)
    assert len(primary.requests) == 4  # MAX_ATTEMPTS 2, twice
    run_one(worker)  # the third failure opens the circuit
    seen = len(primary.requests)

    final, turn, elapsed = run_one(worker)  # skipped: not even a first attempt
    assert len(primary.requests) == seen and final["status"] == "completed" and elapsed < 3
    assert calls(turn)[0] == ("primary-model", "skipped")

    time.sleep(3.2)  # the cool-down
    primary.add(openai_text("Back again."))
    final, turn, _ = run_one(worker)  # the one probe
    assert final["messages"][-1]["content"] == "Back again." and len(primary.requests) == seen + 1
    assert turn.model == "primary-model"


def test_several_workers_share_one_breaker(chain, worker_process, conversations_settings):
    primary, fallback = chain
    fallback.default = openai_text("Shared.")
    conversations_settings.update(BREAKER_COOLDOWN=30, MAX_ATTEMPTS=1)
    worker_process(2)
    clients = []
    for number in range(6):
        client = make_client()
        clients.append((client, start_turn(client, f"Turn {number}", REMOTE_ADDR=visitor_address())))
        poll_until_done(client, clients[-1][1]["poll_url"], timeout=30)
    # Three failures opened it for every worker: the last three turns never reached the primary.
    assert len(primary.requests) == 3
    assert all(poll_until_done(c, s["poll_url"])["status"] == "completed" for c, s in clients)


def test_a_chain_that_names_an_unknown_provider_is_refused_at_start_up(conversations_settings):
    conversations_settings.update(FALLBACKS=[{"PROVIDER": "no.such.Provider"}, {"PROVIDER": "openai", "KEY": "x"}],
                                  FALLBACK_RESERVE=0.5, MIN_CALL_BUDGET=1)
    errors = [e for e in check_config() if e.id in ("conversations.E013", "conversations.E014")]
    assert [e.id for e in errors] == ["conversations.E013", "conversations.E013", "conversations.E014"]
    assert errors[1] == Error(
        "The site's FALLBACKS cannot work: its fallback 2 has unknown keys: KEY (an entry takes PROVIDER, MODEL, "
        "BASE_URL and either API_KEY or CREDENTIAL).",
        hint="An entry takes PROVIDER and, as needed, MODEL, BASE_URL and either API_KEY or CREDENTIAL (a name in "
             "CREDENTIALS, bound to the entry's endpoint).", id="conversations.E013")


def test_a_chain_that_names_an_unknown_credential_or_both_a_key_and_a_credential_is_refused_at_start_up(
        conversations_settings):
    conversations_settings.update(CREDENTIALS={"backup": "env:TEST_NO_SUCH_VARIABLE"}, FALLBACKS=[
        {"PROVIDER": "openai", "CREDENTIAL": "backpu"},
        {"PROVIDER": "openai", "CREDENTIAL": "backup", "API_KEY": "sk-x"},
        {"PROVIDER": "anthropic", "CREDENTIAL": "backup"}])
    messages = [(m.id, m.msg) for m in check_config() if m.id in ("conversations.E013", "conversations.W040")]
    assert messages == [
        ("conversations.E013", "The site's FALLBACKS cannot work: in its fallback 1, its credential “backpu” is not "
                               "in the site's CREDENTIALS setting."),
        ("conversations.E013", "The site's FALLBACKS cannot work: its fallback 2 has both API_KEY and CREDENTIAL: "
                               "keep one."),
        # The third is fine here: its variable is read by the workers, which start with this warning.
        ("conversations.W040", "CREDENTIALS['backup'] reads the environment variable TEST_NO_SUCH_VARIABLE, which "
                               "is not set in this process.")]


@pytest.fixture
def backup_key(chain, conversations_settings, monkeypatch):
    """The site's fallback names its key by a credential read from the environment, as in production."""
    primary, fallback = chain
    monkeypatch.setenv("TEST_BACKUP_KEY", "sk-backup-from-env")
    conversations_settings.update(CREDENTIALS={"backup": local_key("env:TEST_BACKUP_KEY")}, FALLBACKS=[
        {"PROVIDER": "openai", "BASE_URL": fallback.url, "MODEL": "fallback-model", "CREDENTIAL": "backup"}])
    return primary, fallback


def test_a_fallback_naming_a_credential_is_sent_its_key_read_by_the_worker(backup_key, worker):
    primary, fallback = backup_key
    fallback.add(openai_text("Answered with the credential's key."))
    final, turn, _ = run_one(worker)

    assert final["status"] == "completed" and final["messages"][-1]["content"] == "Answered with the credential's key."
    assert (turn.provider, turn.model) == ("openai", "fallback-model")
    assert fallback.requests[0]["headers"]["Authorization"] == "Bearer sk-backup-from-env"
    assert primary.requests[0]["headers"]["Authorization"] == "Bearer sk-primary"


def test_a_fallback_whose_key_the_worker_cannot_read_is_left_out_and_logged(backup_key, worker, monkeypatch, tmp_path):
    import logging

    primary, fallback = backup_key
    monkeypatch.delenv("TEST_BACKUP_KEY")
    handler = logging.FileHandler(tmp_path / "worker.log")  # the forked work horse inherits it
    logging.getLogger("conversations").addHandler(handler)
    try:
        final, turn, _ = run_one(worker)
    finally:
        logging.getLogger("conversations").removeHandler(handler)
        handler.close()

    # The primary is down and the fallback has no key here: the visitor is told as for any outage,
    assert (final["status"], final["error"]) == ("failed", UNAVAILABLE) and fallback.requests == []
    assert len(primary.requests) == 2
    # and the worker's log tells the operator why the fallback was not tried.
    assert ("Fallback 1 (openai) left out of the chain: the environment variable TEST_BACKUP_KEY of its credential "
            "“backup” is not set.") in (tmp_path / "worker.log").read_text().splitlines()


def test_provider_health_shows_each_breaker_and_fails_while_one_is_open(chain, worker, conversations_settings):
    import io

    from django.core.management import call_command

    primary, fallback = chain
    conversations_settings.update(BREAKER_COOLDOWN=30)
    fallback.default = openai_text("Fine.")
    out = io.StringIO()
    call_command("provider_health", stdout=out)
    assert out.getvalue().splitlines() == [
        HEALTH_HEADER,
        f"openai:primary-model at {host(primary)} (the site's primary): circuit closed, called as usual "
        "(0 recent failures)",
        f"openai:fallback-model at {host(fallback)} (the site's fallback 1): circuit closed, called as usual "
        "(0 recent failures)"]
    for _ in range(3):
        run_one(worker)
    out = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("provider_health", stdout=out)
    assert exited.value.code == 1
    first = out.getvalue().splitlines()[1]
    assert first.startswith(f"openai:primary-model at {host(primary)} (the site's primary): circuit open, skipped for ")
    assert first.endswith("s more")


HEALTH_HEADER = ("Circuit breakers (closed: called as usual; open: skipped after repeated failures; half-open: the "
                 "next call probes it):")


def host(fake):
    return fake.url.split("//")[1].split("/")[0]


def test_provider_health_tells_a_dead_primary_from_its_fallback_of_the_same_model(chain, worker,
                                                                                   conversations_settings):
    import io

    from django.core.management import call_command

    primary, fallback = chain
    conversations_settings.update(BREAKER_COOLDOWN=30, MODEL="gpt-4o-mini",
                                  FALLBACKS=[{"PROVIDER": "openai", "BASE_URL": fallback.url, "API_KEY": "sk-fallback",
                                              "MODEL": "gpt-4o-mini"}])
    fallback.default = openai_text("Fine.")
    for _ in range(3):
        run_one(worker)
    out = io.StringIO()
    with pytest.raises(SystemExit):
        call_command("provider_health", stdout=out)
    dead, alive = out.getvalue().splitlines()[1:]

    assert dead.startswith(f"openai:gpt-4o-mini at {host(primary)} (the site's primary): circuit open, skipped for ")
    assert alive == (f"openai:gpt-4o-mini at {host(fallback)} (the site's fallback 1): circuit closed, called as usual "
                     "(0 recent failures)")


def test_the_admins_turn_list_shows_each_providers_circuit(chain, worker, conversations_settings, admin_client):
    primary, fallback = chain
    conversations_settings.update(BREAKER_COOLDOWN=30)
    fallback.default = openai_text("Fine.")
    page = admin_client.get("/admin/conversations/turn/").content.decode()
    assert f"openai:primary-model at {host(primary)} (the site&#x27;s primary)\nanswering (0 recent failures)" in page
    for _ in range(3):
        run_one(worker)
    page = admin_client.get("/admin/conversations/turn/").content.decode()
    assert re.search(r"primary-model at [^(]+\(the site&#x27;s primary\)\nskipped for \d+ s more</span>", page)
    assert "(the site&#x27;s fallback 1)\nanswering" in page


def test_provider_health_lists_the_active_assistants_chains_once_per_circuit(chain, admin_client):
    import io

    from django.core.management import call_command

    from conversations.models import Assistant

    primary, fallback = chain

    def assistant(slug, **fields):
        Assistant.objects.create(**{"slug": slug, "name": slug.title(), "system_prompt": "Hi.", "provider": "openai",
                                    "base_url": primary.url, "model": "primary-model", **fields})

    assistant("support", fallbacks=[{"provider": "openai", "base_url": fallback.url, "model": "fallback-model"},
                                    {"provider": "demo"}])
    assistant("helpdesk", fallbacks=[{"provider": "demo"}])
    assistant("shop", model="shop-model")  # the site's chain after its own provider
    assistant("plain", model="plain-model", fallbacks=[])  # no chain: no circuit
    assistant("retired", model="retired-model", active=False, fallbacks=[{"provider": "demo"}])

    out = io.StringIO()
    call_command("provider_health", stdout=out)
    closed = "circuit closed, called as usual (0 recent failures)"
    assert out.getvalue().splitlines() == [
        HEALTH_HEADER,
        f"openai:primary-model at {host(primary)} (the site's primary, helpdesk's primary, support's primary): {closed}",
        f"openai:fallback-model at {host(fallback)} (the site's fallback 1, shop's fallback 1, "
        f"support's fallback 1): {closed}",
        f"demo:(default model) (helpdesk's fallback 1, support's fallback 2): {closed}",
        f"openai:shop-model at {host(primary)} (shop's primary): {closed}"]
    page = admin_client.get("/admin/conversations/turn/").content.decode()
    assert "demo:(default model) (helpdesk&#x27;s fallback 1, support&#x27;s fallback 2)\nanswering" in page
    assert "plain-model" not in page


def test_a_site_without_fallbacks_has_no_circuit_to_show(conversations_settings, admin_client):
    import io

    from django.core.management import call_command

    conversations_settings.update(FALLBACKS=[])
    out = io.StringIO()
    call_command("provider_health", stdout=out)  # exits 0: nothing can be open
    assert out.getvalue().startswith("No provider has fallbacks")
    page = admin_client.get("/admin/conversations/turn/").content.decode()
    assert 'class="provider-health"' not in page  # no "answering" line for a provider nothing watches


def test_a_chain_names_its_first_provider_and_the_one_that_answered_as_a_lone_provider_does(chain):
    """The runner asks any provider which one it calls first and which one answered; a chain
    answers with its links, a lone provider with itself (the turn records both)."""
    def built(config):
        return build_provider(config, Budget(10), recorder=lambda **fields: None, cancelled=lambda: False,
                              turn_id="")

    chain[1].add(openai_text("Hello from the fallback."))
    lone, lone_https = built({**get_config(), "FALLBACKS": ()})
    two, chain_https = built(get_config())
    try:
        assert lone.first is lone and lone.answered_by is lone
        assert (two.first.model, two.answered_by.model) == ("primary-model", "primary-model")
        two.complete([ChatMessage(role="user", content="Hello?")], [])
        assert (two.first.model, two.answered_by.model) == ("primary-model", "fallback-model")
    finally:
        for http in lone_https + chain_https:
            http.close()
