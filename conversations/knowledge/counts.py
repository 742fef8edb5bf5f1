"""How many passages hold each word a search asks about, kept for a short while: a word's rarity
weighs how well a passage matched, and counting it took most of a search among 10,000 articles
(PostgreSQL: one aggregate over the text search index, 117 ms of 206). The counts of a process
are kept with the index's generation, a token in the Django cache that every write of the index
replaces once it commits, so a save anywhere makes every process count again (but the words
``COMMON`` passages hold, whose weight a save barely moves); and for at most ``MAX_AGE`` seconds,
so a cache that other processes do not share (or one that lost the token) still leaves counts at
most that old. Counts only weigh words: who may read a passage is decided elsewhere, and never
from here."""

import threading
import time
import uuid

from django.core.cache import caches

from ..conf import get_config

GENERATION_KEY = "conversations:knowledge:generation"
MAX_AGE = 60.0
# Words counted per process at most; a flood of different words starts the counts over.
MAX_WORDS = 10000
# A word at least this many passages hold keeps its count through a change of generation (still
# MAX_AGE seconds at most): a save moves it by a few passages in hundreds, next to nothing in its
# weight, while counting it again was the slow part of the first search after a save (PostgreSQL,
# 10,000 articles: p50 216 ms against 16 ms). Rarer words, whose weight a save can change, are
# counted again at once.
COMMON = 100
_TOTAL = ()  # the key of the number of passages (no term is an empty tuple)

_lock = threading.Lock()
_kept = {}  # database alias -> (generation, monotonic time it was started, {term: count})


def _cache():
    return caches[get_config()["CACHE_ALIAS"]]


def generation():
    """The index's current generation, or None when the cache cannot say (nothing is kept then)."""
    try:
        cache = _cache()
        token = cache.get(GENERATION_KEY)
        if token is None:
            cache.add(GENERATION_KEY, uuid.uuid4().hex, timeout=None)
            token = cache.get(GENERATION_KEY)
        return token
    except Exception:  # noqa: BLE001 - a cache that is down costs a count, never a search
        return None


def index_changed():
    """Mark the index changed: every process counts again. Call once the write has committed."""
    try:
        _cache().set(GENERATION_KEY, uuid.uuid4().hex, timeout=None)
    except Exception:  # noqa: BLE001 - the counts then live MAX_AGE seconds at most
        with _lock:
            _kept.clear()


def counted(alias, terms, count, total):
    """``(passages, {term: passages holding it})`` of database ``alias``: ``count(terms)`` and
    ``total()`` are called only for what this process has not counted in this generation."""
    token, now = generation(), time.monotonic()
    if token is None:
        return total(), count(terms)
    with _lock:
        kept = _kept.get(alias)
        if kept is None or now - kept[1] > MAX_AGE or len(kept[2]) > MAX_WORDS:
            kept = _kept[alias] = (token, now, {})
        elif kept[0] != token:
            common = {term: count for term, count in kept[2].items() if term != _TOTAL and count >= COMMON}
            kept = _kept[alias] = (token, kept[1], common)
        known = dict(kept[2])
    missing = [term for term in terms if term not in known]
    if missing:
        known.update(count(missing))
    if _TOTAL not in known:
        known[_TOTAL] = total()
    with _lock:
        if _kept.get(alias) is kept:
            kept[2].update({term: known[term] for term in [*missing, _TOTAL]})
    return known[_TOTAL], {term: known[term] for term in terms}
