"""Fallback providers under the turn's clocks.

``CONVERSATIONS["FALLBACKS"]`` lists providers to try, in order, after the site's own
(``PROVIDER``, ``MODEL``, ``BASE_URL``, ``API_KEY``): each a dict with ``PROVIDER`` and, as
needed, ``MODEL``, ``BASE_URL`` and either ``API_KEY`` or ``CREDENTIAL`` (a name in
``CREDENTIALS``, resolved to its key by the job, ``engine.configure.config_for_turn``). An assistant
may have a chain of its own (``Assistant.fallbacks``), which replaces the site's. A model call
goes to the first provider whose circuit is not open (``breaker``); when it is down — a
connection error, a time-out, 408/429/5xx/529 or an overloaded error, after the retries that
still fit — the call moves to the next. A 4xx that is the request's own fault (400, 404, 422…)
does not: the next provider would refuse it too; with ``FAILOVER_ON_AUTH`` a 401/403 (one
provider's key) does.

The clocks decide how far down the chain a call may go: every provider but the last sees the
turn's budget less ``FALLBACK_RESERVE`` seconds, so a primary that hangs is cut off while the
next still gets at least that long. A reply that streamed some text and then broke off is
kept as it is, never asked again of another provider.
"""

import logging

from ..infra import telemetry
from ..infra.breaker import CircuitBreaker, provider_key
from ..core.budget import Budget, BudgetExhausted
from ..endpoints import bind_settings_key, calls_url
from ..infra.http import BudgetedHTTP
from ..infra.network import endpoint
from . import BaseProvider, ProviderError, call_complete, get_provider_class
from ..core.types import ErrorCode, Outcome, record_call
from ..infra.queue import get_queue

logger = logging.getLogger("conversations.fallback")

# ProviderError codes that say the provider, not the request, is the problem.
OUTAGE_CODES = frozenset({ErrorCode.TIMEOUT, ErrorCode.CONNECTION, ErrorCode.UNAVAILABLE, ErrorCode.RATE_LIMITED})
ENTRY_KEYS = ("PROVIDER", "MODEL", "BASE_URL", "API_KEY", "CREDENTIAL")


class ReservedBudget(Budget):
    """The turn's budget less ``reserve`` seconds kept back for the next provider in the chain:
    what a provider that is not the last sees (``remaining``, ``call_timeout``, ``can_start``)."""

    def __init__(self, budget, reserve):  # a view of ``budget``: its clock, start and deadline
        self.__dict__.update(budget.__dict__)
        self.budget, self.reserve = budget, float(reserve)

    def remaining(self):
        return max(0.0, self.budget.remaining() - self.reserve)


def chain_entries(config):
    """The providers to try, in order: the site's own, then ``FALLBACKS``; each a full config. An
    entry's key is its ``API_KEY``: the job has resolved its ``CREDENTIAL`` into that
    (``engine.configure.resolve_chain``); elsewhere (the admin, ``provider_health``) none is needed."""
    entries = [dict(config)]
    for entry in config["FALLBACKS"]:
        entries.append({**config, "MODEL": "", "BASE_URL": "", "API_KEY": "",
                        **{key: entry[key] for key in ENTRY_KEYS if key in entry},
                        # set for an assistant's own chain (assistants.chain_settings), never inherited
                        "ADMIN_ENDPOINT": bool(entry.get("ADMIN_ENDPOINT"))})
    # A key still unbound here came from settings (the site's API_KEY, a FALLBACKS entry's):
    # bound to the endpoint those settings name. The job binds every key an assistant brings
    # (assistants.config_for_turn), and an assistant's chain never holds an API_KEY.
    return [{**entry, "API_KEY": bind_settings_key(entry)} for entry in entries]


class Link:
    """One provider of the chain, with its own budgeted HTTP client and breaker."""

    def __init__(self, config, budget, *, recorder, cancelled, turn_id, connection, last):
        cls = get_provider_class(config["PROVIDER"])
        self.budget = budget if last else ReservedBudget(budget, config["FALLBACK_RESERVE"])
        self.http = BudgetedHTTP(self.budget, config, recorder=recorder, turn_id=turn_id, cancelled=cancelled)
        self.provider = cls(config, http=self.http, budget=self.budget)
        self.label = f"{self.provider.name}:{getattr(self.provider, 'model', '') or self.provider.name}"
        self.http.name = getattr(self.provider, "model", "") or self.provider.name
        self.http.provider = self.provider.name
        self.breaker = CircuitBreaker(provider_key(config), failures=config["BREAKER_FAILURES"],
                                      window=config["BREAKER_WINDOW"], cooldown=config["BREAKER_COOLDOWN"],
                                      probe_timeout=config["CALL_TIMEOUT"] + 5, connection=connection,
                                      label=self.label)


class ProviderChain(BaseProvider):
    """Calls the first provider of ``links`` that is up; see the module's docstring.

    ``answered`` is the ``Link`` whose reply the last call returned; ``current`` the one asked now
    (its ``breaker_state`` what its breaker said then), for the call's span (``telemetry``).
    """

    name = "chain"

    def __init__(self, links, config, budget, owner=""):
        super().__init__(config, http=links[0].http, budget=budget)
        self.links = links
        self.answered = links[0]
        self.current = None
        self.owner = owner  # whose turn this is, for the breakers (``breaker.owner_key``)

    @property
    def model(self):
        return getattr(self.links[0].provider, "model", "")

    @property
    def first(self):
        return self.links[0].provider

    @property
    def answered_by(self):
        return self.answered.provider

    def streams(self, on_text):
        return any(link.provider.streams(on_text) for link in self.links)

    def complete(self, messages, tools, on_text=None):
        """The reply of the first provider up, or the last outage's ``ProviderError``."""
        failure = None
        # A used-up allowance is the account's, not an outage: the next provider is asked, and the
        # breaker does not count it (it opens only for outages).
        failover = OUTAGE_CODES | {ErrorCode.QUOTA} | ({ErrorCode.AUTH} if self.config["FAILOVER_ON_AUTH"] else set())
        for index, link in enumerate(self.links):
            last = index == len(self.links) - 1
            allowed = link.breaker.allow()
            self.current = link
            link.breaker_state = "half-open" if allowed == "probe" else "closed" if allowed else "open"
            telemetry.breaker_state(link.label, link.breaker_state)
            if not allowed:
                self.hop(link, "circuit open")
                continue
            probe = allowed == "probe"
            try:
                reply = call_complete(link.provider, messages, tools, on_text)
            except ProviderError as error:
                # Only an outage counts: a request's own error (and a key refused, even when it
                # fails over) would let one visitor open the circuit for everyone.
                if error.code in OUTAGE_CODES:
                    after = link.breaker.failed(self.owner, probe=probe)
                    if isinstance(after, str):
                        telemetry.breaker_state(link.label, after)
                elif probe:
                    link.breaker.released()
                if error.code not in failover:
                    raise
                failure = error
                self.hop(link, f"{error.code}: {error.detail}"[:200], last=last)
                continue
            except BudgetExhausted:
                # Only the reserve kept for the next provider was left: the next may still start.
                if last or not self.budget.can_start(self.config["MIN_CALL_BUDGET"]):
                    raise
                self.hop(link, "no time left before the reserve", last=last)
                continue
            link.breaker.succeeded(probe=probe)
            self.answered = link
            return reply
        if failure is not None:
            raise failure
        raise ProviderError(ErrorCode.UNAVAILABLE, "every provider of the chain is skipped: their circuits are open")

    def hop(self, link, why, *, last=False):
        """Log that ``link`` was passed over, and why; an open circuit is also recorded as a skipped call."""
        following = "" if last else f"; {self.budget.remaining():.1f}s left for the next"
        logger.warning("Provider %s left: %s%s", link.label, why, following,
                       extra={"provider": link.label, "reason": why})
        if why == "circuit open":
            record_call(link.http.recorder, "model", link.http.name, Outcome.SKIPPED,
                        started_offset=self.budget.elapsed(), remaining_before=self.budget.remaining(),
                        detail=f"{link.label}: circuit open, skipped{following}")


def build_provider(config, budget, *, recorder, cancelled, turn_id, owner=""):
    """The turn's provider: the site's own, or a ``ProviderChain`` when ``FALLBACKS`` lists more.
    ``owner`` is whose turn it is (``breaker.owner_key``). Returns ``(provider, http clients to
    close at the end of the turn)``."""
    entries = chain_entries(config)
    if len(entries) == 1:
        config = entries[0]  # its key bound
        cls = get_provider_class(config["PROVIDER"])
        http = BudgetedHTTP(budget, config, recorder=recorder, turn_id=turn_id, cancelled=cancelled)
        http.provider = cls.name
        provider = cls(config, http=http, budget=budget)
        # Every model call of the turn, attempted or skipped, is recorded under this one name
        # (a chain's links name their own).
        http.name = getattr(provider, "model", "") or provider.name
        return provider, [http]

    connection = get_queue().connection
    links = [Link(entry, budget, recorder=recorder, cancelled=cancelled, turn_id=turn_id, connection=connection,
                  last=index == len(entries) - 1) for index, entry in enumerate(entries)]
    return ProviderChain(links, config, budget, owner=owner), [link.http for link in links]


def provider_health(config, connection, chains=()):
    """``[(label, state)]`` for every provider of the site's chain, in order, then for those of
    ``chains`` (``[(name, config)]``, the active assistants' chains: ``engine.configure.chains()``) not
    shown yet, each once per breaker (``provider_key``). The label names the provider, its model
    and the host it calls (two entries of one vendor and model differ by it), then its place in
    each chain that holds it: "openai:gpt-4o-mini at api.openai.com:443 (the site's primary)",
    "… (support's fallback 1)". ``state`` is the breaker's (``CircuitBreaker.state()``: closed,
    open or half-open, recent failures), None when Redis cannot be read. For ``manage.py
    provider_health`` and the admin's turn list."""
    rows = {}  # breaker key → [what it calls, its places in the chains that hold it]
    # A provider with no fallbacks is called directly (``build_provider``): it has no circuit.
    for owner, chain in [*([(None, config)] if config["FALLBACKS"] else []), *chains]:
        for index, entry in enumerate(chain_entries(chain)):
            row = rows.setdefault(provider_key(entry), [_calls(entry), []])
            place = "primary" if index == 0 else f"fallback {index}"
            row[1].append(f"the site's {place}" if owner is None else f"{owner}'s {place}")
    health = []
    for key, (calls, places) in rows.items():
        label = f"{calls} ({', '.join(places)})"
        breaker = CircuitBreaker(key, failures=config["BREAKER_FAILURES"], window=config["BREAKER_WINDOW"],
                                 cooldown=config["BREAKER_COOLDOWN"], probe_timeout=config["CALL_TIMEOUT"],
                                 connection=connection, label=label)
        health.append((label, breaker.state()))
    return health


def _calls(entry):
    """``provider:model at host:port`` for one chain entry (the vendor's default endpoint when it
    names none; no host for a provider that calls none, like the demo model). Never the key."""
    what = f"{entry['PROVIDER']}:{entry['MODEL'] or '(default model)'}"
    where = endpoint(calls_url(entry["PROVIDER"], entry.get("BASE_URL")))
    return f"{what} at {where}" if where else what
