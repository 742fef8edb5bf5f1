"""Redaction before storage: with ``REDACT`` on, a card number (or an e-mail address) a visitor
types is in no row, no cached state the widget polled, and no Redis key, whether the model read
it or not; an assistant's own list replaces the site's; and neither the call records nor the
logs carry the visitor's words when a provider's error quotes them."""

import logging
import re

import pytest
from django.apps import apps

from conversations.models import Assistant, CallRecord, Message
from conversations.tools import tool
from tests.support.fake_stream import openai_stream, streaming
from tests.support.fakes import FakeProvider, http_error
from tests.support.helpers import Poller, api_post, make_client, poll_until_done, redis_values, run_worker, start_turn

pytestmark = pytest.mark.django_db(transaction=True)

CARD = re.compile(r"4111[ -]?1111[ -]?1111[ -]?1111")
EMAIL = "ana.quill@example.com"


@pytest.fixture
def fake(conversations_settings):
    with FakeProvider() as provider:
        conversations_settings.update(PROVIDER="openai", BASE_URL=provider.url, API_KEY="k", MODEL="m", STREAM=True,
                                      MAX_ATTEMPTS=1, REDACT=["card", "email"], PUBLISH_INTERVAL=0)
        yield provider


def stored_texts():
    """Every text column of every row of every table, and every value in Redis, as text."""
    for model in apps.get_models():
        if not model._meta.managed or model._meta.proxy:
            continue
        for row in model._base_manager.values_list():
            yield repr(row)
    for value in redis_values():
        if isinstance(value, bytes):
            yield value.decode("utf-8", "replace")


def sent_to_model(fake, number=0):
    return fake.requests[number]["json"]["messages"][-1]["content"]


def test_a_card_number_the_visitor_typed_is_stored_nowhere_and_the_model_reads_it_redacted(fake):
    # The model echoes it, word by word as it streams: the answer is redacted too, at every publish.
    fake.add(streaming(openai_stream("Noted: 4111 1111 1111 1111, and I will write to " + EMAIL + " today."),
                       interval=0.02))
    client = make_client()
    turn = start_turn(client, f"Pay with 4111-1111-1111-1111 please, mail me at {EMAIL}")

    with Poller(client, turn["poll_url"], interval=0.005) as poller:
        run_worker()
    final = poll_until_done(client, turn["poll_url"])

    assert final["status"] == "completed"
    assert [m["content"] for m in final["messages"]] == [
        "Pay with [card number removed] please, mail me at [e-mail address removed]",
        "Noted: [card number removed], and I will write to [e-mail address removed] today."]
    assert len(poller.states) >= 3  # the growing answer was seen several times, never with the number
    assert not [state for state in poller.states if CARD.search(str(state)) or "4111" in str(state)]
    assert sent_to_model(fake) == "Pay with [card number removed] please, mail me at [e-mail address removed]"
    assert not [text for text in stored_texts() if CARD.search(text) or EMAIL in text]


def test_the_model_may_read_the_original_in_its_turn_while_nothing_stores_it(fake, conversations_settings):
    conversations_settings.update(REDACT_ORIGINAL_TO_MODEL=True)
    fake.add(streaming(openai_stream("Charged 4111 1111 1111 1111.")), streaming(openai_stream("Hello again.")))
    client = make_client()
    turn = start_turn(client, "Pay with 4111-1111-1111-1111 please")
    run_worker()
    poll_until_done(client, turn["poll_url"])

    assert sent_to_model(fake) == "Pay with 4111-1111-1111-1111 please"
    assert not [text for text in stored_texts() if CARD.search(text)]
    # The next turn's model reads the stored, redacted words.
    response = api_post(client, f"/api/conversations/{turn['conversation']}/turns/", {"content": "And now?"})
    run_worker()
    poll_until_done(client, response.json()["poll_url"])
    assert fake.requests[1]["json"]["messages"][-3]["content"] == "Pay with [card number removed] please"


def test_an_assistants_own_list_replaces_the_sites(fake, conversations_settings):
    Assistant.objects.create(slug="mail-only", name="Mail", system_prompt="Help.", provider="openai",
                             redact=["email"])
    Assistant.objects.create(slug="keeps-all", name="All", system_prompt="Help.", provider="openai", redact=[])
    fake.add(streaming(openai_stream("ok")), streaming(openai_stream("ok")))
    client = make_client()
    for slug in ("mail-only", "keeps-all"):
        conversation = api_post(client, "/api/conversations/", {"assistant": slug}).json()["id"]
        api_post(client, f"/api/conversations/{conversation}/turns/", {"content": f"4111111111111111 {EMAIL}"})
        run_worker()

    stored = dict(Message.objects.filter(role="user").values_list("conversation__assistant__slug", "content"))
    assert stored == {"mail-only": "4111111111111111 [e-mail address removed]",
                      "keeps-all": f"4111111111111111 {EMAIL}"}


def test_what_a_visitor_writes_to_staff_is_redacted_as_a_turn_is(fake):
    Assistant.objects.create(slug="support", name="Help", system_prompt="Help.", provider="demo",
                             handoff=Assistant.HandoffWays.BOTH)
    client = make_client()
    conversation = api_post(client, "/api/conversations/", {"assistant": "support"}).json()["id"]
    api_post(client, f"/api/conversations/{conversation}/handoff/")
    api_post(client, f"/api/conversations/{conversation}/turns/", {"content": "card 4111 1111 1111 1111"})

    assert list(Message.objects.values_list("content", flat=True)) == ["card [card number removed]"]
    assert not [text for text in stored_texts() if CARD.search(text)]


@pytest.mark.parametrize("debug", [False, True])
def test_a_provider_error_quoting_the_visitor_keeps_their_words_out_of_call_records_and_logs_unless_debug(
        fake, conversations_settings, settings, caplog, log_file, debug):
    settings.DEBUG = debug
    conversations_settings.update(REDACT=[])
    words = "my neighbour Quillfeather keeps chickens"
    fake.add(http_error(400, f"Your message '{words}' was flagged by our content policy."))
    caplog.set_level(logging.DEBUG)
    client = make_client()
    turn = start_turn(client, words)
    run_worker()
    final = poll_until_done(client, turn["poll_url"])

    assert final["status"] == "failed"
    details = " ".join(CallRecord.objects.values_list("detail", flat=True))
    logged = "\n".join(record.getMessage() for record in caplog.records) + log_file.read_text()
    assert "content policy" in details  # the provider's reason is kept
    assert (words in details) is debug and (words in logged) is debug


def test_redaction_and_retention_settings_that_cannot_work_stop_the_check_with_a_sentence(conversations_settings):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    conversations_settings.update(REDACT=["card", "iban"], REDACT_PATTERNS=["ORD-(\\d+"], RETENTION_FROM="updated")
    with pytest.raises(SystemCheckError) as failed:
        call_command("check")

    report = str(failed.value)
    assert "conversations.E085" in report and "'iban', which is not one of card, email, phone" in report
    assert "REDACT_PATTERNS: missing ), unterminated subpattern" in report and "RETENTION_FROM is 'updated'" in report


@tool
def find_order(reference: str) -> str:
    """Look an order up (it fails, quoting what it was given, as tools often do)."""
    raise ValueError(f"no order matches {reference!r}")


@pytest.mark.parametrize("debug", [False, True])
def test_a_tool_error_quoting_its_arguments_keeps_them_out_of_call_records_and_logs_unless_debug(
        fake, conversations_settings, settings, caplog, log_file, debug):
    settings.DEBUG = debug
    conversations_settings.update(REDACT=[], TOOLS=[f"{__name__}.find_order"])
    words = "Quillfeather's parcel to Marzipan Lane"
    fake.add(streaming(openai_stream(calls=[("call_1", "find_order", {"reference": words})])),
             streaming(openai_stream("I could not find it.")))
    caplog.set_level(logging.DEBUG)
    client = make_client()
    turn = start_turn(client, "Where is it?")
    run_worker()
    assert poll_until_done(client, turn["poll_url"])["status"] == "completed"

    detail = CallRecord.objects.get(kind="tool").detail
    logged = "\n".join(record.getMessage() for record in caplog.records) + log_file.read_text()
    assert detail.startswith("ValueError: no order matches")
    assert (words in detail) is debug and (words in logged) is debug


def hide_member_numbers(text):
    """A site's own rule, named by its dotted path in REDACT_PATTERNS."""
    return re.sub(r"\bM-\d+\b", "[member]", text)


def test_a_sites_own_patterns_apply_after_the_kinds_in_each_of_their_forms(fake, conversations_settings):
    conversations_settings.update(REDACT=["email"], REDACT_PATTERNS=[
        r"\bORD-\d{6,}\b", {"pattern": r"\bVIP\w+", "replacement": "[code]"},
        {"callable": f"{__name__}.hide_member_numbers"}])
    fake.add(streaming(openai_stream("ok")))
    client = make_client()
    turn = start_turn(client, f"Order ORD-123456 for M-998, code VIPSUMMER, mail {EMAIL}")
    run_worker()
    poll_until_done(client, turn["poll_url"])

    assert Message.objects.filter(role="user").get().content == \
        "Order [removed] for [member], code [code], mail [e-mail address removed]"


def test_a_streamed_answer_is_scrubbed_with_the_sites_rules_built_once_for_the_whole_turn(
        fake, conversations_settings, monkeypatch):
    """Every published piece of a growing answer is scrubbed; the site's rules are built once for
    the turn (and once for the visitor's message), not again for each piece."""
    from conversations import redaction

    built, build = [], redaction._site_rule
    monkeypatch.setattr(redaction, "_site_rule", lambda entry: built.append(entry) or build(entry))
    conversations_settings.update(REDACT_PATTERNS=[r"\bORD-\d{6,}\b"])
    fake.add(streaming(openai_stream("Your parcel ORD-123456 left this morning and will be with you soon. " * 4),
                       interval=0.005))
    client = make_client()
    turn = start_turn(client, "Where is ORD-654321?")

    with Poller(client, turn["poll_url"], interval=0.002) as poller:
        run_worker("conversations.worker.ConcurrentWorker")  # in this process, so ``built`` sees its turn
    final = poll_until_done(client, turn["poll_url"])

    assert [m["content"] for m in final["messages"]] == [
        "Where is [removed]?", "Your parcel [removed] left this morning and will be with you soon. " * 4]
    assert len(poller.states) >= 3 and not [state for state in poller.states if "ORD-" in str(state)]
    assert len(built) == 2  # the visitor's message, then the whole turn: its every piece and its answer
