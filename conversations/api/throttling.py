"""Rate limits on turn creation: every turn is a paid model run.

Two throttles apply to ``POST …/turns/``: one per owner (the logged-in user, or the
anonymous visitor's owner token) and one per client IP address (which also catches a
visitor who throws their cookies away). Rates come from ``CONVERSATIONS["TURN_RATE_PER_OWNER"]``
and ``["TURN_RATE_PER_IP"]`` ("10/min", "30/min"; "" or "0" turns a throttle off), or from
``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]`` under the throttle's ``scope`` when set there.
History lives in the default cache (Redis), so every web process shares it. Behind a
reverse proxy set ``REST_FRAMEWORK["NUM_PROXIES"]``, or every visitor shares the proxy's IP.
"""

from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

from ..conf import get_config
from ..owners import owner_token


class ConfiguredRateThrottle(SimpleRateThrottle):
    """A ``SimpleRateThrottle`` whose rate is read when the throttle is built (once per request),
    so a changed setting applies at once. ``config_key`` names the CONVERSATIONS key."""

    config_key = None

    def get_rate(self):
        """The rate string ("10/min"), or None (no limit) when the setting is empty or "0"."""
        rates = api_settings.DEFAULT_THROTTLE_RATES or {}
        rate = rates[self.scope] if self.scope in rates else get_config()[self.config_key]
        return rate if rate and str(rate).strip() != "0" else None


class TurnOwnerThrottle(ConfiguredRateThrottle):
    """Turns per owner: the user id when logged in, else the session's owner token (else the IP)."""

    scope = "conversations_turns_owner"
    config_key = "TURN_RATE_PER_OWNER"

    def get_cache_key(self, request, view):
        """The cache key of this owner's request history."""
        if request.user is not None and request.user.is_authenticated:
            ident = f"user-{request.user.pk}"
        else:
            token = owner_token(request)
            ident = f"token-{token}" if token else f"ip-{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}


class TurnIPThrottle(ConfiguredRateThrottle):
    """Turns per client IP address (``X-Forwarded-For`` is trusted only with ``NUM_PROXIES``)."""

    scope = "conversations_turns_ip"
    config_key = "TURN_RATE_PER_IP"

    def get_cache_key(self, request, view):
        """The cache key of this address's request history."""
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}
