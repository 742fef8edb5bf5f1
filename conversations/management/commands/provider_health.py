"""``manage.py provider_health``: the circuit breaker of every provider the turns may call.

Prints one line per provider of the site's chain (its own, then ``FALLBACKS``; nothing when there
are none: a lone provider has no breaker), then per provider of the active assistants' chains not
listed yet (followed by their slugs): closed,
open (and for how long still) or half-open (the next call probes it), with its recent failures.
Exits 1 when any provider is open, so a monitoring check can run it; 0 otherwise.
"""

from django.core.management.base import BaseCommand, CommandError

from conversations.assistants import chains
from conversations.conf import get_config
from conversations.fallback import provider_health


class Command(BaseCommand):
    help = "Show the circuit breaker of every provider (exit status 1 when one is open)."

    def handle(self, *args, **options):
        from conversations.jobs import get_queue

        any_open = False
        health = provider_health(get_config(), get_queue().connection, chains())
        if not health:
            self.stdout.write("No provider has fallbacks (FALLBACKS, or an assistant's own): each is called "
                              "directly, with no circuit breaker.")
        for label, state in health:
            if state is None:
                raise CommandError("Redis is unreachable: the breakers cannot be read.")
            any_open = any_open or state["state"] == "open"
            extra = f", open for {state['open_for']}s more" if state["state"] == "open" else ""
            self.stdout.write(f"{label}: {state['state']} ({state['recent_failures']} recent failures{extra})")
        if any_open:
            raise SystemExit(1)
