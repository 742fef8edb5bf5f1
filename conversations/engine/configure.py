"""An assistant's configuration in the job, and what the database keeps of assistants: the
configuration a turn runs with (its credential resolved, its tools narrowed), the version it
records, and the active assistants' chains of providers. What a configuration is and must
satisfy needs no database: ``conversations.assistants``.
"""

import logging

from ..assistants import (Inactive, NoAccess, NotSetUp, assistant_key, fingerprint, problems, registered_tools,
                          settings_for, snapshot)
from ..conf import get_config
from ..endpoints import CredentialError, resolve_credential
from ..models import Assistant, AssistantVersion

logger = logging.getLogger("conversations.assistants")


def record_version(assistant, cfg):
    """The ``AssistantVersion`` of ``assistant`` under ``cfg``, created the first time it answers."""
    data = snapshot(assistant, cfg)
    version, _created = AssistantVersion.objects.get_or_create(
        assistant=assistant, fingerprint=fingerprint(data), defaults={"snapshot": data})
    return version


# The built-in tool an assistant whose ``handoff`` allows it is given (engine/handoff.py).
HANDOFF_TOOL = "conversations.engine.handoff.hand_to_person"


def config_for_turn(turn, cfg=None):
    """The configuration ``turn`` runs with: the site's for a turn with no assistant; else its
    assistant's, with its credential resolved and the site's tools narrowed to its own. Sets
    ``turn.assistant_version`` (not saved). Raises ``NotSetUp`` (``Inactive``) with the
    visitor's sentence when the assistant cannot answer."""
    site = get_config() if cfg is None else cfg
    assistant = turn.answering_assistant()  # a test run's draft, over the live assistant
    if assistant is None:
        if not any(entry.get("CREDENTIAL") for entry in site["FALLBACKS"]):
            return site
        return {**site, "FALLBACKS": resolve_chain(site["FALLBACKS"], site)}
    if not assistant.active:
        raise Inactive(assistant)
    # Read now, not when the conversation started: a visitor whose access was taken away since
    # (staff no more, a permission removed, a stricter policy) gets no more answers.
    if not assistant.allows(turn.conversation.user):
        raise NoAccess(assistant)
    found = problems(assistant, site)
    if found:
        raise NotSetUp(assistant, found[0][1])
    config = settings_for(assistant, site)
    tools = registered_tools(site)
    config["TOOLS"] = tuple(tools[name] for name in assistant.tools)
    if assistant.offers_handoff("tool"):  # built in: no site lists it in TOOLS
        config["TOOLS"] += (HANDOFF_TOOL,)
    # On top of what each tool asks for itself (engine/approvals.py).
    config["APPROVAL_TOOLS"] = tuple(assistant.approval_tools or ())
    config["API_KEY"] = assistant_key(assistant, config, site)
    config["ADMIN_ENDPOINT"] = bool(assistant.base_url)  # its connections are checked (endpoints)
    config["FALLBACKS"] = resolve_chain(config["FALLBACKS"], site)
    turn.assistant_version = record_version(assistant, config)
    return config


def resolve_chain(entries, cfg):
    """``entries`` (``FALLBACKS``) with each ``CREDENTIAL`` resolved to its key as ``API_KEY``, read
    now, in the worker, as an assistant's own credential is. An entry whose key cannot be read
    here (its environment variable unset: ``conversations.W040`` warned at start-up) is left out,
    with an error logged: it could not answer, and the rest of the chain still may."""
    chain = []
    for number, entry in enumerate(entries, start=1):
        if not entry.get("CREDENTIAL"):
            chain.append(entry)
            continue
        try:
            chain.append({**entry, "API_KEY": resolve_credential(entry["CREDENTIAL"], cfg,
                                                                 provider=entry.get("PROVIDER", ""))})
        except CredentialError as exc:
            logger.error("Fallback %d (%s) left out of the chain: %s", number, entry.get("PROVIDER"), exc.reason,
                         extra={"provider": entry.get("PROVIDER")})
    return tuple(chain)


def chains(cfg=None):
    """``[(slug, settings)]`` for each active assistant whose turns go through a chain of providers
    (its own provider, then its fallbacks or the site's): circuits besides the site's, which
    ``providers.chain.provider_health`` shows too."""
    site = get_config() if cfg is None else cfg
    configs = [(a.slug, settings_for(a, site)) for a in Assistant.objects.filter(active=True).order_by("slug")]
    return [(slug, config) for slug, config in configs if config["FALLBACKS"]]
