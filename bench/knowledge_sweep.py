"""Weights of the meaning option chosen without a database: reads ``bench.knowledge_dump``'s
dumps (one per database) and, for each setting of the depth, the weights and the words' match,
puts the floor at the lowest that leaves at most one of the 30 tuned-on unanswerable questions a
passage on both databases, then ranks the settings by right-first + MRR of the 115 tuned-on
questions on the worse database. The held-out questions are printed beside the best settings,
never used to choose.

    .venv/bin/python -m bench.knowledge_dump --database sqlite --embeddings /tmp/emb/bin/python /tmp/sqlite.json
    .venv/bin/python -m bench.knowledge_dump --database postgres --embeddings /tmp/emb/bin/python /tmp/pg.json
    python3 -m bench.knowledge_sweep /tmp/sqlite.json /tmp/pg.json
"""

import argparse
import itertools
import json

DEPTHS, MEANINGS, TITLE_MEANINGS, TITLE_MATCHES, MATCHES = (10, 20, 30), (4, 6, 8, 10), (0, 1, 2, 4), (0, 0.5, 1, 2), \
    (0.5, 1, 1.5)


def ordered(question, depth, meaning, title_meaning, title_match, match):
    """``[(score, holds every word, slug)]`` of the question's first ``depth`` candidates, best first."""
    return sorted(((match * hit["match"] + title_match * hit["title"] + meaning * hit["cos"]
                    + title_meaning * hit["cos_title"], hit["every"], hit["slug"]) for hit in question["hits"][:depth]),
                  key=lambda each: -each[0])


def quality(questions, sets, unanswerable, floor, *weights):
    """(right first, MRR, share of the ``unanswerable`` sets' questions shown a passage)."""
    first = reciprocal = count = 0
    for question in questions:
        if question["set"] in sets:
            count += 1
            shown = [slug for score, every, slug in ordered(question, *weights) if score >= floor or every][:5]
            if question["slug"] in shown:
                rank = shown.index(question["slug"]) + 1
                first, reciprocal = first + (rank == 1), reciprocal + 1 / rank
    asked = [question for question in questions if question["set"] in unanswerable]
    shown = sum(any(score >= floor or every for score, every, _ in ordered(question, *weights)) for question in asked)
    return first / count, reciprocal / count, shown / len(asked)


def lowest_floor(questions, *weights, allowed=1):
    """Just above the best score of the (allowed + 1)-th best-scoring tuned-on unanswerable question."""
    tops = sorted((max([score for score, *_ in ordered(question, *weights)] or [float("-inf")])
                   for question in questions if question["set"] == "unanswerable"), reverse=True)
    return tops[allowed] + 1e-6


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dumps", nargs="+")
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    dumps = {path: json.load(open(path))["questions"] for path in args.dumps}
    rows = []
    for weights in itertools.product(DEPTHS, MEANINGS, TITLE_MEANINGS, TITLE_MATCHES, MATCHES):
        floor = max(lowest_floor(questions, *weights) for questions in dumps.values())
        tuned = [quality(questions, {"tuned"}, {"unanswerable"}, floor, *weights) for questions in dumps.values()]
        rows.append((min(first + mrr for first, mrr, _ in tuned), weights, floor))
    rows.sort(key=lambda row: -row[0])
    for score, weights, floor in rows[:args.top]:
        print("depth {} meaning {} title meaning {} title match {} match {}".format(*weights), f"floor {floor:.2f}")
        for path, questions in dumps.items():
            for name, sets, unanswerable in (("115 tuned-on", {"tuned"}, {"unanswerable"}),
                                             ("62 held-out", {"held_out"}, {"unanswerable_held_out"})):
                first, mrr, shown = quality(questions, sets, unanswerable, floor, *weights)
                print(f"  {path}: {name}: first {first:.1%}, MRR {mrr:.3f}, unanswerable shown {shown:.1%}")


if __name__ == "__main__":
    main()
