"""The one rule for keeping API keys out of what the operator reads, and the one for keeping
what a site must not store (card numbers, e-mail addresses, phone numbers, its own patterns) out
of what it stores (``Scrubber``, below).

Every key the site knows (its ``API_KEY``, its ``FALLBACKS`` keys, each of its ``CREDENTIALS``)
and the key of the call at hand are hidden wherever they appear, with the same marker. Text
that a provider wrote (an error body, an error event in a stream, a malformed event's
excerpt) may quote a key this process does not know (a rotated one, another tenant's), so
there anything key-like is hidden too (``redact``); text the site itself stores (messages, tool
arguments) keeps its words and loses only the known keys (``hide_keys``).
"""

import contextlib
import contextvars
import functools
import re
from collections.abc import Mapping

from django.conf import settings
from django.utils.module_loading import import_string
from django.utils.translation import gettext as _
from django.views.debug import SafeExceptionReporterFilter

from .conf import get_config
from .core.scrub import KINDS, scrub
from .endpoints import credential_values

MARKER = "[API key hidden]"

# Things in a provider's error text that look like credentials: OpenAI echoes a masked key
# ("Incorrect API key provided: sk-abc***xyz"), others quote tokens.
# A known key already hidden is not hidden again ("key provided: [API" would leave " key hidden]").
_SECRETISH = re.compile(r"(?i)(\b(?:sk|pk|rk|key|api|ant)[-_][\w*.\-]{4,}|\b[A-Za-z0-9_\-]{32,}\b|"
                        r"key provided:\s*(?!" + re.escape(MARKER) + r")\S+)")


def known_keys(cfg=None):
    """Every API key the site's settings name or resolve to in this process, and the secret host
    sites sign identities with (``IDENTITY_SECRET``), longest first."""
    cfg = get_config() if cfg is None else cfg
    keys = [cfg["API_KEY"], cfg["IDENTITY_SECRET"], *(entry.get("API_KEY") for entry in cfg["FALLBACKS"]), *credential_values(cfg)]
    return sorted({str(key) for key in keys if key}, key=len, reverse=True)


QUOTED = "[conversation text]"
# Pieces of a sent text looked for in a provider's error: a quote of part of a message is found too.
_WINDOW, _STRIDE = 24, 8
_quoted = contextvars.ContextVar("conversations_quoted", default=())


@contextlib.contextmanager
def quoting(texts):
    """While a provider call runs: the texts it sends (the conversation's messages), which a
    provider's error may quote back (a content filter's "Your message '…' was flagged"); ``redact``
    hides them from log lines and call records unless ``DEBUG``."""
    token = _quoted.set(tuple(sorted({t for t in texts if isinstance(t, str) and len(t.strip()) >= 8},
                                     key=len, reverse=True)))
    try:
        yield
    finally:
        _quoted.reset(token)


def texts_in(value, skip=("model", "tools")):
    """Every string in ``value`` (a request payload, a tool call's arguments: JSON-like lists and
    dicts), leaving out the values of the keys in ``skip``, for ``quoting``."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [text for key, item in value.items() if key not in skip for text in texts_in(item, skip)]
    if isinstance(value, (list, tuple)):
        return [text for item in value for text in texts_in(item, skip)]
    return []


def hide_quoted(text):
    """``text`` without what the call in progress sent (``quoting``), whole or in part."""
    if settings.DEBUG:
        return text
    for sent in _quoted.get():
        if sent in text:
            text = text.replace(sent, QUOTED)
        for start in range(0, max(len(sent) - _WINDOW, 0) + 1, _STRIDE):
            piece = sent[start:start + _WINDOW]
            if len(piece) >= 8 and piece in text:
                text = text.replace(piece, QUOTED)
    return text


def hide_keys(text, *secrets):
    """``text`` with ``secrets`` and every key the site knows replaced by ``MARKER``."""
    text = "" if text is None else str(text)
    for key in sorted({str(s) for s in secrets if s} | set(known_keys()), key=len, reverse=True):
        if len(key) >= 4 and key in text:
            text = text.replace(key, MARKER)
    return text


def redact(text, *secrets, limit=300):
    """Text a provider sent, for a log line or ``CallRecord.detail``: the keys hidden as by
    ``hide_keys``, anything key-like too, and (unless ``DEBUG``) what the call sent that the
    text quotes (``quoting``), shortened to ``limit`` characters."""
    text = _SECRETISH.sub(MARKER, hide_quoted(hide_keys(text, *secrets)))
    return text if len(text) <= limit else text[: limit - 1] + "…"


class ExceptionReporterFilter(SafeExceptionReporterFilter):
    """Django's filter for error reports (the DEBUG page, the mails to ``ADMINS``), which hides
    settings whose names look secret (``API_KEY``, ``IDENTITY_SECRET``), hiding the site's keys
    too where their names do not: ``CREDENTIALS`` maps names the site chose to bare keys, so the
    whole setting is hidden, and a frame's variable holding a known key (a string, or a
    configuration dict) is cleansed as a setting is. Set ``DEFAULT_EXCEPTION_REPORTER_FILTER =
    "conversations.redaction.ExceptionReporterFilter"``; check conversations.W042 warns while the
    site's filter would show a key."""

    hidden_settings = re.compile(SafeExceptionReporterFilter.hidden_settings.pattern + "|CREDENTIAL", flags=re.I)

    def cleanse_special_types(self, request, value):
        """A frame variable as the report shows it: a dict cleansed like a setting, a string with a
        known key in it with the key hidden."""
        value = super().cleanse_special_types(request, value)
        if isinstance(value, dict):
            return self.cleanse_setting("", value)
        if isinstance(value, str):
            try:
                return hide_keys(value)
            except Exception:  # noqa: BLE001 - a broken configuration must not break the error report
                return value
        return value


def keys_shown_in_error_reports(filter_class, cfg=None):
    """How many of the site's known keys an error report made with ``filter_class`` (an
    ``ExceptionReporterFilter`` class) would show among the settings."""
    shown = repr(filter_class().get_safe_settings())
    return sum(1 for key in known_keys(cfg) if len(key) >= 4 and key in shown)


# -- personal data: redaction before storage (docs/privacy.md) ------------------------------


def _markers():
    """What a found card number, e-mail address or phone number becomes, in the active language."""
    return {"card": _("[card number removed]"), "email": _("[e-mail address removed]"),
            "phone": _("[phone number removed]")}


def _site_rule(entry):
    """One ``REDACT_PATTERNS`` entry as a callable taking and returning text: a regular expression
    (its matches become "[removed]"), ``{"pattern", "replacement"}``, ``{"callable": dotted path}``
    or a callable. Raises ``ValueError`` (or ``ImportError``) for one that cannot work."""
    if callable(entry):
        return entry
    if isinstance(entry, str):
        entry = {"pattern": entry}
    if isinstance(entry, Mapping) and "callable" in entry:
        return import_string(entry["callable"])
    if isinstance(entry, Mapping) and "pattern" in entry:
        compiled = re.compile(entry["pattern"])
        replacement = entry.get("replacement")
        return lambda text: compiled.sub(lambda match: replacement or _("[removed]"), text)
    raise ValueError(f"{entry!r} is not a pattern, a {{'pattern': …}} or {{'callable': …}} dict, or a callable")


def redaction_problems(kinds, patterns):
    """Why ``REDACT`` ``kinds`` or ``REDACT_PATTERNS`` cannot work: a list of sentences."""
    problems = [f"REDACT names {kind!r}, which is not one of {', '.join(KINDS)}" for kind in kinds
                if kind not in KINDS]
    for entry in patterns:
        try:
            _site_rule(entry)
        except (ValueError, ImportError, re.error) as exc:
            problems.append(f"REDACT_PATTERNS: {exc}")
    return problems


class Scrubber:
    """What ``cfg`` (a turn's configuration: ``REDACT``, ``REDACT_PATTERNS``) says must not be
    stored, replaced in text (``text``), JSON-like values (``value``) and a growing answer
    (``growing``). The site's rules are built once, at the first text that needs them: a turn
    builds one and scrubs every streamed piece of its answer with it; a message stored alone is
    ``Scrubber(cfg).text(content)``."""

    def __init__(self, cfg):
        self.kinds, self.patterns = tuple(cfg["REDACT"]), cfg["REDACT_PATTERNS"]
        self.on = bool(self.kinds or self.patterns)

    @functools.cached_property
    def rules(self):
        return [_site_rule(entry) for entry in self.patterns]

    def text(self, text):
        """``text`` with what must not be stored replaced; ``text`` itself when nothing is to be."""
        if not text or not isinstance(text, str) or not self.on:
            return text
        return scrub(text, self.kinds, _markers(), self.rules)[0]

    def value(self, value):
        """``value`` (text, or JSON-like lists and dicts of it: tool call arguments) scrubbed as
        ``text`` scrubs text."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.value(item) for item in value]
        if isinstance(value, dict):
            return {key: self.value(item) for key, item in value.items()}
        return value

    def growing(self, text):
        """A streamed answer so far, scrubbed as ``text`` does, without its unfinished end (a
        number or address still being written would not be found yet)."""
        if not text or not self.on:
            return text
        return _UNFINISHED.sub("", self.text(text))


# The end of a growing answer that may be the start of a card number, phone number or e-mail
# address still being written: held back until the next words show what it is.
_UNFINISHED = re.compile(r"(?:\+?\d[\d .()\-/]*|\S*@\S*)$")
