"""Where a turn's provider calls may go, and which key may go with each.

**Keys are bound to origins.** A ``CREDENTIALS`` entry is ``{"KEY": "sk-…" or "env:VAR",
"ORIGINS": ["https://gw.example.com", …]}``; a bare string (a key, or ``env:VAR``) may go only
to the default origin of the provider it is used with (``https://api.openai.com`` for
``openai``). The site's ``API_KEY`` goes to the site's ``BASE_URL`` (or its provider's default),
a ``FALLBACKS`` entry's ``API_KEY`` to that entry's. The job hands each provider its key as a
``BoundKey`` (the key and its origins), and the HTTP layer checks the origin of every request
right before sending it (``check_key``): a key is never put into a request for an origin it
is not bound to, whatever the admin says.
"""

import fnmatch
import os
import re
from urllib.parse import urlsplit

from django.utils.translation import gettext as _

ENV_PREFIX = "env:"
_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin(url):
    """``scheme://host[:port]`` of ``url``, lower-cased, without a default port; "" for none."""
    parts = urlsplit(str(url or "").strip())
    if not parts.scheme or not parts.hostname:
        return ""
    try:
        port = parts.port
    except ValueError:
        return ""
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    scheme = parts.scheme.lower()
    return f"{scheme}://{host}" + (f":{port}" if port and port != _DEFAULT_PORTS.get(scheme) else "")


# An origin pattern: a scheme, a host that may hold "*" (any characters), and "*" or a number as port.
_PATTERN = re.compile(r"^https?://(\[[0-9a-f:.]+\]|[a-z0-9*._-]+)(:(\*|[0-9]+))?$")


def origin_pattern(value):
    """``value`` (an origin, or one with ``*`` wildcards: ``https://*.example.com``,
    ``http://127.0.0.1:*``) in the form ``origin_allowed`` compares; "" when it is neither."""
    text = str(value or "").strip().rstrip("/").lower()
    if "*" not in text:
        text = origin(text)
    return text if _PATTERN.match(text) else ""


def origin_allowed(target, patterns):
    """Whether origin ``target`` matches one of ``patterns`` (see ``origin_pattern``)."""
    return bool(target) and any(fnmatch.fnmatchcase(target, origin_pattern(p)) for p in patterns if origin_pattern(p))


def default_origin(provider):
    """The origin a provider (a name in ``PROVIDER``) calls when no ``BASE_URL`` is set; "" when it
    cannot be loaded or calls nothing (``demo``)."""
    from .providers import get_provider_class

    try:
        return origin(get_provider_class(provider).default_base_url)
    except (ImportError, TypeError, ValueError):
        return ""


def endpoint_origin(provider, base_url):
    """The origin calls of ``provider`` go to with ``base_url`` (empty: the provider's default)."""
    return origin(base_url) if base_url else default_origin(provider)


class BoundKey(str):
    """An API key with ``origins``, the origins it may be sent to."""

    origins = ()

    def __new__(cls, key, origins):
        value = super().__new__(cls, key)
        value.origins = tuple(sorted({origin_pattern(o) for o in origins if origin_pattern(o)}))
        return value


class CredentialError(LookupError):
    """A credential cannot be resolved; ``reason`` ends "The assistant … is not set up correctly: "."""

    def __init__(self, reason):
        self.reason = reason
        super().__init__(reason)


def credential_shape_problem(value):
    """Why a ``CREDENTIALS`` value is not a credential, or None."""
    if isinstance(value, dict) or hasattr(value, "keys"):
        key, origins = value.get("KEY"), value.get("ORIGINS", ())
        if set(value) - {"KEY", "ORIGINS"}:
            return "takes only KEY and ORIGINS"
        if not isinstance(key, str) or not key or key == ENV_PREFIX:
            return "needs a KEY: an API key or \"env:VARIABLE\" (a non-empty string)"
        if isinstance(origins, str) or not all(isinstance(o, str) and origin_pattern(o) for o in origins):
            return "needs ORIGINS as a list of origins such as \"https://gateway.example.com\""
        return None
    if not isinstance(value, str) or not value or value == ENV_PREFIX:
        return "must be an API key or \"env:VARIABLE\" (a non-empty string), or {\"KEY\": …, \"ORIGINS\": […]}"
    return None


def credential_parts(value):
    """``(key or "env:VAR", origins or None)`` of a ``CREDENTIALS`` value (None: a bare string)."""
    if isinstance(value, str):
        return value, None
    return value.get("KEY"), tuple(value.get("ORIGINS") or ())


def resolve_credential(name, cfg, provider=None):
    """The API key that credential ``name`` stands for: its key itself, or the environment
    variable it names with ``env:`` (read now, in the process that calls). With ``provider``
    (the provider it is used with), a ``BoundKey`` with the origins it may go to. Raises
    ``CredentialError``."""
    credentials = cfg["CREDENTIALS"]
    if name not in credentials:
        raise CredentialError(_("its credential “%(name)s” is not in the site's CREDENTIALS setting.") % {
            "name": name})
    if credential_shape_problem(credentials[name]):
        raise CredentialError(_("its credential “%(name)s” is not a key.") % {"name": name})
    value, origins = credential_parts(credentials[name])
    if value.startswith(ENV_PREFIX):
        variable = value[len(ENV_PREFIX):]
        if not os.environ.get(variable):
            raise CredentialError(_("the environment variable %(variable)s of its credential “%(name)s” is not "
                                    "set.") % {"variable": variable, "name": name})
        value = os.environ[variable]
    if provider is None:
        return value
    return BoundKey(value, origins if origins is not None else [default_origin(provider)])


def bind_settings_key(entry):
    """The ``API_KEY`` of a configuration taken from settings (the site's own, or a ``FALLBACKS``
    entry's), bound to the endpoint those settings name: the operator's word."""
    key = entry.get("API_KEY") or ""
    if not key or isinstance(key, BoundKey):
        return key
    return BoundKey(key, [endpoint_origin(entry.get("PROVIDER", ""), entry.get("BASE_URL", ""))])


class KeyNotBound(Exception):
    """A request would carry a key to an origin it is not bound to; it is not sent."""


def check_key(url, headers, key):
    """Raise ``KeyNotBound`` unless ``key`` (a ``BoundKey``; a plain string counts as bound to
    nothing) may be sent to ``url``. Called with the request's headers right before sending: a
    request that does not carry the key passes."""
    if not key or not any(key in str(value) for value in headers.values()):
        return
    target = origin(url)
    if not origin_allowed(target, getattr(key, "origins", ())):
        allowed = ", ".join(getattr(key, "origins", ())) or "no origin"
        raise KeyNotBound(f"the key is bound to {allowed}, not to {target or url!r}: not sent")
