"""The embeddings option (``SEARCH_EMBEDDINGS``): the passages' vectors stored when they are
indexed, the full-text hits ordered again and floored by meaning, and a search that falls back to
the words alone, with a warning, when the endpoint or a vector is missing. Against a fake
OpenAI-compatible ``/v1/embeddings`` server on 127.0.0.1 whose vectors follow a small table of
concepts (``tests.support.fakes.embeddings_from``). Off, nothing is ever sent."""

import json
import logging

import pytest
from django.core.checks import Error
from django.core.management import call_command

from chatproject.models import Article
from conversations.checks import check_knowledge
from conversations.conf import get_config
from conversations.knowledge.models import Passage, StaleObject
from conversations.knowledge.search import search
from conversations.knowledge.tool import search_site
from tests.support.fakes import FakeProvider, Reply, embeddings_from, refused_url

pytestmark = pytest.mark.django_db(transaction=True)  # on_commit indexing

# Hiring and renting mean the same; kayaks and canoes are boats; clubs, members and Sundays are
# club life; sofas and sales are furniture shopping.
CONCEPTS = {"hire": 0, "hired": 0, "rent": 0, "rented": 0, "renting": 0, "rental": 0,
            "canoe": 1, "canoes": 1, "kayak": 1, "kayaks": 1,
            "club": 2, "members": 2, "sundays": 2, "meets": 2,
            "sofa": 3, "sofas": 3, "sales": 3}
MODEL = "fake-minilm"


@pytest.fixture(autouse=True)
def no_articles():
    """Each test starts with no article (the demo's own, from its data migration, are there until a
    flush), as in test_knowledge."""
    Article.objects.all().delete()


@pytest.fixture
def endpoint(conversations_settings):
    with FakeProvider(default=embeddings_from(CONCEPTS)) as fake:
        yield fake


def meaning_on(conversations_settings, url, **more):
    conversations_settings.update(SEARCH_EMBEDDINGS={"BASE_URL": url, "MODEL": MODEL, **more})


def article(slug, title, text):
    return Article.objects.create(slug=slug, title=title, body=f"<p>{text}</p>")


def articles():
    """The canoe club's page holds "canoe" twice (its title too); the rental page once, but it is
    about hiring one."""
    article("canoe-club", "The canoe club", "The canoe club meets on Sundays; members bring their own.")
    article("kayak-rental", "Renting a kayak", "Kayaks are rented by the hour at the lake shore, a canoe too.")
    article("opening-hours", "Opening hours of the shop", "The shop opens at nine on weekdays.")


def titles(hits):
    return [hit.title for hit in hits]


def test_each_passage_keeps_its_vectors_from_the_endpoint_with_the_key_bound_to_it(conversations_settings, endpoint):
    meaning_on(conversations_settings, endpoint.url, API_KEY="sk-embed")
    article("kayak-rental", "Renting a kayak", "Kayaks are rented by the hour.")
    passage = Passage.objects.get(title="Renting a kayak")
    assert passage.embedding["model"] == MODEL
    assert len(passage.embedding["text"]) == len(passage.embedding["title"]) == 8
    sent = endpoint.requests[-1]
    assert sent["path"] == "/v1/embeddings"
    assert sent["headers"]["Authorization"] == "Bearer sk-embed"
    assert sent["json"] == {"model": MODEL, "input": ["Renting a kayak. Kayaks are rented by the hour.", "Renting a kayak"]}


def test_the_hits_are_ordered_again_by_meaning(conversations_settings, endpoint):
    articles()
    question = "Where can I hire a canoe?"
    assert titles(search(question))[:2] == ["The canoe club", "Renting a kayak"]  # the words alone
    meaning_on(conversations_settings, endpoint.url)
    call_command("rebuild_knowledge")
    rental, club = search(question)[:2]
    assert [rental.title, club.title] == ["Renting a kayak", "The canoe club"]
    assert rental.meaning > 0.9 > 0.6 > club.meaning  # hiring and a boat / a boat and club life


def test_a_hit_whose_meaning_is_far_from_the_question_is_under_the_floor(conversations_settings, endpoint):
    articles()
    question = "Which weekdays does the shop hold sofa sales?"
    floor = get_config()["SEARCH_FLOOR"]
    assert titles(search(question, floor=floor)) == ["Opening hours of the shop"]  # two rare words in common
    meaning_on(conversations_settings, endpoint.url)
    call_command("rebuild_knowledge")
    assert search(question, floor=floor) == []
    assert titles(search(question, floor=0)) == ["Opening hours of the shop"]  # without a floor, still there
    result = json.loads(search_site(None, question))
    assert result["results"] == [] and "could not find it on this site" in result["note"]


def test_the_search_falls_back_to_the_words_when_the_endpoint_is_down(conversations_settings, endpoint, caplog):
    articles()
    meaning_on(conversations_settings, endpoint.url)
    call_command("rebuild_knowledge")
    meaning_on(conversations_settings, refused_url())
    with caplog.at_level(logging.WARNING, logger="conversations.knowledge"):
        hits = search("Where can I hire a canoe?")
    assert titles(hits)[:2] == ["The canoe club", "Renting a kayak"]
    assert "by words alone, the embeddings endpoint failed" in caplog.text and "connection refused" in caplog.text


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_is_not_followed_the_question_and_key_stay_with_the_endpoint(conversations_settings, endpoint,
                                                                                 caplog, status):
    articles()
    meaning_on(conversations_settings, endpoint.url)
    call_command("rebuild_knowledge")
    with FakeProvider() as elsewhere, FakeProvider() as redirecting:
        redirecting.add(Reply(status, b"", {"Location": f"{elsewhere.url}/embeddings"}))
        meaning_on(conversations_settings, redirecting.url, API_KEY="sk-embed-redirect")
        with caplog.at_level(logging.WARNING, logger="conversations.knowledge"):
            hits = search("Where can I hire a canoe?")
        assert elsewhere.requests == [] and len(redirecting.requests) == 1
    assert titles(hits)[:2] == ["The canoe club", "Renting a kayak"]  # the words alone
    assert f"answered HTTP {status}" in caplog.text and "sk-embed-redirect" not in caplog.text


def test_an_article_saved_while_the_endpoint_is_down_is_searchable_by_its_words_and_marked_for_the_rebuild(
        conversations_settings, endpoint, caplog):
    meaning_on(conversations_settings, refused_url())
    with caplog.at_level(logging.WARNING, logger="conversations.knowledge"):
        article("kayak-rental", "Renting a kayak", "Kayaks are rented by the hour.")
    assert Passage.objects.get(title="Renting a kayak").embedding is None
    assert "indexed without vectors" in caplog.text
    assert StaleObject.objects.get().reason.startswith("embeddings: ")
    assert titles(search("kayak rented")) == ["Renting a kayak"]  # the endpoint down: the words alone
    meaning_on(conversations_settings, endpoint.url)
    with caplog.at_level(logging.WARNING, logger="conversations.knowledge"):
        assert titles(search("kayak rented")) == ["Renting a kayak"]  # up, but no vector yet: the words alone
    assert "has no vector of 'fake-minilm' yet" in caplog.text
    call_command("rebuild_knowledge")
    assert Passage.objects.get(title="Renting a kayak").embedding["model"] == MODEL
    assert not StaleObject.objects.exists()
    assert search("kayak rented")[0].meaning is not None


def test_a_search_with_a_candidate_without_a_vector_asks_the_endpoint_nothing(conversations_settings, endpoint,
                                                                              caplog):
    """Its order would be the words' anyway: the question's vector was asked for, then thrown away."""
    meaning_on(conversations_settings, refused_url())
    with caplog.at_level(logging.WARNING, logger="conversations.knowledge"):
        article("kayak-rental", "Renting a kayak", "Kayaks are rented by the hour.")
    meaning_on(conversations_settings, endpoint.url)
    with caplog.at_level(logging.WARNING, logger="conversations.knowledge"):
        assert titles(search("kayak rented")) == ["Renting a kayak"]
    assert endpoint.requests == []
    assert "has no vector of 'fake-minilm' yet" in caplog.text
    call_command("rebuild_knowledge")  # one request: the article's vectors
    assert search("kayak rented")[0].meaning is not None
    assert [sent["json"]["input"] for sent in endpoint.requests[1:]] == [["kayak rented"]]


def test_a_key_is_never_sent_to_an_endpoint_it_is_not_bound_to(conversations_settings, endpoint, caplog):
    articles()
    conversations_settings.update(CREDENTIALS={"gateway": {"KEY": "sk-gw", "ORIGINS": ["https://gw.example.com"]}})
    meaning_on(conversations_settings, endpoint.url, CREDENTIAL="gateway")
    with caplog.at_level(logging.WARNING, logger="conversations.knowledge"):
        call_command("rebuild_knowledge")  # refused before the request: no vectors
        hits = search("Where can I hire a canoe?")
    assert endpoint.requests == []
    assert titles(hits)[:2] == ["The canoe club", "Renting a kayak"]
    assert "not to 'http://127.0.0.1" in caplog.text or "not to http://127.0.0.1" in caplog.text


def test_nothing_is_ever_sent_when_the_option_is_off(endpoint):
    articles()
    Article.objects.filter(slug="canoe-club").update(title="The canoe club and its boats")
    call_command("rebuild_knowledge")
    assert titles(search("Where can I hire a canoe?"))
    assert endpoint.requests == []
    assert Passage.objects.filter(embedding__isnull=False).count() == 0


def test_a_setting_that_could_never_be_used_is_a_system_check_error(conversations_settings):
    assert check_knowledge() == []
    conversations_settings.update(SEARCH_EMBEDDINGS={"BASE_URL": "127.0.0.1:8011", "MODLE": "x", "TIMEOUT": "5",
                                                     "CREDENTIAL": "gateway"})
    found = {error.id: error for error in check_knowledge()}
    assert set(found) == {"conversations.E065", "conversations.E066", "conversations.E067"}
    assert all(isinstance(error, Error) and error.hint for error in found.values())
    assert "has unknown keys MODLE; needs numbers for TIMEOUT" in found["conversations.E066"].msg
    assert "'gateway', which is not in CREDENTIALS" in found["conversations.E067"].msg


@pytest.mark.parametrize("timeout, said", [(0, "needs a number above 0 for TIMEOUT"),
                                            (-1, "needs a number above 0 for TIMEOUT"),
                                            (True, "needs numbers for TIMEOUT")])
def test_a_timeout_requests_cannot_use_is_a_system_check_error(conversations_settings, timeout, said):
    """requests refuses a timeout of 0 or less with a ValueError, which would have failed the
    search instead of falling back to the words; a bool is not a number of seconds."""
    conversations_settings.update(SEARCH_EMBEDDINGS={"BASE_URL": "http://127.0.0.1:8011/v1", "TIMEOUT": timeout})
    found = {error.id: error for error in check_knowledge()}
    assert set(found) == {"conversations.E066"}
    assert said in found["conversations.E066"].msg


def test_status_reports_the_articles_indexed_before_the_option_and_the_rebuild_gives_them_vectors(
        conversations_settings, endpoint, capsys):
    articles()
    call_command("knowledge_status")
    assert "Up to date." in capsys.readouterr().out
    meaning_on(conversations_settings, endpoint.url)
    with pytest.raises(SystemExit):
        call_command("knowledge_status")
    assert "3 without vectors of SEARCH_EMBEDDINGS' model" in capsys.readouterr().out
    call_command("rebuild_knowledge")
    call_command("knowledge_status")
    assert "Up to date." in capsys.readouterr().out


def test_the_passage_page_shows_its_text_not_its_vectors(conversations_settings, endpoint, admin_client):
    """A passage's vectors (about 8 KB of numbers each) are for the search, not for staff: its
    admin page and the source's list of passages neither show nor load them."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    meaning_on(conversations_settings, endpoint.url)
    article("kayak-rental", "Renting a kayak", "Kayaks are rented by the hour.")
    passage = Passage.objects.get(title="Renting a kayak")
    page = admin_client.get(f"/admin/conversations/passage/{passage.pk}/change/").content.decode()
    assert "Kayaks are rented by the hour." in page
    assert "embedding" not in page.lower() and '"model": "fake-minilm"' not in page
    with CaptureQueriesContext(connection) as queries:
        listed = admin_client.get("/admin/conversations/passage/", {"source": "help"})
    assert listed.status_code == 200 and "Renting a kayak" in listed.content.decode()
    column = Passage._meta.get_field("embedding").column
    assert not [q["sql"] for q in queries.captured_queries if column in q["sql"] and "SELECT" in q["sql"]]


def test_the_admins_try_a_query_marks_under_the_floor_what_search_site_leaves_out(conversations_settings, endpoint,
                                                                                 admin_client):
    """One rule for both: with meaning, the floor is on the words and meaning together, not on the
    words' SEARCH_FLOOR (which this hit reaches: two rare words in common)."""
    articles()
    question = "Which weekdays does the shop hold sofa sales?"
    under = "under the relevance floor: search_site leaves it out"

    def tried():
        page = admin_client.get("/admin/conversations/passage/", {"query": question, "visitor": ""}).content.decode()
        assert "Opening hours of the shop" in page
        return page

    shown_by_words = titles(search(question, floor=get_config()["SEARCH_FLOOR"]))
    assert shown_by_words == ["Opening hours of the shop"] and under not in tried()
    meaning_on(conversations_settings, endpoint.url)
    call_command("rebuild_knowledge")
    assert json.loads(search_site(None, question))["results"] == []
    assert under in tried()


def test_the_sources_page_counts_the_objects_missing_only_their_vectors(conversations_settings, endpoint,
                                                                        admin_client):
    articles()
    meaning_on(conversations_settings, endpoint.url)
    page = admin_client.get("/admin/conversations/passage/").content.decode()
    assert "0 not indexed, 0 changed, 0 to drop, 0 failed, 3 without vectors: run manage.py rebuild_knowledge" in page
    call_command("rebuild_knowledge")
    assert "up to date" in admin_client.get("/admin/conversations/passage/").content.decode()
