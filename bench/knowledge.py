"""The site's knowledge: indexing time, query latency, retrieval quality, commit-to-searchable.

    .venv/bin/python -m bench.knowledge [--database postgres|sqlite] [--articles 10000] [--queries 200]

On a migrated database holding the demo's help articles (``chatproject``'s data migration):

1. retrieval quality on ``QUESTIONS``, questions written from the demo articles, each with the
   article that answers it: the share whose article is among the first five hits (and first),
   for ``search()`` (FTS5 / PostgreSQL text search, ranked) and for the baseline, the plain
   ``icontains`` search that other databases get, in the same run;
2. ``--articles`` generated articles (words drawn from the demo's own vocabulary, so they
   compete with the real ones) inserted with ``bulk_create``, then indexed by
   ``rebuild_knowledge``'s ``rebuild()``: its time;
3. retrieval quality again, among those distractors;
4. query latency, p50 and p95 of ``--queries`` searches as an anonymous visitor (visibility
   filter included), for ``search()`` and the baseline;
5. commit to searchable: an article saved in a transaction, the time from the commit's start to
   the first search that finds it (the index is written by ``on_commit``, in the same process).
"""

import argparse
import random
import statistics
import time

from bench.common import Stack, machine, table

# (question, slug of the article that answers it)
QUESTIONS = [
    ("How do I create an account?", "create-account"),
    ("I forgot my password", "reset-password"),
    ("How can I change my email address?", "change-email"),
    ("How do I turn on two-factor authentication?", "two-factor"),
    ("I want to delete my account", "delete-account"),
    ("Can I download all my data?", "export-data"),
    ("How long does delivery take?", "shipping-times"),
    ("Where is my order? I need the tracking number", "track-order"),
    ("Do you ship outside the European Union? Who pays customs duties?", "international-shipping"),
    ("How do I return an item?", "returns"),
    ("When will my refund arrive?", "refund-timing"),
    ("My parcel arrived damaged", "damaged-item"),
    ("Can I pay with PayPal?", "payment-methods"),
    ("Where can I download my invoice?", "invoices"),
    ("How do I use a discount code?", "discount-codes"),
    ("How long is a gift card valid?", "gift-cards"),
    ("What are your support opening hours?", "opening-hours"),
    ("How can I contact support?", "contact-support"),
    ("Where are your shops?", "store-locations"),
    ("Is there a warranty on electronics?", "warranty"),
    ("Which size should I choose?", "size-guide"),
    ("How do I unsubscribe from the newsletter?", "newsletter"),
    ("Do you sell my personal data?", "privacy"),
    ("Which cookies does the site use?", "cookies"),
    ("Can I use the site with a screen reader?", "accessibility"),
    ("How do I create an API key?", "api-keys"),
]


def baseline(query, limit=5):
    """The plain search other databases get: any word in the title or text, in id order, then the
    same visibility filter (``search.search`` with its ranking taken away)."""
    import operator
    from functools import reduce

    from django.contrib.auth.models import AnonymousUser
    from django.db.models import Q

    from conversations.knowledge.models import Passage
    from conversations.knowledge.registry import sources
    from conversations.knowledge.search import allowed_pks
    from conversations.knowledge.text import query_words

    words = query_words(query)
    matching = reduce(operator.or_, [Q(title__icontains=w) | Q(text__icontains=w) for w in words])
    rows = list(Passage.objects.filter(matching).order_by("id")[:200])
    source = sources()["help"]
    allowed = allowed_pks(source, {r.object_pk for r in rows}, AnonymousUser())
    hits, seen = [], set()
    for row in rows:
        if row.object_pk in allowed and row.object_pk not in seen:
            seen.add(row.object_pk)
            hits.append(row)
    return hits[:limit]


def quality(find, slugs_by_pk):
    """(share with the right article in the first five, share with it first)."""
    top5 = first = 0
    for question, slug in QUESTIONS:
        found = [slugs_by_pk.get(hit.object_pk) for hit in find(question)[:5]]
        top5 += slug in found
        first += bool(found) and found[0] == slug
    return top5 / len(QUESTIONS), first / len(QUESTIONS)


def percentiles(samples):
    cuts = statistics.quantiles(samples, n=20)
    return statistics.median(samples) * 1000, cuts[18] * 1000


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", default="postgres", help='"postgres", "sqlite" or a DATABASE_URL')
    parser.add_argument("--articles", type=int, default=10000)
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()

    print(machine())
    with Stack(database=args.database) as stack:
        from django.db import connection, transaction

        from chatproject.models import Article
        from conversations.knowledge.index import rebuild
        from conversations.knowledge.models import Passage
        from conversations.knowledge.search import search
        from conversations.knowledge.text import query_words

        rebuild("help")
        slugs = dict((str(pk), slug) for pk, slug in Article.objects.values_list("pk", "slug"))
        rows = [["demo articles alone", len(slugs), *quality(search, slugs), *quality(baseline, slugs)]]

        rng = random.Random(27)
        vocabulary = sorted({w for p in Passage.objects.values_list("text", flat=True) for w in query_words(p)})
        Article.objects.bulk_create([
            Article(slug=f"generated-{n}", title=" ".join(rng.choices(vocabulary, k=4)).capitalize(),
                    body="".join("<p>" + " ".join(rng.choices(vocabulary, k=60)) + ".</p>" for _ in range(4)))
            for n in range(args.articles)], batch_size=1000)
        started = time.perf_counter()
        counts = rebuild("help")
        indexing = time.perf_counter() - started
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE conversations_passage")
        total = Article.objects.count()
        rows.append([f"among {args.articles:,} generated articles", total, *quality(search, slugs),
                     *quality(baseline, slugs)])

        queries = [QUESTIONS[n % len(QUESTIONS)][0] if n % 2 else " ".join(rng.choices(vocabulary, k=3))
                   for n in range(args.queries)]
        timings = {"search()": [], "baseline (icontains)": []}
        for query in queries:
            for name, find in (("search()", search), ("baseline (icontains)", baseline)):
                started = time.perf_counter()
                find(query)
                timings[name].append(time.perf_counter() - started)

        visible = []
        for n in range(20):
            with transaction.atomic():
                Article.objects.create(slug=f"fresh-{n}", title=f"Fresh article {n}",
                                       body=f"<p>The quokka{n} sanctuary opens soon.</p>")
                started = time.perf_counter()  # the commit starts when the block exits
            while not search(f"quokka{n}"):
                pass
            visible.append(time.perf_counter() - started)
        label = stack.database_label

    print(f"\n{label}; retrieval quality on {len(QUESTIONS)} questions written from the demo articles\n")
    table(["corpus", "articles", "search(): right article in top 5", "search(): first", "baseline: in top 5",
           "baseline: first"], [[r[0], f"{r[1]:,}"] + [f"{v:.0%}" for v in r[2:]] for r in rows])
    print(f"\nindexing {total:,} articles ({sum(counts.values()):,} passages) with rebuild(): {indexing:.1f} s "
          f"({total / indexing:.0f} articles/s)\n")
    table(["search", "queries", "p50 ms", "p95 ms"],
          [[name, len(samples), *(f"{v:.1f}" for v in percentiles(samples))] for name, samples in timings.items()])
    p50, p95 = percentiles(visible)
    print(f"\ncommit to searchable ({len(visible)} saves): p50 {p50:.1f} ms, p95 {p95:.1f} ms")


if __name__ == "__main__":
    main()
