"""Every knob of the app lives in one ``CONVERSATIONS`` settings dict, merged over ``DEFAULTS``.

Values may arrive as strings (the demo project copies ``CONVERSATIONS_<KEY>`` environment
variables in); each is converted to the type of its default. ``get_config()`` is cached and
cleared when the setting changes (``override_settings`` in tests). A default is written only
here: code reads ``get_config()[KEY]``, never ``.get(KEY, fallback)``.
"""

import difflib
import json
from collections.abc import Mapping
from functools import lru_cache
from types import MappingProxyType

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

DEFAULTS = {
    # Which model answers: "demo", "openai", "anthropic" or a dotted path to a BaseProvider subclass.
    "PROVIDER": "demo",
    "MODEL": "",
    "BASE_URL": "",
    "API_KEY": "",
    "SYSTEM_PROMPT": "You are a helpful assistant embedded in a website. Answer briefly.",
    # The three clocks (seconds). The job's own deadline is JOB_TIMEOUT - DEADLINE_MARGIN.
    "JOB_TIMEOUT": 120,
    "DEADLINE_MARGIN": 20,
    "CALL_TIMEOUT": 60,
    "CONNECT_TIMEOUT": 10,
    "MIN_CALL_BUDGET": 5,
    "MAX_ATTEMPTS": 3,
    # Providers tried in order after the site's own when it is down: [{"PROVIDER", "MODEL", "BASE_URL",
    # "API_KEY" or "CREDENTIAL" (a name in CREDENTIALS)}, …] (see conversations/providers/chain.py). Each but
    # the last keeps FALLBACK_RESERVE seconds of the turn's budget back for the next; FAILOVER_ON_AUTH
    # also moves on after a 401/403. An assistant's own chain (Assistant.fallbacks) replaces this one.
    "FALLBACKS": [],
    "FALLBACK_RESERVE": 15,
    "FAILOVER_ON_AUTH": False,
    # A provider failing BREAKER_FAILURES times within BREAKER_WINDOW seconds (outages only, in the
    # turns of more than one owner) is skipped for BREAKER_COOLDOWN seconds, then probed by one
    # call (conversations/infra/breaker.py).
    "BREAKER_FAILURES": 5,
    "BREAKER_WINDOW": 60,
    "BREAKER_COOLDOWN": 30,
    "BACKOFF_BASE": 1.0,
    "BACKOFF_MAX": 20.0,
    # Stream model replies (the visitor watches the answer being written); False for endpoints that
    # cannot. A stream is bounded by CALL_TIMEOUT in total and, once its first byte has arrived, by
    # STREAM_IDLE_TIMEOUT between reads (before it, a gateway may be retrying its upstream).
    "STREAM": True,
    "STREAM_IDLE_TIMEOUT": 20,
    # The most characters one model reply may bring, streamed or not: its text, and each tool call's arguments
    # (0 = no limit). Past it the call ends there, incomplete with the text so far, so that an
    # endpoint streaming without end cannot fill the database, Redis and the poll responses.
    "MAX_REPLY_CHARS": 100000,
    # Seconds between two publishes of a growing answer (each touches only the cache).
    "PUBLISH_INTERVAL": 0.25,
    "TOOL_TIMEOUT": 20,
    # Time kept back from a tool's limit for the round-trip after it.
    "TOOL_RESERVE": 5,
    "MAX_STEPS": 8,
    # Tool calls one model reply may have run (0 = no limit); each one past it gets an error
    # result instead of running, so that a prompt-injected reply cannot run a tool thousands of times.
    "MAX_TOOL_CALLS_PER_STEP": 16,
    # Times a turn is continued by a new job after its work horse died or its worker shut down
    # (each within the turn's own deadline); then it ends failed as before.
    "MAX_RESUMES": 2,
    # Turns one ConcurrentWorker process runs at once, each in a thread (each holds a database
    # connection while it runs a step: keep PostgreSQL's max_connections above processes x this).
    "WORKER_THREADS": 32,
    # PostgreSQL connections a ConcurrentWorker process's turns may keep open, idle, while they wait
    # on a provider or a tool; the other waiting turns close theirs and connect again at their next
    # step (5-6 ms each, bench.pg_connect). 0: every turn closes its connection before each wait.
    "WORKER_IDLE_CONNECTIONS": 4,
    # Threads a ConcurrentWorker gave up on (a turn stuck past its job timeout, a tool past its limit)
    # that may live on before the process shuts down warmly to be restarted by its supervisor.
    "WORKER_MAX_STUCK": 4,
    # OpenTelemetry (the optional extra conversations[otel]; docs/observability.md): "" sends spans and
    # metrics to the providers the site set up itself (none: nothing is made); "otlp" sets up the SDK
    # with its OTLP/HTTP exporters, configured by the standard OTEL_* environment variables
    # (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, ...); "console" prints them to standard output.
    "TELEMETRY": "",
    # Put message text (the model's answers) in spans: off, since a trace backend is read by operators,
    # not only by the site's owners; the spans then carry names, times, counts and error kinds only.
    "TELEMETRY_CONTENT": False,
    # Live state in the Django cache.
    "CACHE_ALIAS": "default",
    "STATE_TTL": 600,
    # A running turn whose state has not changed for this long gets its RQ job checked by the poll view.
    "STALE_AFTER": 45,
    # Seconds a turn may wait in the queue for a worker. A turn no worker has picked up by then is
    # ended (failed, "not available right now") by the poll view, repair_turns or its own job,
    # and never runs later. Keep it well under JOB_TIMEOUT: the widget gives up after that.
    "QUEUE_WAIT": 30,
    "QUEUE": "default",
    "TOOLS": [],
    "TOOL_RESULT_MAX_CHARS": 4000,
    # The search_site tool leaves out passages that matched a question less than this: the
    # question's words a passage holds, each counted by its rarity among the passages (1 for a
    # word only one passage holds), so that a question the site does not answer gets no passage
    # to quote. 1.5: chosen by bench.knowledge_quality (docs/benchmarks.md).
    "SEARCH_FLOOR": 1.5,
    # The site's own synonyms for search_site, added to the built-in ones of its language:
    # {"word" or "two words": ["alternative", ...]}, e.g. {"telly": ["television"]}.
    "SEARCH_SYNONYMS": {},
    # Optional: search_site also weighs a passage by meaning, from an OpenAI-compatible embeddings
    # endpoint: {"BASE_URL": "http://127.0.0.1:8011/v1", "MODEL": "…", "API_KEY": "…" or
    # "CREDENTIAL": "<a name in CREDENTIALS>", "TIMEOUT": 5, "FLOOR": 4.9}. Empty (the default):
    # off, and no call is ever made (docs/knowledge.md#meaning-an-embeddings-endpoint).
    "SEARCH_EMBEDDINGS": {},
    "HISTORY_MAX_CHARS": 24000,
    # The longest answer one model call may write, in tokens (required by Anthropic's API).
    "MAX_TOKENS": 1024,
    "MAX_MESSAGE_LENGTH": 4000,
    # Abuse and cost limits (see SECURITY.md). Rates are DRF rate strings; "" switches one off.
    "TURN_RATE_PER_OWNER": "10/min",
    "TURN_RATE_PER_IP": "30/min",
    # New conversations (each also a session in Redis for an anonymous visitor).
    "CONVERSATION_RATE_PER_OWNER": "20/hour",
    "CONVERSATION_RATE_PER_IP": "100/hour",
    # Every per-address limit counts an IPv6 client by its network of this prefix length: one
    # subscriber usually holds a whole /64 (0-128; 128 counts each address apart).
    "IPV6_PREFIX": 64,
    # Turns one conversation may have, and tokens (input + output) one owner may use per day; 0 = no limit.
    "MAX_TURNS_PER_CONVERSATION": 50,
    "DAILY_TOKEN_BUDGET": 200000,
    # Turns one owner may have queued or running at once, across conversations (0 = no limit), and
    # the tokens the daily budget holds back for each of them until it ends.
    "MAX_ACTIVE_TURNS_PER_OWNER": 2,
    "TURN_TOKEN_RESERVE": 4000,
    # Turns one client address (an IPv6 one by its IPV6_PREFIX network) may have queued or running
    # at once, across all the owners it speaks for (0 = no limit). Keep it below the number of
    # workers, so that one address cannot keep every worker busy (docs/deployment.md).
    "MAX_ACTIVE_TURNS_PER_ADDRESS": 3,
    # When an anonymous visitor logs in, their conversations active within this many seconds become
    # the user's (readable from all their sessions); 0 = none (the browser keeps its own either way).
    "CLAIM_ON_LOGIN_WITHIN": 300,
    # Larger API request bodies are refused (413) before they are read.
    "MAX_REQUEST_BYTES": 65536,
    # Seconds the demo model pauses per reply, so the widget shows each step land.
    "DEMO_DELAY": 0.8,
    # Only logged-in users may chat: anonymous callers get 403 "Please sign in…" from every API endpoint.
    "LOGIN_REQUIRED": False,
    # API keys that assistants (edited in the admin, which never stores a key) and FALLBACKS entries
    # name: {name: value}, the value the key itself or "env:VARIABLE" to read it from the worker's
    # environment, sent only to its provider's default origin; or {"KEY": value, "ORIGINS": [...]}
    # to bind it to the origins it may be sent to (a gateway, Azure; endpoints.py).
    "CREDENTIALS": {},
    # Endpoints an assistant may be given in the admin (its own or a fallback's), besides the
    # vendors' public origins and the site's own BASE_URL and FALLBACKS: origins, "*" matching any
    # characters ("https://*.example.com", "http://127.0.0.1:*"). An entry whose host is written
    # out may be at a private, loopback or link-local address (a local model); the others, like
    # the vendors', must be at a public address, checked on the address connected to.
    "ALLOWED_ENDPOINTS": [],
    # Dotted paths of provider classes an assistant may name in the admin, besides "openai",
    # "anthropic", "demo" and the site's PROVIDER and FALLBACKS providers (nothing else is imported).
    "ALLOWED_PROVIDERS": [],
    # Prices per million tokens, by model name: {"gpt-4o-mini": {"input": "0.15", "output": "0.60"}};
    # each turn's cost is computed from them at its final write.
    "PRICES": {},
    # Ratings of answers per owner and per client address (DRF rates; "" = off).
    "RATING_RATE_PER_OWNER": "30/min",
    "RATING_RATE_PER_IP": "60/min",
    # Conversations a visitor deletes with the widget's "Delete this conversation" (each one an
    # erasure, docs/privacy.md) per owner and per client address (DRF rates; "" = off).
    "DELETE_RATE_PER_OWNER": "10/hour",
    "DELETE_RATE_PER_IP": "30/hour",
    # Pages on other sites that may embed the widget with the one script tag (docs/widget.md):
    # origins, "*" matching any characters ("https://*.example.com"), for every assistant and the
    # default one; an assistant's own list (in the admin) adds to it for that assistant.
    "ALLOWED_ORIGINS": [],
    # Seconds a visitor token (what an embedded widget sends instead of cookies) is good for; the
    # widget renews it before then.
    "WIDGET_TOKEN_TTL": 900,
    # Seconds a token's chain of renewals lasts from its first token (at least WIDGET_TOKEN_TTL):
    # then an anonymous visitor's widget gets a new chain, a signed-in user reloads the page.
    "WIDGET_TOKEN_MAX_AGE": 12 * 3600,
    # Visitor tokens minted per client address (a DRF rate; "" = off).
    "TOKEN_RATE_PER_IP": "30/min",
    # Polls (of a turn, of a handoff) answered 404 per client address, past which its polls get 429
    # before any lookup (a DRF rate; "" = off). A widget polling its own turn never misses.
    "POLL_MISS_RATE_PER_IP": "120/min",
    # The secret a host site signs its signed-in user's id with (HMAC-SHA256; docs/widget.md), and
    # how long such a signature is good for, in seconds. "" refuses every signed identity.
    "IDENTITY_SECRET": "",
    "IDENTITY_MAX_AGE": 300,
    # A conversation handed to a person (Assistant.handoff, engine/handoff.py): seconds a visitor
    # waits for staff to take it before the widget says no one is free and offers the assistant
    # again; addresses mailed at each request, through Django's mail settings (empty: none); how a
    # staff member is named to the visitor ({first_name}, {last_name}, {username}).
    "HANDOFF_WAIT": 300,
    # Messages a visitor may write into one conversation while staff hold it (no turn counts them
    # against MAX_TURNS_PER_CONVERSATION or the token budget); each is MAX_MESSAGE_LENGTH at most. 0 = no limit.
    "HANDOFF_MAX_MESSAGES": 50,
    "HANDOFF_EMAILS": [],
    "HANDOFF_STAFF_NAME": "{first_name} from support",
    # A tool call that waits for a person's approval (``@tool(approval=True)``, docs/tools.md):
    # seconds it waits before the turn ends incomplete; approvals and declines per owner and per
    # client address (DRF rates; "" = off).
    "APPROVAL_WAIT": 600,
    "APPROVAL_RATE_PER_OWNER": "30/min",
    "APPROVAL_RATE_PER_IP": "60/min",
    # The site's address ("https://shop.example.com"), for links in mail sent from a worker, which
    # has no request to take the host from; "" takes it from django.contrib.sites where installed.
    "SITE_URL": "",
    # Redaction before storage (docs/privacy.md): what visitors write, the answers and the tool
    # results are stored, published and shown to staff with these replaced: "card" (card numbers,
    # Luhn-checked), "email", "phone". An assistant's own list (in the admin) replaces it.
    "REDACT": [],
    # The site's own rules, applied after those: regular expressions (each match becomes
    # "[removed]"), {"pattern": ..., "replacement": ...} dicts, or callables taking and returning text.
    "REDACT_PATTERNS": [],
    # Whether the model still reads the visitor's own words, unredacted, in the turn they were
    # written (kept in Redis for that turn only, at most its job timeout); False: it reads what is stored.
    "REDACT_ORIGINAL_TO_MODEL": False,
    # Retention (manage.py purge_conversations): conversations are deleted RETENTION_DAYS days
    # after RETENTION_FROM, "created" (they started) or "last_message" (their last message); 0 keeps
    # them until erased. An assistant's own values (in the admin) replace these for its conversations.
    "RETENTION_DAYS": 0,
    "RETENTION_FROM": "last_message",
    # In the transaction that deletes them, add the purged turns' ratings and costs to anonymous
    # daily totals (RetainedTotal: per day and assistant, no conversation, owner or text).
    "RETENTION_KEEP_TOTALS": True,
    # The purge deletes in short transactions, so that a visitor's turn never waits long behind it
    # for a lock: on SQLite each aims to hold its locks RETENTION_BATCH_TIME seconds (its size
    # follows how long the ones before took) and deletes RETENTION_BATCH messages at most (on
    # PostgreSQL, with row locks, RETENTION_BATCH each); the next begins RETENTION_PAUSE seconds
    # later (SQLite's busy handler retries a waiting writer after up to 100 ms: a shorter pause can
    # let the next batch go first again).
    "RETENTION_BATCH": 500,
    "RETENTION_BATCH_TIME": 0.01,
    "RETENTION_PAUSE": 0.2,
    # Show visitors, under the widget, how long their chat is kept (RETENTION_DAYS, or the assistant's).
    "WIDGET_RETENTION_NOTE": False,
    # The groups (django.contrib.auth) that make a user a member for the site's own rules (a
    # knowledge source's visible=, a permission granted through a group): a test question asked by
    # a "member" is asked by a user of the run's own in these groups. Empty: a member is any
    # signed-in user, as the demo's members-only articles have it.
    "TEST_MEMBER_GROUPS": [],
}

_LIST_KEYS = {"TOOLS", "ALLOWED_ENDPOINTS", "ALLOWED_PROVIDERS", "ALLOWED_ORIGINS", "HANDOFF_EMAILS", "REDACT",
              "TEST_MEMBER_GROUPS"}
_DICT_KEYS = {"CREDENTIALS", "PRICES", "SEARCH_SYNONYMS", "SEARCH_EMBEDDINGS"}


def _frozen(value):
    """``value`` as a read-only mapping (nested mappings too), like the lists that become tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({key: _frozen(item) for key, item in value.items()})
    return value


def _coerce(key, value, default):
    if key in _DICT_KEYS:  # a JSON object when it comes from the environment
        value = json.loads(value) if isinstance(value, str) else value
        if not isinstance(value, Mapping):
            raise ValueError(key)
        return _frozen(value)
    if key == "FALLBACKS":  # a list of dicts; from the environment, as JSON
        entries = json.loads(value) if isinstance(value, str) else value
        if not isinstance(entries, (list, tuple)) or not all(isinstance(e, dict) for e in entries):
            raise ValueError(key)
        return tuple(MappingProxyType(dict(e)) for e in entries)
    if key == "REDACT_PATTERNS":  # regular expressions may hold commas: from the environment, as JSON
        value = json.loads(value) if isinstance(value, str) else value
        if not isinstance(value, (list, tuple)):
            raise ValueError(key)
        return tuple(_frozen(item) for item in value)
    if key in _LIST_KEYS:  # a tuple, so that the shared configuration cannot be changed through it
        if isinstance(value, str):
            return tuple(item.strip() for item in value.split(",") if item.strip())
        return tuple(value)
    if isinstance(value, str):
        if isinstance(default, bool):
            return value.strip().lower() in {"1", "true", "yes", "on"}
        if isinstance(default, int):
            return int(value)
        if isinstance(default, float):
            return float(value)
    return value


@lru_cache(maxsize=None)
def get_config():
    """Return the merged configuration; raises ValueError naming a key that cannot be parsed.

    Every caller shares the one cached object, so it is read-only (a mapping whose lists are
    tuples); ``{**get_config(), KEY: value}`` makes a changed copy.
    """
    user = getattr(settings, "CONVERSATIONS", {}) or {}
    config = {key: tuple(value) if key in _LIST_KEYS or key in ("FALLBACKS", "REDACT_PATTERNS") else _frozen(value)
              for key, value in DEFAULTS.items()}
    for key, value in user.items():
        try:
            config[key] = _coerce(key, value, DEFAULTS.get(key))
        except ValueError:
            raise ValueError(f"CONVERSATIONS[{key!r}] = {value!r} is not a valid {type(DEFAULTS[key]).__name__}"
                             + (" of provider dicts" if key == "FALLBACKS" else ""))
    return MappingProxyType(config)


def unknown_keys():
    """The keys of the ``CONVERSATIONS`` setting that no default has, each with the known key
    it most resembles (or None): ``[(key, close_match)]``, for the system check."""
    user = getattr(settings, "CONVERSATIONS", {}) or {}
    return [(key, next(iter(difflib.get_close_matches(str(key), DEFAULTS, n=1)), None))
            for key in user if key not in DEFAULTS]


@receiver(setting_changed)
def _clear_config(*, setting, **kwargs):
    if setting in {"CONVERSATIONS", "RQ_QUEUES", "RQ"}:
        get_config.cache_clear()
