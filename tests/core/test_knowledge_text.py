"""The knowledge index's text rules, with nothing running: HTML to text, passages, safe FTS5 queries."""

from conversations.knowledge.text import (MAX_QUERY_WORDS, content_words, excerpt, fts5_query, html_to_text, pg_config,
                                          query_terms, query_words, split_passages)


def test_html_becomes_text_with_paragraphs_and_without_scripts():
    markup = ("<h1>Title</h1><p>One &amp; two<br>three</p><script>alert('x')</script><style>p{}</style>"
              "<ul><li>first</li><li>second</li></ul>")
    assert html_to_text(markup) == "Title\n\nOne & two\n\nthree\n\nfirst\n\nsecond"


def test_passages_keep_to_their_size_on_paragraphs_then_sentences_then_spaces():
    paragraphs = ["Short paragraph."] * 3 + ["A sentence that goes on. " * 80] + ["x" * 2500]
    passages = split_passages("\n\n".join(paragraphs), size=300)
    assert passages[0].startswith("Short paragraph.\n\nShort paragraph.\n\nShort paragraph.\n\nA sentence that "
                                  "goes on. A sentence that goes on.")
    assert all(0 < len(p) <= 300 for p in passages)
    assert "".join(passages).replace(" ", "").replace("\n", "").count("x") == 2500  # nothing lost
    assert split_passages("") == []


def test_every_query_word_is_a_quoted_fts5_phrase_so_no_character_is_syntax():
    assert fts5_query(query_words('refund* NEAR("x" y) title:^secret')) == (
        '"refund" OR "near" OR "x" OR "y" OR "title" OR "secret"')
    assert fts5_query(query_words('"""***:::')) == ""
    assert fts5_query(query_words("Доставка в Москву")) == '"доставка" OR "в" OR "москву"'
    assert len(query_words(" ".join(f"w{n}" for n in range(500)))) == MAX_QUERY_WORDS


def test_a_question_is_searched_for_its_content_words_in_the_sites_language():
    assert content_words("Until when can I send back my Larkspur blender?", "en-us") == [
        "send", "back", "larkspur", "blender"]
    assert content_words("¿Cómo puedo devolver mi batidora?", "es") == ["devolver", "batidora"]
    assert content_words("Can I?", "en") == ["can", "i"]  # only common words: searched as they are
    assert content_words("When can I?", "xx") == ["when", "can", "i"]  # a language with no list


def test_a_visitors_words_and_phrases_are_searched_with_their_synonyms():
    assert query_terms("Until when can I send back my Larkspur blender?", "en") == [
        ("send back", "return"), ("larkspur",), ("blender",)]
    assert query_terms("How do I set up the telly?", "en", {"telly": ["television", "TV"]}) == [
        ("set up", "setup", "start"), ("telly", "television", "tv")]
    assert fts5_query(query_terms('send back "x*"', "en")) == '"send back" OR "return" OR "x"'


def test_the_site_language_chooses_the_postgresql_configuration():
    assert (pg_config("en-us"), pg_config("es"), pg_config("ja"), pg_config("")) == (
        "english", "spanish", "simple", "simple")


def test_an_excerpt_is_cut_on_a_space_and_says_so():
    assert excerpt("short", 10) == "short"
    assert excerpt("one two three four", 12) == "one two…"
