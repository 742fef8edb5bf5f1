"""The one rule for keeping API keys out of what the operator reads.

Every key the site knows (its ``API_KEY``, its ``FALLBACKS`` keys, each of its ``CREDENTIALS``)
and the key of the call at hand are hidden wherever they appear, with the same marker. Text
that a provider wrote (an error body, an error event in a stream, a malformed event's
excerpt) may quote a key this process does not know (a rotated one, another tenant's), so
there anything key-like is hidden too (``redact``); text the site itself stores (messages, tool
arguments) keeps its words and loses only the known keys (``hide_keys``).
"""

import re

from django.views.debug import SafeExceptionReporterFilter

from .conf import get_config
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
