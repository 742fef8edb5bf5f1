"""Test sets: questions asked as real turns (real Redis, real RQ workers, the demo model) of the
live assistant and a draft, scored by deterministic checks; a draft is promoted or rolled back in
one action, and visitors get what is live at their next turn."""

from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command

from conversations.evals import drafts, runs
from conversations.evals.csvimport import import_csv
from conversations.evals.scoring import score
from conversations.models import (Assistant, AssistantDraft, Conversation, Message, TestQuestion, TestResult,
                                  TestRun, TestSet, Turn)
from tests.support.helpers import api_post, make_client, make_worker, poll_until_done

TIME = "What time is it in Tokyo?"
REFUNDS = "How do refunds work?"


def make_assistant(**fields):
    values = {"slug": "help", "name": "Help", "system_prompt": "You are Help.", "provider": "demo",
              "tools": ["current_time", "search_faq"]}
    return Assistant.objects.create(**{**values, **fields})


def make_set(assistant, questions):
    test_set = TestSet.objects.create(name="help-articles", assistant=assistant)
    for position, fields in enumerate(questions):
        TestQuestion.objects.create(test_set=test_set, position=position, **fields)
    return test_set


def drive(run, limit=None, rounds=400, worker=None):
    """Run the test run's turns in a real burst worker until it ends, checking after every step
    that no more than ``limit`` of its turns were ever queued or running at once."""
    if worker is None:
        worker = make_worker()
        worker.subscribe = lambda: None
    for _ in range(rounds):
        if limit is not None:
            assert run.results.filter(turn__status__in=Turn.ACTIVE_STATUSES).count() <= limit
        if not runs.unfinished(run):
            return run
        worker.work(burst=True)
        run = runs.advance(run)
    raise AssertionError("the test run did not end")


def ask_as_visitor(client, content=TIME):
    created = api_post(client, "/api/conversations/", {"assistant": "help"})
    assert created.status_code == 201, created.content
    response = api_post(client, f"/api/conversations/{created.json()['id']}/turns/", {"content": content})
    assert response.status_code == 202, response.content
    make_worker().work(burst=True)
    final = poll_until_done(client, response.json()["poll_url"])
    return Turn.objects.get(pk=final["id"]), final["messages"][-1]["content"]


# -- a run over 30 questions ----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_run_of_thirty_questions_ends_under_the_clocks_and_the_concurrency_limit_live_and_draft():
    assistant = make_assistant()
    questions = []
    for number in range(15):
        questions.append({"question": TIME, "must_contain": ["Tokyo"], "must_use_tool": "current_time",
                          "max_seconds": 8})
        questions.append({"question": REFUNDS, "must_contain": ["30 days"], "must_use_tool": "search_faq",
                          "visitor": TestQuestion.Visitor.SIGNED_IN if number % 2 else TestQuestion.Visitor.ANONYMOUS})
    test_set = make_set(assistant, questions)
    # The draft drops the clock tool: its time answers must fail where the live ones pass.
    draft = AssistantDraft.objects.create(assistant=assistant, note="no clock", changes={"tools": ["search_faq"]})

    run = drive(runs.start_run(test_set, draft=draft, concurrency=3), limit=3)

    assert run.status == TestRun.Status.FINISHED
    results = list(run.results.select_related("turn", "question"))
    assert len(results) == 60 and all(r.scored for r in results)
    for result in results:  # each a real turn, ended within its job's own deadline
        turn = result.turn
        assert turn.status == Turn.Status.COMPLETED and turn.conversation.internal
        assert turn.margin_left > 0 and turn.duration < turn.job_timeout - turn.deadline_margin
        assert (turn.draft_id == draft.pk) == (result.side == TestResult.Side.DRAFT)
    found = runs.summary(run)
    assert found["sides"]["live"]["passed"] == 30 and found["sides"]["live"]["pass_rate"] == 1.0
    assert found["sides"]["draft"]["passed"] == 15 and found["sides"]["draft"]["pass_rate"] == 0.5
    assert found["sides"]["live"]["cost"] is None  # the demo model has no price: no cost, rather than 0
    assert {q.question for q in found["changed"]} == {TIME} and len(found["changed"]) == 15
    draft_time = run.results.filter(side="draft", question__question=TIME).first()
    assert "It did not use the tool current_time (used: search_faq)." in runs.failed_reasons(draft_time)
    # Each side ran with a version of the same assistant, the draft's its own.
    live_versions = set(run.results.filter(side="live").values_list("version", flat=True))
    draft_versions = set(run.results.filter(side="draft").values_list("version", flat=True))
    assert len(live_versions) == len(draft_versions) == 1 and live_versions != draft_versions
    assert set(assistant.versions.values_list("pk", flat=True)) == live_versions | draft_versions
    # Signed-in questions were asked by the run's own visitor, who cannot sign in.
    signed_in = run.results.filter(question__visitor="signed_in").select_related("turn__conversation__user").first()
    assert not signed_in.turn.conversation.user.has_usable_password()
    # The visitors' overview counts none of it.
    from conversations.admin.overview import overview
    assert sum(row["turns"] for row in overview(7)) == 0


@pytest.mark.django_db(transaction=True)
def test_stop_ends_the_run_and_its_turns_and_starts_no_more():
    test_set = make_set(make_assistant(), [{"question": TIME}] * 6)
    assert runs.start_run(test_set, concurrency=50).concurrency == 10  # never the whole queue
    runs.stop(TestRun.objects.get())
    run = runs.start_run(test_set, concurrency=2)
    assert run.results.filter(turn__isnull=False).count() == 2  # two queued, four waiting

    run = runs.stop(run)
    run = drive(run)

    assert run.status == TestRun.Status.STOPPED
    assert run.results.filter(turn__isnull=False).count() == 2
    assert set(run.results.filter(turn__isnull=False).values_list("turn__status", flat=True)) == {"cancelled"}
    found = runs.summary(run)
    assert found["sides"]["live"] == {**found["sides"]["live"], "questions": 6, "answered": 2, "passed": 0}
    assert runs.failed_reasons(run.results.filter(turn__isnull=True).first()) == ["Not run."]


@pytest.mark.django_db(transaction=True)
def test_the_earlier_messages_are_the_conversation_the_question_continues():
    test_set = make_set(make_assistant(), [{"question": REFUNDS, "earlier_messages": [
        {"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi! How can I help?"}]}])
    run = drive(runs.start_run(test_set))
    result = run.results.get()
    assert result.passed
    contents = list(Message.objects.filter(conversation=result.turn.conversation).values_list("role", "content"))
    assert contents[:3] == [("user", "Hello"), ("assistant", "Hi! How can I help?"), ("user", REFUNDS)]


@pytest.mark.django_db(transaction=True)
def test_the_cost_limit_starts_no_more_turns_once_spent(conversations_settings):
    conversations_settings.update(PRICES={"demo": {"input": 1000, "output": 1000}})
    test_set = make_set(make_assistant(), [{"question": TIME}] * 4)
    run = drive(runs.start_run(test_set, concurrency=1, max_cost=Decimal("0.000001")))
    assert run.status == TestRun.Status.STOPPED
    assert run.results.filter(scored=True).count() == 1 and run.results.filter(turn__isnull=True).count() == 3
    assert runs.summary(run)["sides"]["live"]["cost"] == run.results.get(scored=True).turn.cost > 0


# -- each check passes and fails -------------------------------------------------------------------


@pytest.fixture
def answered(transactional_db):
    """A real turn answering the time question (with the clock tool), and the question's checks."""
    test_set = make_set(make_assistant(), [{"question": TIME}])
    run = drive(runs.start_run(test_set))
    turn = run.results.get().turn
    turn.cost = Decimal("0.002")

    def checks(**fields):
        return {c["check"]: (c["passed"], c["reason"]) for c in score(TestQuestion(question=TIME, **fields), turn)}

    return turn, checks


@pytest.mark.parametrize("fields, name, passed, reason", [
    ({}, "completed", True, "It ended completed."),
    ({"must_contain": ["tokyo"]}, "contains", True, "The answer contains “tokyo”."),
    ({"must_contain": ["Osaka"]}, "contains", False, "The answer does not contain “Osaka”."),
    ({"must_not_contain": ["Osaka"]}, "does_not_contain", True, "The answer does not contain “Osaka”."),
    ({"must_not_contain": ["Tokyo"]}, "does_not_contain", False, "The answer contains “Tokyo”, which it must not."),
    ({"must_use_tool": "current_time"}, "used_tool", True, "It used the tool current_time."),
    ({"must_use_tool": "search_faq"}, "used_tool", False,
     "It did not use the tool search_faq (used: current_time)."),
    ({"max_cost": Decimal("0.01")}, "cost", True, "It cost 0.002; at most 0.01 allowed."),
    ({"max_cost": Decimal("0.001")}, "cost", False, "It cost 0.002; at most 0.001 allowed."),
])
def test_each_check_passes_and_fails_with_its_reason(answered, fields, name, passed, reason):
    _turn, checks = answered
    assert checks(**fields)[name] == (passed, reason)


def test_within_seconds_passes_and_fails(answered):
    turn, checks = answered
    assert checks(max_seconds=turn.duration + 1)["within_seconds"][0] is True
    assert checks(max_seconds=turn.duration / 2)["within_seconds"][0] is False


def test_ended_completed_fails_for_a_failed_turn(answered):
    turn, checks = answered
    turn.status = Turn.Status.FAILED
    assert checks()["completed"] == (False, "It ended failed.")


@pytest.mark.django_db(transaction=True)
def test_cites_passes_for_the_page_the_answer_links_and_fails_for_another(conversations_settings):
    from chatproject.models import Article

    # Saved here (which indexes it): after another transactional test, the demo migration's articles are gone.
    Article.objects.update_or_create(slug="reset-password", defaults=dict(title="Resetting a forgotten password", body=(
        "<p>On the sign-in page choose Forgot password and enter your email address. We email you a link that "
        "lets you choose a new password; it works once and for one hour.</p>")))
    test_set = make_set(make_assistant(tools=["search_site"]), [
        {"question": "How do I reset a forgotten password?", "must_cite": "/help/reset-password/"},
        {"question": "How do I reset a forgotten password?", "must_cite": "/help/delete-account/"}])
    run = drive(runs.start_run(test_set))
    good, bad = run.results.order_by("question__position")
    assert good.passed and {"check": "cites", "passed": True, "reason": "The answer cites /help/reset-password/."} \
        in good.checks
    assert not bad.passed and runs.failed_reasons(bad) == ["The answer does not cite /help/delete-account/."]


# -- publishing ---------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_promote_and_roll_back_change_what_visitors_get_at_their_next_turn():
    assistant = make_assistant()
    test_set = make_set(assistant, [{"question": TIME, "must_use_tool": "current_time"}])
    draft = AssistantDraft.objects.create(assistant=assistant, changes={"system_prompt": "You are Help, v2.",
                                                                        "tools": ["search_faq"]})
    run = drive(runs.start_run(test_set, draft=draft))
    draft_version = run.results.get(side="draft").version
    visitor = make_client()

    before, answer = ask_as_visitor(visitor)  # the draft exists, but visitors never get it
    assert before.assistant_version != draft_version and before.draft is None
    assert "Tokyo" in answer

    with pytest.raises(ValidationError):  # a run of another draft, or none, justifies nothing
        drafts.promote(draft, None)
    drafts.promote(draft, run)
    draft.refresh_from_db()
    assert draft.promoted_run == run and draft.replaced["tools"] == ["current_time", "search_faq"]

    after, answer = ask_as_visitor(visitor)  # the very version the run scored
    assert after.assistant_version == draft_version and after.draft is None
    assert "Tokyo" not in answer

    drafts.rollback(assistant)
    again, answer = ask_as_visitor(visitor)
    assert again.assistant_version == before.assistant_version
    assert "Tokyo" in answer
    with pytest.raises(ValidationError):
        drafts.rollback(assistant)  # nothing more to roll back


# -- CSV and the command --------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_csv_adds_its_questions_and_a_bad_row_adds_none():
    test_set = make_set(make_assistant(), [])
    count = import_csv(test_set, 'question,visitor,must_contain,must_cite,max_seconds,earlier_messages\n'
                                 f'"{REFUNDS}",signed_in,30 days|refund,/help/refunds/,5,"[{{""role"": ""user"", '
                                 '""content"": ""Hi""}]"\n'
                                 f"{TIME},,,,,\n")
    assert count == 2
    first, second = test_set.questions.all()
    assert (first.question, first.visitor, first.must_contain, first.must_cite, first.max_seconds) == (
        REFUNDS, "signed_in", ["30 days", "refund"], "/help/refunds/", 5.0)
    assert first.earlier_messages == [{"role": "user", "content": "Hi"}] and second.visitor == "anonymous"
    with pytest.raises(ValidationError, match="Row 3: visitor must be one of"):
        import_csv(test_set, f"question,visitor\n{TIME},\n{TIME},staff\n")
    with pytest.raises(ValidationError, match="unknown: must_contian"):
        import_csv(test_set, f"question,must_contian\n{TIME},x\n")
    assert test_set.questions.count() == 2


@pytest.mark.django_db(transaction=True)
def test_the_command_exits_non_zero_below_the_threshold(capsys):
    assistant = make_assistant()
    make_set(assistant, [{"question": TIME, "must_use_tool": "current_time"},
                         {"question": REFUNDS, "must_contain": ["30 days"]}])
    AssistantDraft.objects.create(assistant=assistant, changes={"tools": ["search_faq"]})

    call_command("run_test_set", "help-articles", "--threshold", "1", "--burst")
    assert "live: 2/2 passed (100%)" in capsys.readouterr().out

    with pytest.raises(CommandError, match="The draft pass rate 50% is below the threshold 90%"):
        call_command("run_test_set", "help-articles", "--draft", "--burst")
    out = capsys.readouterr().out
    assert f"changed: {TIME}" in out
    assert f"failed (draft): {TIME}: It did not use the tool current_time (used: search_faq)." in out
    assert not Conversation.objects.filter(internal=False).exists()


@pytest.mark.django_db(transaction=True)
def test_a_work_horse_sigkilled_mid_run_loses_no_result(conversations_settings):
    import os
    import signal
    import threading

    from conversations.core.sentences import crashed_message
    from tests.support.helpers import wait_for

    conversations_settings.update(DEMO_DELAY=0.5)
    test_set = make_set(make_assistant(), [{"question": TIME, "must_contain": ["Tokyo"]}] * 4)
    run = runs.start_run(test_set, concurrency=2)
    worker = make_worker()
    worker.subscribe = lambda: None

    def kill_the_first_running_horse():
        wait_for(lambda: worker.horse_pid and Turn.objects.filter(status="running").exists(), timeout=20)
        os.kill(worker.horse_pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_the_first_running_horse, daemon=True)
    killer.start()
    run = drive(run, limit=2, worker=worker)  # the same worker, burst after burst until the run ends
    killer.join(5)

    assert run.status == TestRun.Status.FINISHED
    results = list(run.results.select_related("turn"))
    assert len(results) == 4 and all(r.scored for r in results)
    killed = [r for r in results if not r.passed]
    assert len(killed) == 1 and killed[0].turn.error == crashed_message()
    assert {"check": "completed", "passed": False, "reason": "It ended failed."} in killed[0].checks
    assert sum(1 for r in results if r.passed) == 3


@pytest.mark.django_db(transaction=True)
def test_the_judges_verdict_is_parsed_from_its_own_turn(conversations_settings):
    from tests.support.fakes import FakeProvider, openai_text

    with FakeProvider() as judge_api:
        judge_api.add(openai_text("PASS: it gives the refund window in days."),
                      openai_text("fail - it never says how long a refund takes."),
                      openai_text("I would rather not say."))
        conversations_settings.update(PROVIDER="openai", BASE_URL=judge_api.url, API_KEY="k", MODEL="judge-model",
                                      STREAM=False)
        judge = Assistant.objects.create(slug="judge", name="Judge", provider="openai",
                                         system_prompt="You judge answers strictly.")
        test_set = make_set(make_assistant(), [{"question": REFUNDS}] * 3)
        test_set.judge, test_set.rubric = judge, "A good answer says how many days a refund takes."
        test_set.save()
        run = drive(runs.start_run(test_set, concurrency=1), limit=1)

    first, second, third = run.results.order_by("question__position").select_related("judge_turn")
    assert first.passed and {"check": "judge", "passed": True,
                             "reason": "The judge: PASS. it gives the refund window in days."} in first.checks
    assert not second.passed and runs.failed_reasons(second) == [
        "The judge: FAIL. it never says how long a refund takes."]
    assert not third.passed and runs.failed_reasons(third) == ["The judge gave no verdict."]
    # The judge read the rubric, the question and the answer, in a turn of its own (internal, costed, recorded).
    asked = judge_api.requests[0]["json"]["messages"]
    assert asked[0] == {"role": "system", "content": "You judge answers strictly."}
    assert "A good answer says how many days" in asked[-1]["content"] and REFUNDS in asked[-1]["content"]
    assert "30 days" in asked[-1]["content"]
    assert first.judge_turn.conversation.internal and first.judge_turn.status == "completed"


@pytest.mark.django_db(transaction=True)
def test_a_run_goes_on_with_only_the_workers_running():
    """Started from the admin, nobody calls advance(): each test turn's job starts the next."""
    test_set = make_set(make_assistant(), [{"question": TIME, "must_contain": ["Tokyo"]}] * 5)
    run = runs.start_run(test_set, concurrency=2)
    worker = make_worker()
    worker.subscribe = lambda: None
    worker.work(burst=True)  # one burst: it takes the turns the finished ones enqueue, until none is left

    run.refresh_from_db()
    assert run.status == TestRun.Status.FINISHED
    assert run.results.filter(scored=True, passed=True).count() == 5


@pytest.mark.django_db(transaction=True)
def test_a_test_turn_ended_by_stop_or_by_the_repair_advances_its_run(conversations_settings, admin_client):
    """No job ends these turns, nobody calls advance() and nobody opens the run's page: the write
    that ends each turn scores it and starts the run's next question."""
    from rq.job import Job

    from conversations.engine import lifecycle, recovery
    from conversations.infra import queue

    conversations_settings.update(MAX_RESUMES=0)  # a turn whose job died ends failed, rather than continued
    run = runs.start_run(make_set(make_assistant(), [{"question": TIME, "must_contain": ["Tokyo"]}] * 3),
                         concurrency=1)
    first, second, third = run.results.order_by("question__position")

    lifecycle.stop(first.turn)  # the turn's own Stop (a visitor's button, or an operator's), not the run's
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.scored and not first.passed and first.turn.status == "cancelled"
    assert second.turn is not None and second.turn.status == "queued"  # the next question, started there

    # The second turn's work horse died as it ran: its job is gone, and the repair ends the turn.
    Turn.objects.filter(pk=second.turn_id).update(status="running", started_at=second.turn.enqueued_at)
    Job.fetch(second.turn.job_id, connection=queue.get_queue().connection).delete()
    assert recovery.repair(Turn.objects.get(pk=second.turn_id)) is not None
    second.refresh_from_db()
    third.refresh_from_db()
    assert second.scored and not second.passed and second.turn.status == "failed"
    assert third.turn is not None and not third.scored

    # Showing the run changes nothing: a turn ended behind the engine's back stays unscored.
    Turn.objects.filter(pk=third.turn_id).update(status="completed")
    assert admin_client.get(f"/admin/conversations/testrun/{run.pk}/change/").status_code == 200
    third.refresh_from_db()
    assert not third.scored and TestRun.objects.get().status == TestRun.Status.RUNNING


@pytest.mark.django_db(transaction=True)
def test_a_member_sees_members_only_knowledge_in_a_test_turn_as_a_real_member_would(conversations_settings):
    """The site's own rule decides who is a member (here: the group "members"), for a test turn as
    for a visitor's: only the member's answer finds and cites the members-only article."""
    from django.contrib.auth.models import Group
    from django.core.checks import Warning

    from chatproject.models import Article
    from conversations import knowledge
    from conversations.checks import check_test_member_groups
    from conversations.knowledge.registry import sources

    def in_members_group(queryset, user):
        return queryset if user.groups.filter(name="members").exists() else queryset.filter(members_only=False)

    demo = sources()["help"]
    fields = {"name": demo.name, "title": demo.title, "body": demo.body, "url": demo.url, "published": demo.published,
              "html": demo.html, "updated": demo.updated}
    knowledge.register(demo.model, **fields, visible=in_members_group)
    try:
        Group.objects.create(name="members")
        conversations_settings.update(TEST_MEMBER_GROUPS=["members"])
        Article.objects.create(slug="member-lounge", title="The members' lounge", members_only=True, published=True,
                               body="<p>The lounge on the second floor is open to members.</p>")
        lounge = {"question": "Where is the members lounge?", "must_cite": "/help/member-lounge/"}
        test_set = make_set(make_assistant(tools=["search_site"]), [
            {**lounge, "visitor": kind} for kind in ("anonymous", "signed_in", "member")])
        run = drive(runs.start_run(test_set, concurrency=3))
    finally:
        knowledge.register(demo.model, **fields, visible=demo.visible)

    results = {r.question.visitor: r for r in run.results.select_related("question", "turn__conversation__user")}
    assert {kind: r.passed for kind, r in results.items()} == {"anonymous": False, "signed_in": False, "member": True}
    assert "The members' lounge" in results["member"].turn.messages.filter(role="assistant").last().content
    member, signed_in = results["member"].turn.conversation.user, results["signed_in"].turn.conversation.user
    assert [g.name for g in member.groups.all()] == ["members"] and not signed_in.groups.exists()
    assert member != signed_in and not member.has_usable_password()

    # A group the setting names but the site does not have: the member would be no member.
    conversations_settings.update(TEST_MEMBER_GROUPS=["members", "club"])
    assert check_test_member_groups(databases=["default"]) == [Warning(
        "CONVERSATIONS['TEST_MEMBER_GROUPS'] names the group 'club', which does not exist: a test question asked by "
        "a member is asked by a user outside it.",
        hint="Name the groups your site's rules count as members, or create this one.", id="conversations.W090")]


@pytest.mark.django_db
def test_the_test_visitors_are_made_from_the_user_models_own_fields(monkeypatch):
    """A site's user model may log in with another field than ``username`` and require others
    (``REQUIRED_FIELDS``): the test visitors are looked up by its login field and created by its
    manager with each required field filled in, as ``createsuperuser`` would."""
    from django.contrib.auth import get_user_model

    model = get_user_model()
    signed_in = runs.test_visitor("signed_in")
    assert signed_in.get_username() == "conversations-test-visitor" and not signed_in.has_usable_password()
    assert not signed_in.is_staff and not signed_in.groups.exists()
    assert runs.test_visitor("signed_in").pk == signed_in.pk and model.objects.count() == 1

    # An e-mail login, with the username required beside it
    monkeypatch.setattr(model, "USERNAME_FIELD", "email")
    monkeypatch.setattr(model, "REQUIRED_FIELDS", ["username", "first_name"])
    member = runs.test_visitor("member")
    assert member.get_username() == "conversations-test-member@example.invalid"
    assert (member.username, member.first_name) == ("conversations-test-member", "")  # may be left empty
    assert not member.has_usable_password()
    assert runs.test_visitor("member").pk == member.pk and model.objects.count() == 2


@pytest.mark.django_db
def test_a_required_user_field_no_name_can_fill_is_a_clear_error(monkeypatch):
    from django.contrib.auth import get_user_model
    from django.core.exceptions import ImproperlyConfigured

    model = get_user_model()
    field = model._meta.get_field("last_login")
    monkeypatch.setattr(model, "REQUIRED_FIELDS", ["last_login"])
    monkeypatch.setattr(field, "null", False)
    monkeypatch.setattr(field, "blank", False)
    with pytest.raises(ImproperlyConfigured) as error:
        runs.test_visitor("signed_in")
    assert str(error.value) == (
        "The test visitor 'conversations-test-visitor' cannot be created: the user model auth.User requires "
        "'last_login', which a name cannot fill and has no default. Create the user whose username is "
        "'conversations-test-visitor' yourself, without a usable password, or give the field a default.")
    assert not model.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_visitors_turn_ending_costs_the_test_runs_no_query():
    """Every turn's ending is announced; a visitor's, with its conversation loaded (as its job has
    it), is no test run's and is left at once."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from conversations.engine import lifecycle

    make_assistant()
    ended, _answer = ask_as_visitor(make_client())
    turn = Turn.objects.select_related("conversation").get(pk=ended.pk)
    with CaptureQueriesContext(connection) as queries:
        lifecycle.turn_ended.send(sender=Turn, turn=turn)
    assert len(queries) == 0
