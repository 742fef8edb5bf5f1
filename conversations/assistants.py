"""Assistants: configurations edited in the admin, each answering the conversations started with it.

A site with no assistant works from its ``CONVERSATIONS`` settings alone, which stay the
defaults of every assistant. An assistant replaces what makes an answer — prompt, provider,
model, endpoint, tools — and the limits it sets (``LIMITS``); it names a credential instead of
holding an API key. Its ``fallbacks``, when set, replace the site's ``FALLBACKS`` (None keeps
the site's, ``[]`` has none); each names a credential too.

- ``settings_for(assistant)``: the site's configuration with the assistant's own over it (no
  credential read, no tool imported): what the web process needs (the job timeout, the
  provider and model a queued turn shows).
- ``problems(assistant)``: why it cannot answer, field by field: the admin refuses to save it,
  a system check lists it, a turn of it ends failed.
- ``chain_problems(fallbacks, site)``: why a chain of fallbacks cannot work, the assistant's own
  or (``settings=True``) the site's ``FALLBACKS``: one rule, which ``problems`` and the site's
  check (conversations.E013) both report.

What needs the database (the configuration a turn runs with, the versions, the active
assistants' chains) is ``engine.configure``.
"""

import hashlib
import logging
from collections.abc import Mapping

from django.core.checks import Error, Warning
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.utils.translation import gettext as _

from .conf import get_config
from .endpoints import (
    CredentialError, bind_settings_key, credential_parts, credential_shape_problem, endpoint_origin,
    endpoint_problem, is_embed_origin, origin_allowed, plain_url_problem, provider_problem, resolve_credential,
    unset_variable,
)
from .tools import canonical_arguments, load_tools
from .core.rules import clock_errors, reserve_errors
from .core.types import ErrorCode
from .providers import get_provider_class
from .knowledge.registry import sources as knowledge_sources

logger = logging.getLogger("conversations.assistants")

# The keys of an entry of ``Assistant.fallbacks``; upper-cased, those of a ``FALLBACKS`` entry.
CHAIN_KEYS = ("provider", "model", "base_url", "credential")

# The fields that decide where an assistant's calls go and with which key: editing them, in the
# assistant or in a draft of it, needs the ``configure_provider`` permission.
CONFIGURE_FIELDS = ("provider", "base_url", "credential", "fallbacks")

# Assistant field → the setting it replaces when set (None keeps the site's).
LIMITS = {"max_steps": "MAX_STEPS", "max_tokens": "MAX_TOKENS", "call_timeout": "CALL_TIMEOUT",
          "job_timeout": "JOB_TIMEOUT"}


class NotSetUp(Exception):
    """A turn's assistant cannot answer it. ``message`` is the sentence the visitor is shown, the
    same whatever broke; ``reason`` says what (a provider that cannot be imported, a credential
    or tool by name), for the operator only: the log and the admin's timeline, where it is
    recorded after ``kind``."""

    kind = "not set up"

    def __init__(self, assistant, reason):
        self.reason = reason
        self.message = not_set_up_message(assistant)
        super().__init__(f"{assistant.slug}: {reason}")


def not_set_up_message(assistant):
    return _("The assistant “%(name)s” is not set up correctly, so it cannot answer right now.") % {
        "name": assistant.name}


class Inactive(NotSetUp):
    def __init__(self, assistant):
        super().__init__(assistant, "it is switched off (not active)")
        self.message = _("The assistant “%(name)s” is no longer available. Please start a new conversation.") % {
            "name": assistant.name}


class NoAccess(NotSetUp):
    """The turn's owner may no longer chat with its assistant (``Assistant.allows``): their
    access was taken away after the conversation started."""

    kind = "refused"

    def __init__(self, assistant):
        super().__init__(assistant, "the owner may not use it")
        self.message = _("The assistant “%(name)s” is not available to you any more.") % {"name": assistant.name}


def access_refused_message(assistant, user):
    """The sentence a visitor reads when ``assistant`` does not allow them (``Assistant.allows``)."""
    if assistant.access == assistant.Access.SIGNED_IN and not (user is not None and user.is_authenticated):
        return _("Please sign in to chat with this assistant.")
    return _("This assistant is not available to you.")


def overrides(assistant):
    """The settings ``assistant`` replaces: ``{KEY: value}``."""
    values = {"SYSTEM_PROMPT": assistant.system_prompt, "PROVIDER": assistant.provider,
              "MODEL": assistant.model, "BASE_URL": assistant.base_url}
    values.update({key: getattr(assistant, field) for field, key in LIMITS.items()
                   if getattr(assistant, field) is not None})
    if assistant.fallbacks is not None:
        values["FALLBACKS"] = chain_settings(assistant.fallbacks)
    if isinstance(assistant.redact, list):
        values["REDACT"] = tuple(assistant.redact)
    if assistant.retention_days is not None:
        values["RETENTION_DAYS"] = assistant.retention_days
    if assistant.retention_from:
        values["RETENTION_FROM"] = assistant.retention_from
    return values


def chain_settings(fallbacks):
    """An assistant's ``fallbacks`` as ``FALLBACKS`` entries: upper-case keys, the credential still
    a name. Entries that are not a dict naming a provider are left out here (``problems`` names
    them), so that the web process never fails on a chain saved before it broke."""
    if not isinstance(fallbacks, list):
        return ()
    return tuple({**{key.upper(): entry[key] for key in CHAIN_KEYS if entry.get(key)},
                  "ADMIN_ENDPOINT": bool(entry.get("base_url"))}  # its connections are checked (endpoints)
                 for entry in fallbacks
                 if isinstance(entry, dict) and entry.get("provider") and isinstance(entry["provider"], str))


def settings_for(assistant, cfg=None):
    """The configuration a turn of ``assistant`` runs with, before its credential and tools are
    resolved; the site's (``cfg``, by default ``get_config()``) for None. An assistant with no
    endpoint of its own and the site's provider calls the site's ``BASE_URL`` (a site on a
    gateway, Azure or a local model never sends its turns to the vendor's default host)."""
    cfg = get_config() if cfg is None else cfg
    if assistant is None:
        return cfg
    values = overrides(assistant)
    if not values["BASE_URL"] and values["PROVIDER"] == cfg["PROVIDER"]:
        values["BASE_URL"] = cfg["BASE_URL"]
    return {**cfg, **values}


def assistant_key(assistant, config, site):
    """The key a turn of ``assistant`` (running with ``config``) sends, bound to where it may go:
    its credential's; else the site's ``API_KEY``, only when its endpoint has the site's origin
    (an endpoint of its own never gets the site's key); else none. Raises ``CredentialError``."""
    if assistant.credential:
        return resolve_credential(assistant.credential, site, provider=config["PROVIDER"])
    site_key = bind_settings_key(site)
    if site_key and origin_allowed(endpoint_origin(config["PROVIDER"], config["BASE_URL"]), site_key.origins):
        return site_key
    return ""


# -- credentials -------------------------------------------------------------------------


# -- what can be known before a turn -----------------------------------------------------------


def registered_tools(cfg=None):
    """The site's tools ``{name: dotted path}``; raises what ``load_tools`` raises."""
    cfg = get_config() if cfg is None else cfg
    return {next(iter(load_tools([path]))): path for path in cfg["TOOLS"]}


def max_prompt_chars(cfg):
    """The longest system prompt: half of ``HISTORY_MAX_CHARS``. The prompt is sent with every call
    and counts against that budget (``history.trim_history``), so a longer one would leave less
    room for the conversation than for itself: earlier exchanges would be dropped within a turn
    or two."""
    return cfg["HISTORY_MAX_CHARS"] // 2


def problems(assistant, cfg=None):
    """Why ``assistant`` cannot answer, as ``[(field or None, reason)]`` (empty when it can).

    Only what can be known without calling the provider: a model name that the provider's
    server rejects shows at the first turn (which ends failed, naming the assistant).
    """
    site = get_config() if cfg is None else cfg
    found = []
    refusal = provider_problem(assistant.provider, site)  # before importing anything it names
    if refusal:
        found.append(("provider", refusal))
    else:
        try:
            cls = get_provider_class(assistant.provider)
        except (ImportError, TypeError, ValueError) as exc:
            found.append(("provider", _("its provider “%(provider)s” cannot be used (%(error)s).") % {
                "provider": assistant.provider, "error": exc}))
        else:
            refusal = cls.check_model(assistant.model)
            if refusal:
                found.append(("model", str(refusal)))
    if assistant.base_url:
        refusal = endpoint_problem(assistant.base_url, site)
        if refusal:
            found.append(("base_url", refusal))
    if not isinstance(assistant.tools, list) or not all(isinstance(name, str) for name in assistant.tools):
        found.append(("tools", _("its tools must be a list of tool names.")))
    else:
        try:
            known = registered_tools(site)
        except (ImportError, TypeError, ValueError):
            known = None  # the site's own tools are broken: conversations.E011 says so
        missing = sorted(set(assistant.tools) - set(known)) if known is not None else []
        if missing:
            found.append(("tools", _("its tools %(tools)s are not among the site's registered tools.") % {
                "tools": ", ".join(f"“{name}”" for name in missing)}))
    asked = getattr(assistant, "approval_tools", None) or []
    if not isinstance(asked, list) or not all(isinstance(name, str) for name in asked):
        found.append(("approval_tools", _("its tools that need an approval must be a list of tool names.")))
    elif isinstance(assistant.tools, list) and set(asked) - set(assistant.tools):
        found.append(("approval_tools", _("%(tools)s must also be among its tools.") % {
            "tools": ", ".join(f"“{name}”" for name in sorted(set(asked) - set(assistant.tools)))}))
    chosen = getattr(assistant, "knowledge_sources", None) or []
    if not isinstance(chosen, list) or not all(isinstance(name, str) for name in chosen):
        found.append(("knowledge_sources", _("its knowledge sources must be a list of source names.")))
    elif set(chosen) - set(knowledge_sources()):
        found.append(("knowledge_sources", _("its knowledge sources %(sources)s are not registered.") % {
            "sources": ", ".join(f"“{name}”" for name in sorted(set(chosen) - set(knowledge_sources())))}))
    if assistant.credential:
        config = settings_for(assistant, site)
        reason = credential_problem(assistant.credential, config["PROVIDER"], config["BASE_URL"], site)
        if reason:
            found.append(("credential", reason))
    limit = max_prompt_chars(site)
    if len(assistant.system_prompt or "") > limit:
        found.append(("system_prompt", _("its system prompt has %(length)d characters; at most %(limit)d (half of "
                                         "HISTORY_MAX_CHARS) are allowed.") % {
            "length": len(assistant.system_prompt), "limit": limit}))
    if not isinstance(assistant.suggestions, list) or len(assistant.suggestions) > assistant.MAX_SUGGESTIONS or any(
            not isinstance(s, str) or not s.strip() or len(s) > assistant.SUGGESTION_MAX_LENGTH
            for s in assistant.suggestions):
        found.append(("suggestions", _("at most %(count)d suggested questions, each of 1 to %(length)d "
                                       "characters.") % {"count": assistant.MAX_SUGGESTIONS,
                                                         "length": assistant.SUGGESTION_MAX_LENGTH}))
    origins = assistant.allowed_origins
    if not isinstance(origins, list) or not all(isinstance(o, str) and is_embed_origin(o) for o in origins):
        found.append(("allowed_origins", _("each line must be an origin, scheme://host[:port] "
                                           "(https://www.example.com), or https://*.example.com for every "
                                           "subdomain of a domain.")))
    # Its warnings too: the form refuses a credential it cannot read, a fallback's as the assistant's own.
    found += [("fallbacks", problem.msg) for problem in chain_problems(assistant.fallbacks, site)]
    clocks = settings_for(assistant, site)
    for error in clock_errors(clocks):
        if error.is_serious():
            fields = [f for f, key in LIMITS.items() if getattr(assistant, f) is not None and key in error.msg]
            found.append((fields[0] if fields else None, error.msg))
    # An inherited chain under the site's clocks is the site's check (conversations.E014, E017).
    if assistant.fallbacks or (clocks["FALLBACKS"] and assistant.job_timeout is not None):
        found += [("job_timeout" if error.id == "conversations.E017" and assistant.job_timeout is not None
                   else "fallbacks", error.msg) for error in reserve_errors(clocks)]
    return found


def credential_problem(name, provider, base_url, site):
    """Why credential ``name`` cannot be sent with calls of ``provider`` to ``base_url`` (its
    default when empty): it cannot be read here, or ``CREDENTIALS`` does not bind it to that
    origin (the worker would refuse to send it, ``endpoints.check_key``). None when it can."""
    try:
        key = resolve_credential(name, site, provider=provider)
    except CredentialError as exc:
        return exc.reason
    if base_url and plain_url_problem(base_url):
        return plain_url_problem(base_url)
    target = endpoint_origin(provider, base_url)
    if target and not origin_allowed(target, key.origins):  # no origin: a provider that calls nothing (demo)
        return _("its credential “%(name)s” may not be sent to %(origin)s: CREDENTIALS binds it to %(origins)s.") % {
            "name": name, "origin": target, "origins": ", ".join(key.origins) or "—"}
    return None


def chain_problems(fallbacks, site, *, settings=False):
    """Why a chain of fallbacks cannot work, entry by entry, as check messages whose ``msg`` is the
    reason ("in its fallback 2, …"). The one rule for both chains: an assistant's ``fallbacks``
    (``CHAIN_KEYS``), whose reasons ``problems`` gives under the form's field, and with
    ``settings`` the site's ``FALLBACKS`` (the same keys in upper case, and an ``API_KEY`` in
    place of a credential: settings are the operator's, while keys never enter the database),
    which ``checks`` reports as conversations.E013. Each entry meets the rules of an assistant's
    own provider: one that loads and takes its model, an endpoint that is a URL the site allows,
    a credential that exists and is bound to that endpoint. A credential whose ``env:`` variable
    is unset in this process is a ``Warning`` (conversations.W040): the workers, which read it,
    may have it; the form refuses it all the same, as it does an assistant's own."""
    if fallbacks is None:
        return []
    if not isinstance(fallbacks, (list, tuple)) or not all(isinstance(entry, Mapping) for entry in fallbacks):
        return [Error(_("its fallbacks must be a list of providers, each {\"provider\": …, \"model\": …, "
                        "\"base_url\": …, \"credential\": …}."), id="conversations.E013")]
    return [problem for number, entry in enumerate(fallbacks, start=1)
            for problem in _entry_problems(number, entry, site, settings)]


def _entry_problems(number, entry, site, settings):
    """``chain_problems`` for one entry, the ``number``-th."""
    spelled = {key: key.upper() if settings else key for key in CHAIN_KEYS}
    known = [*spelled.values(), *(["API_KEY"] if settings else [])]
    found = []
    unknown = sorted(str(key) for key in set(entry) - set(known))
    if unknown:
        keys = ", ".join(unknown)
        found.append(_("its fallback %(number)d has unknown keys: %(keys)s (an entry takes PROVIDER, MODEL, BASE_URL "
                       "and either API_KEY or CREDENTIAL).") % {"number": number, "keys": keys} if settings else
                     _("its fallback %(number)d has unknown keys: %(keys)s (an entry takes provider, model, base_url "
                       "and credential; never an API key).") % {"number": number, "keys": keys})
    if not all(isinstance(entry.get(key, ""), str) for key in known):
        found.append(_("its fallback %(number)d must give its PROVIDER, MODEL, BASE_URL, API_KEY and CREDENTIAL as "
                       "text.") % {"number": number} if settings else
                     _("its fallback %(number)d must give its provider, model, base_url and credential as text.") % {
                         "number": number})
        return [Error(reason, id="conversations.E013") for reason in found]
    provider, model, base_url, credential = (entry.get(spelled[key], "") for key in CHAIN_KEYS)

    def refused(reason):  # a reason that also stops an assistant's own provider, said of this entry
        return _("in its fallback %(number)d, %(reason)s") % {"number": number, "reason": reason}

    if settings and credential and entry.get("API_KEY"):
        found.append(_("its fallback %(number)d has both API_KEY and CREDENTIAL: keep one.") % {"number": number})
    if not provider:
        found.append(_("its fallback %(number)d names no provider.") % {"number": number})
    elif provider_problem(provider, site):
        found.append(refused(provider_problem(provider, site)))
    else:
        try:
            refusal = get_provider_class(provider).check_model(model)
        except (ImportError, TypeError, ValueError) as exc:
            found.append(_("its fallback %(number)d names a provider “%(provider)s” that cannot be used "
                           "(%(error)s).") % {"number": number, "provider": provider, "error": exc})
        else:
            if refusal:
                found.append(refused(refusal))
    if base_url:
        try:
            URLValidator()(base_url)
        except ValidationError:
            found.append(_("its fallback %(number)d has an endpoint that is not a URL: “%(url)s”.") % {
                "number": number, "url": base_url})
        else:
            if endpoint_problem(base_url, site):
                found.append(refused(endpoint_problem(base_url, site)))
    messages = [Error(reason, id="conversations.E013") for reason in found]
    reason = credential_problem(credential, provider, base_url, site) if credential and provider else None
    if reason:
        if _unset_here(credential, site):
            messages.append(Warning(refused(reason), id="conversations.W040"))
        else:
            messages.append(Error(refused(reason), id="conversations.E013"))
    return messages


def _unset_here(name, site):
    """Whether credential ``name`` is a well-formed ``env:`` one whose variable is unset in this process."""
    value = site["CREDENTIALS"].get(name)
    return value is not None and not credential_shape_problem(value) and bool(
        unset_variable(credential_parts(value)[0]))


# -- the job's side ----------------------------------------------------------------------------


def snapshot(assistant, cfg):
    """What answers for ``assistant`` under ``cfg`` (its settings merged): the part of its
    configuration that a version records and a fingerprint covers. Its chain of fallbacks (its
    own or the site's) is there by credential name, never a key; only when it has one, so that
    an assistant without fallbacks keeps the fingerprint it had before chains existed."""
    data = {"system_prompt": cfg["SYSTEM_PROMPT"], "provider": cfg["PROVIDER"], "model": cfg["MODEL"],
            "base_url": cfg["BASE_URL"], "credential": assistant.credential, "tools": sorted(assistant.tools),
            "limits": {key: cfg[key] for key in LIMITS.values()}}
    if getattr(assistant, "knowledge_sources", None):  # only when set: earlier fingerprints stay as they were
        data["knowledge_sources"] = sorted(assistant.knowledge_sources)
    if getattr(assistant, "approval_tools", None):  # likewise
        data["approval_tools"] = sorted(assistant.approval_tools)
    if cfg["FALLBACKS"]:
        data["fallbacks"] = [{key: entry.get(key.upper()) or "" for key in CHAIN_KEYS} for entry in cfg["FALLBACKS"]]
    return data


def fingerprint(data):
    """The first 12 hex digits of the SHA-256 of ``data`` as canonical JSON (the same text an
    approval's hash is of)."""
    return hashlib.sha256(canonical_arguments(data).encode()).hexdigest()[:12]


# ProviderError codes that mean the assistant's configuration is wrong.
SETUP_CODES = frozenset({ErrorCode.AUTH, ErrorCode.UNKNOWN_MODEL, ErrorCode.STREAM_REFUSED, ErrorCode.REDIRECTED,
                         ErrorCode.KEY_NOT_BOUND, ErrorCode.ENDPOINT_REFUSED})


def has_own_endpoint(assistant):
    """Whether ``assistant`` calls an endpoint set in the admin (its own, or a fallback's)."""
    fallbacks = assistant.fallbacks if isinstance(assistant.fallbacks, list) else []
    return bool(assistant.base_url) or any(isinstance(e, dict) and e.get("base_url") for e in fallbacks)


def provider_error_message(turn, error):
    """The sentence a turn ending with ``error`` (a ``ProviderError``) shows: the provider's own;
    for a configuration the service refused, one naming the turn's assistant; and one sentence
    for every failure of an endpoint set in the admin, so that the answers cannot tell a 401
    from a 404, a refused connection or a time-out (a port and status oracle). The error's
    detail is in the log and the timeline."""
    if turn.assistant_id is None:
        return error.message
    if has_own_endpoint(turn.assistant):
        return _("The assistant “%(name)s” could not answer. Please try again later.") % {
            "name": turn.assistant.name}
    if error.code in SETUP_CODES:
        return not_set_up_message(turn.assistant)
    return error.message
