"""The built-in ``search_site`` tool: list ``"conversations.knowledge.tool.search_site"`` in
``CONVERSATIONS["TOOLS"]`` and give it to an assistant like any tool. It runs under the turn's
clocks like every tool (``TOOL_TIMEOUT``), searching for the turn's owner at that moment."""

import json

from ..conf import get_config
from ..tools import tool
from .search import search
from .text import excerpt

# What the model reads when nothing matched well enough.
NOTHING = ("Nothing on this site matches this question well enough (passages under the site's relevance floor are "
           "left out): say that you could not find it on this site rather than guess.")
# The shortest text kept of a passage when a result is shrunk to fit TOOL_RESULT_MAX_CHARS.
MIN_EXCERPT = 120


def allowed_sources(turn):
    """The sources a turn's assistant may search (None: every registered source)."""
    assistant = getattr(turn, "assistant", None) if turn is not None else None
    chosen = getattr(assistant, "knowledge_sources", None) if assistant is not None else None
    return list(chosen) if chosen else None


def result_text(query, hits, max_chars):
    """The tool's result: JSON ``{"query", "results": [{"title", "url", "text", "match"}]}``,
    whole, at most ``max_chars`` long (passages shortened, then the last ones left out) so that
    the widget can read its sources from it. The results hold only what the visitor may open,
    and only what matched at least the relevance floor."""
    results = [{"title": hit.title, "url": hit.url, "text": hit.text, "match": round(hit.match, 2)} for hit in hits]
    if not results:
        return json.dumps({"query": query[:200], "results": [], "note": NOTHING}, ensure_ascii=False)
    size = max(len(r["text"]) for r in results)
    while True:
        shown = [{**r, "text": excerpt(r["text"], size)} for r in results]
        text = json.dumps({"query": query[:200], "results": shown}, ensure_ascii=False)
        if len(text) <= max_chars:
            return text
        if size > MIN_EXCERPT:
            size = max(MIN_EXCERPT, size * 3 // 4)
        elif len(results) > 1:
            results = results[:-1]
        else:
            return json.dumps({"query": query[:200], "results": [{**results[0], "text": ""}]},
                              ensure_ascii=False)[:max_chars]


@tool(idempotent=True)  # read-only
def search_site(context, query: str, limit: int = 5) -> str:
    """Search this site's own pages (help articles and the like) for a question; returns the best
    passages with their titles, URLs and how well each matched (its rare words in common with the
    question, counted by rarity). Passages that match too little are left out: no result means the site does not answer it. Quote them and give the
    URL of what you used."""
    config = get_config()
    hits = search(query, user=context.user if context is not None else None,
                  names=allowed_sources(context.turn if context is not None else None), limit=limit,
                  floor=float(config["SEARCH_FLOOR"]))
    return result_text(query, hits, config["TOOL_RESULT_MAX_CHARS"])
