"""The site's knowledge: does the search put the right article first, and say nothing when the
site has no answer? On ``bench.knowledge_set``'s help centre.

    .venv/bin/python -m bench.knowledge_quality [--database postgres|sqlite] [--articles 10000] [--queries 300]

On a migrated database with the demo's articles replaced by the set's (all published):

1. for each answerable question (and apart, for ``HELD_OUT``, written after the synonyms, and
   ``FRESH``, written a round later), the rank of its article among ``search()``'s first five hits
   as an anonymous visitor: the share ranked first, the mean reciprocal rank (0 when absent),
   the share in the first five, and the share with no hit at or above the relevance floor (the
   floor is ``SEARCH_FLOOR``; code without a floor counts every hit);
2. for each unanswerable question, whether any hit is at or above the floor (``UNANSWERABLE``,
   read while choosing the floors; with ``--held-out`` also ``UNANSWERABLE_HELD_OUT``, never tuned on,
   beside the held-out answerable ones);
3. the same among ``--articles`` generated distractors (words drawn from the set's own
   vocabulary without the products' names, titles included: pages on returns, cleaning and
   warranties in general, none about one of the products), inserted with ``bulk_create`` and
   indexed by ``rebuild()``;
4. query latency there, p50 and p95 of ``--queries`` searches (the set's questions in turn, with
   the floor, as the search_site tool asks), then of as many again with no word's passage count
   kept from an earlier search, then of as many again each right after a save (a new generation
   of the index: the counts that a save makes stale are counted again).

It runs unchanged on the code before the relevance floor (``Hit`` without ``match``), so that
both are measured on the same set, machine and run.

``--embeddings PYTHON`` measures the ``SEARCH_EMBEDDINGS`` option: it starts
``bench/embeddings_server.py`` (all-MiniLM-L6-v2 behind ``/v1/embeddings`` on 127.0.0.1) with that
Python (a venv of its own: the server's docstring says how to make it), indexes with vectors, and
gives each row twice in the same run, by the words alone (the option off) and with meaning; the
latency likewise, alternated. Indexing the generated articles then embeds every one of them
(about 25 a second last round on two busy cores; 2.4 passages a second at a load of 12 to 14 in
the next): ``--articles 2000`` keeps it to minutes. ``--random-vectors`` gives the generated articles random vectors of the same size
instead, for the latency with meaning among 10,000 (their quality with meaning is then not
measured: random vectors rank nothing).
"""

import argparse
import json
import os
import random
import subprocess
import time
from pathlib import Path

from bench.common import Stack, free_port, machine, table, wait_for_port
from bench.knowledge import percentiles
from bench.knowledge_set import ANSWERABLE, ARTICLES, FRESH, HELD_OUT, PRODUCTS, UNANSWERABLE, UNANSWERABLE_HELD_OUT


def embeddings_server(python):
    """Start bench/embeddings_server.py with ``python``; returns (process, SEARCH_EMBEDDINGS)."""
    port = free_port()
    server = subprocess.Popen([python, str(Path(__file__).with_name("embeddings_server.py")), "--port", str(port)],
                              env={**os.environ, "HF_HUB_OFFLINE": "1"}, start_new_session=True)
    wait_for_port(port, timeout=120)
    return server, {"BASE_URL": f"http://127.0.0.1:{port}/v1", "MODEL": "all-MiniLM-L6-v2", "TIMEOUT": 30}


def served(python, work, args):
    """``work(args, SEARCH_EMBEDDINGS)`` with bench/embeddings_server.py started with ``python``
    and stopped after (no ``python``: with ``{}``, the option off)."""
    server, chosen = embeddings_server(python) if python else (None, {})
    try:
        work(args, chosen)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)


def meaning(chosen):
    """Search with ``SEARCH_EMBEDDINGS`` = ``chosen`` ({} : off) from now on, in this process."""
    from django.conf import settings

    from conversations.conf import get_config

    settings.CONVERSATIONS = {**settings.CONVERSATIONS, "SEARCH_EMBEDDINGS": chosen}
    get_config.cache_clear()


def meaning_alone(slugs, cosines=(0.0, 0.4, 0.45, 0.5)):
    """``[(cosine floor, questions, quality)]`` of a search by meaning alone, without the words:
    every passage of the set ordered by the cosine similarity of its vector (its title and text)
    to the question's, those under the floor left out. What the embeddings are worth by themselves."""
    from conversations.knowledge import embeddings
    from conversations.knowledge.models import Passage

    kept = [(slugs[pk], vector["text"]) for pk, vector in Passage.objects.values_list("object_pk", "embedding")]
    rows = []
    for answerable, which in ((ANSWERABLE, "115 tuned-on"), (HELD_OUT + FRESH, f"{len(HELD_OUT) + len(FRESH)} held-out")):
        questions = [q for q, _ in answerable] + UNANSWERABLE
        vectors = embeddings.embed(questions)
        ranked = [sorted(((sum(a * b for a, b in zip(v, text)), slug) for slug, text in kept), reverse=True)
                  for v in vectors]
        for cosine in cosines:
            found = [[(slug, 1.0) for close, slug in each[:5] if close >= cosine] for each in ranked]
            results = ([(slug, hits) for (_, slug), hits in zip(answerable, found)], found[len(answerable):])
            rows.append((f"cosine ≥ {cosine}", which, quality(results, None)))
    return rows


def index_with_random_vectors(articles, chosen, rng):
    """Index ``articles`` with the option off, then give each of their passages random vectors of
    unit length, of the size of the vectors the endpoint gave the set's own: what a search with
    meaning reads and computes among them is the same, without a request per article (two or
    three a second on this machine under load)."""
    from conversations.knowledge import embeddings
    from conversations.knowledge.counts import index_changed
    from conversations.knowledge.index import index_object
    from conversations.knowledge.models import Passage
    from conversations.knowledge.registry import sources

    meaning({})
    source = sources()["help"]
    for article in articles.order_by("pk").iterator(chunk_size=500):
        index_object(source, article)
    meaning(chosen)
    size = len(Passage.objects.exclude(embedding__isnull=True).values_list("embedding", flat=True).first()["text"])

    def unit():
        vector = [rng.gauss(0, 1) for _ in range(size)]
        length = sum(x * x for x in vector) ** 0.5
        return [round(x / length, 5) for x in vector]

    bare = list(Passage.objects.filter(embedding__isnull=True).only("pk"))
    for passage in bare:
        passage.embedding = {"model": embeddings.model_name(), "text": unit(), "title": unit()}
    Passage.objects.bulk_update(bare, ["embedding"], batch_size=500)
    index_changed()


def floor():
    from conversations.conf import get_config

    return get_config().get("SEARCH_FLOOR")


def floor_measure(hit):
    """What the floor reads of ``hit``: its match (None for code without one); infinite when it
    holds every word of the question (shown at any floor); 0 when it matches too few distinct
    things (``Hit.distinct``: shown at no floor above 0), so that a floor ``f`` shows it exactly
    when ``measure(hit) >= f``, as ``search.clears`` does by the words."""
    match = getattr(hit, "match", None)
    if match is None or getattr(hit, "every", False):
        return None if match is None else float("inf")
    try:
        from conversations.knowledge.search import DISTINCT
    except ImportError:  # code before the distinct things
        return match
    return match if hit.distinct >= DISTINCT else 0.0


def answers(search, slugs, answerable=ANSWERABLE, cut=None, unanswerable=UNANSWERABLE):
    """``(answerable, unanswerable)``: for each question of ``answerable`` its article's slug and,
    for it and for each question of ``unanswerable``, ``[(slug, measure)]`` of the first five hits
    (``floor_measure``) at or above the floor ``cut`` (None: every hit), as the search_site tool asks for them."""
    def found(question):
        return [(slugs.get(hit.object_pk), floor_measure(hit))
                for hit in search(question, limit=5, **({} if cut is None else {"floor": cut}))]
    return [(slug, found(question)) for question, slug in answerable], [found(q) for q in unanswerable]


def quality(results, cut):
    """{"first", "mrr", "top5", "silent", "unanswered_hit"} as shares of the question sets, the
    hits under the floor ``cut`` left out (None: every hit counts)."""
    def kept(hits):
        return [slug for slug, match in hits if cut is None or match is None or match >= cut]
    answerable, unanswerable = results
    first = reciprocal = top5 = silent = 0
    for slug, hits in answerable:
        found = kept(hits)
        silent += not found
        if slug in found:
            rank = found.index(slug) + 1
            first += rank == 1
            top5 += 1
            reciprocal += 1 / rank
    total = len(answerable)
    return {"first": first / total, "mrr": reciprocal / total, "top5": top5 / total, "silent": silent / total,
            "unanswered_hit": sum(bool(kept(hits)) for hits in unanswerable) / len(unanswerable)}


def question_weights(questions):
    """``{question: the weights of all its terms, added}``: the most any passage can match."""
    from django.conf import settings

    from conversations.conf import get_config
    from conversations.knowledge.search import engine, rarities
    from conversations.knowledge.text import query_terms

    found, weights = engine(["help"]), {}
    for question in questions:
        terms = found.terms(query_terms(question, settings.LANGUAGE_CODE, get_config()["SEARCH_SYNONYMS"]))
        weights[question] = sum(rarities(found, terms).values()) if terms else 0.0
    return weights


def share_sweep(alone, sets, search, slugs):
    """``[(floor, questions, quality)]`` of floors relative to the question's own weight, alone and
    beside absolute ones, read from the hits of searches without a floor."""
    rows = []
    for answerable in sets:
        results = alone if answerable is ANSWERABLE else answers(search, slugs, answerable)
        total = question_weights([q for q, _ in answerable] + UNANSWERABLE)
        questions = [q for q, _ in answerable] + UNANSWERABLE
        label = "tuning" if answerable is ANSWERABLE else f"{len(answerable)} held-out"
        for absolute, share in ((None, 0.45), (None, 0.55), (1.5, 0.45), (1.5, 0.55), (1.5, 0.65), (1.5, 1.0)):
            def kept(hits, question):
                return [(slug, match if match >= share * total[question] - 1e-9
                         or (absolute is not None and match >= absolute) else -1.0) for slug, match in hits]
            filtered = ([(slug, kept(hits, q)) for (slug, hits), q in zip(results[0], questions)],
                        [kept(hits, q) for hits, q in zip(results[1], questions[len(answerable):])])
            name = f"{share:.0%} of the question" + (f", or {absolute}" if absolute is not None else "")
            rows.append((name, label, quality(filtered, 0.0)))
    return rows


def misses(results, cut, limit=40):
    """The answerable questions whose article is not first, with what was."""
    out = []
    for (question, _), (slug, hits) in zip(ANSWERABLE, results[0]):
        shown = [(each, round(match, 2)) for each, match in hits if cut is None or match is None or match >= cut]
        if not shown or shown[0][0] != slug:
            out.append(f"  {question!r}: wanted {slug}, got {shown[:3] or hits[:3]}")
    return out[:limit] + [f"  unanswerable {q!r}: {hits[:2]}" for q, hits in zip(UNANSWERABLE, results[1])
                          if hits and (cut is None or hits[0][1] is None or hits[0][1] >= cut)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", default="postgres", help='"postgres", "sqlite" or a DATABASE_URL')
    parser.add_argument("--articles", type=int, default=10000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--misses", action="store_true", help="list the questions whose article is not first")
    parser.add_argument("--held-out", action="store_true",
                        help="also measure the held-out questions (HELD_OUT, FRESH): never while tuning")
    parser.add_argument("--no-synonyms", action="store_true",
                        help="without the built-in synonyms (conversations.knowledge.text.SYNONYMS)")
    parser.add_argument("--random-vectors", action="store_true",
                        help="with --embeddings, give the generated articles random vectors instead of the endpoint's: "
                             "the latency with meaning among --articles without embedding each (no quality rows "
                             "with meaning among them)")
    parser.add_argument("--embeddings", metavar="PYTHON",
                        help="also with SEARCH_EMBEDDINGS: all-MiniLM-L6-v2 served by bench/embeddings_server.py run "
                             "with this Python (e.g. /tmp/emb/bin/python)")
    args = parser.parse_args()

    print(machine())
    served(args.embeddings, measure, args)


def floor_table(rows):
    """A table of ``(floor, which questions, quality)`` rows."""
    table(["floor", "questions", "right article first", "MRR", "answerable: nothing shown",
           "unanswerable: something shown"],
          [[name, which, f"{q['first']:.1%}", f"{q['mrr']:.3f}", f"{q['silent']:.1%}", f"{q['unanswered_hit']:.1%}"]
           for name, which, q in rows])


def measure(args, chosen):
    with Stack(database=args.database, conversations={"SEARCH_EMBEDDINGS": json.dumps(chosen)} if chosen else None) as stack:
        from django.db import connection

        from chatproject.models import Article
        from conversations.knowledge.index import rebuild
        from conversations.knowledge.models import Passage
        from conversations.knowledge.search import search
        from conversations.knowledge.text import query_words

        Article.objects.all().delete()
        Article.objects.bulk_create([Article(slug=slug, title=title, body=f"<p>{body}</p>")
                                     for slug, title, body in ARTICLES])
        rebuild("help")
        cut = floor()
        slugs = {str(pk): slug for pk, slug in Article.objects.values_list("pk", "slug")}
        if args.no_synonyms:
            from conversations.knowledge import text

            text.SYNONYMS.clear()
        rows, everything = [], ANSWERABLE + HELD_OUT + FRESH
        for on in ([{}, chosen] if chosen else [{}]):
            meaning(on)
            how = (", with meaning" if on else ", words alone") if chosen else ""
            shown = None if on else cut  # with meaning the search applies its own floor, on match and meaning
            rows += [(f"the set's articles alone{how}", len(slugs), quality(answers(search, slugs, cut=cut), shown))]
            if args.held_out:
                rows += [(f"the same, {len(HELD_OUT)} held-out questions{how}", len(slugs),
                          quality(answers(search, slugs, HELD_OUT, cut), shown)),
                         (f"the same, {len(FRESH)} fresh held-out questions{how}", len(slugs),
                          quality(answers(search, slugs, FRESH, cut), shown)),
                         (f"the same, all {len(HELD_OUT) + len(FRESH)} held-out questions and the "
                          f"{len(UNANSWERABLE_HELD_OUT)} held-out unanswerable{how}", len(slugs),
                          quality(answers(search, slugs, HELD_OUT + FRESH, cut, UNANSWERABLE_HELD_OUT), shown)),
                         (f"the same, all {len(everything)} answerable and all "
                          f"{len(UNANSWERABLE) + len(UNANSWERABLE_HELD_OUT)} unanswerable{how}", len(slugs),
                          quality(answers(search, slugs, everything, cut, UNANSWERABLE + UNANSWERABLE_HELD_OUT),
                                  shown))]
        meaning({})  # the floors' sweeps read the words' match
        alone = answers(search, slugs)
        sweep = [(each, quality(alone, each)) for each in (0.5, 1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0, 3.5)] if cut else []
        shares = share_sweep(alone, [ANSWERABLE, FRESH] if args.held_out else [ANSWERABLE], search, slugs) if cut else []
        meaning(chosen)
        alone_rows = meaning_alone(slugs) if chosen else []
        wrong = misses(answers(search, slugs, cut=cut), cut) if args.misses else []

        rng = random.Random(39)
        names = {word for name, *_ in PRODUCTS for word in query_words(name)}
        vocabulary = sorted({w for p in Passage.objects.values_list("text", flat=True) for w in query_words(p)
                             if not w.isdigit()} - names)
        Article.objects.bulk_create([
            Article(slug=f"generated-{n}", title=" ".join(rng.choices(vocabulary, k=4)).capitalize(),
                    body="".join("<p>" + " ".join(rng.choices(vocabulary, k=60)) + ".</p>" for _ in range(4)))
            for n in range(args.articles)], batch_size=1000)
        if chosen and args.random_vectors:
            index_with_random_vectors(Article.objects.filter(slug__startswith="generated-"), chosen, rng)
        else:
            rebuild("help")
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE conversations_passage")
        total = Article.objects.count()
        for on in ([{}, chosen] if chosen and not args.random_vectors else [{}]):
            meaning(on)
            how = (", with meaning" if on else ", words alone") if chosen else ""
            shown = None if on else cut
            rows.append((f"among {args.articles:,} generated articles{how}", total,
                         quality(answers(search, slugs, cut=cut), shown)))
            if args.held_out:
                rows.append((f"the same, {len(HELD_OUT) + len(FRESH)} held-out questions and the "
                             f"{len(UNANSWERABLE_HELD_OUT)} held-out unanswerable{how}", total,
                             quality(answers(search, slugs, HELD_OUT + FRESH, cut, UNANSWERABLE_HELD_OUT), shown)))

        questions = [q for q, _ in ANSWERABLE] + UNANSWERABLE
        try:  # the words' passage counts a process keeps (code before them has none)
            from conversations.knowledge.counts import _kept as kept
        except ImportError:
            kept = {}
        try:  # what every save's commit does (code before the kept counts has nothing to change)
            from conversations.knowledge.counts import index_changed
        except ImportError:
            def index_changed():
                pass

        timings, counting, saved, words = [], [], [], []
        if chosen:  # with meaning and by the words alone, one query of each in turn
            for n in range(args.queries):
                for on, each in ((chosen, timings), ({}, words)):
                    meaning(on)
                    started = time.perf_counter()
                    search(questions[n % len(questions)], limit=5, floor=cut)
                    each.append(time.perf_counter() - started)
            meaning(chosen)
        for each in ((counting, saved) if chosen else (timings, counting, saved)):
            for n in range(args.queries):
                if each is counting:
                    kept.clear()
                elif each is saved:
                    index_changed()
                started = time.perf_counter()
                search(questions[n % len(questions)], limit=5, **({} if cut is None else {"floor": cut}))
                each.append(time.perf_counter() - started)
        label = stack.database_label

    print(f"\n{label}; {len(ANSWERABLE)} answerable questions over {len(ARTICLES)} articles, "
          f"{len(UNANSWERABLE)} unanswerable; relevance floor: {cut if cut is not None else 'none'}\n")
    table(["corpus", "articles", "right article first", "MRR", "in first five", "answerable: nothing shown",
           "unanswerable: something shown"],
          [[name, f"{count:,}", f"{q['first']:.1%}", f"{q['mrr']:.3f}", f"{q['top5']:.1%}", f"{q['silent']:.1%}",
            f"{q['unanswered_hit']:.1%}"] for name, count, q in rows])
    p50, p95 = percentiles(timings)
    print(f"\nquery latency among {total:,} articles ({len(timings)} searches{', with meaning' if words else ''}): "
          f"p50 {p50:.1f} ms, p95 {p95:.1f} ms")
    if words:
        p50, p95 = percentiles(words)
        print(f"the same by the words alone (SEARCH_EMBEDDINGS off), alternated with those: p50 {p50:.1f} ms, "
              f"p95 {p95:.1f} ms")
    p50, p95 = percentiles(counting)
    print(f"the same, every word counted again (no kept counts): p50 {p50:.1f} ms, p95 {p95:.1f} ms")
    p50, p95 = percentiles(saved)
    print(f"the same, each the first search after a save (the index's generation changed): p50 {p50:.1f} ms, "
          f"p95 {p95:.1f} ms")
    if sweep:
        print("\nthe set's articles alone, by relevance floor:\n")
        table(["floor", "right article first", "MRR", "answerable: nothing shown", "unanswerable: something shown"],
              [[f"{each:.2f}", f"{q['first']:.1%}", f"{q['mrr']:.3f}", f"{q['silent']:.1%}",
                f"{q['unanswered_hit']:.1%}"] for each, q in sweep])
    if shares:
        print("\nfloors relative to the question (a hit kept if its match is at least this share of the weights of all"
              " the question's words, or, with an absolute floor, at least that floor):\n")
        floor_table(shares)
    if alone_rows:
        print("\nby meaning alone (no words: the set's passages ordered by the cosine similarity of their vectors to the"
              " question's):\n")
        floor_table(alone_rows)
    if wrong:
        print("\nnot first:\n" + "\n".join(wrong))


if __name__ == "__main__":
    main()
