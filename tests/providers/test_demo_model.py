"""The demo model, the default provider: offline and deterministic, it calls the site's tools
when a question needs them (several at once when it asks several things), answers from their
results, and otherwise says what it is and what to try."""

import pytest
from redis.exceptions import RedisError

from conversations.core.budget import Budget
from conversations.conf import DEFAULTS
from conversations.infra.http import BudgetedHTTP
from django.urls import reverse

from conversations.models import CallRecord, Message, Turn
from conversations.providers.demo import DemoProvider
from conversations.tools import load_tools
from conversations.core.types import ChatMessage
from tests.support.helpers import FAST, make_client, poll_until_done, start_turn
from tests.support.fake_wire import run_turn_here


def transcript(turn):
    return list(Message.objects.filter(turn=turn).order_by("id"))


def test_the_demo_model_is_the_default_provider():
    assert DEFAULTS["PROVIDER"] == "demo"


@pytest.mark.django_db(transaction=True)
def test_two_cities_are_looked_up_in_one_reply_in_the_worker(worker):
    client = make_client()
    turn = start_turn(client, "What time is it in Tokyo and in Paris?")
    worker()
    final = poll_until_done(client, turn["poll_url"])

    assert final["status"] == "completed"
    assert [m["role"] for m in final["messages"]] == ["user", "assistant", "tool", "tool", "assistant"]
    assert [c["arguments"] for c in final["messages"][1]["tool_calls"]] == [{"city": "Tokyo"}, {"city": "Paris"}]
    answer = final["messages"][-1]["content"]
    assert answer.startswith("It is ") and answer.index("Tokyo") < answer.index("Paris")
    assert Turn.objects.get(pk=turn["id"]).model_calls == 2


@pytest.mark.django_db
def test_a_question_for_both_tools_calls_both_and_answers_from_both():
    turn = run_turn_here("What time is it in London, and how long does shipping take?")
    rows = transcript(turn)

    # The site's pages first (none is indexed here), then the FAQ.
    assert [(c["name"], c["arguments"]) for c in rows[1].tool_calls] == [
        ("current_time", {"city": "London"}), ("search_site", {"query": "how long does shipping take"})]
    assert [(c["name"], c["arguments"]) for c in rows[4].tool_calls] == [
        ("search_faq", {"query": "how long does shipping take"})]
    answer = rows[-1].content
    assert "in London" in answer
    assert "Here is what the FAQ says:" in answer and "Orders ship within one working day" in answer
    assert "could not find" not in answer
    assert turn.status == "completed" and turn.tool_calls == 3 and turn.input_tokens > 0 and turn.output_tokens > 0


@pytest.mark.django_db
def test_a_place_the_tool_does_not_know_gets_the_tools_error_explained():
    turn = run_turn_here("What time is it in Atlantis?")
    rows = transcript(turn)

    assert rows[1].tool_calls[0]["arguments"] == {"city": "Atlantis"}
    assert rows[2].is_error
    assert rows[-1].content.startswith("I asked the current_time tool, but it could not help: unknown city "
                                       "'Atlantis'; known: Berlin")
    assert turn.status == "completed"


@pytest.mark.django_db
def test_a_faq_question_without_an_entry_gets_a_helpful_answer(conversations_settings):
    # The site's own pages (search_site) first, then the FAQ, which has nothing on it either.
    turn = run_turn_here("Why is the sky blue?")
    rows = transcript(turn)
    assert [r.tool_name for r in rows if r.role == "tool"] == ["search_site", "search_faq"]
    assert rows[-1].content == "I could not find that on this site."
    conversations_settings.update(TOOLS=["chatproject.tools.current_time", "chatproject.tools.search_faq"])
    turn = run_turn_here("Why is the sky blue?")
    assert transcript(turn)[-1].content.startswith("I searched the FAQ but found nothing on that.")


@pytest.mark.django_db
@pytest.mark.parametrize("question, start", [
    ("Hello!", "Hello! I am the demo assistant of this site."),
    ("Who are you?", "I am the demo model of this site: I run offline, with no API key"),
    ("Tell me a joke", "I am only the demo model, so I cannot answer that myself"),
])
def test_other_messages_get_an_answer_about_the_demo_itself(question, start):
    turn = run_turn_here(question)
    rows = transcript(turn)
    assert [r.role for r in rows] == ["user", "assistant"]
    assert rows[-1].content.startswith(start)
    assert "What time is it in Tokyo?" in rows[-1].content


@pytest.mark.django_db
@pytest.mark.parametrize("question, start", [
    ("Hello!", "Hello! I am the demo assistant of this site, an offline stand-in for a real model."),
    ("Who are you?", "I am the demo model of this site: I run offline, with no API key."),
    ("What time is it in Tokyo?", "I am only the demo model, so I cannot answer that myself."),
])
def test_without_tools_it_offers_no_question_it_cannot_answer(question, start):
    turn = run_turn_here(question, tools={})
    rows = transcript(turn)

    assert [r.role for r in rows] == ["user", "assistant"] and turn.status == "completed"
    assert rows[-1].content == (f"{start} This site gives me no tools, so I cannot look anything up: I can only "
                                "greet you and say what I am. Set CONVERSATIONS_PROVIDER to use a real model.")


def test_with_one_tool_it_offers_only_that_tools_question():
    tools = list(load_tools(["chatproject.tools.search_faq"]).values())
    reply = DemoProvider({"DEMO_DELAY": 0}).complete([ChatMessage("user", "Tell me a joke")], tools)
    assert reply.text == ("I am only the demo model, so I cannot answer that myself: I can use these tools: "
                          'search_faq. Try "How do refunds work?".')


@pytest.mark.django_db(transaction=True)
def test_each_demo_reply_is_a_provider_call_attempt_in_the_admin_timeline(worker, admin_client):
    client = make_client()
    turn = start_turn(client, "What time is it in Tokyo?")
    worker()
    assert poll_until_done(client, turn["poll_url"])["status"] == "completed"

    calls = list(CallRecord.objects.filter(turn_id=turn["id"], kind="model"))
    assert [(c.name, c.attempt, c.outcome, c.status_code, c.detail) for c in calls] == [("demo", 1, "ok", None, "")] * 2
    assert calls[0].started_offset < calls[1].started_offset
    assert all(0 < c.timeout <= FAST["CALL_TIMEOUT"] and c.remaining_before <= 10 - FAST["DEADLINE_MARGIN"]
               and FAST["DEMO_DELAY"] <= c.duration < c.timeout for c in calls)
    html = admin_client.get(reverse("admin:conversations_turn_change", args=[turn["id"]])).content.decode()
    assert "2 provider call attempt(s) took" in html and "1 tool run(s) took" in html


def test_the_same_question_always_gets_the_same_reply():
    tools = list(load_tools(["chatproject.tools.current_time", "chatproject.tools.search_faq"]).values())
    provider = DemoProvider({"DEMO_DELAY": 0})
    question = [ChatMessage("user", "What time is it in Sydney and Mumbai, and can I get a refund?")]
    first, second = provider.complete(question, tools), provider.complete(question, tools)
    assert first == second
    assert [c.id for c in first.tool_calls] == ["demo_1_1", "demo_1_2", "demo_1_3"]


class TimedDemo(DemoProvider):
    """Records the pauses instead of sleeping."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pauses = []
        self.sleep = self.pauses.append


def test_each_reply_pauses_demo_delay_but_never_past_the_budget():
    now = [0.0]
    budget = Budget(10, clock=lambda: now[0])
    demo = TimedDemo({"DEMO_DELAY": 0.8}, budget=budget)
    demo.complete([ChatMessage("user", "hi")], [])
    now[0] = 9.5  # half a second left: pausing would eat the time kept for the final write
    demo.complete([ChatMessage("user", "hi")], [])
    no_delay = TimedDemo({"DEMO_DELAY": 0}, budget=budget)
    no_delay.complete([ChatMessage("user", "hi")], [])

    assert demo.pauses == [0.8]
    assert no_delay.pauses == []


def test_the_demo_tools_answer_in_the_words_a_visitor_would_read():
    from chatproject.tools import current_time, search_faq

    assert current_time(" UTC ").endswith(" in UTC")
    assert current_time("new york ").endswith(" in New York")
    assert search_faq("how do refunds work").startswith("How do refunds work?")
    # A question the FAQ does not answer shares only words like "when" and "does" with it: no entry.
    assert search_faq("When does the secret winter sale start?") == "No FAQ entry matches that question."


@pytest.mark.django_db
def test_the_demo_page_is_marked_in_the_visitors_language(client):
    assert '<html lang="es">' in client.get("/", HTTP_ACCEPT_LANGUAGE="es").content.decode()
    assert '<html lang="en">' in client.get("/", HTTP_ACCEPT_LANGUAGE="en").content.decode()


def test_a_stop_flag_that_cannot_be_read_does_not_stop_the_demo_model():
    """As for a real provider's call: an unreadable flag (Redis down) stops nothing."""
    def unreadable():
        raise RedisError("Redis is down")

    http = BudgetedHTTP(Budget(10), {**DEFAULTS, "DEMO_DELAY": 0}, recorder=lambda **fields: None,
                        cancelled=unreadable)
    provider = DemoProvider({**DEFAULTS, "DEMO_DELAY": 0}, http=http, budget=Budget(10))
    reply = provider.complete([ChatMessage("user", "Hello?")], [])
    http.close()
    assert reply.text.startswith("Hello! I am the demo assistant")
