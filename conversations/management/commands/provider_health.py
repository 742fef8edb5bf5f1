"""``manage.py provider_health``: the circuit breaker of every provider the turns may call.

Prints one line per provider of the site's chain (its own, then ``FALLBACKS``; nothing when there
are none: a lone provider has no breaker), then per provider of the active assistants' chains not
listed yet, each named with the host it calls and its place in every chain that holds it: its
circuit closed (with its recent failures), open (and for how long still) or half-open (the next
call probes it).
Exits 1 when any provider is open, so a monitoring check can run it; 0 otherwise.
"""

from django.core.management.base import BaseCommand, CommandError

from conversations.engine.configure import chains
from conversations.conf import get_config
from conversations.providers.chain import provider_health
from conversations.infra.queue import get_queue


class Command(BaseCommand):
    help = ("Show the circuit breaker of every provider that has fallbacks, with its place in its chain and the "
            "host it calls (exit status 1 when a circuit is open).")

    def handle(self, *args, **options):
        any_open = False
        health = provider_health(get_config(), get_queue().connection, chains())
        if not health:
            self.stdout.write("No provider has fallbacks (FALLBACKS, or an assistant's own): each is called "
                              "directly, with no circuit breaker.")
            return
        self.stdout.write("Circuit breakers (closed: called as usual; open: skipped after repeated failures; "
                          "half-open: the next call probes it):")
        for label, state in health:
            if state is None:
                raise CommandError("Redis is unreachable: the breakers cannot be read.")
            any_open = any_open or state["state"] == "open"
            self.stdout.write(f"{label}: {describe(state)}")
        if any_open:
            raise SystemExit(1)


def describe(state):
    """A circuit's state in words that agree with each other: an open circuit has forgotten the
    failures that opened it (``CircuitBreaker._open``), so it says how long it stays open instead."""
    if state["state"] == "open":
        return f"circuit open, skipped for {state['open_for']}s more"
    failures = state["recent_failures"]
    counted = f"{failures} recent failure{'' if failures == 1 else 's'}"
    if state["state"] == "half-open":
        return f"circuit half-open, the next call probes it ({counted})"
    return f"circuit closed, called as usual ({counted})"
