"""Meaning beside words, as an option (``SEARCH_EMBEDDINGS``, off by default): an OpenAI-compatible
embeddings endpoint (``POST {BASE_URL}/embeddings``, ``{"model", "input": [texts]}`` →
``{"data": [{"index", "embedding"}]}``) turns each passage into vectors when it is indexed, and
each question when it is searched. The full-text search still finds the candidates; their order
and the floor then add how close each passage's meaning is to the question's
(``search.search``). Off, nothing here is called and no request is ever made.

The key follows the providers' rules (``conversations.endpoints``): an ``API_KEY`` goes only to
``BASE_URL``'s origin, a ``CREDENTIAL`` only to its ``ORIGINS`` (a bare one: OpenAI's), checked
right before sending. Every failure is ``EmbeddingsUnavailable``, which the callers log and live
with: a search falls back to full text, an indexed object keeps its passages without vectors.
"""

import math

import requests

from ..conf import get_config
from ..endpoints import CredentialError, KeyNotBound, bind_settings_key, check_key, locate, resolve_credential
from ..infra.network import endpoint, os_reason

# How a passage's order is made (``search.search``): its match (the question's words it holds, by
# rarity) + MEANING × the cosine similarity of its text (title and text) to the question +
# TITLE_MEANING × its title's. Chosen on bench.knowledge_quality's tuned-on questions with
# all-MiniLM-L6-v2 by bench.knowledge_sweep (meaning 4, 6, 8 and 10; the title's 0, 1, 2 and 4; the
# match's 0.5, 1 and 1.5; the words' title match 0 to 2; 10, 20 or 30 hits) and checked on the
# held-out ones (docs/benchmarks.md#site-knowledge-more-candidates-and-held-out-unanswerable-questions).
MEANING = 6.0
TITLE_MEANING = 1.0
# The floor on that sum, in place of SEARCH_FLOOR (whose scale is the match alone): just above the
# lowest that left at most 5 % of the tuned-on unanswerable questions a passage (4.83), measured
# with the weights above. It does not carry over: questions about a product the help centre names
# but does not answer ("How heavy is the Curlew stand mixer?") score as high as answerable ones.
FLOOR = 4.9
# How many full-text hits are ordered again by meaning: 20 put the right article first for two
# more tuned-on questions than 10 (a sibling the words rank 11th to 20th); 30 for none more.
DEPTH = 20
TIMEOUT = 5.0


KEYS = {"BASE_URL", "MODEL", "API_KEY", "CREDENTIAL", "TIMEOUT", "FLOOR"}


def setting_problems(config=None):
    """``[(check id, message, hint)]`` of what is wrong with ``SEARCH_EMBEDDINGS`` (for the checks):
    a setting that is not off but could never be used, or whose key would never be sent."""
    config = get_config() if config is None else config
    chosen = config["SEARCH_EMBEDDINGS"]
    if not chosen:
        return []
    found = []
    if not chosen.get("BASE_URL") or locate(chosen["BASE_URL"]) is None:
        found.append(("conversations.E065", f"SEARCH_EMBEDDINGS' BASE_URL {chosen.get('BASE_URL')!r} is not a plain "
                      "URL: search_site cannot weigh meaning.",
                      'Give the API root, e.g. "http://127.0.0.1:8011/v1" ({BASE_URL}/embeddings is called), or set '
                      "SEARCH_EMBEDDINGS to {} to turn it off."))
    unknown = sorted(set(chosen) - KEYS)
    numbers = [key for key in ("TIMEOUT", "FLOOR")
               if key in chosen and (isinstance(chosen[key], bool) or not isinstance(chosen[key], (int, float)))]
    # requests refuses a timeout of 0 or less with a ValueError: the search would fail, not fall back
    stopped = "TIMEOUT" in chosen and "TIMEOUT" not in numbers and chosen["TIMEOUT"] <= 0
    if unknown or numbers or stopped or (chosen.get("API_KEY") and chosen.get("CREDENTIAL")):
        found.append(("conversations.E066", "SEARCH_EMBEDDINGS " + "; ".join(filter(None, [
            unknown and f"has unknown keys {', '.join(unknown)}",
            numbers and f"needs numbers for {', '.join(numbers)}",
            stopped and "needs a number above 0 for TIMEOUT",
            chosen.get("API_KEY") and chosen.get("CREDENTIAL") and "names both API_KEY and CREDENTIAL"])) + ".",
            f"It takes {', '.join(sorted(KEYS))} (docs/knowledge.md, 'Meaning: an embeddings endpoint')."))
    if chosen.get("CREDENTIAL") and chosen["CREDENTIAL"] not in config["CREDENTIALS"]:
        found.append(("conversations.E067", f"SEARCH_EMBEDDINGS names the credential {chosen['CREDENTIAL']!r}, which "
                      "is not in CREDENTIALS: every search falls back to the words alone.",
                      'Add it to CREDENTIALS, with "ORIGINS" holding the endpoint\'s origin.'))
    return found


class EmbeddingsUnavailable(Exception):
    """The endpoint could not give vectors: unreachable, refused, slow, or a reply it cannot read."""


def options(config=None):
    """The ``SEARCH_EMBEDDINGS`` setting, or None when it is off (empty, or no ``BASE_URL``)."""
    chosen = (get_config() if config is None else config)["SEARCH_EMBEDDINGS"]
    return chosen if chosen and chosen.get("BASE_URL") else None


def floor(config=None):
    """The floor a passage's match and meaning must reach together (``FLOOR`` unless the setting says)."""
    chosen = options(config) or {}
    return float(chosen.get("FLOOR", FLOOR))


def model_name(config=None):
    """The model named in the setting ("" when it names none): stored beside each vector, so that
    vectors of another model are never compared with the question's."""
    return str((options(config) or {}).get("MODEL") or "")


def _key(chosen, config):
    """The key to send, bound to the origins it may go to; "" for none (a local server)."""
    if chosen.get("CREDENTIAL"):
        try:
            return resolve_credential(chosen["CREDENTIAL"], config, provider="openai")
        except CredentialError as exc:
            raise EmbeddingsUnavailable(exc.reason) from None
    return bind_settings_key({"PROVIDER": "openai", "BASE_URL": chosen["BASE_URL"], "API_KEY": chosen.get("API_KEY")})


def _unit(vector):
    length = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / length for x in vector]


def embed(texts, config=None):
    """One vector of unit length per text of ``texts``, in order. Raises ``EmbeddingsUnavailable``."""
    config = get_config() if config is None else config
    chosen = options(config)
    if chosen is None:
        raise EmbeddingsUnavailable("SEARCH_EMBEDDINGS is off")
    location = locate(chosen["BASE_URL"])
    if location is None:
        raise EmbeddingsUnavailable("SEARCH_EMBEDDINGS' BASE_URL is not a plain URL scheme://host[:port]/path")
    url = location._replace(path=location.path.rstrip("/") + "/embeddings").url
    key = _key(chosen, config)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        check_key(url, headers, key)
    except KeyNotBound as exc:
        raise EmbeddingsUnavailable(str(exc)) from None
    body = {"input": list(texts)}
    if chosen.get("MODEL"):
        body["model"] = chosen["MODEL"]
    try:
        # Never followed: a redirect would carry the question (and, to the same host, the key) to an
        # address the operator did not name, as the providers' calls refuse to.
        reply = requests.post(url, json=body, headers=headers, timeout=float(chosen.get("TIMEOUT", TIMEOUT)),
                              allow_redirects=False)
    except requests.RequestException as exc:
        raise EmbeddingsUnavailable(f"{endpoint(url)}: {os_reason(exc) or type(exc).__name__}") from None
    if reply.status_code != 200:
        raise EmbeddingsUnavailable(f"{endpoint(url)} answered HTTP {reply.status_code}")
    try:
        rows = sorted(reply.json()["data"], key=lambda row: row["index"])
        vectors = [_unit([float(x) for x in row["embedding"]]) for row in rows]
    except (ValueError, KeyError, TypeError) as exc:
        raise EmbeddingsUnavailable(f"{endpoint(url)} gave a reply that is not embeddings ({type(exc).__name__})") from None
    if len(vectors) != len(body["input"]) or len({len(v) for v in vectors}) > 1:
        raise EmbeddingsUnavailable(f"{endpoint(url)} gave {len(vectors)} vectors for {len(body['input'])} texts")
    return vectors


def passage_texts(rows):
    """What is embedded for an object's passages: each passage's title and text, then the title alone."""
    return [f"{row.title}. {row.text}" for row in rows] + [rows[0].title]


def stored(vectors, model):
    """``Passage.embedding`` for each passage, from ``embed(passage_texts(rows))``'s vectors (rounded:
    a fifth decimal changes no order)."""
    *texts, title = vectors
    title = [round(x, 5) for x in title]
    return [{"model": model, "text": [round(x, 5) for x in text], "title": title} for text in texts]


def closeness(question, kept, model):
    """``(text, title)`` cosine similarities of a passage's stored vectors (``kept``) to the
    question's; None when it has none of ``model``'s (indexed before the option, or by another)."""
    if not kept or kept.get("model") != model or len(kept.get("text") or ()) != len(question):
        return None
    return (sum(q * x for q, x in zip(question, kept["text"])),
            sum(q * x for q, x in zip(question, kept["title"])))
