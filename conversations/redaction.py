"""The one rule for keeping API keys out of what the operator reads.

Every key the site knows (its ``API_KEY``, its ``FALLBACKS`` keys, each of its ``CREDENTIALS``)
and the key of the call at hand are hidden wherever they appear, with the same marker. Text
that a provider wrote (an error body, an error event in a stream, a malformed event's
excerpt) may quote a key this process does not know (a rotated one, another tenant's), so
there anything key-like is hidden too (``redact``); text the site itself stores (messages, tool
arguments) keeps its words and loses only the known keys (``hide_keys``).
"""

import re

from .conf import get_config
from .endpoints import credential_values

MARKER = "[API key hidden]"

# Things in a provider's error text that look like credentials: OpenAI echoes a masked key
# ("Incorrect API key provided: sk-abc***xyz"), others quote tokens.
_SECRETISH = re.compile(r"(?i)(\b(?:sk|pk|rk|key|api|ant)[-_][\w*.\-]{4,}|\b[A-Za-z0-9_\-]{32,}\b|key provided:\s*\S+)")


def known_keys(cfg=None):
    """Every API key the site's settings name or resolve to in this process, and the secret host
    sites sign identities with (``IDENTITY_SECRET``), longest first."""
    cfg = get_config() if cfg is None else cfg
    keys = [cfg["API_KEY"], cfg["IDENTITY_SECRET"], *(entry.get("API_KEY") for entry in cfg["FALLBACKS"]), *credential_values(cfg)]
    return sorted({str(key) for key in keys if key}, key=len, reverse=True)


def hide_keys(text, *secrets):
    """``text`` with ``secrets`` and every key the site knows replaced by ``MARKER``."""
    text = "" if text is None else str(text)
    for key in sorted({str(s) for s in secrets if s} | set(known_keys()), key=len, reverse=True):
        if len(key) >= 4 and key in text:
            text = text.replace(key, MARKER)
    return text


def redact(text, *secrets, limit=300):
    """Text a provider sent, for a log line or ``CallRecord.detail``: the keys hidden as by
    ``hide_keys``, anything key-like too, shortened to ``limit`` characters."""
    text = _SECRETISH.sub(MARKER, hide_keys(text, *secrets))
    return text if len(text) <= limit else text[: limit - 1] + "…"
