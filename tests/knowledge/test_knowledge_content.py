"""What the index holds, found by content: a bulk ``update()``, ``loaddata`` and ``bulk_create``
change the site's rows without a signal; ``knowledge_status`` reports them (by a hash of what
each object gives the index) and ``rebuild_knowledge`` mends them; a source never built is a
system-check warning after ``migrate``. And what a visitor reads when the site has no answer,
in a real turn through a real worker."""

import json

import pytest
from django.core.checks import Warning
from django.core.management import call_command

from chatproject.models import Article
from conversations.checks import check_knowledge_built
from conversations.knowledge.search import search
from tests.knowledge.test_knowledge import article, ask, found_in
from tests.support.helpers import api_post, make_client, poll_until_done

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def only_search_site(conversations_settings):
    conversations_settings.update(TOOLS=["conversations.knowledge.tool.search_site"])
    Article.objects.all().delete()


def knowledge_status(capsys):
    """``(exit code, report)`` of ``manage.py knowledge_status``."""
    try:
        call_command("knowledge_status")
        code = 0
    except SystemExit as exit:
        code = exit.code
    return code, capsys.readouterr().out


def titles(query):
    return [hit.title for hit in search(query)]


def test_a_bulk_update_of_the_text_is_reported_and_the_rebuild_serves_the_new_text(capsys):
    kept = article("ferry", "Ferry timetable", "The ferry leaves at noon.")
    assert knowledge_status(capsys) == (0, "help (chatproject.Article): 1 published objects, 1 indexed in 1 passages, "
                                           f"last update {knowledge_status_time()}\nUp to date.\n")
    Article.objects.filter(pk=kept.pk).update(body="<p>The hovercraft leaves at dawn.</p>")
    code, report = knowledge_status(capsys)
    assert code == 1 and f"1 changed since indexed: {kept.pk}" in report and "rebuild_knowledge" in report
    assert titles("hovercraft") == []  # the old text is what the index holds
    call_command("rebuild_knowledge")
    assert titles("hovercraft") == ["Ferry timetable"] and titles("noon") == []
    assert knowledge_status(capsys)[0] == 0


def knowledge_status_time():
    from conversations.knowledge.models import IndexedObject

    return max(IndexedObject.objects.values_list("indexed_at", flat=True))


def test_loaddata_of_changed_and_new_rows_is_reported_and_rebuilt(capsys, tmp_path):
    kept = article("kiosk", "Kiosk hours", "The kiosk opens at eight.")
    fixture = tmp_path / "articles.json"
    fixture.write_text(json.dumps([
        {"model": "chatproject.article", "pk": kept.pk, "fields": {
            "slug": "kiosk", "title": "Kiosk hours", "body": "<p>The kiosk opens at seven.</p>", "published": True,
            "members_only": False, "updated_at": "2026-01-01T00:00:00Z"}},
        {"model": "chatproject.article", "pk": kept.pk + 100, "fields": {
            "slug": "lockers", "title": "Luggage lockers", "body": "<p>Lockers are by the west gate.</p>",
            "published": True, "members_only": False, "updated_at": "2026-01-01T00:00:00Z"}},
    ]))
    call_command("loaddata", str(fixture), verbosity=0)
    code, report = knowledge_status(capsys)
    assert code == 1
    assert f"1 changed since indexed: {kept.pk}" in report and f"1 not indexed: {kept.pk + 100}" in report
    call_command("rebuild_knowledge")
    assert titles("lockers") == ["Luggage lockers"] and titles("seven") == ["Kiosk hours"]
    assert knowledge_status(capsys)[0] == 0


def test_rows_made_by_bulk_create_are_a_check_warning_after_migrate_until_rebuilt(capsys):
    Article.objects.bulk_create([Article(slug="tram", title="Tram stops", body="<p>The tram stops hourly.</p>")])
    code, report = knowledge_status(capsys)
    assert code == 1 and "1 not indexed" in report
    assert titles("tram") == []
    assert check_knowledge_built(databases=["default"]) == [Warning(
        "Knowledge source 'help' has published objects but none is indexed: search_site finds nothing in it.",
        hint="Run manage.py rebuild_knowledge help (rows created by loaddata, a data migration or bulk_create are "
             "indexed only by it).", id="conversations.W054")]
    call_command("migrate", verbosity=1, stdout=open("/dev/null", "w"))
    assert "conversations.W054" in capsys.readouterr().err
    call_command("rebuild_knowledge")
    assert titles("tram") == ["Tram stops"]
    assert check_knowledge_built(databases=["default"]) == []
    assert knowledge_status(capsys)[0] == 0


def test_an_unrelated_question_gets_no_sources_and_the_could_not_find_sentence(worker):
    article("parking", "Bicycle parking at our shops", "Every shop has covered bicycle racks at the entrance, free "
            "for customers during opening hours.")
    article("refunds", "When will I get my refund?", "Refunds go back to the original payment method within ten "
            "working days.")
    state = ask(make_client(), worker, "When does the secret winter sale start?")
    assert state["status"] == "completed"
    assert found_in(state) == []
    assert state["messages"][-1]["content"] == "I could not find that on this site."
    assert "bicycle" not in json.dumps(state["messages"][-1]).lower()


def test_the_demo_searches_the_site_again_in_a_second_turn_of_the_conversation(worker):
    article("bike-repair", "Repairing a bicycle puncture", "Patch the inner tube with a repair kit.")
    article("export", "Exporting your data", "Under Account, Privacy, choose Export to receive a ZIP file.")
    client = make_client()
    conversation = api_post(client, "/api/conversations/").json()["id"]
    answers = []
    for question in ("How do I repair a bicycle puncture?", "How do I export my data?"):
        turn = api_post(client, f"/api/conversations/{conversation}/turns/", {"content": question}).json()
        worker()
        answers.append(poll_until_done(client, turn["poll_url"]))
    assert found_in(answers[0]) == ["Repairing a bicycle puncture"]
    assert answers[1]["status"] == "completed" and found_in(answers[1]) == ["Exporting your data"]
    assert "ZIP file" in answers[1]["messages"][-1]["content"]
