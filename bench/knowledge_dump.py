"""The parts of every candidate's order, dumped once for a sweep of weights without a database:
for each question of ``bench.knowledge_set`` (which set it is in, and its article), the first
``--depth`` passages the full-text search finds for it without a floor, each with its article's
slug, its match, its title's match, whether it holds every word of the question, and, with
``--embeddings``, the cosine similarities of its text and title vectors to the question's.

    .venv/bin/python -m bench.knowledge_dump [--database sqlite] [--depth 30] [--embeddings /tmp/emb/bin/python] dump.json

``bench.knowledge_sweep`` reads it. Only the tuned-on questions (``ANSWERABLE``, ``UNANSWERABLE``)
may be looked at while choosing; the others are there to report beside them.
"""

import argparse
import json

from bench.common import Stack
from bench.knowledge_quality import meaning, served
from bench.knowledge_set import ANSWERABLE, ARTICLES, FRESH, HELD_OUT, UNANSWERABLE, UNANSWERABLE_HELD_OUT

SETS = {"tuned": ANSWERABLE, "held_out": HELD_OUT + FRESH,
        "unanswerable": [(q, None) for q in UNANSWERABLE],
        "unanswerable_held_out": [(q, None) for q in UNANSWERABLE_HELD_OUT]}


def dump(args, chosen):
    with Stack(database=args.database, conversations={"SEARCH_EMBEDDINGS": json.dumps(chosen)} if chosen else None):
        from django.conf import settings

        from chatproject.models import Article
        from conversations.conf import get_config
        from conversations.knowledge import embeddings
        from conversations.knowledge.index import rebuild
        from conversations.knowledge.models import Passage
        from conversations.knowledge.search import _ranked, engine, rarities, title_matches
        from conversations.knowledge.text import query_terms

        Article.objects.all().delete()
        Article.objects.bulk_create([Article(slug=slug, title=title, body=f"<p>{body}</p>")
                                     for slug, title, body in ARTICLES])
        rebuild("help")
        meaning(chosen)
        slugs = {str(pk): slug for pk, slug in Article.objects.values_list("pk", "slug")}
        vectors = dict(Passage.objects.values_list("pk", "embedding")) if chosen else {}
        out = {"database": args.database, "floor": get_config().get("SEARCH_FLOOR"), "questions": []}
        for name, questions in SETS.items():
            asked = embeddings.embed([q for q, _ in questions]) if chosen else [None] * len(questions)
            for (question, slug), vector in zip(questions, asked):
                terms = query_terms(question, settings.LANGUAGE_CODE, get_config()["SEARCH_SYNONYMS"])
                found = engine(["help"])
                kept = found.terms(terms) if terms else []
                ranked = _ranked(terms, None, None, args.depth, 0.0) if kept else []
                weights = rarities(found, kept) if kept else {}
                titles = title_matches(found, weights, [pk for pk, *_ in ranked]) if ranked else {}
                rows = []
                for pk, hit, *_ in ranked:
                    close = embeddings.closeness(vector, vectors.get(pk), embeddings.model_name()) if chosen else None
                    rows.append({"slug": slugs.get(hit.object_pk), "match": hit.match, "title": titles.get(pk, 0.0),
                                 "every": hit.match >= sum(weights.values()) * (1 - 1e-9), "cos": close and close[0], "cos_title": close and close[1]})
                out["questions"].append({"set": name, "question": question, "slug": slug,
                                         "total": sum(weights.values()), "hits": rows})
    with open(args.out, "w") as written:  # not stdout: the embeddings server prints there
        json.dump(out, written)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="the JSON file to write")
    parser.add_argument("--database", default="postgres")
    parser.add_argument("--depth", type=int, default=30)
    parser.add_argument("--embeddings", metavar="PYTHON")
    args = parser.parse_args()
    served(args.embeddings, dump, args)


if __name__ == "__main__":
    main()
