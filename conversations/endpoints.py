"""Where a turn's provider calls may go, and which key may go with each.

**Endpoints set in the admin are allow-listed.** An assistant's own endpoint (or a fallback's)
must have the origin of a vendor's public API, of the site's own ``BASE_URL`` or ``FALLBACKS``,
or match ``ALLOWED_ENDPOINTS`` (``endpoint_rule``). Only an origin written out (the site's, or
an entry without ``*`` in its host) may be at a private, loopback, link-local or metadata
address; for the others the worker resolves the host once, checks the address and connects to
that address (``watchdog.AddressGuard``), so a name that resolves to a public address when the
form is saved and to 169.254.169.254 when the call is made is refused. Endpoints in settings
are the operator's word and are not checked. The provider an assistant names must be a
built-in one, the site's, or listed in ``ALLOWED_PROVIDERS``: the web process imports nothing
else.

**Keys are bound to origins.** A ``CREDENTIALS`` entry is ``{"KEY": "sk-…" or "env:VAR",
"ORIGINS": ["https://gw.example.com", …]}``; a bare string (a key, or ``env:VAR``) may go only
to the default origin of the provider it is used with (``https://api.openai.com`` for
``openai``). The site's ``API_KEY`` goes to the site's ``BASE_URL`` (or its provider's default),
a ``FALLBACKS`` entry's ``API_KEY`` to that entry's. The job hands each provider its key as a
``BoundKey`` (the key and its origins), and the HTTP layer checks the origin of every request
right before sending it (``check_key``): a key is never put into a request for an origin it
is not bound to, whatever the admin says.

**A URL is read once.** ``locate`` is the one parse of a URL that keys and endpoints are checked
against: a plain ``scheme://host[:port]/path[?query]`` that urllib3 (which ``requests`` connects
with) reads the same way, or nothing; providers rebuild the request URL from its parts.
"""

import functools
import ipaddress
import os
import re
from typing import NamedTuple, Optional
from urllib.parse import urlsplit

from urllib3.exceptions import LocationParseError
from urllib3.util import parse_url

from django.utils.module_loading import import_string
from django.utils.translation import gettext as _

from .conf import get_config

ENV_PREFIX = "env:"
_DEFAULT_PORTS = {"http": 80, "https": 443}


# A plain URL in the strict RFC 3986 sense: a scheme, a host (a name of ASCII letters, digits,
# "-" and "_", an IPv4 address, or an IPv6 one in brackets without a zone), a port of digits, then
# a path and a query of URI characters only. No user information, backslash, space, control
# character or percent-encoding before the path: each is a place where two parsers may read two
# different hosts out of one string (urlsplit reads "a\\@b" as host b, urllib3 as host a).
_PLAIN_URL = re.compile(
    r"(?P<scheme>[a-z][a-z0-9+.-]*)://"
    r"(?P<host>\[[0-9a-f:.]+\]|[a-z0-9_-]+(?:\.[a-z0-9_-]+)*\.?)"
    r"(?::(?P<port>[0-9]{1,5}))?"
    r"(?P<path>/(?:[a-z0-9._~!$&'()*+,;=:@/-]|%[0-9a-f]{2})*)?"
    r"(?P<query>\?(?:[a-z0-9._~!$&'()*+,;=:@/?-]|%[0-9a-f]{2})*)?",
    re.IGNORECASE)


class Location(NamedTuple):
    """Where a URL goes, as the HTTP client connects: ``scheme`` and ``host`` lower-cased (an IPv6
    host in brackets), ``port`` (None: the scheme's default), ``path`` and ``query`` (with its ``?``)."""

    scheme: str
    host: str
    port: Optional[int]
    path: str
    query: str

    @property
    def origin(self):
        """``scheme://host[:port]``, without the scheme's default port."""
        default = self.port is None or self.port == _DEFAULT_PORTS.get(self.scheme)
        return f"{self.scheme}://{self.host}" + ("" if default else f":{self.port}")

    @property
    def url(self):
        """The URL rebuilt from its parts: what a request is sent to."""
        port = "" if self.port is None else f":{self.port}"
        return f"{self.scheme}://{self.host}{port}{self.path}{self.query}"


def locate(url):
    """The ``Location`` of ``url``, or None when it is not a plain URL (``_PLAIN_URL``) or when
    urllib3, which ``requests`` connects with, would read another scheme, host or port out of it.
    The one parse of a URL that a key or an endpoint is checked against: whatever it refuses is
    never sent anywhere with a key, and whatever it accepts is where the socket goes.

    Each answer is kept (a ``Location`` cannot change): a turn asked it six times for every model
    call (the endpoint, the origins its key and proxy are checked for), each time parsing the same
    URL twice. The most recently asked URLs only, so that headers anyone may send fill no memory."""
    return _locate(url) if isinstance(url, str) else None


@functools.lru_cache(maxsize=256)
def _locate(text):
    match = _PLAIN_URL.fullmatch(text)
    if not match:
        return None
    port = int(match["port"]) if match["port"] is not None else None
    if port is not None and not 0 < port < 65536:
        return None
    if match["host"].startswith("["):
        try:
            ipaddress.IPv6Address(match["host"][1:-1])
        except ValueError:
            return None
    location = Location(match["scheme"].lower(), match["host"].lower(), port, match["path"] or "",
                        match["query"] or "")
    try:
        client = parse_url(text)
    except LocationParseError:
        return None
    if ((client.scheme or "").lower(), (client.host or "").lower(), client.port) != location[:3]:
        return None
    return location


def origin(url):
    """``scheme://host[:port]`` of ``url``, lower-cased, without a default port; "" for none: a URL
    that is not plain (``locate``), such as a header or setting anyone may write (a bracket
    without its pair, a port out of range, a backslash or user information before the host)."""
    location = locate(url)
    return location.origin if location else ""


# An origin pattern: a scheme, a host that may hold "*" (any characters), and "*" or a number as port.
_PATTERN = re.compile(r"^https?://(\[[0-9a-f:.]+\]|[a-z0-9*._-]+)(:(\*|[0-9]+))?$")


def origin_pattern(value):
    """``value`` (an origin, or one with ``*`` wildcards: ``https://*.example.com``,
    ``http://127.0.0.1:*``) in the form ``origin_allowed`` compares; "" when it is neither."""
    text = str(value or "").strip().rstrip("/").lower()
    if "*" not in text:
        try:
            parts = urlsplit(text)
        except ValueError:  # a bracket without its pair
            return ""
        if parts.path or parts.query or parts.fragment:  # an origin has none: a path would be ignored
            return ""
        text = origin(text)
    return text if _PATTERN.match(text) else ""


def origin_allowed(target, patterns):
    """Whether origin ``target`` matches one of ``patterns`` (see ``origin_pattern``); only ``*`` is
    special (not fnmatch's ``[…]``, which an IPv6 origin holds)."""
    compiled = [re.compile(re.escape(origin_pattern(p)).replace(r"\*", ".*")) for p in patterns if origin_pattern(p)]
    return bool(target) and any(pattern.fullmatch(target) for pattern in compiled)


# A page origin allowed to embed the widget: written out, or "*." before a domain of two labels at
# least (https://*.example.com); a port, if any, written out too. Broader ones ("https://*",
# "http://*.com") would let pages of anyone embed it. Without a public suffix list, "*.co.uk" or
# "*.github.io" pass, and are as broad: the docs warn (docs/widget.md, SECURITY.md).
_EMBED_WILDCARD = re.compile(r"^https?://\*\.[a-z0-9-]+(\.[a-z0-9-]+)+(:[0-9]+)?$")


def is_embed_origin(value):
    """Whether ``value`` may be an allowed page origin (``ALLOWED_ORIGINS``, an assistant's
    allowed origins): an exact origin, or ``scheme://*.domain``."""
    pattern = origin_pattern(value)
    return bool(pattern) and ("*" not in pattern or bool(_EMBED_WILDCARD.match(pattern)))


def embed_origin_allowed(target, patterns):
    """Whether the page origin ``target`` matches one of ``patterns``, the well-formed ones only
    (``is_embed_origin``): a wildcard stands for one or more labels before its domain."""
    return origin_allowed(target, [p for p in patterns if is_embed_origin(p)])


def calls_url(provider, base_url=""):
    """The URL calls of ``provider`` (a name in ``PROVIDER``) go to: ``base_url``, or when it is
    empty the provider's default; "" when the provider cannot be loaded or calls nothing
    (``demo``), or is not one the site allows (``provider_problem``: nothing else is imported).
    The one rule for it: the key bindings, the checks and ``provider_health`` agree."""
    if base_url:
        return base_url
    if provider_problem(provider, get_config()):
        return ""
    try:
        # By its dotted path, not through conversations.providers: they call through the HTTP
        # layer, which applies the rules of this module.
        return import_string(BUILTIN_PROVIDERS.get(provider, provider)).default_base_url or ""
    except (ImportError, TypeError, ValueError, AttributeError):
        return ""


def default_origin(provider):
    """The origin a provider (a name in ``PROVIDER``) calls when no ``BASE_URL`` is set; "" when it
    cannot be loaded or calls nothing (``demo``)."""
    return origin(calls_url(provider))


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
    """A credential cannot be resolved; ``reason`` says why, for the admin form and the log."""

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


def unset_variable(value):
    """The variable an ``env:VARIABLE`` credential value names, when it is unset or empty in this
    process (a credential that cannot be read here); "" otherwise. For the job and check W040."""
    if not value.startswith(ENV_PREFIX):
        return ""
    variable = value[len(ENV_PREFIX):]
    return "" if os.environ.get(variable) else variable


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
    if unset_variable(value):
        raise CredentialError(_("the environment variable %(variable)s of its credential “%(name)s” is not "
                                "set.") % {"variable": unset_variable(value), "name": name})
    if value.startswith(ENV_PREFIX):
        value = os.environ[value[len(ENV_PREFIX):]]
    if provider is None:
        return value
    return BoundKey(value, origins if origins is not None else [default_origin(provider)])


def credential_values(cfg=None):
    """Every API key the site's credentials resolve to here (for redaction)."""
    cfg = get_config() if cfg is None else cfg
    values = []
    for name in cfg["CREDENTIALS"]:
        try:
            values.append(resolve_credential(name, cfg))
        except CredentialError:
            pass
    return values


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
    request that carries the key nowhere (headers or URL) passes."""
    if not key or not (key in url or any(key in str(value) for value in headers.values())):
        return
    target = origin(url)
    if not origin_allowed(target, getattr(key, "origins", ())):
        allowed = ", ".join(getattr(key, "origins", ())) or "no origin"
        raise KeyNotBound(f"the key is bound to {allowed}, not to {target or url!r}: not sent")


# -- endpoints and providers set in the admin ------------------------------------------------

# The built-in providers, by name: the dotted path of each class.
BUILTIN_PROVIDERS = {
    "demo": "conversations.providers.demo.DemoProvider",
    "openai": "conversations.providers.openai.OpenAIProvider",
    "anthropic": "conversations.providers.anthropic.AnthropicProvider",
}


def allowed_providers(cfg):
    """The provider names an assistant may use: the built-in ones, the site's own and its
    fallbacks', and ``ALLOWED_PROVIDERS``."""
    names = [*BUILTIN_PROVIDERS, cfg["PROVIDER"], *(entry.get("PROVIDER") for entry in cfg["FALLBACKS"]),
             *cfg["ALLOWED_PROVIDERS"]]
    return tuple(dict.fromkeys(name for name in names if isinstance(name, str) and name))


def provider_problem(name, cfg):
    """Why an assistant may not name provider ``name`` (checked before anything is imported), or None."""
    if name in allowed_providers(cfg):
        return None
    return _("its provider “%(provider)s” is not one this site allows (a built-in one, the site's own, or a "
             "dotted path in ALLOWED_PROVIDERS).") % {"provider": name}


def _written_out(pattern):
    """Whether an origin pattern names its host without a wildcard."""
    match = _PATTERN.match(origin_pattern(pattern))
    return bool(match) and "*" not in match.group(1)


def endpoint_rule(url, cfg):
    """What an endpoint set in the admin may connect to: ``"any"`` address (an origin the
    operator wrote out: the site's ``BASE_URL`` or a ``FALLBACKS`` one, an ``ALLOWED_ENDPOINTS``
    entry whose host has no ``*``), ``"public"`` addresses only (a vendor's public origin, or a
    wildcard entry), or None: not allowed at all."""
    target = origin(url)
    if not target:
        return None
    site = [endpoint_origin(cfg["PROVIDER"], cfg["BASE_URL"]),
            *(endpoint_origin(e.get("PROVIDER", ""), e.get("BASE_URL", "")) for e in cfg["FALLBACKS"])]
    listed = list(cfg["ALLOWED_ENDPOINTS"])
    if origin_allowed(target, [*site, *(p for p in listed if _written_out(p))]):
        return "any"
    vendors = [default_origin(name) for name in BUILTIN_PROVIDERS]
    if origin_allowed(target, [*vendors, *listed]):
        return "public"
    return None


def address_allowed(address, rule):
    """Whether an endpoint under ``rule`` (``endpoint_rule``) may connect to IP ``address``: a
    public one, unless the rule allows any. Private, loopback, link-local (the cloud metadata
    service, 169.254.169.254), shared, reserved and multicast addresses are not public; an
    IPv6 address that carries an IPv4 one counts as that address (``carried_ipv4``); the
    deprecated site-local ``fec0::/10`` is not public."""
    if rule == "any":
        return True
    if rule != "public":
        return False
    ip = ipaddress.ip_address(str(address).split("%", 1)[0])
    ip = carried_ipv4(ip) or ip
    return ip.is_global and not ip.is_multicast and not getattr(ip, "is_site_local", False)


# IPv6 prefixes whose last 32 bits are an IPv4 address a gateway forwards to: NAT64's well-known
# and local-use prefixes (RFC 6052, RFC 8215) and the deprecated IPv4-compatible form (::a.b.c.d).
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


def carried_ipv4(ip):
    """The IPv4 address an IPv6 address ``ip`` carries (mapped ``::ffff:a.b.c.d``, 6to4
    ``2002::/16``, NAT64, IPv4-compatible, Teredo's client), or None."""
    if ip.version != 6:
        return None
    if ip.ipv4_mapped or ip.sixtofour:
        return ip.ipv4_mapped or ip.sixtofour
    if ip.teredo:
        return ip.teredo[1]
    if any(ip in network for network in _NAT64) or (ip in _IPV4_COMPATIBLE and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def plain_url_problem(url):
    """Why ``url`` cannot be an endpoint that a key may go to, or None: it is not a plain URL
    (``locate``), so the HTTP client might connect to another host than the one it names."""
    if locate(url):
        return None
    return _("its endpoint “%(url)s” is not a plain URL of the form scheme://host[:port]/path: no user name, "
             "backslash, space, control character or percent-encoding may come before the path.") % {"url": url}


def endpoint_problem(url, cfg):
    """Why an endpoint may not be set in the admin, or None: it is not a plain URL, its origin is
    not allowed, or it is an address (written as such) that its rule does not allow."""
    if plain_url_problem(url):
        return plain_url_problem(url)
    rule = endpoint_rule(url, cfg)
    if rule is None:
        return _("its endpoint %(origin)s is not one this site allows (a vendor's, the site's own, or one in "
                 "ALLOWED_ENDPOINTS).") % {"origin": origin(url)}
    host = locate(url).host.strip("[]")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return None  # a name: its addresses are checked when the worker connects
    if not address_allowed(host, rule):
        return _("its endpoint %(origin)s is a private, loopback or link-local address, which ALLOWED_ENDPOINTS "
                 "does not list.") % {"origin": origin(url)}
    return None
