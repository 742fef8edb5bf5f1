"""The admin of test sets: a CSV adds questions, a run starts from the set, its page compares the
live version with the draft question by question, and Stop and promote are one action each."""

import pytest
from django.contrib.auth.models import Permission, User

from conversations.evals import runs
from conversations.models import Assistant, AssistantDraft, TestResult, TestRun, TestSet
from tests.evals.test_test_sets import REFUNDS, TIME, drive, make_assistant, make_set


@pytest.mark.django_db(transaction=True)
def test_csv_upload_run_comparison_page_and_promotion(admin_client):
    assistant = make_assistant()
    test_set = make_set(assistant, [])
    upload = ("question,must_contain,must_use_tool\n"
              f"{TIME},Tokyo,current_time\n{REFUNDS},30 days,\n").encode()
    from django.core.files.uploadedfile import SimpleUploadedFile

    changed = admin_client.post(f"/admin/conversations/testset/{test_set.pk}/change/", {
        "name": test_set.name, "assistant": assistant.pk, "description": "",
        "csv_file": SimpleUploadedFile("questions.csv", upload, content_type="text/csv"),
        "questions-TOTAL_FORMS": 0, "questions-INITIAL_FORMS": 0}, follow=True)
    assert "2 questions added from the CSV file." in changed.content.decode()
    draft = admin_client.post("/admin/conversations/assistantdraft/add/", {
        "assistant": assistant.pk, "note": "no clock", "changes": '{"tools": ["search_faq"]}'})
    assert draft.status_code == 302
    refused = admin_client.post("/admin/conversations/assistantdraft/add/", {
        "assistant": assistant.pk, "note": "", "changes": '{"tools": ["no_such_tool"], "slug": "x"}'})
    assert "A JSON object whose keys are among" in refused.content.decode()

    admin_client.post("/admin/conversations/testset/", {"action": "run_with_draft", "_selected_action": [test_set.pk]})
    run = drive(TestRun.objects.get())

    page = admin_client.get(f"/admin/conversations/testrun/{run.pk}/change/").content.decode()
    assert "✓" in page and ("✗ The answer does not contain “Tokyo”. It did not use the tool current_time (used: "
                            "search_faq).</td>") in page
    assert "<td>2/2 (100%)</td>" in page and "<td>1/2 (50%)</td>" in page and "<strong>changed</strong>" in page
    listed = admin_client.get("/admin/conversations/testrun/").content.decode()
    assert "live 100% · draft 50%" in listed  # the pass rates of the run list's column

    admin_client.post("/admin/conversations/testrun/", {"action": "promote", "_selected_action": [run.pk]})
    assert Assistant.objects.get().tools == ["search_faq"]
    admin_client.post("/admin/conversations/assistantdraft/", {
        "action": "roll_back", "_selected_action": [AssistantDraft.objects.get().pk]})
    assert Assistant.objects.get().tools == ["current_time", "search_faq"]


@pytest.mark.django_db(transaction=True)
def test_stop_in_the_admin_and_a_draft_changing_the_endpoint_needs_the_configure_permission(client):
    assistant = make_assistant()
    run = runs.start_run(make_set(assistant, [{"question": TIME}] * 4), concurrency=1)
    staff = User.objects.create_user("editor", password="pw-123456789", is_staff=True)
    staff.user_permissions.set(Permission.objects.filter(codename__in=[
        "view_testrun", "change_testrun", "add_assistantdraft", "view_assistantdraft"]))
    client.force_login(staff)

    client.post("/admin/conversations/testrun/", {"action": "stop", "_selected_action": [run.pk]})
    assert drive(run).status == TestRun.Status.STOPPED

    refused = client.post("/admin/conversations/assistantdraft/add/", {
        "assistant": assistant.pk, "note": "", "changes": '{"provider": "openai"}'})
    assert refused.status_code == 403 and not AssistantDraft.objects.exists()
    assert TestSet.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_badly_rated_turn_becomes_a_question_of_the_test_set_staff_pick(admin_client, client, conversations_settings):
    from django.contrib.auth.models import Group

    from conversations.models import TestQuestion, Turn
    from tests.evals.test_test_sets import ask_as_visitor
    from tests.support.helpers import api_post, logged_in_client, make_client, make_worker, poll_until_done

    assistant = make_assistant()
    turn, _answer = ask_as_visitor(make_client(), REFUNDS)
    Turn.objects.filter(pk=turn.pk).update(rating="down")
    run = drive(runs.start_run(make_set(assistant, [{"question": TIME}])))  # a test run's turn is never added
    regulars = TestSet.objects.create(name="regulars", assistant=assistant)
    TestSet.objects.create(name="other-assistant", assistant=Assistant.objects.create(slug="other", name="Other"))

    staff = User.objects.create_user("reader", password="pw-123456789", is_staff=True)
    staff.user_permissions.set(Permission.objects.filter(codename__in=["view_turn", "change_turn"]))
    client.force_login(staff)
    refused = client.post("/admin/conversations/turn/", {"action": "add_to_test_set", "_selected_action": [turn.pk],
                                                         "index": 0})
    assert refused.status_code == 403  # change_turn alone: no adding questions
    assert "Add to a test set" not in client.get(f"/admin/conversations/turn/{turn.pk}/change/").content.decode()
    assert client.get(f"/admin/conversations/turn/{turn.pk}/add-to-test-set/").status_code == 403

    # From the turn list: the action asks which test set (the turn's assistant's only), then adds.
    asked = admin_client.post("/admin/conversations/turn/", {
        "action": "add_to_test_set", "_selected_action": [turn.pk, run.results.get().turn_id], "index": 0})
    page = asked.content.decode()
    assert asked.status_code == 200 and "regulars" in page and "other-assistant" not in page
    assert not TestQuestion.objects.filter(test_set=regulars).exists()  # nothing added until chosen
    done = admin_client.post("/admin/conversations/turn/", {
        "action": "add_to_test_set", "_selected_action": [turn.pk, run.results.get().turn_id], "apply": "yes",
        "test_set": ""}, follow=True)
    assert "1 question added to the test set help-from-turns." in done.content.decode()
    (question,) = TestSet.objects.get(name="help-from-turns").questions.all()
    assert (question.question, question.visitor, question.earlier_messages) == (REFUNDS, "anonymous", [])

    # From the turn's own page, a member's turn (its second message) goes to the set picked, with
    # the message before it and the member's kind; a GET adds nothing, a POST needs the CSRF token.
    conversations_settings.update(TEST_MEMBER_GROUPS=["members"])
    member = logged_in_client("member")
    member.user.groups.add(Group.objects.create(name="members"))
    first, _answer = ask_as_visitor(member, "Hello")
    posted = api_post(member, f"/api/conversations/{first.conversation_id}/turns/", {"content": TIME})
    make_worker().work(burst=True)
    member_turn = Turn.objects.get(pk=poll_until_done(member, posted.json()["poll_url"])["id"])
    turn_page = admin_client.get(f"/admin/conversations/turn/{member_turn.pk}/change/").content.decode()
    assert f"/admin/conversations/turn/{member_turn.pk}/add-to-test-set/" in turn_page
    shown = admin_client.get(f"/admin/conversations/turn/{member_turn.pk}/add-to-test-set/")
    assert shown.status_code == 200 and not regulars.questions.exists()
    from django.test import Client

    guarded = Client(enforce_csrf_checks=True)
    guarded.force_login(User.objects.get(username="admin"))
    assert guarded.post(f"/admin/conversations/turn/{member_turn.pk}/add-to-test-set/", {
        "apply": "yes", "test_set": regulars.pk}).status_code == 403
    added = admin_client.post(f"/admin/conversations/turn/{member_turn.pk}/add-to-test-set/", {
        "apply": "yes", "test_set": regulars.pk})
    assert added.status_code == 302 and added.url.endswith(f"/turn/{member_turn.pk}/change/")
    (question,) = regulars.questions.all()
    assert question.question == TIME and question.visitor == "member"
    assert [m["content"] for m in question.earlier_messages][0] == "Hello"


@pytest.mark.django_db(transaction=True)
def test_a_run_started_in_the_admin_keeps_its_limits_and_its_page_says_the_cost_limit_stopped_it(
        admin_client, conversations_settings):
    from decimal import Decimal

    conversations_settings.update(PRICES={"demo": {"input": 1000, "output": 1000}})
    test_set = make_set(make_assistant(), [{"question": TIME}] * 4)
    listed = admin_client.get("/admin/conversations/testset/").content.decode()
    assert 'name="concurrency"' in listed and 'name="max_cost"' in listed

    refused = admin_client.post("/admin/conversations/testset/", {
        "action": "run_live", "_selected_action": [test_set.pk], "concurrency": 0, "max_cost": ""}, follow=True)
    assert "Turns at a time: Ensure this value is greater than or equal to 1." in refused.content.decode()
    assert not TestRun.objects.exists()

    admin_client.post("/admin/conversations/testset/", {
        "action": "run_live", "_selected_action": [test_set.pk], "concurrency": 3, "max_cost": "0.000001"})
    run = TestRun.objects.get()
    assert (run.concurrency, run.max_cost) == (3, Decimal("0.000001"))
    run = drive(run, limit=3)  # three at once; their cost passes the limit, so the fourth is never asked

    assert run.status == TestRun.Status.STOPPED
    page = admin_client.get(f"/admin/conversations/testrun/{run.pk}/change/").content.decode()
    assert "At most 3 turns at a time. Cost limit 0.000001" in page
    assert "The cost limit is reached: the run asks no more questions (1 was not asked)." in page


@pytest.mark.django_db(transaction=True)
def test_the_run_page_sums_the_runs_cost_once(admin_client, conversations_settings):
    """What a run spent is shown beside its limit and decides whether the limit is reached: one
    query sums it (and tells a run with no priced turn, shown "—", from one that cost 0)."""
    import re
    from decimal import Decimal

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    conversations_settings.update(PRICES={"demo": {"input": 1000, "output": 1000}})
    run = drive(runs.start_run(make_set(make_assistant(), [{"question": TIME}] * 2), concurrency=1,
                               max_cost=Decimal("0.000001")))
    spent = sum(result.turn.cost for result in run.results.exclude(turn=None))
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(f"/admin/conversations/testrun/{run.pk}/change/").content.decode()
    assert f"Cost limit 0.000001; spent {spent.normalize():f}." in page
    assert "The cost limit is reached: the run asks no more questions (1 was not asked)." in page
    # the queries that add up, or look for, the turns' costs (the results' rows are read for the comparison)
    summing = re.compile(r'SUM\([^)]*"cost"\)|"cost" IS NOT NULL')
    costs = [q["sql"] for q in queries.captured_queries if summing.search(q["sql"])]
    assert len(costs) == 1, costs


@pytest.mark.django_db(transaction=True)
def test_only_the_run_list_counts_each_runs_results(admin_client):
    """The list's pass-rate column counts each run's results in the list's one query; the run's own
    page (which shows no such column) reads the run without that aggregate."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    run = drive(runs.start_run(make_set(make_assistant(), [{"question": TIME}]), concurrency=1))
    table, results = (f'"{model._meta.db_table}"' for model in (TestRun, TestResult))
    for url, counted in ((f"/admin/conversations/testrun/{run.pk}/change/", False),
                         ("/admin/conversations/testrun/", True)):
        with CaptureQueriesContext(connection) as queries:
            assert admin_client.get(url).status_code == 200
        runs_read = [q["sql"] for q in queries.captured_queries
                     if q["sql"].startswith("SELECT") and f"FROM {table}" in q["sql"]]
        assert any("COUNT(" in sql and results in sql for sql in runs_read) is counted, (url, runs_read)


@pytest.mark.django_db
def test_a_csv_question_of_two_paragraphs_keeps_its_line_break_and_unreadable_csv_is_refused(admin_client):
    """A spreadsheet's export: CRLF rows, and a quoted question holding a line break. A field the
    csv module refuses (past its size limit) is a sentence on the page, nothing added."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    from conversations.models import TestQuestion

    test_set = make_set(make_assistant(), [])

    def upload(body):
        return admin_client.post(f"/admin/conversations/testset/{test_set.pk}/change/", {
            "name": test_set.name, "assistant": test_set.assistant_id, "description": "",
            "csv_file": SimpleUploadedFile("questions.csv", body.encode(), content_type="text/csv"),
            "questions-TOTAL_FORMS": 0, "questions-INITIAL_FORMS": 0}, follow=True)

    added = upload('question,must_contain\r\n"I bought a lamp 40 days ago.\r\nCan I still return it?",refund\r\n'
                   f"{TIME},Tokyo\r\n")
    assert "2 questions added from the CSV file." in added.content.decode()
    assert list(TestQuestion.objects.order_by("position").values_list("question", "must_contain")) == [
        ("I bought a lamp 40 days ago.\nCan I still return it?", ["refund"]), (TIME, ["Tokyo"])]

    refused = upload(f'question\n{TIME}\n"{"x" * 200_000}"\n')
    assert refused.status_code == 200
    assert "Row 3: this is not CSV the importer can read (field larger than field limit (131072))." in \
        refused.content.decode()
    assert TestQuestion.objects.count() == 2
