"""Where the words alone fail, and one rule tried on it: the tuned-on questions of
``bench.knowledge_set`` that ``search()`` (the default, no network call) does not answer first,
each with why, then the figures of the default beside those of the rule "the site's own words".

    .venv/bin/python -m bench.knowledge_rules --database sqlite [--held-out]

**The site's own words** (tried, not kept; docs/benchmarks.md, "a reranker, and the site's own
words"): the floor is there for questions about what the site does not cover, and nearly all of
those name it with a word no page uses ("lawn mowers", "student discounts"). A question every
word of which some page uses is asked in the site's own vocabulary; when nothing clears the
floor for it, the pages holding one of its words that no other page holds ("Canada") are shown
instead of nothing, in the search's order. It is measured here beside ``search()`` with the floor
(``SEARCH_FLOOR``), not built into it: what ``search()`` returns is the default's row exactly.

Only the tuned-on questions (``ANSWERABLE``, ``UNANSWERABLE``) are listed; ``--held-out`` adds the
rows of the held-out ones (``HELD_OUT`` + ``FRESH``, ``UNANSWERABLE_HELD_OUT``): read once, at the
end, never to choose.
"""

import argparse

from bench.common import Stack, machine, table
from bench.knowledge_set import ANSWERABLE, ARTICLES, FRESH, HELD_OUT, UNANSWERABLE, UNANSWERABLE_HELD_OUT


def asked(question):
    """``(terms, {term: the ids of the passages holding it}, the object pks of search() without a
    floor, in its order)`` for ``question``."""
    from django.conf import settings

    from conversations.conf import get_config
    from conversations.knowledge.search import _ranked, engine
    from conversations.knowledge.text import query_terms

    terms = query_terms(question, settings.LANGUAGE_CODE, get_config()["SEARCH_SYNONYMS"])
    found = engine(["help"])
    kept = found.terms(terms) if terms else []
    postings = found.postings(kept) if kept else {}
    order = [hit.object_pk for _pk, hit in _ranked(terms, None, None, 20, 0.0)] if kept else []
    return kept, postings, order


def site_words(kept, postings, order, objects):
    """The pages the rule shows when nothing clears the floor: ``[object pk]``, in the search's order."""
    if not kept or any(not postings[term] for term in kept):  # a word no page uses
        return []
    unique = {objects[pk] for term in kept if len(postings[term]) == 1 for pk in postings[term]}
    rank = {pk: number for number, pk in enumerate(order)}
    return sorted(unique, key=lambda pk: rank.get(pk, len(rank)))[:5]


def measure(args):
    with Stack(database=args.database) as stack:
        from chatproject.models import Article
        from conversations.conf import get_config
        from conversations.knowledge.index import rebuild
        from conversations.knowledge.models import Passage
        from conversations.knowledge.search import search

        Article.objects.all().delete()
        Article.objects.bulk_create([Article(slug=slug, title=title, body=f"<p>{body}</p>")
                                     for slug, title, body in ARTICLES])
        rebuild("help")
        floor = get_config()["SEARCH_FLOOR"]
        slugs = {str(pk): slug for pk, slug in Article.objects.values_list("pk", "slug")}
        objects = dict(Passage.objects.values_list("pk", "object_pk"))

        def shown(question):
            """``(the default's slugs, the rule's slugs, terms, postings)``."""
            default = [slugs[hit.object_pk] for hit in search(question, limit=5, floor=floor)]
            kept, postings, order = asked(question)
            rule = default or [slugs[pk] for pk in site_words(kept, postings, order, objects)]
            return default, rule, kept, postings

        sets = [("tuned-on", ANSWERABLE, UNANSWERABLE)]
        if args.held_out:
            sets.append(("held-out", HELD_OUT + FRESH, UNANSWERABLE_HELD_OUT))
        rows, misses = [], []
        for name, answerable, unanswerable in sets:
            results = {"default": [], "the site's own words": []}
            for question, slug in answerable:
                default, rule, kept, postings = shown(question)
                results["default"].append((slug, default))
                results["the site's own words"].append((slug, rule))
                if name == "tuned-on" and default[:1] != [slug]:
                    misses.append((question, slug, default, kept, postings))
            nothing = {"default": [], "the site's own words": []}
            for question in unanswerable:
                default, rule, _kept, _postings = shown(question)
                nothing["default"].append(default)
                nothing["the site's own words"].append(rule)
            for how in results:
                rows.append([f"{len(answerable)} {name} + {len(unanswerable)} unanswerable", how,
                             *figures(results[how], nothing[how])])
        label = stack.database_label

    print(f"\n{label}; relevance floor {floor}\n")
    table(["questions", "search", "right article first", "MRR", "answerable: nothing shown",
           "answerable: a wrong page first", "unanswerable: something shown"], rows)
    print(f"\nthe {len(misses)} tuned-on questions not answered first by default:\n")
    table(["question", "its article", "shown first", "why"],
          [[question, slug, (default or ["nothing"])[0], why(slug, default, kept, postings, objects, slugs)]
           for question, slug, default, kept, postings in misses])


def figures(answered, unanswered):
    """Right first, MRR, nothing shown, a wrong page first (shares of ``answered``: ``[(slug, shown
    slugs)]``), something shown (share of ``unanswered``: ``[shown slugs]``)."""
    total = len(answered)
    first = sum(shown[:1] == [slug] for slug, shown in answered)
    reciprocal = sum(1 / (shown.index(slug) + 1) for slug, shown in answered if slug in shown)
    silent = sum(not shown for _slug, shown in answered)
    wrong = sum(bool(shown) and shown[0] != slug for slug, shown in answered)
    return (f"{first / total:.1%}", f"{reciprocal / total:.3f}", f"{silent / total:.1%}", f"{wrong / total:.1%}",
            f"{sum(bool(shown) for shown in unanswered) / len(unanswered):.1%}")


def why(slug, default, kept, postings, objects, slugs):
    """Why the default does not show ``slug`` first, in a few words."""
    words = {term[0]: len(postings[term]) for term in kept}
    unknown = [word for word, count in words.items() if not count]
    mine = [term[0] for term in kept if any(slugs[objects[pk]] == slug for pk in postings[term])]
    if not default:
        return (f"under the floor: its page holds {', '.join(mine) or 'none of its words'}"
                + (f"; no page uses {', '.join(unknown)}" if unknown else "; every word is the site's"))
    rivals = [term[0] for term in kept if any(slugs[objects[pk]] == default[0] for pk in postings[term])]
    if set(mine) <= set(rivals):
        more = sorted(set(rivals) - set(mine))
        return (f"a tie: both hold {', '.join(mine)}"
                + (f"; the one shown also {', '.join(more)}" if more else ", nothing else of the question"))
    return f"its page holds {', '.join(mine)}; the first holds {', '.join(rivals)}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", default="postgres", help='"postgres", "sqlite" or a DATABASE_URL')
    parser.add_argument("--held-out", action="store_true",
                        help="also the held-out questions (HELD_OUT, FRESH, UNANSWERABLE_HELD_OUT): never while choosing")
    args = parser.parse_args()
    print(machine())
    measure(args)


if __name__ == "__main__":
    main()
