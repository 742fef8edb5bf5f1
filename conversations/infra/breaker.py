"""A circuit breaker per provider, shared by every worker through Redis.

After ``BREAKER_FAILURES`` failures of one provider (an outage: time-outs, refused
connections, 408/429/5xx/529, and the same errors sent as an event in a stream) within
``BREAKER_WINDOW`` seconds, coming from the turns of more than one owner at more than one
client address, the provider is
*open*: skipped for ``BREAKER_COOLDOWN`` seconds, so one broken provider does not cost every
turn its first attempt. Then it is *half-open*: exactly one call, by whichever worker asks
first, may probe it; its success closes it, its failure opens it for another cool-down.

The breaker is shared by every visitor, so no one visitor may open it: a request's own fault
(a moderation refusal, a context too long, a bad key; a refusal a gateway wraps in a 500 too)
never counts, failures from one owner alone never open it, nor from the many owners one client
address can make (a new anonymous owner costs only a cookie), and a call that began before the
circuit opened cannot close it by succeeding; only the probe can. A success while closed
forgets the failures so far.

State lives in the Redis of the turns' queue (the app needs it anyway), under
``conversations:breaker:<queue>:<provider key>:…`` (``queue.site_key``: two sites sharing that
Redis keep breakers of their own). When Redis cannot be read the breaker lets every
call through: it must never be the reason a turn fails.
"""

import hashlib
import logging
import time
import uuid

from redis.exceptions import RedisError

from .queue import site_key

logger = logging.getLogger("conversations.breaker")

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"


def owner_key(conversation, address=""):
    """Who a failure is counted for: ``"<owner>.<address>"``, the conversation's user or anonymous
    owner and the client address (``api.throttling.client_key``) its turn was asked from, each
    hashed (the token is a credential of sorts, the address personal data; Redis only needs to
    tell them apart). A turn whose address is not known counts its owner as its address."""
    who = _digest(f"user:{conversation.user_id}" if conversation.user_id else f"token:{conversation.owner_token}")
    return f"{who}.{_digest(f'address:{address}') if address else who}"


def _digest(text):
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def provider_key(config):
    """A short, stable key for one provider entry (kind, endpoint and model; never the key)."""
    identity = "|".join(str(config.get(name) or "") for name in ("PROVIDER", "BASE_URL", "MODEL"))
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


class CircuitBreaker:
    """The breaker of one provider. ``connection`` is a redis-py client; ``clock`` (``time.time``)
    is a class attribute so tests can move time."""

    clock = staticmethod(time.time)

    def __init__(self, key, *, failures, window, cooldown, probe_timeout, connection, label=""):
        self.prefix = site_key("breaker", key)
        self.failures, self.window, self.cooldown = int(failures), float(window), float(cooldown)
        self.probe_timeout = max(1, int(probe_timeout))
        self.redis = connection
        self.label = label or key

    def _key(self, name):
        return f"{self.prefix}:{name}"

    def allow(self):
        """Called before a call to this provider: ``True`` (closed), ``"probe"`` (half-open, and
        this caller holds the one probe) or ``False`` (open, or another caller is probing)."""
        try:
            if self.redis.exists(self._key("open")):
                return False
            if not self.redis.exists(self._key("tripped")):
                return True
            return "probe" if self.redis.set(self._key("probe"), "1", nx=True, ex=self.probe_timeout) else False
        except RedisError:
            return True

    def succeeded(self, probe=False):
        """The provider answered: its failures so far are forgotten; the probe's answer (``probe``:
        ``allow()`` said ``"probe"``) also closes the circuit. Any other call's answer leaves an
        open circuit open: it was sent before the circuit opened, and says little of now."""
        try:
            if probe:
                self.redis.delete(self._key("failures"), self._key("tripped"), self._key("probe"), self._key("open"))
            else:
                self.redis.delete(self._key("failures"))
        except RedisError:
            pass

    def released(self):
        """The probe's call ended without saying whether the provider is up (the request's own
        error): the next caller probes instead."""
        try:
            self.redis.delete(self._key("probe"))
        except RedisError:
            pass

    def failed(self, owner, probe=False):
        """The provider failed in a way that says it is down, in a turn of ``owner``
        (``owner_key``); opens the breaker at the threshold, when more than one owner from more
        than one client address failed within the window, or at once when the probe (``probe``)
        failed. Returns the state afterwards."""
        now = self.clock()
        try:
            if probe:  # a failed probe: another cool-down
                return self._open(now)
            pipe = self.redis.pipeline()
            pipe.zadd(self._key("failures"), {f"{now:.6f}:{owner}:{uuid.uuid4().hex[:8]}": now})
            pipe.zremrangebyscore(self._key("failures"), 0, now - self.window)
            pipe.zrange(self._key("failures"), 0, -1)
            pipe.expire(self._key("failures"), int(self.window) + 1)
            recent = pipe.execute()[2]
            sources = [member.split(b":")[1].partition(b".") for member in recent]
            owners, addresses = {who for who, _, _ in sources}, {where or who for who, _, where in sources}
            if len(recent) >= self.failures and len(owners) > 1 and len(addresses) > 1:
                return self._open(now)
            return CLOSED
        except RedisError:
            return CLOSED

    def _open(self, now):
        logger.warning("Provider %s skipped for %ss after repeated failures", self.label, self.cooldown,
                       extra={"provider": self.label})
        pipe = self.redis.pipeline()
        pipe.set(self._key("open"), f"{now:.3f}", ex=max(1, int(round(self.cooldown))))
        # Remembered past the cool-down, so that the first call after it is a probe.
        pipe.set(self._key("tripped"), f"{now:.3f}", ex=max(1, int(self.cooldown * 10 + self.window)))
        pipe.delete(self._key("failures"), self._key("probe"))
        pipe.execute()
        return OPEN

    def state(self):
        """``{"state": closed|open|half-open, "recent_failures": n, "open_for": seconds}`` for the
        admin and ``manage.py provider_health``; None when Redis cannot be read."""
        try:
            ttl = self.redis.ttl(self._key("open"))
            tripped = self.redis.exists(self._key("tripped"))
            recent = self.redis.zcount(self._key("failures"), self.clock() - self.window, "+inf")
        except RedisError:
            return None
        if ttl and ttl > 0:
            return {"state": OPEN, "recent_failures": recent, "open_for": ttl}
        return {"state": HALF_OPEN if tripped else CLOSED, "recent_failures": recent, "open_for": 0}
