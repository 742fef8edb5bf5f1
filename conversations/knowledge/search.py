"""Searching the index for one visitor: full-text search ranked by relevance (SQLite FTS5,
PostgreSQL's text search, or a plain ``icontains`` elsewhere), then each hit kept only if its
object, as it is now in the site's own table, is one the visitor may open. The query is always a
parameter: no SQL is ever built from what a visitor typed."""

from dataclasses import asdict, dataclass
from functools import reduce
import operator
import re

from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.db import connections, router
from django.db.models import Q
from django.db.models.expressions import RawSQL

from .models import Passage
from .registry import sources
from .text import fts5_query, pg_config, query_words

FTS_TABLE = "conversations_passage_fts"
# Ranked candidates read per round while filtering for the visitor, and at most this many in all:
# a visitor who may see little of what matches gets fewer hits, never an unbounded scan.
BATCH = 50
MAX_CANDIDATES = 400
MAX_LIMIT = 10


@dataclass
class Hit:
    """One passage found: where it comes from, its title, URL and text, and its relevance (higher
    is better; comparable only within one search)."""

    source: str
    object_pk: str
    title: str
    url: str
    text: str
    score: float

    def as_dict(self):
        return asdict(self)


def _has_fts5(connection):
    with connection.cursor() as cursor:
        return FTS_TABLE in connection.introspection.table_names(cursor)


def ranked(query, names, offset, count):
    """``[(passage id, score)]`` of the passages of sources ``names`` matching ``query``, best first."""
    using = router.db_for_read(Passage)
    connection = connections[using]
    if connection.vendor == "sqlite" and _has_fts5(connection):
        match = fts5_query(query)
        marks = ", ".join(["%s"] * len(names))
        # bm25: lower is better; the title weighs four times the text.
        sql = (f"SELECT p.id, bm25({FTS_TABLE}, 4.0, 1.0) AS rank FROM {FTS_TABLE} JOIN conversations_passage p "
               f"ON p.id = {FTS_TABLE}.rowid WHERE {FTS_TABLE} MATCH %s AND p.source IN ({marks}) "
               "ORDER BY rank, p.id LIMIT %s OFFSET %s")
        with connection.cursor() as cursor:
            cursor.execute(sql, [match, *names, count, offset])
            return [(pk, -rank) for pk, rank in cursor.fetchall()]
    words = query_words(query)
    passages = Passage.objects.using(using).filter(source__in=names)
    if connection.vendor == "postgresql":
        return list(ranked_queryset(query, passages)[offset:offset + count])
    matching = reduce(operator.or_, [Q(title__icontains=word) | Q(text__icontains=word) for word in words])
    return [(pk, 0.0) for pk in passages.filter(matching).order_by("id").values_list("id", flat=True)[
        offset:offset + count]]


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


def ranked_queryset(query, passages=None):
    """PostgreSQL: ``(id, rank)`` of the passages matching any word of ``query``, best first."""
    # Optional dependency: django.contrib.postgres imports psycopg, which only PostgreSQL sites have.
    from django.contrib.postgres.search import SearchQuery, SearchRank, SearchVectorField

    passages = Passage.objects.all() if passages is None else passages
    config = document_config(connections[passages.db])
    # The generated column of migration 0010 (PostgreSQL only, so not a field of the model),
    # indexed with GIN; each word is a separate plain query, OR-ed.
    document = RawSQL(f'"{Passage._meta.db_table}"."search_document"', [], output_field=SearchVectorField())
    wanted = reduce(operator.or_, [SearchQuery(word, search_type="plain", config=config)
                                   for word in query_words(query)])
    return (passages.annotate(document=document, rank=SearchRank(document, wanted)).filter(document=wanted)
            .order_by("-rank", "id").values_list("id", "rank"))


def allowed_pks(source, pks, user):
    """Which of ``pks`` (strings) of ``source``'s model ``user`` may open now, as strings."""
    model = source.model_class()
    if model is None:
        return set()
    queryset = source.visible_to(model._default_manager.filter(pk__in=list(pks)), user)
    return {str(pk) for pk in queryset.values_list("pk", flat=True)}


def search(query, *, user=None, names=None, limit=5):
    """The passages best matching ``query`` that ``user`` (None: an anonymous visitor) may see,
    from the sources ``names`` (None or empty: every registered one), at most ``limit`` (≤ 10),
    best first, one per object. Returns ``[Hit]``."""
    registered = sources()
    chosen = [name for name in (names or registered) if name in registered]
    limit = max(1, min(int(limit), MAX_LIMIT))
    if not chosen or not query_words(query):
        return []
    user = AnonymousUser() if user is None else user
    hits, seen, offset = [], set(), 0
    while len(hits) < limit and offset < MAX_CANDIDATES:
        batch = ranked(query, chosen, offset, BATCH)
        offset += BATCH
        if not batch:
            break
        rows = Passage.objects.in_bulk([pk for pk, _score in batch])
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
            hits.append(Hit(row.source, row.object_pk, row.title, row.url, row.text, float(score)))
            if len(hits) == limit:
                break
        if len(batch) < BATCH:
            break
    return hits
