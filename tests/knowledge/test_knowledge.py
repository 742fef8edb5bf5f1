"""The site's knowledge end to end: the demo's help articles (``chatproject.Article``, registered
as the source "help" in ``chatproject.apps``) indexed when saved, searched by the built-in
``search_site`` tool in a real turn, and filtered for whoever owns the turn at the moment of the
search. Run on SQLite (FTS5) and PostgreSQL (text search, GIN index) alike."""

import json
import logging
import re
import threading
import time

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.contrib.sessions.models import Session
from django.db import InterfaceError, connection, transaction
from django.db.models.deletion import Collector
from django.http import HttpResponse
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import path

from chatproject.models import Article
from conversations import knowledge
from conversations.assistants import problems
from conversations.conf import get_config
from conversations.knowledge import index
from conversations.knowledge.index import status
from conversations.knowledge.models import Passage, StaleObject
from conversations.knowledge.search import engine, search
from conversations.models import Assistant, CallRecord
from tests.support.helpers import api_post, logged_in_client, make_client, poll_until_done, start_turn

pytestmark = pytest.mark.django_db(transaction=True)  # on_commit indexing, and the tool's own thread

SEARCH_SITE = "conversations.knowledge.tool.search_site"


@pytest.fixture(autouse=True)
def only_search_site(conversations_settings):
    """The demo model asks search_site straight away when it is the only tool; each test starts
    with no article (the demo's own, from its data migration, are there until a flush)."""
    conversations_settings.update(TOOLS=[SEARCH_SITE])
    Article.objects.all().delete()


def article(slug, title, text, **fields):
    return Article.objects.create(slug=slug, title=title, body=f"<p>{text}</p>", **fields)


def ask(client, worker, question):
    """Post ``question`` as ``client``, run the turn in a real worker; return the final state."""
    turn = start_turn(client, question)
    worker()
    return poll_until_done(client, turn["poll_url"])


def found_in(state):
    """The titles search_site returned in a turn's state."""
    results = [json.loads(m["content"]) for m in state["messages"] if m["role"] == "tool"
               and m["name"] == "search_site" and not m["is_error"]]
    return [hit["title"] for result in results for hit in result["results"]]


def test_a_published_article_is_found_in_the_next_turn_and_quoted_with_its_link(worker):
    article("bike-repair", "Repairing a bicycle puncture", "Patch the inner tube with a repair kit, then pump it up.")
    state = ask(make_client(), worker, "How do I repair a bicycle puncture?")
    assert state["status"] == "completed"
    answer = state["messages"][-1]["content"]
    assert "Repairing a bicycle puncture" in answer and "/help/bike-repair/" in answer
    assert "inner tube" in answer
    assert found_in(state)[0] == "Repairing a bicycle puncture"


def test_an_article_saved_inside_a_transaction_is_indexed_only_when_it_commits():
    with transaction.atomic():
        article("kayak", "Renting a kayak", "Kayaks are rented by the hour at the lake shore.")
        assert not Passage.objects.filter(title="Renting a kayak").exists()
    assert [hit.title for hit in search("kayak rental")] == ["Renting a kayak"]
    try:
        with transaction.atomic():
            article("canoe", "Renting a canoe", "Canoes are rented by the day.")
            raise RuntimeError("rolled back")
    except RuntimeError:
        pass
    assert search("canoe") == []


@pytest.mark.parametrize("change", ["unpublished", "unpublished in bulk", "deleted", "made members-only in bulk",
                                    "made members-only"])
def test_an_article_changed_after_the_turn_started_is_never_found_by_an_anonymous_visitor(worker, change):
    secret = article("sailing", "Sailing lessons", "Sailing lessons start every Saturday at the harbour.")
    client = make_client()
    assert found_in(ask(client, worker, "When do sailing lessons start?")) == ["Sailing lessons"]

    turn = start_turn(client, "When do sailing lessons start?")  # queued: it starts before the change lands
    if change == "unpublished":
        secret.published = False
        secret.save()
    elif change == "unpublished in bulk":  # no signal: the passages stay, the search reads the row
        Article.objects.filter(pk=secret.pk).update(published=False)
    elif change == "deleted":
        secret.delete()
    elif change == "made members-only in bulk":
        Article.objects.filter(pk=secret.pk).update(members_only=True)
    else:
        secret.members_only = True
        secret.save()
    worker()
    state = poll_until_done(client, turn["poll_url"])
    assert state["status"] == "completed"
    assert found_in(state) == []
    assert "Saturday" not in json.dumps(state)
    assert state["messages"][-1]["content"] == "I could not find that on this site."


def test_a_members_only_article_is_found_for_a_member_and_nobody_else(worker):
    article("member-lounge", "The members' lounge", "The lounge on the second floor is open to members.",
            members_only=True)
    member = logged_in_client("member")
    assert found_in(ask(member, worker, "Where is the members lounge?")) == ["The members' lounge"]
    assert found_in(ask(make_client(), worker, "Where is the members lounge?")) == []
    inactive = logged_in_client("gone")
    assert [h.title for h in search("members lounge", user=inactive.user)] == ["The members' lounge"]
    inactive.user.is_active = False
    inactive.user.save()
    assert search("members lounge", user=inactive.user) == []


def slow_rule(queryset, user):
    time.sleep(4)  # a site's permission rule that calls a slow service
    return queryset


@pytest.fixture
def extra_source():
    """Register more sources for one test; all are removed afterwards."""
    names = []

    def add(model, **options):
        source = knowledge.register(model, **options)
        names.append(source.name)
        return source

    yield add
    for name in names:
        knowledge.unregister(name)


def test_a_slow_search_is_cut_by_the_tool_timeout_and_the_turn_still_answers(worker, extra_source,
                                                                              conversations_settings):
    extra_source("chatproject.Article", name="slow-help", url="get_absolute_url", visible=slow_rule)
    article("ferry", "Ferry timetable", "The ferry leaves every hour.")
    conversations_settings.update(TOOL_TIMEOUT=1)
    started = time.monotonic()
    state = ask(make_client(), worker, "When does the ferry leave?")
    assert time.monotonic() - started < 9  # the 4-second rule was not waited for
    assert state["status"] == "completed"
    assert "timed out" in state["messages"][-1]["content"]
    record = CallRecord.objects.get(kind="tool", name="search_site")
    assert record.outcome == "timeout" and record.timeout == pytest.approx(1, abs=0.01)


HOSTILE = ['"', '""', "*", "NEAR(a b)", "a AND OR NOT", "title:secret", "^start", "-minus", "(((", "'; DROP TABLE "
           "conversations_passage; --", "\\", "%_%", "\x00", "🙂", "colour:* OR \"x", "x" * 100000,
           " ".join(["word"] * 5000)]


@pytest.mark.parametrize("query", HOSTILE, ids=range(len(HOSTILE)))
def test_a_query_of_any_shape_is_searched_safely(query):
    article("harbour", "Harbour parking", "Parking at the harbour costs two euros an hour.")
    assert isinstance(search(query), list)
    assert Passage.objects.filter(title="Harbour parking").exists()  # nothing was dropped


def test_other_alphabets_are_indexed_and_searched():
    article("moscow", "Доставка в Москву", "Доставка в Москву занимает три дня.")
    article("athens", "Παράδοση στην Αθήνα", "Η παράδοση στην Αθήνα διαρκεί δύο ημέρες.")
    assert [h.title for h in search("Москву")] == ["Доставка в Москву"]
    assert [h.title for h in search("Αθήνα")] == ["Παράδοση στην Αθήνα"]


def test_a_huge_body_is_split_into_passages_and_its_last_words_are_found():
    filler = " ".join(f"Sentence number {n} says nothing in particular." for n in range(40000))  # about 2 MB
    Article.objects.create(slug="huge", title="A huge article", body=f"<p>{filler}</p><p>The zeppelin lands "
                           "at noon.</p>")
    passages = Passage.objects.filter(title="A huge article")
    assert passages.count() > 1000 and max(len(p.text) for p in passages) <= 1000
    hits = search("zeppelin")
    assert [h.title for h in hits] == ["A huge article"] and "zeppelin lands at noon" in hits[0].text


def test_html_is_reduced_to_text_and_never_kept_as_markup():
    Article.objects.create(slug="html", title="<b>Bold</b> title", body=(
        "<h2>Opening &amp; closing</h2><p>The <em>market</em> opens at six.</p>"
        "<script>var secret = 'pineapple';</script><style>p { color: red }</style>"))
    passage = Passage.objects.get(object_pk=str(Article.objects.get(slug="html").pk))
    assert passage.text == "Opening & closing\n\nThe market opens at six."
    assert search("pineapple") == [] and [h.title for h in search("market")] == ["<b>Bold</b> title"]


def test_the_best_match_comes_first():
    article("tea", "Green tea", "Green tea is brewed at eighty degrees for two minutes.")
    article("coffee", "Coffee", "Coffee is brewed at ninety degrees. Some drink it with tea biscuits.")
    assert [h.title for h in search("how to brew green tea")][0] == "Green tea"


def test_a_words_rarity_is_counted_once_and_again_after_any_write_of_the_index():
    """The passages holding each word are counted once per generation of the index: the same
    question again counts nothing, and a save anywhere makes the next search count anew."""
    article("kayak", "Kayak rental", "Rent a kayak by the hour at the lake.")
    article("ferry", "Ferry timetable", "The ferry leaves at noon.")
    article("toaster", "Toaster crumbs", "Empty the crumb tray.")
    first = search("kayak by the lake")[0].match
    with CaptureQueriesContext(connection) as queries:
        assert search("kayak by the lake")[0].match == first
    assert not [each["sql"] for each in queries if "count(" in each["sql"].lower()]
    article("canoe", "Canoe trips", "A canoe on the lake is steadier than a kayak.")
    assert search("kayak by the lake")[0].match < first  # both words are held by two passages now
    Article.objects.filter(slug="canoe").update(body="<p>A canoe is steadier than a rowing boat.</p>")
    call_command("rebuild_knowledge")
    assert search("kayak by the lake")[0].match == pytest.approx(first)


def test_after_a_save_only_the_rarer_words_are_counted_again(monkeypatch):
    """A word many passages hold keeps its count through a save (it moves its weight next to
    nothing, and counting it was the slow part of the first search after a save); a rarer one is
    counted again at once."""
    from conversations.knowledge import counts

    monkeypatch.setattr(counts, "COMMON", 3)
    for number in range(3):
        article(f"lake-{number}", f"Lake walk {number}", "A walk round the lake.")
    article("kayak", "Kayak rental", "Rent a kayak at the lake.")
    search("kayak on the lake")
    article("canoe", "Canoe trips", "A canoe or a kayak on the lake.")
    with CaptureQueriesContext(connection) as queries:
        search("kayak on the lake")
    counted = dict(counts._kept[connection.alias][2])
    assert [count for term, count in counted.items() if term and term[0] == "lake"] == [4]  # kept from before
    assert [count for term, count in counted.items() if term and term[0] == "kayak"] == [2]  # counted again
    assert [each for each in queries if "count(" in each["sql"].lower()]


def test_a_search_with_a_floor_shows_what_the_same_search_without_one_shows_above_it():
    """With a floor, candidates are ranked by the question's rarer words alone (a passage holding
    only the common ones is under the floor): what a visitor is shown is unchanged by it."""
    for number in range(8):
        article(f"returns-{number}", f"Returning order {number}", "Return it within thirty days of delivery.")
    article("kettle-returns", "Returning the Heron kettle", "Return the Heron kettle within fourteen days.")
    article("kettle-care", "Heron kettle care", "Descale the Heron kettle monthly; return it to the stand dry.")
    article("toaster", "Toaster crumbs", "Empty the crumb tray after delivery.")
    question = "Can I return my Heron kettle after delivery?"
    everything = search(question, limit=10)
    for floor in (0.5, 1.0, 1.5, 2.0):
        above = [(hit.title, hit.match) for hit in everything if hit.match >= floor][:5]
        assert [(hit.title, hit.match) for hit in search(question, floor=floor)] == above
    assert [hit.title for hit in search(question, floor=1.5)][:2] == ["Returning the Heron kettle", "Heron kettle care"]


def test_the_pieces_of_contractions_are_no_words_of_the_question():
    """"What's", "don't": their "s", "t" and "don" matched the sizes of a T-shirt page."""
    article("tshirt", "T-shirt sizes", "Our T-shirts come in S, M and L.")
    assert search("What's the price, don't you know?") == []
    assert [h.title for h in search("What sizes do T-shirts come in?")] == ["T-shirt sizes"]


def test_the_article_whose_title_names_the_question_comes_before_a_neighbour_holding_one_more_word():
    """Four articles on one kettle: the question's subject ("clean") is the title of one of them,
    and the body of another, which also holds the question's "month". The title decides."""
    article("kettle-care", "Cleaning the Heron kettle", "Descale the Heron kettle with white vinegar.")
    article("kettle-warranty", "Heron kettle warranty", "The Heron kettle is guaranteed for two years. Send it in "
            "every month if it needs cleaning by our workshop.")
    article("kettle-setup", "Getting started", "Boil water twice before the first cup.")
    article("ferry", "Ferry timetable", "The ferry leaves at noon.")
    article("toaster", "Toaster crumbs", "Empty the crumb tray.")
    article("kettle-returns", "Returning a kettle", "Send it back within thirty days.")
    assert [h.title for h in search("How do I clean my Heron kettle each month?")][:2] == [
        "Cleaning the Heron kettle", "Heron kettle warranty"]


# Questions of the benchmark's held-out set (bench.knowledge_set.FRESH), never tuned on, over its
# 78 help articles with three neighbours each: one or two per subject.
HELD_OUT = [
    ("What's the return window on the Curlew stand mixer?", "curlew-returns"),
    ("Where do I print a return label for the Tern kettle?", "tern-returns"),
    ("How do I stop mould growing in the Puffin humidifier?", "puffin-care"),
    ("Is the Larkspur blender blade dishwasher safe?", "larkspur-care"),
    ("I dropped my Wren toaster and it cracked, will you repair it?", "wren-warranty"),
    ("Serial number location on the Puffin humidifier", "puffin-warranty"),
    ("How do I pair the Swift e-bike with the app?", "swift-setup"),
    ("Why does my new Wren toaster smell?", "wren-setup"),
    ("How many working days before the refund shows in my bank?", "refund-timing"),
    ("Can I get a file with my orders and addresses?", "export-data"),
]
UNRELATED = ["When does the secret winter sale start?", "Do you have job openings in Ghent?",
             "Is the Larkspur blender available in pink?", "Can I have my order gift-wrapped?"]


def test_paraphrased_questions_find_their_article_first_and_unrelated_ones_nothing_above_the_floor():
    from bench.knowledge_set import ARTICLES

    Article.objects.bulk_create([Article(slug=slug, title=title, body=f"<p>{body}</p>")
                                 for slug, title, body in ARTICLES])
    index.rebuild("help")
    slugs = dict(Article.objects.values_list("pk", "slug"))
    floor = get_config()["SEARCH_FLOOR"]
    first = {question: [slugs[int(hit.object_pk)] for hit in search(question, floor=floor)][:1]
             for question, _ in HELD_OUT}
    assert first == {question: [slug] for question, slug in HELD_OUT}
    for question in UNRELATED:
        assert search(question, floor=0.0), question  # a weak hit there is, on a word or a product's name
        assert search(question, floor=floor) == [], question


def test_the_words_of_a_name_that_the_same_passages_hold_are_one_thing_and_a_word_one_passage_holds_is_its_own():
    """distinct_things alone: "osprey" (passages 1-4) and "vacuum" (1-4 and 9) are one thing,
    "clean" (1, 5-8, 10-12: mostly elsewhere) another; "combine" and "coupon", each held by
    passage 20 alone, are two; a common word without postings is always one."""
    from conversations.knowledge.search import distinct_things

    weights = {"osprey": 0.7, "vacuum": 0.65, "clean": 0.4, "combine": 1.0, "coupon": 1.0, "order": 0.2}
    postings = {"osprey": {1, 2, 3, 4}, "vacuum": {1, 2, 3, 4, 9}, "clean": {1, 5, 6, 7, 8, 10, 11, 12},
                "combine": {20}, "coupon": {20}}
    holdings = {"osprey": {1, 2}, "vacuum": {1, 2, 9}, "clean": {1}, "combine": {20}, "coupon": {20},
                "order": {2, 20}}  # which of the passages 1, 2, 9 and 20 hold each term
    assert distinct_things(weights, holdings, postings, [1, 2, 9, 20]) == {1: 2, 2: 2, 9: 1, 20: 3}


def test_a_question_that_matches_only_a_products_name_is_under_the_floor_and_one_about_its_subject_is_not():
    """Over the benchmark's 78 articles (four per product): "Does the Osprey vacuum cleaner work on
    Mars?" matches its product's pages well above the floor, but only on the product's name (its
    three words, which the same passages hold, are one thing); a question naming the product and
    what is asked of it is answered, and so is a general one matching two rare words."""
    from bench.knowledge_set import ARTICLES

    Article.objects.bulk_create([Article(slug=slug, title=title, body=f"<p>{body}</p>")
                                 for slug, title, body in ARTICLES])
    index.rebuild("help")
    floor = get_config()["SEARCH_FLOOR"]
    unanswered = search("Does the Osprey vacuum cleaner work on Mars?")
    assert unanswered[0].match >= floor
    assert search("Does the Osprey vacuum cleaner work on Mars?", floor=floor) == []
    assert unanswered[0].distinct == 1
    assert [hit.title for hit in search("How long is the Curlew stand mixer guaranteed?", floor=floor)][:1] == [
        "Curlew stand mixer warranty and repairs"]
    assert [hit.title for hit in search("Do you take Apple Pay?", floor=floor)] == ["Payment methods"]
    assert [hit.title for hit in search("Osprey vacuum cleaner", floor=floor)][:1]  # every word: always shown


def test_a_registration_naming_a_missing_model_or_field_is_a_system_check_error(extra_source):
    extra_source("shop.Product", name="products", url="url")
    with pytest.raises(SystemCheckError, match=r"conversations\.E050.*shop\.Product"):
        call_command("check")
    Passage.objects.create(source="products", object_pk="7", title="Old product", url="/p/7/", text="old")
    call_command("rebuild_knowledge", "products")  # the model is gone: so are its passages
    assert not Passage.objects.filter(source="products").exists()
    knowledge.unregister("products")
    extra_source("chatproject.Article", name="articles", title="headline", url="get_absolute_url")
    with pytest.raises(SystemCheckError, match=r"conversations\.E051.*title='headline'"):
        call_command("check")
    knowledge.unregister("articles")
    extra_source("chatproject.Article", name="no-url")
    with pytest.raises(SystemCheckError, match=r"conversations\.E052"):
        call_command("check")


def failing_body(obj):
    raise ValueError("the body service is down")


def test_a_failure_to_index_never_fails_the_save_and_is_picked_up_by_the_rebuild(extra_source, caplog):
    source = extra_source("chatproject.Article", name="fragile", body=failing_body, url="get_absolute_url")
    with caplog.at_level(logging.ERROR, logger="conversations.knowledge"):
        saved = article("kite", "Flying a kite", "Kites fly best in a steady wind.")
    assert Article.objects.filter(pk=saved.pk).exists()
    assert "Could not index fragile:" in caplog.text
    assert StaleObject.objects.filter(source="fragile", object_pk=str(saved.pk)).exists()
    [row] = [r for r in status() if r["name"] == "fragile"]
    assert row["stale"] == [str(saved.pk)]
    source.body = "body"  # the service is back
    call_command("rebuild_knowledge", "fragile")
    assert not StaleObject.objects.exists()
    assert Passage.objects.filter(source="fragile", object_pk=str(saved.pk)).exists()


def test_deleting_rows_of_a_model_that_is_no_source_stays_one_query_and_a_sources_deletes_drop_passages(extra_source):
    """The index follows the sources' models only: clearsessions or a purge of call records
    deletes in one statement, not a row and a signal at a time."""
    for model in (Session, CallRecord):
        assert Collector(using="default").can_fast_delete(model.objects.all()), model
    Session.objects.bulk_create([Session(session_key=f"key{n:036d}", session_data="x", expire_date="2000-01-01T00:00Z")
                                 for n in range(50)])
    with CaptureQueriesContext(connection) as queries:
        Session.objects.all().delete()
    assert len([q for q in queries if "session" in q["sql"].lower()]) == 1

    article("map", "Harbour map", "The harbour map is at the gate.")
    Article.objects.filter(slug="map").delete()  # a bulk delete of a source's rows still drops its passages
    assert search("harbour map") == []
    extra_source("auth.User", name="people", title="username", body="username", url=lambda user: "/people/")
    assert not Collector(using="default").can_fast_delete(get_user_model().objects.all())
    get_user_model().objects.create_user("lighthousekeeper")
    assert [h.title for h in search("lighthousekeeper")] == ["lighthousekeeper"]
    get_user_model().objects.filter(username="lighthousekeeper").delete()
    assert search("lighthousekeeper") == []


AFTER_COMMIT = []


def edit_article(request, slug):
    """A site's own view: saves or deletes an article, then has work of its own after the commit."""
    with transaction.atomic():
        if request.method == "DELETE":
            Article.objects.get(slug=slug).delete()
        else:
            Article.objects.create(slug=slug, title="Opening hours", body="<p>Open from nine to five.</p>")
        transaction.on_commit(lambda: AFTER_COMMIT.append(slug))
    return HttpResponse("saved")


urlpatterns = [path("edit/<slug:slug>/", edit_article)]


def closed_connection(*args, **kwargs):
    raise InterfaceError("connection already closed")


@pytest.mark.urls(__name__)
@pytest.mark.parametrize("change", ["saved", "deleted"])
def test_a_closed_connection_while_indexing_never_fails_the_sites_request(change, monkeypatch, caplog):
    """InterfaceError is no DatabaseError: caught as one, it reached the site's request as a 500
    after its save had committed, and the site's own later on_commit work was skipped."""
    AFTER_COMMIT.clear()
    if change == "deleted":
        existing = article("hours", "Opening hours", "Open from nine to five.")
        monkeypatch.setattr(index, "remove_object", closed_connection)
    else:  # the index write and the mark for the rebuild both fail
        monkeypatch.setattr(index, "index_object", closed_connection)
        monkeypatch.setattr(StaleObject.objects, "update_or_create", closed_connection)
    client = Client(raise_request_exception=False)
    with caplog.at_level(logging.ERROR, logger="conversations.knowledge"):
        response = client.generic("DELETE" if change == "deleted" else "POST", "/edit/hours/")
    assert response.status_code == 200 and response.content == b"saved"
    assert AFTER_COMMIT == ["hours"]
    assert "InterfaceError" in caplog.text
    monkeypatch.undo()
    [row] = [r for r in status() if r["name"] == "help"]
    if change == "deleted":  # marked for the rebuild
        assert row["stale"] == [str(existing.pk)] and row["orphans"] == [str(existing.pk)]
    else:  # not even marked: the status still sees it was never indexed
        assert row["missing"] == [str(Article.objects.get(slug="hours").pk)]
    call_command("rebuild_knowledge")
    assert [h.title for h in search("opening hours")] == ([] if change == "deleted" else ["Opening hours"])


def test_two_refreshes_of_one_article_at_once_leave_one_copy_of_its_passages(monkeypatch):
    """PostgreSQL: two saves of one article committed at once are indexed in two threads; each
    deleted the passages it could see (none of the other's, not committed yet), then inserted."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite writes one transaction at a time")
    [saved] = Article.objects.bulk_create([Article(slug="tides", title="Tide tables", body="<p>High tide at six.</p>")])
    first_inserting, second_done = threading.Event(), threading.Event()
    insert = Passage.objects.bulk_create

    def slow_first_insert(rows, *args, **kwargs):
        if threading.current_thread().name == "first":
            first_inserting.set()
            second_done.wait(2)  # with the other refresh waiting for this one, it never comes
        return insert(rows, *args, **kwargs)

    monkeypatch.setattr(Passage.objects, "bulk_create", slow_first_insert)
    source = knowledge.sources()["help"]

    def refresh(name):
        def run():
            try:
                if name == "second":
                    first_inserting.wait(5)
                index.refresh(source, Article, saved.pk)
                second_done.set() if name == "second" else None
            finally:
                connection.close()
        return threading.Thread(target=run, name=name)

    threads = [refresh("first"), refresh("second")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    [row] = [r for r in status() if r["name"] == "help"]
    assert row["passages"] == 1 and not StaleObject.objects.exists()


def test_status_reports_what_bulk_updates_left_out_of_date_and_the_rebuild_mends_it(capsys):
    kept = article("ski", "Ski hire", "Skis are hired by the day.")
    Article.objects.bulk_create([Article(slug="snow", title="Snow chains", body="<p>Chains are required.</p>")])
    Article.objects.filter(pk=kept.pk).update(published=False)
    Passage.objects.create(source="old-source", object_pk="1", title="Gone", url="/gone/", text="gone")
    with pytest.raises(SystemExit):
        call_command("knowledge_status")
    report = capsys.readouterr().out
    assert "1 not indexed" in report and "1 indexed but deleted or unpublished" in report
    assert "old-source: not registered any more, 1 passages to drop" in report
    call_command("rebuild_knowledge")
    assert set(Passage.objects.values_list("title", flat=True)) == {"Snow chains"}
    call_command("knowledge_status")
    assert "Up to date." in capsys.readouterr().out


def test_each_assistant_searches_only_its_own_sources(worker, extra_source):
    extra_source("auth.User", name="people", title="username", body="username", url=lambda user: "/people/")
    get_user_model().objects.create_user("harbourmaster")
    article("harbour-office", "The harbour office", "The harbourmaster works at the harbour office.")
    helper = Assistant.objects.create(slug="help", name="Help", system_prompt="Help.", tools=["search_site"],
                                      knowledge_sources=["help"])
    client = make_client()
    conversation = api_post(client, "/api/conversations/", {"assistant": "help"}).json()
    response = api_post(client, f"/api/conversations/{conversation['id']}/turns/",
                        {"content": "Who is the harbourmaster?"})
    worker()
    state = poll_until_done(client, response.json()["poll_url"])
    assert found_in(state) == ["The harbour office"]
    assert {h.source for h in search("harbourmaster")} == {"help", "people"}
    helper.knowledge_sources = ["nowhere"]
    assert ("knowledge_sources", "its knowledge sources “nowhere” are not registered.") in problems(helper)


def test_the_admin_lists_the_sources_and_tries_a_query_as_a_kind_of_visitor(admin_client):
    article("piano", "Piano lessons", "Piano lessons are on Tuesdays.")
    article("organ", "Organ lessons", "Organ lessons are for members, on Thursdays.", members_only=True)
    get_user_model().objects.create_user("member")
    page = admin_client.get("/admin/conversations/passage/").content.decode()
    assert "chatproject.Article" in page and "up to date" in page
    anonymous = admin_client.get("/admin/conversations/passage/", {"query": "lessons", "visitor": ""})
    assert "Piano lessons" in anonymous.content.decode() and "Organ lessons" not in anonymous.content.decode()
    member = admin_client.get("/admin/conversations/passage/", {"query": "lessons", "visitor": "member"})
    assert "Piano lessons" in member.content.decode() and "Organ lessons" in member.content.decode()
    nobody = admin_client.get("/admin/conversations/passage/", {"query": "lessons", "visitor": "nobody"})
    assert "No user has that username." in nobody.content.decode()


def test_the_search_index_is_the_databases_own():
    """The FTS5 table on SQLite, the GIN index on PostgreSQL: the query plan uses it."""
    article("violin", "Violin lessons", "Violin lessons are on Mondays.")
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            assert "conversations_passage_fts" in connection.introspection.table_names(cursor)
        else:
            cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'conv_passage_search'")
            assert "gin" in cursor.fetchone()[0]
            # The search's expression is the index's: with sequential scans off, the plan uses it.
            cursor.execute("SET enable_seqscan = off")
            try:
                # How many passages hold a word: counted for every word of every search.
                found = engine(["help"])
                sql, params = found._holding(("violin",), found.everything).query.sql_with_params()
                cursor.execute(f"EXPLAIN {sql}", params)
                assert "conv_passage_search" in " ".join(row[0] for row in cursor.fetchall())
            finally:
                cursor.execute("SET enable_seqscan = on")
    assert [h.title for h in search("violin")] == ["Violin lessons"]


def test_a_site_that_changes_its_language_after_migrating_still_finds_its_articles(settings):
    """PostgreSQL: the stored document was stemmed in the language of the migration ("kayak",
    "hour"); a query stemmed in the new LANGUAGE_CODE's language ("kayaks", "hours") matched none."""
    if connection.vendor != "postgresql":
        pytest.skip("the stored document and its language are PostgreSQL's")
    article("kayak", "Renting a kayak", "Kayaks are rented by the hour at the lake shore.")
    settings.LANGUAGE_CODE = "es"
    assert [h.title for h in search("kayaks by the hours")] == ["Renting a kayak"]


def test_the_admin_turn_page_shows_each_query_and_what_it_returned(worker, admin_client):
    article("lighthouse", "Visiting the lighthouse", "The lighthouse is open on Sundays.")
    state = ask(make_client(), worker, "When can I visit the lighthouse?")
    page = admin_client.get(f"/admin/conversations/turn/{state['id']}/change/").content.decode()
    assert "When can I visit the lighthouse?" in page  # the query the model sent
    assert "Visiting the lighthouse" in page and "/help/lighthouse/" in page  # what came back


def test_the_sources_page_is_for_staff_who_may_view_passages(client):
    staff = get_user_model().objects.create_user("editor", password="pw-123456789", is_staff=True)
    client.force_login(staff)
    assert client.get("/admin/conversations/passage/", {"query": "lessons"}).status_code == 403


def test_the_try_a_query_box_links_only_pages_of_this_site(admin_client, extra_source):
    """As the widget does: ``/\\host/`` is another site to a browser, never a link here."""
    extra_source("auth.User", name="people", title="username", body="username", url=lambda user: user.first_name)
    urls = {"backslash": "/\\evil.example/login", "tab": "/\t/evil.example/", "scheme": "javascript:alert(1)",
            "elsewhere": "https://evil.example/help/", "relative": "/help/pilots/",
            "absolute": "http://testserver/help/crew/"}
    for name, url in urls.items():
        get_user_model().objects.create_user(f"pilot {name}", first_name=url)

    page = admin_client.get("/admin/conversations/passage/", {"query": "pilot", "visitor": ""}).content.decode()

    links = re.findall(r'<a href="([^"]*)" rel="noopener noreferrer">pilot (\w+)</a>', page)
    assert sorted(links) == [("http://testserver/help/crew/", "absolute"),
                             ("http://testserver/help/pilots/", "relative")]
    assert all(f"pilot {name}" in page for name in urls)
