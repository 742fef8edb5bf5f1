"""The demo's "email me this answer": the offline demo model asks for the demo site's
email_answer tool, which waits for the visitor's approval; approved, the answer is mailed (to the
console in the demo; to files here, since the work horse is another process); declined, nothing is sent."""

import django
import pytest

from tests.support.helpers import api_post, make_client, poll_until_done, run_worker

pytestmark = pytest.mark.django_db(transaction=True)

DEMO_TOOLS = ["chatproject.tools.current_time", "chatproject.tools.search_faq", "chatproject.tools.email_answer"]


@pytest.fixture
def mailbox(settings, conversations_settings, tmp_path):
    files = "django.core.mail.backends.filebased.EmailBackend"
    if django.VERSION >= (6, 1):  # the demo settings configure mail with MAILERS there, as Django 6.1 asks
        settings.MAILERS = {"default": {"BACKEND": files, "OPTIONS": {"file_path": str(tmp_path)}}}
    else:
        settings.EMAIL_BACKEND, settings.EMAIL_FILE_PATH = files, str(tmp_path)
    conversations_settings.update(PROVIDER="demo", MODEL="", TOOLS=DEMO_TOOLS, DEMO_DELAY=0, STREAM=False)
    return tmp_path


def ask(client, conversation, content):
    turn = api_post(client, f"/api/conversations/{conversation}/turns/", {"content": content}).json()
    run_worker()
    return turn, client.get(turn["poll_url"]).json()


def first_answer(client):
    conversation = api_post(client, "/api/conversations/").json()["id"]
    turn, _ = ask(client, conversation, "What time is it in Tokyo?")
    answer = poll_until_done(client, turn["poll_url"])["messages"][-1]["content"]
    assert answer.startswith("It is ")
    return conversation, answer


def test_email_me_this_answer_waits_for_the_visitor_and_mails_it_once_approved(mailbox):
    client = make_client()
    conversation, answer = first_answer(client)
    turn, state = ask(client, conversation, "Email me this answer, please.")

    assert state["status"] == "waiting_approval"
    (approval,) = state["approvals"]
    assert approval["tool"] == "email_answer" and answer in approval["summary"]
    assert list(mailbox.iterdir()) == []  # nothing sent before the approval

    api_post(client, turn["approval_url"], {"call_id": approval["call_id"], "decision": "approve",
                                            "arguments_sha256": approval["arguments_sha256"]})
    run_worker()
    final = poll_until_done(client, turn["poll_url"])
    assert final["messages"][-1]["content"] == "Done: Sent the answer to visitor@example.com."
    (sent,) = mailbox.iterdir()
    mail = sent.read_text()
    assert "To: visitor@example.com" in mail and answer in mail


def test_declined_the_demo_sends_nothing_and_says_so(mailbox):
    client = make_client()
    conversation, _answer = first_answer(client)
    turn, state = ask(client, conversation, "Mail me that.")
    approval = state["approvals"][0]
    api_post(client, turn["approval_url"], {"call_id": approval["call_id"], "decision": "decline",
                                            "arguments_sha256": approval["arguments_sha256"]})
    run_worker()
    assert poll_until_done(client, turn["poll_url"])["messages"][-1]["content"] == "All right: I did not send the email."
    assert list(mailbox.iterdir()) == []


def test_only_a_request_to_mail_the_answer_asks_for_the_email_tool(mailbox):
    from conversations.providers.demo import DemoProvider
    from conversations.tools import load_tools
    from conversations.core.types import ChatMessage

    tools = list(load_tools(DEMO_TOOLS).values())
    before = [ChatMessage(role="user", content="Hi"), ChatMessage(role="assistant", content="It is noon.")]
    demo = DemoProvider.__new__(DemoProvider)
    asked = [demo.plan(question, {t.name for t in tools}, 2, before + [ChatMessage(role="user", content=question)])
             for question in ("Email me this answer", "Can you send me the refund policy?", "Mail it to me, please")]
    assert [[c.name for c in calls] for calls in asked] == [["email_answer"], ["search_faq"], ["email_answer"]]
    assert asked[0][0].arguments == {"text": "It is noon."}
