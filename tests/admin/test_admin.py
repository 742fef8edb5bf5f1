"""The admin as an operator uses it: the turn list, the turn page (timeline, transcript, RQ job),
permissions, and the re-run and cancel operations.

Most turns here are written straight to the database with the call records a real turn of
that kind leaves (clocks of 120 s with a 20 s margin, so the percentages are easy to check);
others are produced by running a real turn in a forking RQ worker against a fake provider.
"""

import re
import threading
import time

import django_rq
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import Permission, User
from django.db import connection, models
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from conversations.engine import lifecycle as turns
from conversations.admin.conversations import user_fields
from conversations.admin.turns import TurnAdmin
from conversations.models import CallRecord, Conversation, Message, Turn, user_label
from tests.support.helpers import make_client, start_turn
from tests.support.fakes import FakeProvider, openai_text, openai_tool_calls

CHANGELIST = "/admin/conversations/turn/"


def turn_url(turn):
    return reverse("admin:conversations_turn_change", args=[turn.pk])


def make_turn(status, calls=(), messages=(), *, user=None, conversation=None, **fields):
    """A turn as the job leaves it: 120 s job timeout, 20 s margin, its messages and call records."""
    conversation = conversation or Conversation.objects.create(user=user, owner_token="" if user else "tok")
    started = timezone.now() - timezone.timedelta(minutes=5)
    defaults = {"provider": "openai", "model": "gpt-test", "enqueued_at": started, "started_at": started,
                "job_id": "", "job_timeout": 120.0, "deadline_margin": 20.0,
                "deadline_at": started + timezone.timedelta(seconds=100)}
    defaults.update(fields)
    turn = Turn.objects.create(conversation=conversation, status=status, **defaults)
    for role, content, extra in messages:
        Message.objects.create(conversation=conversation, turn=turn, role=role, content=content, **extra)
    for offset, kind, name, attempt, timeout, remaining, duration, outcome, code, detail in calls:
        CallRecord.objects.create(turn=turn, kind=kind, name=name, attempt=attempt, started_offset=offset,
                                  timeout=timeout, remaining_before=remaining, duration=duration, outcome=outcome,
                                  status_code=code, detail=detail)
    return turn


def completed_turn(user=None):
    """Model asks for a tool, the tool runs, the model answers: 4.1 s of a 120 s job."""
    started = timezone.now() - timezone.timedelta(minutes=5)
    return make_turn(
        "completed",
        calls=[(0.0, "model", "gpt-test", 1, 60.0, 100.0, 1.5, "ok", 200, ""),
               (1.6, "tool", "search_faq", 1, 20.0, 98.4, 0.3, "ok", None, "Refunds are accepted within 30 days"),
               (2.1, "model", "gpt-test", 1, 60.0, 97.9, 2.0, "ok", 200, "")],
        messages=[("user", "How do refunds work?", {}),
                  ("assistant", "", {"tool_calls": [{"id": "call_1", "name": "search_faq",
                                                     "arguments": {"query": "refunds", "limit": 2}}]}),
                  ("tool", "Refunds are accepted within 30 days of delivery.",
                   {"tool_call_id": "call_1", "tool_name": "search_faq"}),
                  ("assistant", "Refunds take 30 days.", {})],
        user=user, started_at=started, finished_at=started + timezone.timedelta(seconds=4.1),
        margin_left=115.9, model_calls=2, tool_calls=1, input_tokens=24, output_tokens=12,
    )


def deadline_turn():
    """Two timed-out attempts eat the budget; the third is skipped; the turn ends incomplete."""
    started = timezone.now() - timezone.timedelta(minutes=4)
    return make_turn(
        "incomplete",
        calls=[(0.0, "model", "gpt-test", 1, 60.0, 100.0, 60.0, "timeout", None, "no complete response within 60.0s"),
               (61.0, "model", "gpt-test", 2, 39.0, 39.0, 39.0, "timeout", None, "no complete response within 39.0s"),
               (100.0, "model", "gpt-test", 3, 0.0, 0.0, 0.0, "skipped", None, "Skipped call — job budget exhausted")],
        messages=[("user", "Summarise the whole catalogue", {})],
        started_at=started, finished_at=started + timezone.timedelta(seconds=100.1), margin_left=19.9,
        error="I ran out of time before I could finish this answer. Please ask again to continue.",
    )


def failed_turn():
    """Three attempts answered 429, 500, 503: the provider is down, the turn fails."""
    started = timezone.now() - timezone.timedelta(minutes=3)
    return make_turn(
        "failed",
        calls=[(0.0, "model", "gpt-test", 1, 60.0, 100.0, 0.4, "http_error", 429, "HTTP 429"),
               (1.4, "model", "gpt-test", 2, 60.0, 98.6, 0.6, "http_error", 500, "HTTP 500"),
               (3.9, "model", "gpt-test", 3, 60.0, 96.1, 0.3, "http_error", 503, "HTTP 503")],
        messages=[("user", "Hello?", {})],
        started_at=started, finished_at=started + timezone.timedelta(seconds=4.3), margin_left=115.7,
        error="The assistant is unavailable right now. Please try again in a minute.",
    )


def cancelled_turn():
    """The visitor pressed stop while the model was answering: the tool never ran."""
    started = timezone.now() - timezone.timedelta(minutes=2)
    return make_turn(
        "cancelled",
        calls=[(0.0, "model", "gpt-test", 1, 60.0, 100.0, 3.0, "ok", 200, "")],
        messages=[("user", "What time is it in Tokyo?", {}),
                  ("assistant", "", {"tool_calls": [{"id": "call_9", "name": "current_time",
                                                     "arguments": {"city": "Tokyo"}}]})],
        started_at=started, finished_at=started + timezone.timedelta(seconds=3.1), margin_left=116.9,
        cancel_requested=True, model_calls=1,
    )


def bar_styles(html):
    """The (left, width) of every solid bar of the timeline, in page order."""
    return re.findall(r'class="timeline-bar[^"]*" style="left:([\d.]+%);width:([\d.]+%)"', html)


def allowed_styles(html):
    return re.findall(r'class="timeline-allowed" style="left:([\d.]+%);width:([\d.]+%)"', html)


def table_rows(html):
    """The cells of the timeline table: [[call, attempt, started, timeout, left before, took, outcome, HTTP, detail]]."""
    body = html.split('<table class="timeline-table">', 1)[1].split("</table>", 1)[0]
    rows = re.findall(r'<tr class="timeline-call">(.*?)</tr>', body, re.S)
    return [[re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
            for row in rows]


def staff_client(*codenames):
    """A logged-in staff member (not superuser) with the given conversations permissions."""
    user = User.objects.create_user(f"staff-{'-'.join(codenames) or 'none'}", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="conversations",
                                                        codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


# -- the turn list -------------------------------------------------------------------------


@pytest.mark.django_db
def test_turn_list_shows_status_owner_duration_counts_tokens_and_margin(admin_client):
    owner = User.objects.create_user("maria", email="maria@example.com")
    completed = completed_turn(user=owner)
    incomplete, failed, cancelled = deadline_turn(), failed_turn(), cancelled_turn()

    response = admin_client.get(CHANGELIST)

    assert response.status_code == 200
    html = response.content.decode()
    rows = {turn: html.split(f'title="{turn.id}"', 1)[1].split("</tr>", 1)[0]
            for turn in (completed, incomplete, failed, cancelled)}
    assert 'turn-status-completed">completed' in rows[completed]
    assert '<span title="maria &lt;maria@example.com&gt;">maria</span>' in rows[completed]
    assert "4.1 s" in rows[completed] and "24 / 12" in rows[completed] and "115.9 s" in rows[completed]
    assert '<td class="field-model_calls">2</td><td class="field-tool_calls">1</td>' in rows[completed]
    assert 'turn-status-incomplete">incomplete' in rows[incomplete] and "100.1 s" in rows[incomplete]
    # 19.9 s left is less than the 20 s margin: the final write came after the own deadline.
    assert '<span class="margin-overran">19.9 s</span>' in rows[incomplete]
    assert "anonymous visitor" in rows[incomplete]
    assert 'turn-status-failed">failed' in rows[failed] and "115.7 s" in rows[failed]
    assert 'turn-status-cancelled">cancelled' in rows[cancelled]
    assert str(completed.conversation_id) in rows[completed]


@pytest.mark.django_db
def test_turn_list_query_count_does_not_grow_with_rows(admin_client):
    owner = User.objects.create_user("owner", email="owner@example.com")

    def count_queries():
        with CaptureQueriesContext(connection) as queries:
            response = admin_client.get(CHANGELIST)
        assert response.status_code == 200
        return len(queries), response.content.decode().count('class="field-short_id"')

    for _ in range(3):
        completed_turn(user=owner)
    few = count_queries()
    for index in range(27):
        [completed_turn, deadline_turn, failed_turn][index % 3]()
    many = count_queries()

    assert few[1] == 3 and many[1] == 30
    assert many[0] == few[0]


@pytest.mark.django_db
def test_near_deadline_filter_lists_turns_that_ended_within_five_seconds_of_their_deadline(admin_client):
    late = deadline_turn()
    early = completed_turn()
    # 24 s left with a 20 s margin: written 4 s before the own deadline, so "near" but not "after".
    close = make_turn("completed", margin_left=24.0)
    unfinished = make_turn("running")

    near = admin_client.get(CHANGELIST, {"deadline": "near"}).content.decode()
    overran = admin_client.get(CHANGELIST, {"deadline": "overran"}).content.decode()

    assert str(late.id) in near and str(close.id) in near
    assert str(early.id) not in near and str(unfinished.id) not in near
    assert str(late.id) in overran and str(close.id) not in overran


@pytest.mark.django_db
def test_turn_list_search_finds_turn_by_conversation_id_owner_and_message_text(admin_client):
    owner = User.objects.create_user("joan", email="joan@shop.example")
    mine = completed_turn(user=owner)
    other = failed_turn()

    def found(term):
        html = admin_client.get(CHANGELIST, {"q": term}).content.decode()
        return {turn for turn in (mine, other) if str(turn.id) in html}

    assert found(str(mine.conversation_id)) == {mine}
    assert found(str(other.id)) == {other}
    assert found("joan") == {mine}
    assert found("shop.example") == {mine}
    assert found("refunds work") == {mine}
    assert found("Hello?") == {other}
    assert found("no such words") == set()


class EmailLoginUser(AbstractBaseUser):
    """A custom user model that logs in with an email address: it has no ``username``."""

    email = models.EmailField(unique=True)
    USERNAME_FIELD = "email"
    EMAIL_FIELD = "email"

    class Meta:
        app_label = "tests"


class PhoneLoginUser(AbstractBaseUser):
    """A custom user model with neither ``username`` nor ``email``."""

    phone = models.CharField(max_length=20, unique=True)
    USERNAME_FIELD = "phone"

    class Meta:
        app_label = "tests"


def test_owners_are_searched_and_ordered_by_the_user_models_own_fields():
    assert user_fields() == ["username", "email"]
    assert user_fields(EmailLoginUser) == ["email"]
    assert user_fields(PhoneLoginUser) == ["phone"]
    assert TurnAdmin.owner_short.admin_order_field == f"conversation__user__{get_user_model().USERNAME_FIELD}"
    assert user_label(EmailLoginUser(email="ann@shop.example")) == "ann@shop.example"


@pytest.mark.django_db
def test_turn_and_conversation_search_work_for_a_site_whose_users_log_in_by_email(admin_client, monkeypatch):
    """The admin asks the user model for its fields: with an email login it searches the email
    (here on the stock user table, which has one), never a ``username`` the model lacks."""
    owner = User.objects.create_user("joan", email="joan@shop.example")
    mine = completed_turn(user=owner)
    monkeypatch.setattr("conversations.admin.conversations.get_user_model", lambda: EmailLoginUser)

    turns_found = admin_client.get(CHANGELIST, {"q": "joan@shop"})
    conversations_found = admin_client.get("/admin/conversations/conversation/", {"q": "joan@shop"})

    assert turns_found.status_code == conversations_found.status_code == 200
    assert str(mine.id) in turns_found.content.decode()
    assert str(mine.conversation_id) in conversations_found.content.decode()
    assert turns_found.context["cl"].search_fields == ["conversation__user__email", "messages__content"]
    assert conversations_found.context["cl"].search_fields == ["user__email"]


@pytest.mark.django_db
def test_turns_no_worker_picked_up_are_listed_as_never_started_with_their_sentence(admin_client):
    ran = completed_turn()
    waiting = make_turn("queued", started_at=None, deadline_at=None)
    unpicked = make_turn("queued", started_at=None, deadline_at=None, job_id="conversations-turn-x",
                         enqueued_at=timezone.now() - timezone.timedelta(seconds=31))
    turns.end_unclaimed(unpicked)

    never = admin_client.get(CHANGELIST, {"worker": "never"}).content.decode()
    queued = admin_client.get(CHANGELIST, {"worker": "waiting"}).content.decode()
    page = admin_client.get(turn_url(unpicked)).content.decode()

    assert str(unpicked.id) in never and str(ran.id) not in never and str(waiting.id) not in never
    row = never.split(f'title="{unpicked.id}"', 1)[1].split("</tr>", 1)[0]
    assert 'turn-status-failed">failed' in row and '<td class="field-started">never</td>' in row
    assert str(waiting.id) in queued and str(unpicked.id) not in queued and str(ran.id) not in queued
    assert "The assistant is not available right now. Please try again later." in page


@pytest.mark.django_db
def test_turn_list_filters_by_status_and_model(admin_client):
    completed, failed = completed_turn(), failed_turn()
    other_model = make_turn("completed", model="other-model", margin_left=100.0)

    by_status = admin_client.get(CHANGELIST, {"status__exact": "failed"}).content.decode()
    by_model = admin_client.get(CHANGELIST, {"model": "other-model"}).content.decode()

    assert str(failed.id) in by_status and str(completed.id) not in by_status
    assert str(other_model.id) in by_model and str(completed.id) not in by_model


# -- the turn page -------------------------------------------------------------------------


@pytest.mark.django_db
def test_completed_turn_page_shows_transcript_and_timeline_numbers(admin_client):
    turn = completed_turn()

    html = admin_client.get(turn_url(turn)).content.decode()

    # Bars in percent of the 120 s job timeout: 0 + 1.5 s, 1.6 + 0.3 s, 2.1 + 2.0 s.
    assert bar_styles(html) == [("0.00%", "1.25%"), ("1.33%", "0.25%"), ("1.75%", "1.67%")]
    # Each call was allowed 60 s (model) or 20 s (tool): the grey bands.
    assert allowed_styles(html) == [("0.00%", "50.00%"), ("1.33%", "16.67%"), ("1.75%", "50.00%")]
    assert table_rows(html) == [
        ["model call · gpt-test", "1", "+0.00 s", "60.00 s", "100.00 s", "1.50 s", "ok", "200", ""],
        ["tool run · search_faq", "1", "+1.60 s", "20.00 s", "98.40 s", "0.30 s", "ok", "",
         "Refunds are accepted within 30 days"],
        ["model call · gpt-test", "1", "+2.10 s", "60.00 s", "97.90 s", "2.00 s", "ok", "200", ""],
    ]
    # The own deadline at 100 s, the job timeout at 120 s, the final write at 120 - 115.9 = 4.1 s.
    assert 'timeline-marker-deadline" style="left:83.33%"' in html
    assert 'timeline-marker-job-timeout" style="left:100.00%"' in html
    assert 'timeline-marker-final-write" style="left:3.42%"' in html
    assert "2 provider call attempt(s) took 3.50 s; 1 tool run(s) took 0.30 s." in html
    # The transcript, in order, with the tool call's arguments and the tool's result.
    transcript = html.split('id="transcript"', 1)[1]
    positions = [transcript.index(text) for text in (
        "How do refunds work?", "search_faq", "&quot;limit&quot;: 2", "Refunds are accepted within 30 days of",
        "Refunds take 30 days.")]
    assert positions == sorted(positions)
    assert "transcript-turn-error" not in transcript


@pytest.mark.django_db
def test_deadline_turn_page_shows_timeouts_filling_the_budget_and_the_skipped_call(admin_client):
    turn = deadline_turn()

    html = admin_client.get(turn_url(turn)).content.decode()

    assert bar_styles(html) == [("0.00%", "50.00%"), ("50.83%", "32.50%"), ("83.33%", "0.00%")]
    assert [row[1:7] for row in table_rows(html)] == [
        ["1", "+0.00 s", "60.00 s", "100.00 s", "60.00 s", "timeout"],
        ["2", "+61.00 s", "39.00 s", "39.00 s", "39.00 s", "timeout"],
        ["3", "+100.00 s", "0.00 s", "0.00 s", "0.00 s", "skipped"],
    ]
    assert 'timeline-bar timeline-timeout" style="left:50.83%' in html
    assert 'timeline-bar timeline-skipped" style="left:83.33%' in html
    # The final write came 0.1 s after the own deadline, 19.9 s before RQ's timeout.
    assert 'timeline-marker-final-write" style="left:83.42%"' in html
    assert "time left at the final write: 19.9 s" in html
    assert "I ran out of time before I could finish this answer." in html.split('id="transcript"', 1)[1]


@pytest.mark.django_db
def test_failed_turn_page_shows_each_http_error_attempt_and_the_error(admin_client):
    turn = failed_turn()

    html = admin_client.get(turn_url(turn)).content.decode()

    assert bar_styles(html) == [("0.00%", "0.33%"), ("1.17%", "0.50%"), ("3.25%", "0.25%")]
    assert [(row[1], row[2], row[6], row[7]) for row in table_rows(html)] == [
        ("1", "+0.00 s", "HTTP error", "429"), ("2", "+1.40 s", "HTTP error", "500"),
        ("3", "+3.90 s", "HTTP error", "503")]
    assert html.count("timeline-bar timeline-error") == 3
    assert "The assistant is unavailable right now." in html.split('id="transcript"', 1)[1]


@pytest.mark.django_db
def test_cancelled_turn_page_shows_the_unanswered_tool_call(admin_client):
    turn = cancelled_turn()

    html = admin_client.get(turn_url(turn)).content.decode()

    assert bar_styles(html) == [("0.00%", "2.50%")]
    assert 'turn-status-cancelled">cancelled' in html
    transcript = html.split('id="transcript"', 1)[1]
    assert "current_time" in transcript and "&quot;city&quot;: &quot;Tokyo&quot;" in transcript
    # A done turn offers re-run but not cancel.
    assert "Re-run this message" in html and "Cancel this turn" not in html


@pytest.mark.django_db
def test_turn_page_escapes_model_output_and_hides_the_api_key(admin_client, conversations_settings):
    conversations_settings.update(API_KEY="sk-live-abcdef123456")
    turn = make_turn(
        "failed",
        calls=[(0.0, "model", "gpt-test", 1, 60.0, 100.0, 0.2, "http_error", 401,
                "HTTP 401 invalid key sk-live-abcdef123456")],
        messages=[("user", "<b>hi</b>", {}),
                  ("assistant", '<script>alert("x")</script>',
                   {"tool_calls": [{"id": "c1", "name": "<img src=x onerror=alert(1)>",
                                    "arguments": {"q": "</pre><script>"}}]})],
        error="Echoed sk-live-abcdef123456 <i>back</i>",
    )

    html = admin_client.get(turn_url(turn)).content.decode()

    assert "<script>alert" not in html and "<img src=x" not in html and "<b>hi</b>" not in html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "&lt;/pre&gt;&lt;script&gt;" in html
    assert "sk-live-abcdef123456" not in html
    assert "HTTP 401 invalid key [API key hidden]" in html


@pytest.mark.django_db
def test_turn_page_hides_the_api_keys_of_the_sites_fallbacks_too(admin_client, conversations_settings):
    conversations_settings.update(API_KEY="sk-primary-111111", FALLBACKS=[
        {"PROVIDER": "openai", "MODEL": "backup", "BASE_URL": "http://127.0.0.1:9/v1", "API_KEY": "sk-backup-222222"},
    ])
    turn = make_turn(
        "failed",
        calls=[(0.0, "model", "backup", 1, 60.0, 100.0, 0.2, "http_error", 401,
                "HTTP 401 invalid key sk-backup-222222")],
        messages=[("user", "hi", {}), ("assistant", "Your key is sk-backup-222222", {})],
        error="Echoed sk-backup-222222",
    )

    html = admin_client.get(turn_url(turn)).content.decode()

    assert "sk-backup-222222" not in html
    assert "HTTP 401 invalid key [API key hidden]" in html and "Your key is [API key hidden]" in html


@pytest.mark.django_db
def test_turn_page_reports_a_job_gone_from_redis(admin_client):
    turn = make_turn("running", job_id="conversations-turn-gone", finished_at=None)

    html = admin_client.get(turn_url(turn)).content.decode()

    assert "conversations-turn-gone" in html
    assert '<div class="readonly">gone</div>' in html
    assert "/django-rq/" not in html


@pytest.mark.django_db(transaction=True)
def test_turn_run_by_the_worker_shows_its_recorded_calls_and_links_to_django_rq(worker, conversations_settings,
                                                                                   admin_client):
    with FakeProvider() as fake:
        fake.add(openai_tool_calls(("search_faq", {"query": "refunds"})), openai_text("Refunds take 30 days."))
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="sk-test-key", MODEL="gpt-test")
        started = start_turn(make_client(), "How do refunds work?")
        worker()

    turn = Turn.objects.get(pk=started["id"])
    calls = list(turn.calls.order_by("started_offset", "id"))
    assert [(c.kind, c.name, c.outcome) for c in calls] == [
        ("model", "gpt-test", "ok"), ("tool", "search_faq", "ok"), ("model", "gpt-test", "ok")]

    html = admin_client.get(turn_url(turn)).content.decode()

    expected = [(f"{c.started_offset / 10 * 100:.2f}%", f"{c.duration / 10 * 100:.2f}%") for c in calls]
    assert bar_styles(html) == expected
    assert [row[2:6] for row in table_rows(html)] == [
        [f"+{c.started_offset:.2f} s", f"{c.timeout:.2f} s", f"{c.remaining_before:.2f} s", f"{c.duration:.2f} s"]
        for c in calls]
    # Each model call was given min(CALL_TIMEOUT=5, what was left of the 6 s budget).
    assert [c.timeout for c in calls if c.kind == "model"] == [
        pytest.approx(min(5.0, c.remaining_before), abs=0.01) for c in calls if c.kind == "model"]
    assert f'timeline-marker-final-write" style="left:{(10 - turn.margin_left) * 10:.2f}%"' in html
    assert 'timeline-marker-deadline" style="left:60.00%"' in html
    assert "Refunds take 30 days." in html and "sk-test-key" not in html
    job_url = f"/django-rq/queues/0/{turn.job_id}/"
    assert f'finished · <a href="{job_url}">' in html
    assert admin_client.get(job_url).status_code == 200


@pytest.mark.django_db
def test_queued_turn_page_offers_cancel_and_shows_the_queued_job(admin_client, django_capture_on_commit_callbacks):
    conversation = Conversation.objects.create(owner_token="tok")
    with django_capture_on_commit_callbacks(execute=True):  # django-rq enqueues at commit
        turn = turns.create(conversation, "Hello")[0]

    html = admin_client.get(turn_url(turn)).content.decode()

    assert "No provider call or tool run was recorded for this turn." in html
    assert f'queued · <a href="/django-rq/queues/0/{turn.job_id}/">' in html
    assert "Cancel this turn" in html
    assert re.search(r'<button type="submit" disabled[^>]*>Re-run this message</button>', html)
    # No final write yet: the deadline and job timeout markers, but no final-write marker.
    assert 'timeline-key-deadline">deadline 6.0 s' in html and "timeline-key-final-write" not in html


@pytest.mark.django_db
def test_message_list_is_read_only_and_escaped(admin_client):
    completed_turn()
    Message.objects.update(content="<b>bold</b> reply")

    html = admin_client.get("/admin/conversations/message/").content.decode()

    assert "&lt;b&gt;bold&lt;/b&gt; reply" in html and "<b>bold</b>" not in html
    assert admin_client.get("/admin/conversations/message/add/").status_code == 403
    message = Message.objects.first()
    assert admin_client.post(f"/admin/conversations/message/{message.pk}/change/",
                             {"content": "edited"}).status_code == 403
    assert Message.objects.filter(content="edited").count() == 0


# -- conversation page ---------------------------------------------------------------------


@pytest.mark.django_db
def test_conversation_page_lists_its_turns_with_links(admin_client):
    owner = User.objects.create_user("lee", email="lee@example.com")
    first = completed_turn(user=owner)
    second = make_turn("failed", conversation=first.conversation, margin_left=110.0,
                       enqueued_at=timezone.now(), error="The assistant is unavailable right now.")

    html = admin_client.get(reverse("admin:conversations_conversation_change", args=[first.conversation_id]))
    html = html.content.decode()

    assert "lee &lt;lee@example.com&gt;" in html
    assert html.index(turn_url(first)) < html.index(turn_url(second))
    assert "115.9 s" in html and "110.0 s" in html and "The assistant is unavailable right now." in html


@pytest.mark.django_db
def test_conversation_page_of_an_anonymous_visitor_hides_the_owner_token(admin_client):
    conversation = Conversation.objects.create(owner_token="visitor-secret-token-42")
    make_turn("completed", conversation=conversation, margin_left=110.0)

    html = admin_client.get(reverse("admin:conversations_conversation_change", args=[conversation.pk]))

    assert "anonymous visitor" in html.content.decode()
    assert "visitor-secret-token-42" not in html.content.decode()


@pytest.mark.django_db
def test_conversation_list_counts_turns_without_a_query_per_row(admin_client):
    owner = User.objects.create_user("kim", email="kim@example.com")
    turn = completed_turn(user=owner)
    make_turn("completed", conversation=turn.conversation, margin_left=110.0)
    url = "/admin/conversations/conversation/"

    with CaptureQueriesContext(connection) as few:
        html = admin_client.get(url).content.decode()
    for _ in range(10):
        completed_turn(user=owner)
    with CaptureQueriesContext(connection) as many:
        admin_client.get(url)

    assert '<td class="field-turn_count">2</td>' in html and "kim &lt;kim@example.com&gt;" in html
    assert len(many) == len(few)


# -- permissions ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_staff_without_permission_sees_no_turns():
    turn = completed_turn()
    client = staff_client()

    assert client.get(CHANGELIST).status_code == 403
    assert client.get(turn_url(turn)).status_code == 403
    assert client.post(reverse("admin:conversations_turn_rerun", args=[turn.pk])).status_code == 403
    index = client.get("/admin/").content.decode()
    assert "/admin/conversations/" not in index
    assert Turn.objects.count() == 1


@pytest.mark.django_db
def test_staff_with_view_permission_sees_turns_but_cannot_change_or_operate():
    turn = completed_turn()
    client = staff_client("view_turn", "view_conversation")

    page = client.get(turn_url(turn))
    changelist = client.get(CHANGELIST).content.decode()

    assert page.status_code == 200 and "Timeline" in page.content.decode()
    assert "Re-run this message" not in page.content.decode()
    assert str(turn.id) in changelist
    assert "rerun_selected" not in changelist and "cancel_selected" not in changelist
    assert client.post(turn_url(turn), {"status": "failed"}).status_code == 403
    assert client.post(reverse("admin:conversations_turn_rerun", args=[turn.pk])).status_code == 403
    assert client.post(CHANGELIST, {"action": "rerun_selected", "_selected_action": [turn.pk]}).status_code == 200
    assert client.get("/admin/conversations/turn/add/").status_code == 403
    assert client.post(reverse("admin:conversations_turn_delete", args=[turn.pk])).status_code == 403
    assert Turn.objects.count() == 1 and Turn.objects.get().status == "completed"


@pytest.mark.django_db
def test_staff_with_change_permission_may_operate_but_still_not_edit():
    turn = completed_turn()
    client = staff_client("view_turn", "change_turn")

    html = client.get(turn_url(turn)).content.decode()

    assert "Re-run this message" in html and "rerun_selected" in client.get(CHANGELIST).content.decode()
    assert client.post(turn_url(turn), {"status": "failed"}).status_code == 403
    assert client.post(reverse("admin:conversations_turn_delete", args=[turn.pk])).status_code == 403


# -- operations ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_rerun_action_enqueues_a_new_turn_with_the_same_message(worker, admin_client):
    started = start_turn(make_client(), "What time is it in Tokyo?")
    worker()
    old = Turn.objects.get(pk=started["id"])
    assert old.status == "completed"

    response = admin_client.post(CHANGELIST, {"action": "rerun_selected", "_selected_action": [old.pk]},
                                 follow=True)

    assert "Re-running 1 turn." in response.content.decode()
    new = Turn.objects.exclude(pk=old.pk).get()
    assert new.conversation_id == old.conversation_id and new.status == "queued"
    assert [m.content for m in new.messages.filter(role="user")] == ["What time is it in Tokyo?"]
    assert new.job_id in django_rq.get_queue("default").job_ids
    worker()
    new.refresh_from_db()
    assert new.status == "completed" and "Tokyo" in new.messages.order_by("id").last().content


@pytest.mark.django_db
def test_rerun_button_redirects_to_the_new_turn(admin_client):
    old = failed_turn()

    response = admin_client.post(reverse("admin:conversations_turn_rerun", args=[old.pk]))

    new = Turn.objects.exclude(pk=old.pk).get()
    assert response.status_code == 302 and response["Location"] == turn_url(new)
    assert new.messages.get().content == "Hello?" and new.status == "queued"


@pytest.mark.django_db
def test_rerun_is_refused_politely_while_the_conversation_has_a_running_turn(admin_client):
    old = completed_turn()
    make_turn("running", conversation=old.conversation, finished_at=None)

    response = admin_client.post(CHANGELIST, {"action": "rerun_selected", "_selected_action": [old.pk]},
                                 follow=True)

    assert response.status_code == 200
    assert "its conversation is still answering a message; wait for it or cancel it first" in \
        response.content.decode()
    assert Turn.objects.filter(conversation=old.conversation).count() == 2


@pytest.mark.django_db(transaction=True)
def test_rerun_while_the_queue_is_unreachable_says_so_and_leaves_no_turn_waiting(admin_client, unreachable_queue):
    old = failed_turn()
    unreachable_queue()

    response = admin_client.post(CHANGELIST, {"action": "rerun_selected", "_selected_action": [old.pk]},
                                 follow=True)

    assert "the job queue is unreachable" in response.content.decode()
    new = Turn.objects.exclude(pk=old.pk).get()
    assert new.status == "failed" and new.error == "The assistant is unavailable right now. Please try again in a minute."


@pytest.mark.django_db
def test_cancel_while_redis_is_down_says_the_running_turn_could_not_be_reached(admin_client, unreachable_cache):
    running = make_turn("running", finished_at=None)
    unreachable_cache()

    response = admin_client.post(CHANGELIST, {"action": "cancel_selected", "_selected_action": [running.pk]},
                                 follow=True)

    assert response.status_code == 200
    assert "1 running turn could not be asked to stop: Redis is unreachable." in response.content.decode()
    running.refresh_from_db()
    assert running.status == "running" and running.cancel_requested


@pytest.mark.django_db
def test_rerun_button_only_accepts_post(admin_client):
    old = completed_turn()

    assert admin_client.get(reverse("admin:conversations_turn_rerun", args=[old.pk])).status_code == 405
    assert admin_client.post("/admin/conversations/turn/not-a-uuid/rerun/").status_code == 403
    assert Turn.objects.count() == 1


@pytest.mark.django_db
def test_cancel_action_ends_a_queued_turn_cancelled(admin_client):
    conversation = Conversation.objects.create(owner_token="tok")
    turn = turns.create(conversation, "Hello")[0]

    response = admin_client.post(CHANGELIST, {"action": "cancel_selected", "_selected_action": [turn.pk]},
                                 follow=True)

    assert "1 turn cancelled." in response.content.decode()
    turn.refresh_from_db()
    assert turn.status == "cancelled" and turn.finished_at is not None


@pytest.mark.django_db
def test_cancel_button_ends_a_running_turn_whose_job_is_gone(admin_client):
    turn = make_turn("running", job_id="conversations-turn-lost", finished_at=None)

    response = admin_client.post(reverse("admin:conversations_turn_cancel", args=[turn.pk]), follow=True)

    assert "1 turn cancelled." in response.content.decode()
    turn.refresh_from_db()
    assert turn.status == "cancelled" and turn.cancel_requested


@pytest.mark.django_db(transaction=True)
def test_cancel_stops_a_running_turn_before_its_next_tool_call(worker_process, conversations_settings,
                                                                admin_client):
    cancel_pressed = threading.Event()

    def slow_tool_request(handler):
        cancel_pressed.wait(10)  # the model "thinks" while the operator presses cancel
        handler.send_json(200, openai_tool_calls(("search_faq", {"query": "refunds"})))

    with FakeProvider() as fake:
        fake.add(slow_tool_request, openai_text("never sent"))
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="sk-test-key",
                                      MODEL="gpt-test", JOB_TIMEOUT=20, DEADLINE_MARGIN=4, CALL_TIMEOUT=10)
        started = start_turn(make_client(), "How do refunds work?")
        worker_process()
        deadline = time.monotonic() + 30
        while not fake.requests:  # the turn is running and its first model call is in flight
            assert time.monotonic() < deadline, "the worker never called the model"
            time.sleep(0.05)

        response = admin_client.post(CHANGELIST, {"action": "cancel_selected", "_selected_action": [started["id"]]},
                                     follow=True)
        cancel_pressed.set()
        assert "1 running turn asked to stop" in response.content.decode()
        while not Turn.objects.get(pk=started["id"]).done:
            assert time.monotonic() < deadline, "the turn never ended"
            time.sleep(0.05)

    turn = Turn.objects.get(pk=started["id"])
    assert turn.status == "cancelled"
    assert list(turn.calls.values_list("kind", flat=True)) == ["model"]
    assert len(fake.requests) == 1
    html = admin_client.get(turn_url(turn)).content.decode()
    assert 'turn-status-cancelled">cancelled' in html and len(bar_styles(html)) == 1
