"""Searching the index for one visitor: full-text search ranked by relevance (SQLite FTS5,
PostgreSQL's text search, or a plain ``icontains`` elsewhere), then each hit kept only if its
object, as it is now in the site's own table, is one the visitor may open. The query is always a
parameter: no SQL is ever built from what a visitor typed."""

from dataclasses import asdict, dataclass
from functools import reduce
import logging
import math
import operator
import re
from typing import Optional

from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.db import connections, router
from django.db.models import BooleanField, Case, Count, Q, Value, When
from django.db.models.expressions import RawSQL

from . import embeddings
from .counts import COMMON, counted
from .models import Passage
from .registry import sources
from ..conf import get_config
from .text import fts5_query, pg_config, query_terms

logger = logging.getLogger("conversations.knowledge")

FTS_TABLE = "conversations_passage_fts"
# Ranked candidates read per round while filtering for the visitor, and at most this many in all:
# a visitor who may see little of what matches gets fewer hits, never an unbounded scan. Each
# round is ordered again by how well its passages matched (``Hit.match``).
BATCH = 100
MAX_CANDIDATES = 400
MAX_LIMIT = 10
# The title's weight against the text's (1) in the database's ranking, chosen by bench.knowledge_quality.
TITLE_WEIGHT = 4.0
# In the order of the hits (not in ``Hit.match``, the floor's measure), each term a passage's
# title holds counts this many times more: the article titled "Returning your Larkspur blender"
# before its three neighbours that name the blender as often. 0 (match alone), 1, 2 and 3 were
# measured on bench.knowledge_quality's tuning questions: 2 was best on SQLite (77.4 %, 79.1 %,
# 80.0 %, 80.0 % first), 1 and 2 equal on PostgreSQL (78.3 %, 82.6 %, 82.6 %).
TITLE_BONUS = 2.0
# A passage under the floor's test must also match the question on this many distinct things
# (``distinct``): a term counts as one when at least DISTINCT_SHARE of the passages holding it hold
# none of the question's rarer terms that passage holds. The three words of "Osprey vacuum
# cleaner" are then one thing (the passages holding "vacuum" or "cleaner" are nearly all the
# Osprey's), so "Does the Osprey vacuum cleaner work on Mars?" or "How heavy is the Curlew stand
# mixer?" no longer clear the floor on the product's name alone, while "How long is the Curlew
# stand mixer guaranteed?" matches its name and its guarantee. Measured on bench.knowledge_quality
# (docs/benchmarks.md, "distinct things").
DISTINCT = 2
DISTINCT_SHARE = 0.5


@dataclass
class Hit:
    """One passage found: where it comes from, its title, URL and text, how well it matched
    (``match``: the question's words the passage holds, each counted by its rarity among the
    passages, 1 for a word only one passage holds; comparable between searches) and the
    database's own rank (``score``, higher is better, comparable only within one search); with
    ``SEARCH_EMBEDDINGS``, ``meaning``: the cosine similarity of its text to the question's, and
    ``relevance``: the match and meaning together (``by_meaning``'s order). ``every``: whether it
    holds every word of the question; ``distinct``: how many distinct things of the question it
    holds (``distinct_things``). ``clears()`` reads them against the floor."""

    source: str
    object_pk: str
    title: str
    url: str
    text: str
    score: float
    match: float = 0.0
    meaning: Optional[float] = None
    relevance: Optional[float] = None
    every: bool = False
    distinct: int = 0

    def as_dict(self):
        return asdict(self)


def clears(hit, floor):
    """Whether ``search(..., floor=floor)`` (the search_site tool's, ``floor`` its
    ``SEARCH_FLOOR``) shows ``hit``, a hit of a search without a floor: every hit for a floor of 0;
    else one holding every word of the question, or whose measure reaches the floor: by the words,
    its match reaching ``floor`` on at least ``DISTINCT`` distinct things (``hit.distinct``); with
    meaning (``hit.relevance`` set), its match and meaning together reaching ``embeddings.floor()``.
    The one rule of both searches and of the admin's "Try a query"."""
    if floor <= 0 or hit.every:
        return True
    if hit.relevance is not None:
        return hit.relevance >= embeddings.floor()
    return _words_clear(hit.match, hit.distinct, floor)


def _words_clear(match, distinct, floor):
    """The floor's test by the words, for a passage not holding every word of the question: a
    ``match`` reaching ``floor`` (> 0) on at least ``DISTINCT`` ``distinct`` things."""
    return match >= floor and (floor <= 0 or distinct >= DISTINCT)


def _has_fts5(connection):
    with connection.cursor() as cursor:
        return FTS_TABLE in connection.introspection.table_names(cursor)


class Engine:
    """The full-text search of one database: ``ranked`` candidates, and for the relevance of
    each, ``frequency`` (passages holding a word) and ``holding`` (which of some passages hold
    it). This one is the plain ``icontains`` search of databases without full-text search."""

    def __init__(self, connection, names):
        self.connection, self.names = connection, names
        # Rarity is counted among all the site's passages, whichever sources a search may read.
        self.everything = Passage.objects.using(connection.alias)
        self.passages = self.everything.filter(source__in=names)

    def terms(self, terms):
        """Of ``terms`` (``query_terms``: a tuple of a word or phrase and its alternatives per
        thing asked), those worth searching for."""
        return terms

    def ranked(self, terms, offset, count):
        """``[(passage id, score)]`` of the passages holding any of ``terms``, best first."""
        matching = reduce(operator.or_, [self._holds(term) for term in terms])
        return [(pk, 0.0) for pk in self.passages.filter(matching).order_by("id").values_list("id", flat=True)[
            offset:offset + count]]

    @staticmethod
    def _holds(term):
        return reduce(operator.or_, [Q(title__icontains=each) | Q(text__icontains=each) for each in term])

    def _holding(self, term, passages):
        return passages.filter(self._holds(term))

    def frequency(self, term):
        """How many of all the site's passages hold ``term``."""
        return self._holding(term, self.everything).count()

    def holding(self, term, pks):
        """Which of the passages ``pks`` hold ``term``."""
        return set(self._holding(term, self.everything).filter(pk__in=pks).values_list("pk", flat=True))

    def frequencies(self, terms):
        """``{term: how many of all the site's passages hold it}``."""
        return {term: self.frequency(term) for term in terms}

    def holdings(self, terms, pks):
        """``{term: which of the passages pks hold it}``."""
        return {term: self.holding(term, pks) for term in terms}

    def postings(self, terms):
        """``{term: the ids of all the site's passages that hold it}``: for rare terms only (each
        a few passages), to tell which of them are one thing (``distinct_things``)."""
        return {term: set(self._holding(term, self.everything).values_list("pk", flat=True)) for term in terms}

    def titled(self, terms, pks):
        """``{term: which of the passages pks hold it in their title}``."""
        return {term: set(self.everything.filter(pk__in=pks).filter(
            reduce(operator.or_, [Q(title__icontains=each) for each in term])).values_list("pk", flat=True))
            for term in terms}


class Fts5(Engine):
    """SQLite's FTS5 table (migrations 0010 and 0013), ranked by ``bm25``."""

    def _query(self, sql, params):
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()

    def _sources(self):
        return "p.source IN (" + ", ".join(["%s"] * len(self.names)) + ")"

    def ranked(self, terms, offset, count):
        # bm25: lower is better.
        rows = self._query(
            f"SELECT p.id, bm25({FTS_TABLE}, {TITLE_WEIGHT}, 1.0) AS rank FROM {FTS_TABLE} JOIN "
            f"conversations_passage p ON p.id = {FTS_TABLE}.rowid WHERE {FTS_TABLE} MATCH %s AND {self._sources()} "
            "ORDER BY rank, p.id LIMIT %s OFFSET %s", [fts5_query(terms), *self.names, count, offset])
        return [(pk, -rank) for pk, rank in rows]

    def frequency(self, term):
        # The FTS5 table alone: joined to the passages' table (for their source), SQLite probed
        # the index once per passage, seconds among 10,000 articles instead of a millisecond.
        return self._query(f"SELECT count(*) FROM {FTS_TABLE} WHERE {FTS_TABLE} MATCH %s", [fts5_query([term])])[0][0]

    # Every passage holding the term, then those of pks among them: with "rowid IN (pks)" in the
    # statement FTS5 took 6 ms for a word 8,000 of 40,000 passages hold, its whole list 2 ms.
    def holding(self, term, pks, match=None):
        return self._rowids(match or fts5_query([term])).intersection(pks)

    def _rowids(self, match):
        """The ids of every passage the FTS5 expression ``match`` finds."""
        return {pk for pk, in self._query(f"SELECT rowid FROM {FTS_TABLE} WHERE {FTS_TABLE} MATCH %s", [match])}

    def titled(self, terms, pks):
        return {term: self.holding(term, pks, f"title : ({fts5_query([term])})") for term in terms}

    def postings(self, terms):
        return {term: self._rowids(fts5_query([term])) for term in terms}


class PostgresSearch(Engine):
    """PostgreSQL's text search on the stored document of migration 0010, ranked by ``ts_rank``."""

    def __init__(self, connection, names):
        super().__init__(connection, names)
        self.config = document_config(connection)

    def terms(self, terms):
        # The configuration's own stop words and stems: "exporting" and "export" are one term,
        # and a word it drops would otherwise count as a word no passage holds.
        every = sorted({each for term in terms for each in term})
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT word, plainto_tsquery(%s::regconfig, word)::text FROM unnest(%s::text[]) word",
                           [self.config, every])
            lexemes = dict(cursor.fetchall())
        kept, seen = [], set()
        for term in terms:
            alternatives = tuple(each for each in term if lexemes.get(each))
            if alternatives and lexemes[alternatives[0]] not in seen:
                seen.add(lexemes[alternatives[0]])
                kept.append(alternatives)
        return kept

    def query(self, term):
        """The ``SearchQuery`` of a passage holding any of ``term``'s alternatives."""
        from django.contrib.postgres.search import SearchQuery

        return reduce(operator.or_, [SearchQuery(each, search_type="plain", config=self.config) for each in term])

    def _document(self):
        from django.contrib.postgres.search import SearchVectorField

        # The generated column of migration 0010 (PostgreSQL only, so not a field of the model).
        return RawSQL(f'"{Passage._meta.db_table}"."search_document"', [], output_field=SearchVectorField())

    def _holding(self, term, passages):
        return passages.annotate(document=self._document()).filter(document=self.query(term))

    def ranked_queryset(self, terms):
        """``(id, rank)`` of the passages holding any of ``terms``, best first, found through the
        GIN index on the stored document."""
        from django.contrib.postgres.search import SearchRank

        wanted = reduce(operator.or_, [self.query(term) for term in terms])
        # Weights of D, C, B (the text) and A (the title): the title TITLE_WEIGHT times the text.
        rank = SearchRank(self._document(), wanted, weights=[0.1, 0.1, 1 / TITLE_WEIGHT, 1.0])
        return (self.passages.annotate(document=self._document(), rank=rank).filter(document=wanted)
                .order_by("-rank", "id").values_list("id", "rank"))

    def ranked(self, terms, offset, count):
        return list(self.ranked_queryset(terms)[offset:offset + count])

    # All the terms in one statement each (one scan of the GIN index for their union, each term
    # then tested on its rows): a statement per term cost a scan per term, p95 285 ms among
    # 10,000 articles.
    def frequencies(self, terms):
        queries = [self.query(term) for term in terms]
        counts = (self.everything.annotate(document=self._document()).filter(document=reduce(operator.or_, queries))
                  .aggregate(**{f"t{n}": Count("id", filter=Q(document=query)) for n, query in enumerate(queries)}))
        return {term: counts[f"t{n}"] for n, term in enumerate(terms)}

    def holdings(self, terms, pks, document=None):
        return self._flagged(self.everything.filter(pk__in=pks).annotate(document=document or self._document()),
                             terms)

    def postings(self, terms):
        # One statement: the passages holding any of the terms (through the GIN index), each term
        # then tested on its rows.
        if not terms:
            return {}
        wanted = reduce(operator.or_, [self.query(term) for term in terms])
        return self._flagged(self.everything.annotate(document=self._document()).filter(document=wanted).order_by(),
                             terms)

    def _flagged(self, passages, terms):
        """``{term: which of passages (annotated with their ``document``) hold it}``, in one statement."""
        if not terms:
            return {}
        flags = {f"t{n}": Case(When(document=self.query(term), then=Value(True)), default=Value(False),
                               output_field=BooleanField()) for n, term in enumerate(terms)}
        rows = passages.annotate(**flags).values_list("pk", *flags)
        return {term: {row[0] for row in rows if row[n + 1]} for n, term in enumerate(terms)}

    def titled(self, terms, pks):
        from django.contrib.postgres.search import SearchVector

        # The title alone, as the stored document's weight-A part was built (the same configuration).
        return self.holdings(terms, pks, SearchVector("title", config=self.config))


def engine(names):
    """The search ``Engine`` of the passages' database, for sources ``names``."""
    connection = connections[router.db_for_read(Passage)]
    if connection.vendor == "sqlite" and _has_fts5(connection):
        return Fts5(connection, names)
    if connection.vendor == "postgresql":
        return PostgresSearch(connection, names)
    return Engine(connection, names)


def rarities(engine, terms):
    """``{term: weight}``: how much finding each term in a passage says, by its rarity among the
    passages (inverse document frequency), in units of a term only one passage holds (1). A term
    most passages hold weighs next to nothing."""
    return _weighed(engine, terms)[0]


def _weighed(engine, terms):
    """``(rarities(engine, terms), {term: how many passages hold it})``."""
    total, counts = counted(engine.connection.alias, terms, engine.frequencies, engine.everything.count)
    unit = math.log((total + 1) / 1.5)
    return {term: max(0.0, math.log((total + 1) / (counts[term] + 0.5)) / unit) for term in terms}, counts


def distinct_things(weights, holdings, postings, pks):
    """``{passage id: how many distinct things of the question it holds}`` for ``pks``. The terms
    a passage holds are taken rarest first (``weights``); each is a thing of its own when at least
    ``DISTINCT_SHARE`` of the passages holding it (``postings``: all of them, for the rare terms)
    hold none of the rarer terms already taken, so that the words of a product's name, which the
    same few passages hold, are one thing; a term only one passage holds is always one, and so is
    a term without postings (``COMMON`` passages hold it or more): a word that common is no part
    of a name. ``holdings``: ``{term: which of pks hold it}``."""
    order = sorted(weights, key=lambda term: (-weights[term], len(postings.get(term, ())) or COMMON))
    found = {}
    for pk in pks:
        covered, things = set(), 0
        for term in order:
            if pk not in holdings[term]:
                continue
            holders = postings.get(term)
            if holders is None:
                things += 1
                continue
            # A term one passage holds says nothing of what it goes with: two things asked of a
            # general page ("combine" and "coupon") are two, not a name.
            things += len(holders) < 2 or len(holders - covered) >= DISTINCT_SHARE * len(holders)
            covered |= holders
        found[pk] = things
    return found


def _added(holdings, weights, pks):
    """``{passage id: the weights of the terms it holds, added}`` for ``pks``, from ``holdings``
    (``{term: which of pks hold it}``)."""
    held = dict.fromkeys(pks, 0.0)
    for term, holding in holdings.items():
        for pk in holding:
            held[pk] += weights[term]
    return held


def matches(engine, weights, pks, holdings=None):
    """``{passage id: how well it matched}`` for ``pks``: the weights of the terms it holds, added
    (``holdings``: ``engine.holdings(weights, pks)``, when already read)."""
    return _added(engine.holdings(list(weights), pks) if holdings is None else holdings, weights, pks)


def essential(weights, bar):
    """The terms a passage must hold one of to match at least ``bar``: all but the lightest,
    as many of them as weigh less than ``bar`` together (a passage holding only those is under
    it). Candidates are ranked by these alone: among 10,000 articles the common words a floor
    makes irrelevant were most of the database's ranking (thousands of passages hold "return")."""
    lightest, left = sorted(weights, key=weights.get), 0.0
    for number, term in enumerate(lightest):
        if left + weights[term] >= bar:
            return lightest[number:]
        left += weights[term]
    return lightest


def title_matches(engine, weights, pks):
    """``{passage id: the weights of the terms its title holds, added}`` for ``pks``."""
    return _added(engine.titled(list(weights), pks), weights, pks)


_CONFIGS = {}  # database alias -> the text search configuration of its stored document


def document_config(connection):
    """PostgreSQL: the text search configuration migration 0010 built the stored document with,
    read from the generated column's expression once per process and database; the site's
    ``LANGUAGE_CODE``'s only while the column cannot be read. A query must be stemmed as the
    document was: after a change of ``LANGUAGE_CODE``, the new language's stems matched nothing."""
    if connection.alias not in _CONFIGS:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d JOIN pg_attribute a ON "
                           "a.attrelid = d.adrelid AND a.attnum = d.adnum WHERE d.adrelid = to_regclass(%s) "
                           "AND a.attname = 'search_document'", [Passage._meta.db_table])
            row = cursor.fetchone()
        built = re.search(r"to_tsvector\('([^']+)'::regconfig", row[0]) if row else None
        if built is None:
            return pg_config(settings.LANGUAGE_CODE)
        _CONFIGS[connection.alias] = built.group(1)
    return _CONFIGS[connection.alias]


def allowed_pks(source, pks, user):
    """Which of ``pks`` (strings) of ``source``'s model ``user`` may open now, as strings."""
    model = source.model_class()
    if model is None:
        return set()
    queryset = source.visible_to(model._default_manager.filter(pk__in=list(pks)), user)
    return {str(pk) for pk in queryset.values_list("pk", flat=True)}


def search(query, *, user=None, names=None, limit=5, floor=0.0):
    """The passages best matching ``query`` that ``user`` (None: an anonymous visitor) may see,
    from the sources ``names`` (None or empty: every registered one), at most ``limit`` (≤ 10),
    one per object, none that matched less than ``floor`` (``Hit.match``) or on fewer than
    ``DISTINCT`` distinct things unless it holds every word of the question, the best matched
    first. Returns ``[Hit]``.

    With ``SEARCH_EMBEDDINGS``, the first ``embeddings.DEPTH`` of those found without a floor are
    ordered again by their match and their meaning together (``by_meaning``), and, with a floor,
    those under ``embeddings.floor()`` left out; when a candidate has no vector yet (no request is
    made then), or the endpoint fails, the search is the words' alone, with a warning logged."""
    limit = max(1, min(int(limit), MAX_LIMIT))
    terms = query_terms(query, settings.LANGUAGE_CODE, get_config()["SEARCH_SYNONYMS"])
    if embeddings.options() is not None and terms:
        found = by_meaning(query, _ranked(terms, user, names, embeddings.DEPTH, 0.0), floor)
        if found is not None:
            return found[:limit]
    return [hit for _pk, hit in _ranked(terms, user, names, limit, floor)]


def by_meaning(query, ranked, floor):
    """The hits of ``ranked`` (``_ranked``'s) ordered by their match + how close their meaning is
    to the question ``query``'s (``embeddings.MEANING`` × the text's cosine similarity +
    ``embeddings.TITLE_MEANING`` × the title's), without those under ``embeddings.floor()``
    (with ``floor`` > 0) unless they hold every word of the question; each hit's ``meaning`` set.
    None, without asking the endpoint for the question's vector, when a candidate has no vector of
    the model (indexed before the option was set, or while the endpoint was down): the order would
    be the words' anyway. None too when the endpoint fails."""
    if not ranked:
        return []
    model = embeddings.model_name()
    kept = dict(Passage.objects.filter(pk__in=[pk for pk, _hit in ranked]).values_list("pk", "embedding"))
    for pk, hit in ranked:
        vectors = kept.get(pk)
        if not vectors or vectors.get("model") != model:
            logger.warning("search_site by words alone: passage %s of %s:%s has no vector of %r yet "
                           "(rebuild_knowledge gives it one)", pk, hit.source, hit.object_pk, model)
            return None
    try:
        question = embeddings.embed([query])[0]
    except embeddings.EmbeddingsUnavailable as exc:
        logger.warning("search_site by words alone, the embeddings endpoint failed: %s", exc)
        return None
    scored = []
    for pk, hit in ranked:
        close = embeddings.closeness(question, kept[pk], model)
        if close is None:
            logger.warning("search_site by words alone: passage %s of %s:%s has vectors of another size than "
                           "the question's (rebuild_knowledge gives it new ones)", pk, hit.source, hit.object_pk)
            return None
        hit.meaning = close[0]
        hit.relevance = hit.match + embeddings.MEANING * close[0] + embeddings.TITLE_MEANING * close[1]
        scored.append(hit)
    return [hit for hit in sorted(scored, key=lambda each: -each.relevance) if clears(hit, floor)]


def _ranked(terms, user, names, limit, floor):
    """``search()`` by the words alone, for the question's ``terms`` (``query_terms``): ``[(passage
    id, Hit)]``."""
    registered = sources()
    chosen = [name for name in (names or registered) if name in registered]
    if not chosen or not terms:
        return []
    found = engine(chosen)
    terms = found.terms(terms)
    if not terms:
        return []
    user = AnonymousUser() if user is None else user
    weights, counts = _weighed(found, terms)
    # Only the terms some passage holds are asked for: with words no passage holds in its query,
    # PostgreSQL expected hundreds of rows and read the whole table (53 ms among 10,000 articles,
    # against 3 ms without them).
    postings = {**{term: set() for term in terms if not counts[term]},
                **found.postings([term for term in terms if 0 < counts[term] < COMMON])}
    # A passage holding every word of the question is never left out, however common they are.
    total = sum(weights.values()) * (1 - 1e-9)
    bar = min(floor, total)
    wanted_terms = essential(weights, bar)
    hits, seen, offset = [], set(), 0
    while len(hits) < limit and offset < MAX_CANDIDATES:
        batch = found.ranked(wanted_terms, offset, BATCH)
        offset, fetched = offset + BATCH, len(batch)
        if not batch:
            break
        pks = [pk for pk, _score in batch]
        # The rare terms' holders are known already: only the common ones are asked for.
        holdings = {**found.holdings([term for term in terms if term not in postings], pks),
                    **{term: holders.intersection(pks) for term, holders in postings.items()}}
        matched = matches(found, weights, pks, holdings)
        things = distinct_things(weights, holdings, postings, pks)
        titles = title_matches(found, weights, pks)
        batch = sorted(((pk, score) for pk, score in batch  # clears(), by the words
                        if matched[pk] >= total or _words_clear(matched[pk], things[pk], floor)),
                       key=lambda pair: (-(matched[pair[0]] + TITLE_BONUS * titles[pair[0]]), -pair[1]))
        if not batch:  # the database ranks the rest lower still: none of them is likely to reach the floor
            break
        rows = Passage.objects.defer("embedding").in_bulk([pk for pk, _score in batch])
        wanted = {}
        for pk, _score in batch:
            row = rows.get(pk)
            if row is not None:
                wanted.setdefault(row.source, set()).add(row.object_pk)
        allowed = {name: allowed_pks(registered[name], pks, user) for name, pks in wanted.items()}
        for pk, score in batch:
            row = rows.get(pk)
            if row is None or (row.source, row.object_pk) in seen or row.object_pk not in allowed[row.source]:
                continue
            seen.add((row.source, row.object_pk))
            hits.append((pk, Hit(row.source, row.object_pk, row.title, row.url, row.text, float(score), matched[pk],
                                 every=matched[pk] >= total, distinct=things[pk])))
            if len(hits) == limit:
                break
        if fetched < BATCH:
            break
    return hits
