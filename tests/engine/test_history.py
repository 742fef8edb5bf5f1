"""History within the model's window, through a turn: what a provider is sent when the
conversation is longer than HISTORY_MAX_CHARS (the trimming itself: tests/core/test_history.py)."""

import pytest

from conversations.models import Conversation
from tests.support.fake_wire import anthropic_message, run_turn_here
from tests.support.fakes import FakeProvider, openai_text, openai_tool_calls


@pytest.mark.django_db
def test_a_long_conversation_sends_only_what_fits_to_the_provider(conversations_settings):
    with FakeProvider() as fake:
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="k", TOOLS=[],
                                      SYSTEM_PROMPT="S" * 100, HISTORY_MAX_CHARS=400)
        fake.add(*[openai_text(f"answer {n} " + "." * 80) for n in range(5)])
        conversation = Conversation.objects.create(owner_token="visitor")
        for n in range(5):
            run_turn_here(f"question {n} " + "?" * 80, conversation=conversation)

    sent = [r["json"]["messages"] for r in fake.requests]
    assert len(sent[0]) == 2  # the system prompt and the first question
    last = sent[-1]
    assert last[0] == {"role": "system", "content": "S" * 100}
    assert last[1]["role"] == "user"
    # 100 for the prompt, ~90 for each message: the question and one earlier exchange fit.
    assert [m["content"][:10] for m in last[1:]] == ["question 3", "answer 3 .", "question 4"]
    assert sum(len(m["content"]) for m in last) <= 400 + 90


@pytest.mark.django_db
def test_anthropic_gets_a_user_message_first_after_trimming(conversations_settings):
    with FakeProvider() as fake:
        conversations_settings.update(PROVIDER="anthropic", BASE_URL=fake.url, API_KEY="k", TOOLS=[],
                                      SYSTEM_PROMPT="", HISTORY_MAX_CHARS=150)
        fake.add(*[anthropic_message("a" * 100) for _ in range(3)])
        conversation = Conversation.objects.create(owner_token="visitor")
        for n in range(3):
            run_turn_here(f"q{n}", conversation=conversation)

    body = fake.requests[-1]["json"]
    assert "system" not in body
    assert body["messages"][0] == {"role": "user", "content": "q1"}
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]


@pytest.mark.django_db
def test_the_history_is_trimmed_again_before_each_call_of_a_turn(conversations_settings):
    with FakeProvider() as fake:
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="k", SYSTEM_PROMPT="",
                                      TOOLS=["chatproject.tools.search_faq"], HISTORY_MAX_CHARS=600)
        fake.add(openai_text("earlier answer " + "." * 100),
                 openai_tool_calls(("search_faq", {"query": "refunds shipping price password support widget",
                                                   "limit": 5})),
                 openai_text("Here is everything."))
        conversation = Conversation.objects.create(owner_token="visitor")
        run_turn_here("earlier question " + "?" * 100, conversation=conversation)
        run_turn_here("Tell me everything", conversation=conversation)

    first_call, second_call = (r["json"]["messages"] for r in fake.requests[1:])
    # The earlier exchange fitted before the tool ran; the long tool result pushed it out.
    assert [m["content"][:14] for m in first_call] == ["earlier questi", "earlier answer", "Tell me everyt"]
    assert [m["role"] for m in second_call] == ["user", "assistant", "tool"]
    assert second_call[0]["content"] == "Tell me everything" and len(second_call[2]["content"]) > 600
