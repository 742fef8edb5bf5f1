"""The one place that makes a provider HTTP call.

``requests`` only knows per-socket-operation timeouts: a provider that trickles its headers
or body a byte at a time never trips them. Here every attempt gets a *total* wall-clock
limit, ``min(CALL_TIMEOUT, remaining)``: a ``watchdog.Watchdog`` shuts the attempt's sockets
down when the limit passes, or when the turn is stopped, which wakes a blocked
``recv``/``send`` within milliseconds.

A streamed call (``post_stream``) is bounded the same way in total, and also, once its first
byte has arrived, by ``STREAM_IDLE_TIMEOUT`` between two reads: a stream trickles by design.
Before that first byte it waits as long as an unstreamed call, since a gateway sends nothing
while it retries its upstream or honours the upstream's ``Retry-After``. Its events are read as
they arrive and handed to the caller; once text has been received, a failure is not retried
but ends the call with the reply so far (``PartialReply``).

Retries (connection errors, 408, 429, 5xx) stay inside the same budget: the wait before the
next attempt honours ``Retry-After`` (seconds, HTTP date) and ``retry-after-ms`` (also as a gateway
forwards them, ``llm_provider-retry-after``), otherwise a
jittered exponential back-off, and is never taken when the attempt after it could not get
``MIN_CALL_BUDGET`` seconds.

Not bounded: DNS resolution (``getaddrinfo`` cannot be interrupted); use IP addresses or a
local resolver cache when that matters.
"""

import contextlib
import email.utils
import json
import logging
import random
import time
from dataclasses import dataclass, field

import requests
from requests.sessions import merge_setting
from requests.structures import CaseInsensitiveDict
from urllib3 import exceptions as urllib3_exceptions

from ..core.budget import BudgetExhausted
from ..conf import get_config
from ..endpoints import KeyNotBound, address_allowed, check_key, endpoint_rule, origin
from .network import failed_endpoint, os_reason
from ..redaction import redact
from ..core.streaming import EventDecoder, StreamError
from ..core.types import ErrorCode, Finish, Outcome, record_call
from .watchdog import BODY, CONNECT, FIRST_BYTE, SEND, AddressGuard, Watchdog, environment_settings, new_session, stopped

logger = logging.getLogger("conversations.http")

SKIPPED_MESSAGE = "Skipped call — job budget exhausted"

# The longest detail a call's record keeps (CallRecord.detail).
DETAIL_CHARS = 500

# 529: Anthropic's "overloaded".
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504, 529})

# How a gateway (the LiteLLM proxy) spells the headers of the provider behind it.
GATEWAY_HEADER_PREFIX = "llm_provider-"

class CallFailed(Exception):
    """An attempt (or the last of several) produced no usable response.

    ``outcome`` is an ``Outcome``; ``status``, ``body`` and ``headers``
    are set for HTTP errors. The message never contains request headers (where API keys live).
    """

    def __init__(self, outcome, detail, *, status=None, body="", headers=None, retryable=False, code=""):
        super().__init__(detail)
        self.code = code  # a ProviderError code when the failure names one (an error event in a stream)
        self.outcome = outcome
        self.detail = detail
        self.status = status
        self.body = body
        self.headers = headers or {}
        self.retryable = retryable

    def json(self):
        """The error body parsed as JSON, or ``{}``."""
        try:
            value = json.loads(self.body)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


class PartialReply(Exception):
    """A streamed reply broke off after text had arrived: ``data`` is the reply so far, added up
    by the stream's accumulator; ``outcome`` and ``detail`` say why it ended, and ``code`` the
    ``ErrorCode`` of an error event that ended it ("" when the stream itself broke). Never retried:
    the visitor has seen that text, and another attempt would write a different one."""

    def __init__(self, data, outcome, detail, finish=Finish.CUT, code=""):
        super().__init__(detail)
        self.data, self.outcome, self.detail = data, outcome, detail
        self.code = code
        # The ModelReply's: CUT (broke off, or an error event ended it), LENGTH (passed
        # MAX_REPLY_CHARS), REFUSED (a content filter's error event).
        self.finish = Finish.REFUSED if code == ErrorCode.REFUSED else finish


class CallCancelled(Exception):
    """The turn was stopped while the call was in flight, and its sockets were shut down.
    ``data`` is a streamed reply so far (None when nothing had arrived, or not streamed);
    ``reply`` is the ``ModelReply`` a provider made of it, set by the provider (None when none)."""

    def __init__(self, data=None):
        super().__init__("the turn was stopped during the call")
        self.data = data
        self.reply = None


@dataclass
class Response:
    status: int
    data: dict
    headers: dict = field(default_factory=dict)


def parse_retry_after(headers, now=None):
    """Seconds to wait according to ``retry-after-ms`` or ``Retry-After`` (seconds or HTTP date), or None."""
    lowered = {k.lower(): v for k, v in (headers or {}).items()}
    for name, value in list(lowered.items()):  # LiteLLM forwards the upstream's headers under its prefix
        if name.startswith(GATEWAY_HEADER_PREFIX):
            lowered.setdefault(name[len(GATEWAY_HEADER_PREFIX):], value)
    value = lowered.get("retry-after-ms")
    if value:
        try:
            return max(0.0, float(value) / 1000.0)
        except ValueError:
            pass
    value = lowered.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def ensure_call_budget(budget, minimum, *, turn_id="", name="", attempt=1, recorder=None):
    """Called before every model call and every attempt of one: returns None when ``budget``
    still has ``minimum`` seconds (``MIN_CALL_BUDGET``) left. Otherwise the call is refused —
    logged at error level, recorded as skipped — and BudgetExhausted is raised."""
    if budget.can_start(minimum):
        return
    remaining = budget.remaining()
    logger.error(
        SKIPPED_MESSAGE,
        extra={"turn_id": turn_id, "call": name, "attempt": attempt, "remaining": round(remaining, 3)},
    )
    record_call(recorder, "model", name, Outcome.SKIPPED, attempt=attempt, started_offset=budget.elapsed(),
                remaining_before=remaining, detail=SKIPPED_MESSAGE)
    raise BudgetExhausted(SKIPPED_MESSAGE)


class BudgetedHTTP:
    """Makes a provider's POSTs within a turn's budget: JSON replies (``post_json``) or server-sent
    event streams (``post_stream``), retried within the budget, and shut as soon as ``cancelled()``
    says the turn was stopped (``CallCancelled``).

    ``recorder(**fields)`` is called once per attempt with the fields of a ``CallRecord``.
    ``sleep`` and ``random`` are class attributes so tests can replace them.
    """

    sleep = staticmethod(time.sleep)
    random = random.Random()

    def __init__(self, budget, config, *, recorder=None, name="", turn_id="", session=None, cancelled=None):
        self.budget = budget
        self.config = config
        self.cancelled = cancelled  # () -> bool: whether the turn was stopped (checked during calls)
        self.recorder = recorder
        self.name = name
        self.provider = ""  # the provider's kind, for the log line (set by whoever builds the provider)
        self.turn_id = turn_id
        self.session = session or new_session()
        self._environment = {}
        self._requests = {}  # (url, *headers) -> the request as prepared for every call to it (``_request``)

    def close(self):
        self.session.close()

    def post_json(self, url, payload, headers, classify=None):
        """POST ``payload`` as JSON; return a ``Response`` with the parsed body.

        Raises ``CallFailed`` for an error the retries could not get past (or that is not
        retried: 4xx other than 408/429, a body that is not JSON, a 5xx whose body
        ``classify(failure)`` reads as the request's own error, such as a refusal a gateway
        wraps in a 500), and ``BudgetExhausted`` when the next attempt could not have
        ``MIN_CALL_BUDGET`` seconds.
        """
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json", **headers}
        return self._retrying(lambda attempt: self._attempt(url, body, headers, attempt, classify=classify), classify)

    def post_stream(self, url, payload, headers, stream, on_text, classify=None):
        """POST ``payload`` (which asks for a stream) and read the server-sent events as they
        arrive: each is fed to ``stream`` (an accumulator from ``conversations.streaming``) and
        the text it adds is passed to ``on_text(text)``. Returns a ``Response`` whose ``data`` is
        the whole reply, added up (or the JSON body of a server that answered unstreamed).

        Failures before any text arrived are retried as in ``post_json`` (with a fresh
        accumulator from ``stream.__class__``); after, ``PartialReply`` carries the reply so
        far. ``CallCancelled`` when the turn is stopped meanwhile. ``classify(failure)`` (the
        provider's ``error_from_failure``) names the ``ProviderError`` code of an error event, read
        as the provider reads the same error in an HTTP error body; without it, such an event is
        a ``bad_response``.
        """
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream", **headers}
        limit = self.config["MAX_REPLY_CHARS"] or None
        return self._retrying(lambda attempt: self._attempt(url, body, headers, attempt,
                                                            stream=type(stream)(limit), on_text=on_text,
                                                            classify=classify), classify)

    def _retrying(self, attempt_once, classify=None):
        """Call ``attempt_once(attempt)`` until it returns, retrying what may be retried while the
        budget allows (see ``post_json``)."""
        cfg = self.config
        max_attempts = max(1, int(cfg["MAX_ATTEMPTS"]))
        attempt = 0
        while True:
            attempt += 1
            ensure_call_budget(self.budget, cfg["MIN_CALL_BUDGET"], turn_id=self.turn_id, name=self.name,
                               attempt=attempt, recorder=self.recorder)
            try:
                return attempt_once(attempt)
            except CallFailed as failure:
                if not failure.retryable or attempt >= max_attempts or _request_error(failure, classify):
                    raise
                wait = parse_retry_after(failure.headers)
                if wait is None:
                    wait = self._backoff(attempt)
                if self.budget.remaining() - wait < cfg["MIN_CALL_BUDGET"]:
                    logger.warning(
                        "Not retrying %s: waiting %.1fs would leave less than %ss",
                        self.name, wait, cfg["MIN_CALL_BUDGET"],
                        extra={"turn_id": self.turn_id, "attempt": attempt},
                    )
                    raise
                self._wait(wait)

    def _wait(self, seconds):
        """Sleep ``seconds`` before the next attempt, but end the call as soon as the turn is stopped."""
        if self.cancelled is None:
            return self.sleep(seconds)
        end = time.monotonic() + seconds
        while True:
            if stopped(self.cancelled):
                raise CallCancelled()
            left = end - time.monotonic()
            if left <= 0:
                return
            self.sleep(min(left, Watchdog.poll))

    def _backoff(self, attempt):
        base = float(self.config["BACKOFF_BASE"]) * (2 ** (attempt - 1))
        return min(float(self.config["BACKOFF_MAX"]), base) * (0.5 + self.random.random() / 2)

    def _attempt(self, url, body, headers, attempt, *, stream=None, on_text=None, classify=None):
        """One attempt within ``min(CALL_TIMEOUT, remaining)``, recorded and logged. With ``stream``,
        the reply's events are read as they come (``_read_events``), each read after the headers
        within ``STREAM_IDLE_TIMEOUT``; the headers themselves may take the whole limit."""
        cfg = self.config
        remaining = self.budget.remaining()
        limit = self.budget.call_timeout(cfg["CALL_TIMEOUT"])
        connect = min(float(cfg["CONNECT_TIMEOUT"]), limit)
        idle = min(float(cfg["STREAM_IDLE_TIMEOUT"]), limit) if stream is not None else limit
        # Each phase's socket limit, as a time-out names it (urllib3 sends within the connect limit).
        limits = {CONNECT: ("connect", connect), SEND: ("connect", connect), FIRST_BYTE: ("call", limit),
                  BODY: ("idle", idle) if stream is not None else ("call", limit)}
        started_offset = self.budget.elapsed()
        started = time.monotonic()
        outcome, status, detail = Outcome.OK, None, ""
        try:
            try:
                guard = self._guard(url)
            except CallFailed as failure:
                outcome, detail = failure.outcome, failure.detail
                raise
            with Watchdog(limit, self.cancelled) as watchdog, guard or contextlib.nullcontext():
                try:
                    try:  # the last moment before the key leaves: is it bound to this origin?
                        check_key(url, headers, cfg.get("API_KEY"))
                    except KeyNotBound as refusal:
                        raise CallFailed(Outcome.ERROR, str(refusal), code=ErrorCode.KEY_NOT_BOUND) from None
                    if url not in self._environment:
                        self._environment[url] = environment_settings(url)
                    # Never follow a redirect: requests strips only Authorization on the way,
                    # so an x-api-key or api-key header would reach whatever host it names.
                    reply = self.session.send(self._request(url, headers, body), timeout=(connect, limit),
                                              allow_redirects=False, stream=stream is not None,
                                              **self._environment[url])
                    status = reply.status_code
                    if stream is not None and status == 200 and _is_event_stream(reply):
                        watchdog.read_timeout(idle)  # the stream has begun: now it may not pause for long
                        try:
                            data = self._read_events(reply, watchdog, stream, on_text, limit, idle, classify)
                        except PartialReply as cut:
                            outcome, detail = cut.outcome, cut.detail
                            raise
                        return Response(status=status, data=data, headers=dict(reply.headers))
                    content = reply.content  # read inside the watchdog: the body is what trickles
                except requests.RequestException as exc:
                    if guard is not None and guard.refused:
                        outcome, detail = Outcome.CONNECTION_ERROR, guard.refused
                        raise CallFailed(outcome, detail, code=ErrorCode.ENDPOINT_REFUSED) from None
                    outcome, detail = self._failure(exc, watchdog, limit, limits)
                    raise CallFailed(outcome, detail, retryable=True) from None
                except CallFailed as failure:
                    outcome, detail = failure.outcome, failure.detail
                    raise
                if watchdog.fired:  # a body without a length "ends" when its socket is shut down
                    outcome, detail = self._failure(None, watchdog, limit, limits)
                    raise CallFailed(outcome, detail, retryable=True)
            if 300 <= status < 400:  # the Location is not quoted: it may carry a token of its own
                outcome, detail = Outcome.HTTP_ERROR, f"HTTP {status} redirect, not followed"
                raise CallFailed(outcome, detail, status=status)
            if status >= 400:
                outcome = Outcome.HTTP_ERROR
                failure = CallFailed(outcome, f"HTTP {status}", status=status,
                                     body=content.decode("utf-8", "replace")[:4000], headers=dict(reply.headers),
                                     retryable=status in RETRY_STATUSES)
                # The timeline's line is the log's: the provider's reading of the body, short and redacted.
                detail = (classify(failure).detail if classify is not None else failure.detail)[:DETAIL_CHARS]
                raise failure
            try:
                data = json.loads(content)
                if not isinstance(data, dict):
                    raise ValueError("not a JSON object")
            except ValueError as exc:
                outcome, detail = Outcome.BAD_RESPONSE, f"malformed JSON from the provider ({exc})"[:200]
                raise CallFailed(outcome, detail, status=status, body=content[:4000].decode("utf-8", "replace"))
            failure = _error_reply(status, data, content, reply.headers, classify)
            if failure is not None:  # a gateway's error sent as a 200 (a stream request it answered unstreamed)
                outcome, detail = failure.outcome, failure.detail[:DETAIL_CHARS]
                raise failure
            return Response(status=status, data=data, headers=dict(reply.headers))
        except CallCancelled:
            outcome, detail = Outcome.CANCELLED, "stopped during the call"
            raise
        finally:
            duration = time.monotonic() - started
            logger.info(
                "provider call turn=%s provider=%s name=%s attempt=%d timeout=%.2f remaining=%.2f duration=%.3f "
                "outcome=%s status=%s%s",
                self.turn_id, self.provider, self.name, attempt, limit, remaining, duration, outcome, status,
                f" detail={detail}" if detail else "",
                extra={
                    "turn_id": self.turn_id, "provider": self.provider, "attempt": attempt, "timeout": round(limit, 3),
                    "remaining": round(remaining, 3), "duration": round(duration, 3), "outcome": outcome,
                },
            )
            record_call(self.recorder, "model", self.name, outcome, attempt=attempt, started_offset=started_offset,
                        timeout=limit, remaining_before=remaining, duration=duration, status_code=status, detail=detail)

    def _request(self, url, headers, body):
        """``body`` POSTed to ``url`` with ``headers``, prepared as ``Session.post`` prepares it: the
        URL parsed, checked and quoted, the session's own headers merged under ``headers``, its
        cookies (those the provider set on an earlier reply), the body and its length.

        All but the cookies and the body are the same for each call to a URL with the same headers
        (a turn's round trips), and requests' preparation of them was a quarter of a call's CPU in
        this client: that part is prepared once per client and copied. The session is
        ``new_session``'s: no params, auth or netrc to merge (it never reads the environment)."""
        key = (url, *headers.items())
        template = self._requests.get(key)
        if template is None:
            template = requests.PreparedRequest()
            template.prepare(method="POST", url=url, hooks=self.session.hooks,
                             headers=merge_setting(headers, self.session.headers, dict_class=CaseInsensitiveDict))
            self._requests[key] = template
        prepared = template.copy()
        prepared.prepare_cookies(self.session.cookies)
        prepared.prepare_body(body, None)
        return prepared

    def _guard(self, url):
        """For an endpoint set in the admin (``ADMIN_ENDPOINT``), an ``AddressGuard`` letting the
        attempt connect only where ``endpoints.endpoint_rule`` allows, under the site's settings
        as they are now; raises ``CallFailed`` when its origin is not allowed at all. Endpoints
        from settings are the operator's word: no guard."""
        if not self.config.get("ADMIN_ENDPOINT"):
            return None
        rule = endpoint_rule(url, get_config())
        if rule is None:
            raise CallFailed(Outcome.ERROR, f"{origin(url) or 'the endpoint'} is not an allowed endpoint: not sent",
                             code=ErrorCode.ENDPOINT_REFUSED)
        if rule == "any":  # an origin the operator wrote out: wherever it resolves to
            return None
        return AddressGuard(lambda address: address_allowed(address, rule))

    @staticmethod
    def _failure(exc, watchdog, limit, limits):
        """``(outcome, detail)`` for an attempt whose sockets failed (``exc``) or were shut down.
        A time-out names the phase it ended in and the limit that ended it (``limits``: phase
        -> (name, seconds)). Raises ``CallCancelled`` when the watchdog shut them because the
        turn was stopped."""
        if watchdog.cancelled:
            raise CallCancelled()
        if watchdog.expired:
            return Outcome.TIMEOUT, f"timed out {watchdog.phase} (total limit {limit:.1f}s)"
        if _timed_out(exc):  # a socket timeout
            name, seconds = limits[watchdog.phase]
            return Outcome.TIMEOUT, f"{_describe(exc)}: timed out {watchdog.phase} ({name} limit {seconds:.1f}s)"
        return Outcome.CONNECTION_ERROR, _describe(exc)

    def _read_events(self, reply, watchdog, stream, on_text, limit, idle, classify=None):
        """Feed the reply's events to ``stream`` until its terminator; return the reply it adds up to.

        A failure before any text raises ``CallFailed`` (retried like any other); after some text,
        ``PartialReply``; a stop, ``CallCancelled`` with the text so far. A body that holds no event
        but is one JSON object (LiteLLM's Anthropic route forwards an unstreamed upstream reply so)
        is returned as it is, like the JSON reply of a server that does not stream.
        """
        decoder, received, body = EventDecoder(), False, b""
        try:
            while not stream.done:
                chunk = reply.raw.read1(65536)  # what has arrived, without waiting for more
                if not chunk:
                    whole = _json_object(body) if body is not None else None
                    if whole is not None:  # a gateway passing a JSON reply on under a stream's content type
                        failure = _error_reply(reply.status_code, whole, body, reply.headers, classify)
                        if failure is not None:
                            raise failure
                        return whole
                    raise StreamError(ErrorCode.BAD_RESPONSE, "the stream ended before its last event")
                if body is not None:  # kept until the first event (the decoder bounds its size)
                    body += chunk
                for event, data in decoder.feed(chunk):
                    body = None
                    added = stream.feed(event, data)
                    if added:
                        received = True
                        on_text(added)
                    if stream.limit.exceeded:  # never retried: another attempt would run on as long
                        raise PartialReply(stream.reply(), Outcome.BAD_RESPONSE, stream.limit.exceeded, Finish.LENGTH)
                    if stream.done:
                        break
            return stream.reply()
        except (StreamError, requests.RequestException, urllib3_exceptions.HTTPError, OSError) as exc:
            if watchdog.cancelled:
                raise CallCancelled(stream.reply() if received else None) from None
            if isinstance(exc, StreamError):  # its detail quotes the provider, who may quote the key
                outcome, detail, code = Outcome.BAD_RESPONSE, redact(exc.detail, self.config.get("API_KEY")), exc.code
            elif watchdog.expired:
                outcome, detail, code = Outcome.TIMEOUT, f"timed out {BODY} (total limit {limit:.1f}s)", ""
            elif _timed_out(exc):
                outcome, detail, code = Outcome.TIMEOUT, f"timed out {BODY} (idle limit {idle:.1f}s)", ""
            else:
                outcome, detail, code = Outcome.CONNECTION_ERROR, f"the stream broke off: {_describe(exc)}", ""
            event = isinstance(exc, StreamError) and exc.body is not None
            # An error event is read by the provider, as the error body it stands for (its own status in
            # a gateway's "code"), not by the decoder's guess.
            failure = CallFailed(outcome, detail, status=200, code="" if event else code)
            if event:  # an error event: the provider says which
                failure.body = json.dumps(exc.body)
                named = classify(failure) if classify is not None else None
                failure.code = named.code if named is not None else ErrorCode.BAD_RESPONSE
                failure.detail = named.detail if named is not None else detail
            if received:  # the visitor has seen text: it is kept, and the record says what ended it
                raise PartialReply(stream.reply(), outcome, failure.detail, code=failure.code if event else "") \
                    from None
            # An error event naming an outage may be retried, like the same error as a status; a
            # malformed stream may not (the next would most likely be malformed too).
            failure.retryable = failure.code in RETRIED_CODES or not isinstance(exc, StreamError)
            raise failure from None
        finally:
            reply.close()


# The ProviderError codes of an outage, which another attempt may get past.
RETRIED_CODES = frozenset({ErrorCode.UNAVAILABLE, ErrorCode.RATE_LIMITED, ErrorCode.TIMEOUT})


def _request_error(failure, classify):
    """Whether an HTTP error of a retried status (a 5xx, 429, 408) is the request's own, as the
    provider reads its body (``classify``): a gateway wraps an upstream's refusal in a 500."""
    if classify is None or not failure.status or failure.code:
        return False
    return classify(failure).code not in RETRIED_CODES


def _json_object(raw):
    """``raw`` parsed as a JSON object, or None."""
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _error_reply(status, data, raw, headers, classify):
    """A ``CallFailed`` for a 200 reply whose JSON ``data`` (``raw``, its bytes) is an error instead of
    an answer — ``{"error": ...}`` (OpenAI's shape, a gateway's own) or ``{"type": "error", ...}``
    (Anthropic's), without a reply's fields — read by the provider (``classify``) as the same error
    sent with its own status would be, and retryable as that one; None for an answer."""
    if "choices" in data or "content" in data:
        return None
    if not isinstance(data.get("error"), (dict, str)) and data.get("type") != "error":
        return None
    failure = CallFailed(Outcome.HTTP_ERROR, f"HTTP {status}: an error object in the reply", status=status,
                         body=raw[:4000].decode("utf-8", "replace"), headers=dict(headers))
    named = classify(failure) if classify is not None else None
    if named is not None:
        failure.code, failure.detail = named.code, named.detail
    failure.retryable = failure.code in RETRIED_CODES
    return failure


def _is_event_stream(reply):
    return reply.headers.get("Content-Type", "").split(";")[0].strip().lower() == "text/event-stream"


def _timed_out(exc):
    """Whether a socket timeout caused ``exc``.

    ``requests`` raises ``Timeout`` only for some of them: a send that timed out (a server
    that never reads a large upload) or a read timeout in the body arrives as a plain
    ``ConnectionError`` or ``ChunkedEncodingError`` wrapping one.
    """
    seen = set()
    pending = [exc]
    while pending:
        current = pending.pop()
        # Not every ``reason`` is an exception: an SSLError's is a string (a failed TLS handshake).
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        # urllib3's NewConnectionError subclasses ConnectTimeoutError even for "connection refused".
        timeout_types = (requests.Timeout, TimeoutError, urllib3_exceptions.TimeoutError)
        if isinstance(current, timeout_types) and not isinstance(current, urllib3_exceptions.NewConnectionError):
            return True
        pending += [current.__cause__, current.__context__, getattr(current, "reason", None)]
        pending += [arg for arg in getattr(current, "args", ()) if isinstance(arg, BaseException)]
    return False


def _describe(exc):
    """A short, secret-free description of a connection failure: where (host and port only, no
    path, query or headers) and the operating system's reason, e.g. "ConnectionError to
    api.example.com:443: name not known (Name or service not known)"."""
    name = type(exc).__name__
    where = failed_endpoint(exc)
    name = f"{name} to {where}" if where else name
    reason = str(exc.args[0]) if exc.args else ""
    if "IncompleteRead" in reason or "incomplete" in reason.lower():
        return f"{name}: response cut short"
    found = os_reason(exc)
    if not found and "reset" in reason.lower():
        found = "connection reset"
    return f"{name}: {found}" if found else name
