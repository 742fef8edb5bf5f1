"""Rate limits on what costs the site: turns (each a paid model run), new conversations, ratings,
and visitor tokens for widgets embedded on other sites.

Each throttle counts per owner (the logged-in user, or the anonymous visitor's owner token: a
session's, or the one an embedded widget's visitor token names; ``owners.owner_token``)
or per client IP address (which also catches a visitor who throws their cookies away). Rates
come from ``CONVERSATIONS`` (``TURN_RATE_PER_OWNER`` "10/min", ``TURN_RATE_PER_IP`` "30/min",
``CONVERSATION_RATE_PER_OWNER``, ``CONVERSATION_RATE_PER_IP``; "" or "0" turns one off), or
from ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]`` under the throttle's ``scope`` when set there.
History lives in the default cache (Redis), so every web process shares it.

The client's address is ``REMOTE_ADDR``. Headers a client can write (``X-Forwarded-For``,
``Forwarded``, ``X-Real-IP``) are read only when ``REST_FRAMEWORK["NUM_PROXIES"]`` says how many
proxies in front of the site append to ``X-Forwarded-For``; then the address the outermost of
them saw is used, as DRF reads it. Every per-address limit counts by ``client_key``, which
counts an IPv6 address by its network (``IPV6_PREFIX``).
"""

import ipaddress

from django.utils.translation import gettext_lazy
from rest_framework.exceptions import Throttled
from rest_framework.settings import api_settings
from rest_framework.throttling import BaseThrottle, SimpleRateThrottle

from ..conf import get_config
from ..core.rules import rate_is_on
from ..owners import owner_token


def client_address(request):
    """The client's IP address: ``REMOTE_ADDR``, or with ``NUM_PROXIES`` set the
    ``X-Forwarded-For`` entry that the outermost trusted proxy wrote (DRF's rule)."""
    if api_settings.NUM_PROXIES is None:
        return request.META.get("REMOTE_ADDR", "")
    return BaseThrottle().get_ident(request)


def client_key(request):
    """What every per-address limit counts by (throttles, turns running at once): the client's
    address, an IPv6 one cut to its ``IPV6_PREFIX`` network. One IPv6 subscriber is usually
    given a whole /64, so keying on the full address would give them 2**64 fresh limits. An
    IPv4-mapped IPv6 address counts as its IPv4 one; text that is not an address counts as is."""
    address = client_address(request)
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return address[:100]
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.version == 4:
        return str(ip)
    # From the integer: a zone ("fe80::1%eth0") is no part of the network.
    return str(ipaddress.IPv6Network((int(ip), get_config()["IPV6_PREFIX"]), strict=False))


class ConfiguredRateThrottle(SimpleRateThrottle):
    """A ``SimpleRateThrottle`` whose rate is read when the throttle is built (once per request),
    so a changed setting applies at once. ``config_key`` names the CONVERSATIONS key."""

    config_key = None

    def get_rate(self):
        """The rate string ("10/min"), or None (no limit) when the setting is empty or "0"."""
        rates = api_settings.DEFAULT_THROTTLE_RATES or {}
        rate = rates[self.scope] if self.scope in rates else get_config()[self.config_key]
        return rate if rate_is_on(rate) else None

    def get_ident(self, request):
        """The client's key (``client_key``): DRF's own would trust ``X-Forwarded-For`` from
        anyone when ``NUM_PROXIES`` is unset, and count each IPv6 address of a network apart."""
        return client_key(request)


class OwnerThrottle(ConfiguredRateThrottle):
    """Counts per owner: the user id when logged in, else the session's owner token. A visitor
    who owns nothing yet has no token (their first conversation creates it) and is not counted
    here; the per-address throttle counts them."""

    def get_cache_key(self, request, view):
        """The cache key of this owner's request history, or None (not counted)."""
        if request.user is not None and request.user.is_authenticated:
            ident = f"user-{request.user.pk}"
        else:
            token = owner_token(request)
            if not token:
                return None
            ident = f"token-{token}"
        return self.cache_format % {"scope": self.scope, "ident": ident}


class AddressThrottle(ConfiguredRateThrottle):
    """Counts per client address (see ``client_key``)."""

    def get_cache_key(self, request, view):
        """The cache key of this address's request history."""
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}


class TurnOwnerThrottle(OwnerThrottle):
    scope = "conversations_turns_owner"
    config_key = "TURN_RATE_PER_OWNER"


class TurnIPThrottle(AddressThrottle):
    scope = "conversations_turns_ip"
    config_key = "TURN_RATE_PER_IP"


class ConversationOwnerThrottle(OwnerThrottle):
    scope = "conversations_new_owner"
    config_key = "CONVERSATION_RATE_PER_OWNER"


class ConversationIPThrottle(AddressThrottle):
    scope = "conversations_new_ip"
    config_key = "CONVERSATION_RATE_PER_IP"


class RatingOwnerThrottle(OwnerThrottle):
    scope = "conversations_ratings_owner"
    config_key = "RATING_RATE_PER_OWNER"


class RatingIPThrottle(AddressThrottle):
    scope = "conversations_ratings_ip"
    config_key = "RATING_RATE_PER_IP"


class ApprovalOwnerThrottle(OwnerThrottle):
    scope = "conversations_approvals_owner"
    config_key = "APPROVAL_RATE_PER_OWNER"


class ApprovalIPThrottle(AddressThrottle):
    scope = "conversations_approvals_ip"
    config_key = "APPROVAL_RATE_PER_IP"


class DeleteOwnerThrottle(OwnerThrottle):
    """Conversations a visitor deletes (each an erasure: a scan of Redis) per owner."""

    scope = "conversations_delete_owner"
    config_key = "DELETE_RATE_PER_OWNER"


class DeleteIPThrottle(AddressThrottle):
    scope = "conversations_delete_ip"
    config_key = "DELETE_RATE_PER_IP"


class TokenIPThrottle(AddressThrottle):
    """Visitor tokens minted (or renewed) per client address."""

    scope = "conversations_tokens_ip"
    config_key = "TOKEN_RATE_PER_IP"


def refuse(message, wait):
    """Raise a 429 that reads ``message`` alone (DRF would add its own sentence, "Expected available
    in 60 seconds.", in another voice), with ``Retry-After`` in whole seconds (at least 1); DRF's
    own sentence when ``message`` is None."""
    wait = max(1, round(wait)) if wait is not None else None
    if message is None:
        raise Throttled(wait)
    refusal = Throttled(detail=str(message))
    refusal.wait = wait  # DRF's handler sends it as Retry-After
    raise refusal


class PollMissThrottle(AddressThrottle):
    """The polls of one client address that missed (404: no such turn or conversation, or not
    the caller's), within ``POLL_MISS_RATE_PER_IP``. A miss costs lookups a hit served from the
    cache does not, so an address past the rate is refused (429) before them; only misses count
    (``record_miss``), so a widget polling its own turn every half second is never refused."""

    scope = "conversations_poll_misses_ip"
    config_key = "POLL_MISS_RATE_PER_IP"

    def allow_request(self, request, view):
        """Whether the address has missed fewer times than the rate allows in its window (records nothing)."""
        if self.rate is None:
            return True
        self.key = self.get_cache_key(request, view)
        self.history = self.cache.get(self.key, [])
        self.now = self.timer()
        while self.history and self.history[-1] <= self.now - self.duration:
            self.history.pop()
        return len(self.history) < self.num_requests

    def record_miss(self, request, view):
        """Count a poll of this address answered 404."""
        if self.allow_request(request, view) and self.rate is not None:
            self.history.insert(0, self.now)
            self.cache.set(self.key, self.history, self.duration)


class PollMissLimit:
    """For a view widgets poll: an address past ``PollMissThrottle`` refused first (429 with a
    sentence and ``Retry-After``), and each 404 the view answers counted."""

    poll_miss_message = gettext_lazy("Too many requests from your address asked for chats that are not there. "
                                     "Please wait a moment and reload the page.")

    def check_throttles(self, request):
        throttle = PollMissThrottle()
        if not throttle.allow_request(request, self):
            refuse(self.poll_miss_message, throttle.wait())
        super().check_throttles(request)

    def finalize_response(self, request, response, *args, **kwargs):
        if response.status_code == 404:
            PollMissThrottle().record_miss(request, self)
        return super().finalize_response(request, response, *args, **kwargs)
