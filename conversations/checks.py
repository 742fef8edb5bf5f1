"""System checks: configurations that cannot work are refused at start-up, each with an id and a hint.

The clocks must nest: every call fits in the job's own deadline, which fits in RQ's job
timeout, with a margin left for the final write. ``check_config()`` is run by Django's check
framework (``manage.py check``, ``runserver``, ``rqworker``); it returns a list of messages.
"""

import importlib.util
import os
import re
import sys
from urllib.parse import urlsplit

from django.apps import apps
from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.utils.module_loading import import_string

from .conf import DEFAULTS, get_config, unknown_keys
from .infra.network import describe_redis_error, redis_endpoint
from .core.rules import clock_errors, rate_is_on, reserve_errors
from .engine.handoff import staff_name_problem
from .engine.retention import timing_problems
from .engine.worker import ConcurrentWorker, Worker
from .providers import get_provider_class
from .endpoints import (calls_url, credential_parts, credential_shape_problem, is_embed_origin, origin, origin_pattern,
                        plain_url_problem, unset_variable)
from .redaction import keys_shown_in_error_reports, redaction_problems
from .tools import load_tools
from .core.pricing import price_problem
from .assistants import chain_problems, problems
from .models import Assistant
from .knowledge.embeddings import setting_problems as embeddings_problems
from .knowledge.index import never_built
from .knowledge.models import IndexedObject
from .knowledge.registry import sources as knowledge_sources


@register()
def check_config(app_configs=None, **kwargs):
    try:
        cfg = get_config()
    except ValueError as exc:
        return [Error(str(exc), hint="Use a number for timeouts and limits.", id="conversations.E000")]
    errors = _check_keys() + clock_errors(cfg)
    if isinstance(cfg["SEARCH_FLOOR"], bool) or not isinstance(cfg["SEARCH_FLOOR"], (int, float)):
        errors.append(Error(f"CONVERSATIONS['SEARCH_FLOOR'] = {cfg['SEARCH_FLOOR']!r} is not a number.",
                            hint="Use a number: 1.5 by default, 0 to keep every hit.", id="conversations.E000"))
    job = cfg["JOB_TIMEOUT"]
    queue = getattr(settings, "RQ_QUEUES", {}).get(cfg["QUEUE"])
    if queue is None:
        errors.append(Error(f"RQ_QUEUES has no queue named {cfg['QUEUE']!r}.",
                            hint="Add it to RQ_QUEUES or set CONVERSATIONS['QUEUE'].", id="conversations.E006"))
    elif queue.get("DEFAULT_TIMEOUT") not in (None, job):
        errors.append(Error(
            f"RQ_QUEUES[{cfg['QUEUE']!r}]['DEFAULT_TIMEOUT'] ({queue.get('DEFAULT_TIMEOUT')}) disagrees with "
            f"JOB_TIMEOUT ({job}).",
            hint="Use the same value, so every clock is nested the way the deadline assumes.",
            id="conversations.E007"))
    errors += _check_provider(cfg) + _check_environment(cfg) + _check_fallbacks(cfg) + _check_tools(cfg)
    errors += _check_rates(cfg)
    for key, least in (("WORKER_THREADS", 1), ("WORKER_MAX_STUCK", 1), ("WORKER_IDLE_CONNECTIONS", 0)):
        if cfg[key] < least:
            errors.append(Error(f"{key} ({cfg[key]}) must be at least {least}.", hint="See docs/deployment.md.",
                                id="conversations.E015"))
    errors += _check_credentials(cfg) + _check_prices(cfg) + _check_allowed_endpoints(cfg) + _check_handoff(cfg)
    errors += _check_approvals(cfg) + _check_privacy(cfg)
    errors += _check_widget_tokens(cfg) + _check_telemetry(cfg)
    if "django.contrib.auth.middleware.LoginRequiredMiddleware" in settings.MIDDLEWARE and not cfg["LOGIN_REQUIRED"]:
        errors.append(Warning(
            "LoginRequiredMiddleware is on but CONVERSATIONS['LOGIN_REQUIRED'] is not: the chat API is exempt from "
            "the middleware (a redirect to a login page means nothing to the widget), so anonymous visitors can "
            "still chat.",
            hint="Set CONVERSATIONS['LOGIN_REQUIRED'] = True to keep the assistant to logged-in users, or silence "
                 "this warning if anonymous visitors of your public pages may chat.",
            id="conversations.W007"))
    if not _final_writing_worker(getattr(settings, "RQ", {}).get("WORKER_CLASS", "")):
        errors.append(Warning(
            "The RQ worker class is neither conversations.worker.ConcurrentWorker nor conversations.worker.Worker: "
            "a killed work horse leaves its turn without a final state until a poll notices.",
            hint='Set RQ = {"WORKER_CLASS": "conversations.worker.ConcurrentWorker"} or '
                 '"conversations.worker.Worker" (or subclass one).',
            id="conversations.W001"))
    return errors


TELEMETRY_MODES = {"": None, "console": ["opentelemetry.sdk"],
                   "otlp": ["opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"]}


def _check_telemetry(cfg):
    """TELEMETRY names a mode this app knows, and the packages that mode needs are installed."""
    mode = cfg["TELEMETRY"]
    if mode not in TELEMETRY_MODES:
        return [Error(f"CONVERSATIONS['TELEMETRY'] = {mode!r} is not a telemetry mode.",
                      hint='Use "" (the site\'s own OpenTelemetry set-up, if any), "otlp" or "console" '
                           "(docs/observability.md).", id="conversations.E080")]
    missing = [name for name in TELEMETRY_MODES[mode] or [] if not _importable(name)]
    if missing:
        return [Warning(f"CONVERSATIONS['TELEMETRY'] = {mode!r}, but {', '.join(missing)} cannot be imported: "
                        "no span or metric is sent.",
                        hint="Install the extra: pip install 'django-conversations[otel]'.", id="conversations.W080")]
    return []


def _importable(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def _final_writing_worker(worker_class):
    """Whether the configured RQ worker class is (a subclass of) one of ours."""
    try:
        cls = import_string(worker_class) if isinstance(worker_class, str) else worker_class
    except ImportError:
        return False
    return isinstance(cls, type) and issubclass(cls, (Worker, ConcurrentWorker))


def _check_provider(cfg):
    try:
        get_provider_class(cfg["PROVIDER"])
    except (ImportError, TypeError) as exc:
        return [Error(f"PROVIDER {cfg['PROVIDER']!r} cannot be used: {exc}",
                      hint="Use 'demo', 'openai', 'anthropic' or the dotted path of a BaseProvider subclass.",
                      id="conversations.E010")]
    if cfg["BASE_URL"] and plain_url_problem(cfg["BASE_URL"]):
        return [Error("BASE_URL is not a plain URL: no turn can be sent to it.",
                      hint="Write it as scheme://host[:port]/path, without a user name, backslash, space, control "
                           "character or percent-encoding before the path (a gateway's credentials go in "
                           "API_KEY).", id="conversations.E016")]
    if cfg["PROVIDER"] not in ("demo",) and not cfg["API_KEY"] and not cfg["BASE_URL"]:
        return [Warning(f"PROVIDER is {cfg['PROVIDER']!r} but API_KEY is empty.",
                        hint="Set CONVERSATIONS_API_KEY (or BASE_URL for a local server that needs none).",
                        id="conversations.W002")]
    return []


# The provider's keys that "Choosing a provider" tells a site to set as CONVERSATIONS_<KEY>.
PROVIDER_ENVIRONMENT = ("PROVIDER", "MODEL", "BASE_URL", "API_KEY")


def _check_environment(cfg):
    """A ``CONVERSATIONS_<KEY>`` variable of the provider's that the settings do not use
    (conversations.W008): a settings module that reads PROVIDER, MODEL and API_KEY from the
    environment but not BASE_URL sends every turn to the vendor's default host, not to the one
    the operator named, and the visitor reads "could not reach the AI service". The settings
    win, so this only warns: it is silenced where a site overrides the environment on purpose.
    The message names keys and hosts, never a key's value."""
    messages = []
    for key in PROVIDER_ENVIRONMENT:
        variable = f"CONVERSATIONS_{key}"
        value = os.environ.get(variable, "")
        if not value or str(cfg[key]) == value:
            continue
        if key == "BASE_URL":
            calls = calls_url(cfg["PROVIDER"], cfg["BASE_URL"])
            said = (f"{variable} names {_host(value)}, but the turns call {_host(calls)}" if calls else
                    f"{variable} names {_host(value)}, but the settings name no endpoint")
        elif key == "API_KEY":
            said = f"{variable} is set, but the settings use {'another key' if cfg[key] else 'no key'}"
        else:
            said = f"{variable} is {value!r}, but the settings use {cfg[key]!r}"
        messages.append(Warning(
            f"{said}: the environment's value is not in CONVERSATIONS['{key}'].",
            hint=f'Read it in settings.py, as the README\'s block does: "{key}": os.environ.get("{variable}", ""); '
                 "or unset the variable (or silence this warning) if the settings are meant to win.",
            id="conversations.W008"))
    return messages


def _host(url):
    """The origin of ``url`` (``scheme://host[:port]``), as the admin's endpoint sentences and
    ``ALLOWED_ENDPOINTS`` write it: no user, password, path or query, where keys sometimes travel.
    Read leniently (a URL no key may go to is still named by its host), for a message only."""
    try:
        parts = urlsplit(str(url))
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "an unreadable URL"
    host = parts.hostname or ""
    return origin(f"{parts.scheme}://{f'[{host}]' if ':' in host else host}{port}") or "an unreadable URL"


def _check_fallbacks(cfg):
    """The site's FALLBACKS meet the rule an assistant's chain meets in the admin
    (``assistants.chain_problems``), said in the same sentences (conversations.E013); the reserve
    kept for the next provider lets a call start (conversations.E014)."""
    messages = []
    for problem in chain_problems(cfg["FALLBACKS"], cfg, settings=True):
        if problem.id == "conversations.W040":
            continue  # an unset variable: _check_credentials names it once, for its credential
        messages.append(Error(f"The site's FALLBACKS cannot work: {problem.msg}", hint=FALLBACKS_HINT,
                              id=problem.id))
    return messages + reserve_errors(cfg)


FALLBACKS_HINT = ("An entry takes PROVIDER and, as needed, MODEL, BASE_URL and either API_KEY or CREDENTIAL (a name "
                  "in CREDENTIALS, bound to the entry's endpoint).")


def _check_tools(cfg):
    try:
        load_tools(cfg["TOOLS"])
    except (ImportError, TypeError, ValueError) as exc:
        return [Error(f"A tool in TOOLS cannot be loaded: {exc}",
                      hint="List dotted paths of functions (or @tool objects) with supported type hints.",
                      id="conversations.E011")]
    return []


def _check_rates(cfg):
    """A rate DRF cannot parse would only fail (500) on the first turn posted; refuse it at start-up."""
    from rest_framework.throttling import SimpleRateThrottle

    errors = []
    for key in ("TURN_RATE_PER_OWNER", "TURN_RATE_PER_IP", "CONVERSATION_RATE_PER_OWNER", "CONVERSATION_RATE_PER_IP",
                "RATING_RATE_PER_OWNER", "RATING_RATE_PER_IP", "TOKEN_RATE_PER_IP",
                "APPROVAL_RATE_PER_OWNER", "APPROVAL_RATE_PER_IP"):
        rate = cfg[key]
        if not rate_is_on(rate):
            continue
        try:
            SimpleRateThrottle.parse_rate(None, str(rate))
        except (ValueError, KeyError, IndexError, AttributeError):
            errors.append(Error(f"{key} {rate!r} is not a rate.",
                                hint='Use "<number>/<sec|min|hour|day>", e.g. "10/min", or "" for no limit.',
                                id="conversations.E012"))
    prefix = cfg["IPV6_PREFIX"]
    if not isinstance(prefix, int) or isinstance(prefix, bool) or not 0 <= prefix <= 128:
        # Every per-address limit would fail (500) on the first IPv6 visitor.
        errors.append(Error(f"IPV6_PREFIX {prefix!r} is not an IPv6 prefix length.",
                            hint="Use a whole number from 0 to 128; 64 counts each subscriber's network as one "
                                 "address.", id="conversations.E019"))
    return errors


# -- the cache the app runs on (the queue is conversations.E006) -------------------------
# Ids E020… and W020…: a group of their own after the clocks (E000…) and what the app loads (E010…).

# Backends whose entries live in one process: a worker's writes never reach a web process.
PROCESS_LOCAL_CACHES = ("django.core.cache.backends.locmem.LocMemCache", "django.core.cache.backends.dummy.DummyCache")
FILE_CACHE = "django.core.cache.backends.filebased.FileBasedCache"


@register()
def check_cache(app_configs=None, **kwargs):
    """The cache of ``CACHE_ALIAS`` carries every step from the worker to the web processes (and
    Stop the other way), so it must be one that every process shares.

    A process-local cache is an error, in development too: the worker is always another process
    (and its work horse a fork of it), so nothing it publishes would ever be seen. The one
    exception is a queue with ``ASYNC: False``, where django-rq runs the job inside the web
    process that enqueued it (tests do this).
    """
    try:
        cfg = get_config()
    except ValueError:
        return []  # conversations.E000 names the value
    alias = cfg["CACHE_ALIAS"]
    caches = getattr(settings, "CACHES", {})
    if alias not in caches:
        return [Error(f"CACHES has no cache {alias!r}, which CONVERSATIONS['CACHE_ALIAS'] names.",
                      hint="Add it to CACHES (a Redis cache every process shares), or set CACHE_ALIAS to one "
                           "you have.", id="conversations.E020")]
    backend = caches[alias].get("BACKEND", "")
    try:
        cls = import_string(backend)
    except ImportError:
        return []  # Django itself fails on it at the first use of the cache, naming it
    kind = next((path.rsplit(".", 1)[1] for path in PROCESS_LOCAL_CACHES if issubclass(cls, import_string(path))),
                None)
    in_process = getattr(settings, "RQ_QUEUES", {}).get(cfg["QUEUE"], {}).get("ASYNC") is False
    if kind and not in_process:
        return [Error(
            f"CACHES[{alias!r}] is a {kind}, which each process keeps to itself: the steps a worker publishes "
            "never reach the web processes (the widget shows nothing until the turn's row is read from the "
            "database), and Stop never reaches the worker.",
            hint='Use a cache every process shares: {"BACKEND": "conversations.cache.RedisCache", "LOCATION": '
                 'REDIS_URL} (or Django\'s RedisCache), or point CONVERSATIONS["CACHE_ALIAS"] at one.',
            id="conversations.E021")]
    if issubclass(cls, import_string(FILE_CACHE)):
        return [Warning(
            f"CACHES[{alias!r}] is a FileBasedCache: processes on this machine share it, but a worker on "
            "another machine would publish its turns' steps where no web process reads them.",
            hint="Use Redis (conversations.cache.RedisCache), which the queue needs anyway; or keep every "
                 "worker on the web server's machine and silence this warning.",
            id="conversations.W020")]
    return []


# -- check --deploy: production settings the app relies on ----------------------------------


@register("security", deploy=True)  # Tags.security: listed by check --deploy only
def check_deploy(app_configs=None, **kwargs):
    """Warnings for ``manage.py check --deploy``: settings that work in development but not for
    real visitors. (A real provider without an API key is ``conversations.W002`` in every mode.)"""
    try:
        cfg = get_config()
    except ValueError:
        return []
    warnings = []
    if cfg["PROVIDER"] == "demo":
        warnings.append(Warning(
            "PROVIDER is 'demo': visitors get the offline demo model's canned answers, not a real model.",
            hint="Set CONVERSATIONS['PROVIDER'] ('openai', 'anthropic' or your own), with MODEL and API_KEY.",
            id="conversations.W030"))
    rest = getattr(settings, "REST_FRAMEWORK", {}) or {}
    behind_proxy = getattr(settings, "SECURE_PROXY_SSL_HEADER", None) or getattr(settings, "USE_X_FORWARDED_HOST",
                                                                                   False)
    if behind_proxy and rest.get("NUM_PROXIES") is None and rate_is_on(cfg["TURN_RATE_PER_IP"]):
        warnings.append(Warning(
            "The site is behind a reverse proxy (SECURE_PROXY_SSL_HEADER or USE_X_FORWARDED_HOST is set) but "
            "REST_FRAMEWORK['NUM_PROXIES'] is not: the per-IP turn limit sees every visitor as the proxy, so a "
            "few visitors use it up for everyone.",
            hint="Set REST_FRAMEWORK['NUM_PROXIES'] to the number of proxies in front of Django (see SECURITY.md).",
            id="conversations.W031"))
    if (cfg["PROVIDER"] != "demo" and not rate_is_on(cfg["TURN_RATE_PER_OWNER"])
            and not rate_is_on(cfg["TURN_RATE_PER_IP"]) and not cfg["DAILY_TOKEN_BUDGET"]):
        warnings.append(Warning(
            "TURN_RATE_PER_OWNER, TURN_RATE_PER_IP and DAILY_TOKEN_BUDGET are all off: anyone who can reach the "
            "page can make the site pay for model calls without limit.",
            hint="Set at least one of them (the defaults are 10/min, 30/min and 200000 tokens a day).",
            id="conversations.W032"))
    if cfg["TELEMETRY_CONTENT"]:
        warnings.append(Warning(
            "TELEMETRY_CONTENT is on: the model's answers are put in spans, where whoever reads the trace "
            "backend reads them, beyond the conversations' owners and the site's staff.",
            hint="Leave it off in production unless the trace backend is held to the same rules as the database.",
            id="conversations.W081"))
    return warnings


def _check_keys():
    """A misspelled key would otherwise be ignored without a word, its default silently used."""
    return [Warning(f"CONVERSATIONS[{key!r}] is not a setting of conversations; it is ignored.",
                    hint=f"Did you mean {match!r}?" if match else "The settings are listed in conversations/conf.py.",
                    id="conversations.W005")
            for key, match in unknown_keys()]


# -- assistants, their credentials, and prices ----------------------------------------------
# Ids E040… and W040…


def _check_error_reports(cfg):
    """Django's default filter hides settings by name: the bare keys of ``CREDENTIALS`` would be
    in the DEBUG page and in every mail to ``ADMINS``."""
    try:
        shown = keys_shown_in_error_reports(import_string(settings.DEFAULT_EXCEPTION_REPORTER_FILTER), cfg)
    except ImportError:
        return []  # Django's own check names a filter that cannot be imported
    if not shown:
        return []
    return [Warning(
        f"Error reports (the DEBUG page, mails to ADMINS) would show {shown} of the site's API keys: "
        "DEFAULT_EXCEPTION_REPORTER_FILTER hides settings by name, and CREDENTIALS holds keys under names of "
        "your choosing.",
        hint='Set DEFAULT_EXCEPTION_REPORTER_FILTER = "conversations.redaction.ExceptionReporterFilter" (or a '
             "filter of your own that hides CREDENTIALS).", id="conversations.W042")]


def _check_credentials(cfg):
    """A credential is a key or ``env:VARIABLE``; one whose variable is unset here is probably
    unset on the workers too (where it is read), so every turn of an assistant naming it fails."""
    messages = _check_error_reports(cfg)
    for name, entry in cfg["CREDENTIALS"].items():
        problem = credential_shape_problem(entry)
        if problem:
            messages.append(Error(
                f"CREDENTIALS[{name!r}] {problem}.",
                hint='For example {"support-key": "env:SUPPORT_OPENAI_KEY"} (sent to its provider\'s own origin '
                     'only) or {"gateway": {"KEY": "env:GATEWAY_KEY", "ORIGINS": ["https://gw.example.com"]}}: '
                     "the key is read from that environment variable when a turn starts.", id="conversations.E040"))
            continue
        variable = unset_variable(credential_parts(entry)[0])
        if variable:
            messages.append(Warning(
                f"CREDENTIALS[{name!r}] reads the environment variable {variable}, which is not set "
                "in this process.",
                hint="Set it wherever workers run: every turn of an assistant that uses this credential fails "
                     "without it.", id="conversations.W040"))
    return messages


def _check_approvals(cfg):
    """A tool call that needs an approval must be able to get one (engine/approvals.py)."""
    messages = []
    if cfg["APPROVAL_WAIT"] < 1:
        messages.append(Error(f"APPROVAL_WAIT is {cfg['APPROVAL_WAIT']}: every tool call that needs an approval "
                              "would expire before anyone could approve it.",
                              hint='Seconds a person has to approve a call, e.g. "APPROVAL_WAIT": 600.',
                              id="conversations.E075"))
    try:
        tools = load_tools(cfg["TOOLS"]).values()
    except (ImportError, TypeError, ValueError):  # conversations.E011 says so
        tools = []
    staff_only = sorted(t.name for t in tools if t.approval and t.approver == "staff")
    if staff_only and not apps.is_installed("django.contrib.admin"):
        messages.append(Warning(
            f"The tools {', '.join(staff_only)} wait for staff approval, which is given in the admin, and "
            "django.contrib.admin is not installed: their calls can only be declined or expire.",
            hint="Install the admin, or declare them approver=\"visitor\".", id="conversations.W076"))
    return messages


def _check_privacy(cfg):
    """Redaction and retention settings must be usable (docs/privacy.md)."""
    problems_found = redaction_problems(cfg["REDACT"], cfg["REDACT_PATTERNS"])
    if cfg["RETENTION_FROM"] not in ("created", "last_message"):
        problems_found.append(f"RETENTION_FROM is {cfg['RETENTION_FROM']!r}, not \"created\" or \"last_message\"")
    days = cfg["RETENTION_DAYS"]
    if isinstance(days, bool) or not isinstance(days, int) or days < 0:
        problems_found.append(f"RETENTION_DAYS is {days!r}, not a whole number of at least 0")
    errors = [Error(f"{problem}.", hint='For example "REDACT": ["card", "email"], "REDACT_PATTERNS": [r"ORD-\\d+"], '
                    '"RETENTION_DAYS": 90, "RETENTION_FROM": "last_message".',
                    id="conversations.E085") for problem in problems_found]
    # the hint's values are conf.DEFAULTS' own, so that it cannot name defaults the app no longer has
    hint = (f'The defaults: "RETENTION_BATCH": {DEFAULTS["RETENTION_BATCH"]} (messages per transaction at most), '
            f'"RETENTION_BATCH_TIME": {DEFAULTS["RETENTION_BATCH_TIME"]} (seconds a transaction aims at), '
            f'"RETENTION_PAUSE": {DEFAULTS["RETENTION_PAUSE"]} (seconds between two).')
    return errors + [Error(f"{problem}.", hint=hint, id="conversations.E086")
                     for problem in timing_problems(cfg["RETENTION_BATCH"], cfg["RETENTION_BATCH_TIME"],
                                                    cfg["RETENTION_PAUSE"])]


def _check_handoff(cfg):
    """How staff are named to visitors, and how long a visitor waits for them, must be usable."""
    problems_found = []
    problem = staff_name_problem(cfg["HANDOFF_STAFF_NAME"])
    if problem:
        problems_found.append(f"HANDOFF_STAFF_NAME {cfg['HANDOFF_STAFF_NAME']!r} {problem}")
    if cfg["HANDOFF_WAIT"] < 1:
        problems_found.append(f"HANDOFF_WAIT is {cfg['HANDOFF_WAIT']}: a visitor would be told no one is free at once")
    problems_found += [f"HANDOFF_EMAILS has {address!r}, which is not an e-mail address"
                       for address in cfg["HANDOFF_EMAILS"] if "@" not in str(address)]
    if cfg["SITE_URL"] and not re.fullmatch(r"https?://[^/\s?#]+(/[^\s?#]*)?", cfg["SITE_URL"]):
        problems_found.append(f"SITE_URL {cfg['SITE_URL']!r} is not an http(s) address")
    messages = [Error(f"{problem}.", hint='For example "HANDOFF_STAFF_NAME": "{first_name} from support", '
                      '"HANDOFF_WAIT": 300, "HANDOFF_EMAILS": ["support@example.com"], '
                      '"SITE_URL": "https://shop.example.com".', id="conversations.E044")
                for problem in problems_found]
    if cfg["HANDOFF_EMAILS"] and not cfg["SITE_URL"] and not apps.is_installed("django.contrib.sites"):
        messages.append(Warning(
            "The handoff mail's link to the answer page will be a path alone, which a mail program cannot open.",
            hint='Set CONVERSATIONS["SITE_URL"] to the site\'s address ("https://shop.example.com"), or install '
                 "django.contrib.sites.", id="conversations.W046"))
    return messages


def _check_widget_tokens(cfg):
    """A chain of visitor tokens is renewed for WIDGET_TOKEN_MAX_AGE from its first token, which
    alone lasts WIDGET_TOKEN_TTL: a shorter max age would leave nothing to renew."""
    ttl, max_age = cfg["WIDGET_TOKEN_TTL"], cfg["WIDGET_TOKEN_MAX_AGE"]
    if max_age >= ttl:
        return []
    return [Error(f"WIDGET_TOKEN_MAX_AGE ({max_age}s) is shorter than WIDGET_TOKEN_TTL ({ttl}s): the first token "
                  "of a chain would outlive the time its chain may be renewed for.",
                  hint="Make WIDGET_TOKEN_MAX_AGE at least WIDGET_TOKEN_TTL (by default 12 hours and 15 minutes "
                       "respectively).",
                  id="conversations.E045")]


def _check_prices(cfg):
    """Each price is a decimal number of the site's currency per million tokens, input and output."""
    return [Error(f"PRICES[{model!r}] {problem}.",
                  hint='Write {"model-name": {"input": "0.15", "output": "0.60"}}: prices per million tokens, '
                       "as decimal strings.", id="conversations.E041")
            for model, entry in cfg["PRICES"].items()
            for problem in [price_problem(entry)] if problem]


def _check_allowed_endpoints(cfg):
    """Each ALLOWED_ENDPOINTS entry is an origin, wildcards allowed; anything else would match
    nothing, and the endpoint the operator meant to allow would be refused without a word."""
    return [Error(f"ALLOWED_ENDPOINTS entry {entry!r} is not an origin.",
                  hint='Write a scheme, a host and an optional port, without a path: "https://gw.example.com", '
                       '"https://*.openai.azure.com", "http://10.0.0.5:11434".', id="conversations.E042")
            for entry in cfg["ALLOWED_ENDPOINTS"] if not origin_pattern(entry)] + [
        # An ALLOWED_ORIGINS entry that is no origin would leave the pages it meant refused; one as
        # broad as "https://*" would let every site's pages embed the widget.
        Error(f"ALLOWED_ORIGINS entry {entry!r} is not an origin a page can have.",
              hint='Write a scheme, a host and an optional port, without a path: "https://www.example.com", or '
                   '"https://*.example.com" for every subdomain of a domain.', id="conversations.E043")
        for entry in cfg["ALLOWED_ORIGINS"] if not is_embed_origin(entry)]


@register(Tags.database)
def check_assistants(app_configs=None, databases=None, **kwargs):
    """Assistants whose provider, tools, credential, prompt or clocks cannot work any more (a
    setting changed after they were saved). A database check, as Django's own are: it runs when
    a database is named (``migrate``, ``check --database default``), and then only once the
    assistants' table exists; warnings, so that they never stop a migration. A turn of such an
    assistant ends failed with a sentence naming it, and the admin refuses to save it."""
    from django.db import DatabaseError, connections

    messages = []
    for alias in databases or []:
        try:
            if Assistant._meta.db_table not in connections[alias].introspection.table_names():
                continue
            assistants = list(Assistant.objects.using(alias).filter(active=True).order_by("slug"))
        except DatabaseError:
            continue
        for assistant in assistants:
            for field, reason in problems(assistant):
                messages.append(Warning(
                    f"The assistant {assistant.slug!r} is not set up correctly: {reason}",
                    hint="Correct it in the admin, or switch it off; meanwhile each of its turns ends failed.",
                    obj=assistant, id="conversations.W041"))
    return messages


@register()
def check_knowledge(app_configs=None, **kwargs):
    """Knowledge sources (``conversations.knowledge.register``) naming a model or field that does
    not exist, or giving no URL: errors, since a search of them could only fail."""
    return [Error(message, hint=hint, id=check_id)
            for source in knowledge_sources().values() for check_id, message, hint in source.problems()] + [
        Error(message, hint=hint, id=check_id) for check_id, message, hint in embeddings_problems()]


@register(Tags.database)
def check_knowledge_built(app_configs=None, databases=None, **kwargs):
    """Knowledge sources whose objects are published but none is indexed (``conversations.W054``):
    rows that existed before the registration, or came by ``loaddata``, a data migration or
    ``bulk_create``, none of which indexes. A database check, like ``check_assistants``; it is
    also shown at the end of ``migrate`` (``report_after_migrate``)."""
    from django.db import DatabaseError, connections, router

    messages = []
    for alias in databases or []:
        if router.db_for_read(IndexedObject) != alias:
            continue
        try:
            if IndexedObject._meta.db_table not in connections[alias].introspection.table_names():
                continue
            unbuilt = [source.name for source in knowledge_sources().values() if never_built(source)]
        except DatabaseError:
            continue
        messages += [Warning(f"Knowledge source {name!r} has published objects but none is indexed: search_site "
                             "finds nothing in it.",
                             hint=f"Run manage.py rebuild_knowledge {name} (rows created by loaddata, a data "
                                  "migration or bulk_create are indexed only by it).", id="conversations.W054")
                     for name in unbuilt]
    return messages


@register(Tags.database)
def check_test_member_groups(app_configs=None, databases=None, **kwargs):
    """``TEST_MEMBER_GROUPS`` naming a group that does not exist (``conversations.W090``): a test
    question asked by a member would be asked by a user outside it, who sees only what any
    signed-in visitor sees, and the run would score the member's answers wrongly. A database
    check, like ``check_assistants``."""
    from django.contrib.auth.models import Group
    from django.db import DatabaseError, connections

    names = get_config()["TEST_MEMBER_GROUPS"]
    messages = []
    for alias in (databases or []) if names else []:
        try:
            if Group._meta.db_table not in connections[alias].introspection.table_names():
                continue
            found = set(Group.objects.using(alias).filter(name__in=names).values_list("name", flat=True))
        except DatabaseError:
            continue
        messages += [Warning(f"CONVERSATIONS['TEST_MEMBER_GROUPS'] names the group {name!r}, which does not exist: "
                             "a test question asked by a member is asked by a user outside it.",
                             hint="Name the groups your site's rules count as members, or create this one.",
                             id="conversations.W090") for name in names if name not in found]
    return messages


def report_after_migrate(using, verbosity=1, **kwargs):
    """post_migrate: print ``check_knowledge_built``'s warnings once the database is migrated,
    since ``migrate`` runs the database checks before it migrates, when nothing is there yet."""
    if verbosity:
        for message in check_knowledge_built(databases=[using]):
            sys.stderr.write(f"{message}\n")


# -- check --deploy: Redis answers -----------------------------------------------------------
# A deploy-time check (``check --deploy``; ``check --deploy --tag caches`` runs it alone): it
# opens connections, so it stays out of the plain ``check`` that runserver, rqworker and the
# tests run on every start.

REDIS_CHECK_TIMEOUT = 3  # seconds per connect and reply: a black-holed host must not hang a deploy


@register(Tags.caches, deploy=True)
def check_redis(app_configs=None, **kwargs):
    """The Redis servers the app needs (``CACHE_ALIAS``'s cache: live states, sessions kept in
    it, throttles; the turns' queue) answer a PING (conversations.E022). A wrong ``REDIS_URL``
    otherwise passes ``check`` and shows up as 503s in the widget and an HTML 500 at the admin's
    login. The message names host, port and reason, never a password."""
    import redis

    try:
        cfg = get_config()
    except ValueError:
        return []
    targets = {}  # URL -> what uses it
    cache = getattr(settings, "CACHES", {}).get(cfg["CACHE_ALIAS"], {})
    locations = cache.get("LOCATION", "")
    for location in locations.split(",") if isinstance(locations, str) else locations:
        if str(location).strip().startswith(("redis://", "rediss://", "unix://")):
            targets.setdefault(str(location).strip(), f"the cache {cfg['CACHE_ALIAS']!r}")
    queue = getattr(settings, "RQ_QUEUES", {}).get(cfg["QUEUE"], {})
    passwords = {}  # a queue given as HOST/PORT/DB keeps its PASSWORD out of the URL
    url = queue.get("URL") or ""
    if not url and queue.get("HOST"):
        url = f"redis://{queue['HOST']}:{queue.get('PORT', 6379)}/{queue.get('DB', 0)}"
        passwords[url] = queue.get("PASSWORD")
    if url:
        targets[url] = (targets[url] + " and " if url in targets else "") + f"the queue {cfg['QUEUE']!r}"
    errors = []
    for url, users in targets.items():
        options = {"socket_connect_timeout": REDIS_CHECK_TIMEOUT, "socket_timeout": REDIS_CHECK_TIMEOUT}
        if passwords.get(url):
            options["password"] = passwords[url]
        try:
            client = redis.Redis.from_url(url, **options)
            try:
                client.ping()
            finally:
                client.close()
        except (redis.RedisError, ValueError, OSError) as exc:
            errors.append(Error(
                f"Redis at {redis_endpoint(url)} is unreachable (used by {users}): {describe_redis_error(exc)}",
                hint="Check REDIS_URL (host, port, password, rediss:// for TLS) and that this machine may reach "
                     "it: until it answers, the widget's every request answers 503 and, with sessions in the "
                     "cache, the admin cannot log anyone in.",
                id="conversations.E022"))
    return errors
