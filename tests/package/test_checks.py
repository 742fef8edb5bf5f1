"""System checks refuse budgets that cannot work; each message has an id and a hint."""

import pytest
from django.core.cache.backends.locmem import LocMemCache
from django.core.checks import Error, Warning
from django.core.checks.registry import registry

import conversations.worker
from conversations.checks import check_cache, check_config, check_deploy


def test_the_suites_short_clocks_and_the_defaults_pass(conversations_settings, settings):
    assert check_config() == []
    conversations_settings.update(JOB_TIMEOUT=120, DEADLINE_MARGIN=20, CALL_TIMEOUT=60, CONNECT_TIMEOUT=10,
                                  MIN_CALL_BUDGET=5, TOOL_TIMEOUT=20, TOOL_RESERVE=5, STATE_TTL=600)
    assert check_config() == []


def test_margin_not_below_job_timeout(conversations_settings):
    conversations_settings.update(JOB_TIMEOUT=10, DEADLINE_MARGIN=10)
    assert check_config() == [Error(
        "DEADLINE_MARGIN (10s) must be smaller than JOB_TIMEOUT (10s).",
        hint="The job's own deadline is JOB_TIMEOUT - DEADLINE_MARGIN; it must leave time for work.",
        id="conversations.E001")]


def test_min_call_budget_not_below_margin(conversations_settings):
    conversations_settings.update(DEADLINE_MARGIN=4, MIN_CALL_BUDGET=4, TOOL_RESERVE=4, CALL_TIMEOUT=5)
    assert check_config() == [Error(
        "MIN_CALL_BUDGET (4s) must be smaller than DEADLINE_MARGIN (4s).",
        hint="The margin is what remains for the final write after the last call that may start.",
        id="conversations.E002")]


def test_call_timeout_below_min_call_budget(conversations_settings):
    conversations_settings.update(CALL_TIMEOUT=1, CONNECT_TIMEOUT=1, MIN_CALL_BUDGET=2, TOOL_RESERVE=2)
    assert check_config() == [Error(
        "CALL_TIMEOUT (1s) is smaller than MIN_CALL_BUDGET (2s): no call could ever start.",
        hint="Raise CALL_TIMEOUT or lower MIN_CALL_BUDGET.",
        id="conversations.E003")]


def test_deadline_too_short_for_a_single_call(conversations_settings):
    conversations_settings.update(JOB_TIMEOUT=10, DEADLINE_MARGIN=8, MIN_CALL_BUDGET=5, TOOL_RESERVE=5)
    assert check_config() == [Error(
        "JOB_TIMEOUT - DEADLINE_MARGIN (2s) is less than MIN_CALL_BUDGET (5s): no model call could ever start.",
        hint="The job's own deadline must leave room for at least one call: raise JOB_TIMEOUT or lower "
             "DEADLINE_MARGIN or MIN_CALL_BUDGET.",
        id="conversations.E008")]


def test_queue_default_timeout_that_disagrees_with_job_timeout(conversations_settings, settings):
    settings.RQ_QUEUES = {"default": {**settings.RQ_QUEUES["default"], "DEFAULT_TIMEOUT": 180}}
    assert check_config() == [Error(
        "RQ_QUEUES['default']['DEFAULT_TIMEOUT'] (180) disagrees with JOB_TIMEOUT (10).",
        hint="Use the same value, so every clock is nested the way the deadline assumes.",
        id="conversations.E007")]


def test_queue_missing(conversations_settings):
    conversations_settings.update(QUEUE="chat")
    assert check_config() == [Error(
        "RQ_QUEUES has no queue named 'chat'.",
        hint="Add it to RQ_QUEUES or set CONVERSATIONS['QUEUE'].", id="conversations.E006")]


def test_state_that_could_expire_while_the_turn_runs(conversations_settings):
    conversations_settings.update(STATE_TTL=5)
    assert check_config() == [Error(
        "STATE_TTL (5s) is shorter than JOB_TIMEOUT (10s): a turn's state could expire while it runs.",
        hint="Make STATE_TTL at least JOB_TIMEOUT.", id="conversations.E005")]


@pytest.mark.parametrize("key", ["STALE_AFTER", "STREAM_IDLE_TIMEOUT", "PUBLISH_INTERVAL"])
def test_non_positive_clock(conversations_settings, key):
    conversations_settings.update(**{key: 0})
    assert check_config() == [Error(f"{key} must be positive (it is 0).", hint="Use a positive number.",
                                    id="conversations.E004")]


def test_a_queue_wait_of_zero_would_end_every_turn_before_a_worker_could_take_it(conversations_settings):
    conversations_settings.update(QUEUE_WAIT=0)
    assert check_config() == [Error("QUEUE_WAIT must be positive (it is 0).", hint="Use a positive number.",
                                    id="conversations.E004")]


def test_a_queue_wait_longer_than_the_widget_waits_past_the_job_timeout(conversations_settings):
    conversations_settings.update(QUEUE_WAIT=31)
    assert check_config() == [Warning(
        "QUEUE_WAIT (31s) is longer than the widget's give-up margin (30s): the widget stops polling JOB_TIMEOUT "
        "plus that margin after the message was sent, so a turn that waits this long for a worker and then runs "
        "its whole JOB_TIMEOUT ends after the visitor was told it did not finish.",
        hint="Keep QUEUE_WAIT at most 30s and add workers rather than let turns wait, or give the widget a "
             "data-give-up-margin of at least QUEUE_WAIT and silence this warning.",
        id="conversations.W006")]
    conversations_settings.update(QUEUE_WAIT=30)
    assert check_config() == []


def test_login_required_middleware_without_login_required_leaves_the_chat_open(conversations_settings, settings):
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django.contrib.auth.middleware.LoginRequiredMiddleware"]
    assert check_config() == [Warning(
        "LoginRequiredMiddleware is on but CONVERSATIONS['LOGIN_REQUIRED'] is not: the chat API is exempt from the "
        "middleware (a redirect to a login page means nothing to the widget), so anonymous visitors can still chat.",
        hint="Set CONVERSATIONS['LOGIN_REQUIRED'] = True to keep the assistant to logged-in users, or silence this "
             "warning if anonymous visitors of your public pages may chat.",
        id="conversations.W007")]
    conversations_settings.update(LOGIN_REQUIRED=True)
    assert check_config() == []


def test_unparseable_number(conversations_settings, settings):
    settings.CONVERSATIONS = {**settings.CONVERSATIONS, "JOB_TIMEOUT": "two minutes"}
    assert check_config() == [Error("CONVERSATIONS['JOB_TIMEOUT'] = 'two minutes' is not a valid int",
                                    hint="Use a number for timeouts and limits.", id="conversations.E000")]


def test_a_relevance_floor_that_is_no_number(conversations_settings):
    conversations_settings.update(SEARCH_FLOOR=[1])
    assert check_config() == [Error("CONVERSATIONS['SEARCH_FLOOR'] = [1] is not a number.",
                                    hint="Use a number: 1.5 by default, 0 to keep every hit.", id="conversations.E000")]
    conversations_settings.update(SEARCH_FLOOR=0)
    assert check_config() == []


def test_connect_timeout_longer_than_the_call(conversations_settings):
    conversations_settings.update(CONNECT_TIMEOUT=10)
    assert check_config() == [Warning(
        "CONNECT_TIMEOUT (10s) is longer than CALL_TIMEOUT (5s); a connect never gets more than the call's total "
        "limit.", hint="Set CONNECT_TIMEOUT to at most CALL_TIMEOUT (a few seconds is usual).",
        id="conversations.W003")]


def test_tool_reserve_too_small_for_the_call_after_the_tool(conversations_settings):
    conversations_settings.update(TOOL_RESERVE=0.5)
    assert check_config() == [Warning(
        "TOOL_RESERVE (0.5s) is smaller than MIN_CALL_BUDGET (1s): a tool that uses its whole limit late in a turn "
        "leaves too little time for the model to read its result.",
        hint="Make TOOL_RESERVE at least MIN_CALL_BUDGET.", id="conversations.W004")]


def test_worker_class_that_cannot_write_the_final_state_of_a_killed_horse(settings):
    settings.RQ = {"WORKER_CLASS": "rq.Worker"}
    assert check_config() == [Warning(
        "The RQ worker class is neither conversations.worker.ConcurrentWorker nor conversations.worker.Worker: "
        "a killed work horse leaves its turn without a final state until a poll notices.",
        hint='Set RQ = {"WORKER_CLASS": "conversations.worker.ConcurrentWorker"} or "conversations.worker.Worker" '
             '(or subclass one).',
        id="conversations.W001")]


class ChatWorker(conversations.worker.Worker):
    """A project's own worker class, built on ours."""


def test_a_subclass_of_our_worker_class_is_fine(settings):
    settings.RQ = {"WORKER_CLASS": f"{__name__}.ChatWorker"}
    assert check_config() == []


def test_the_concurrent_worker_is_fine_with_at_least_one_thread(settings, conversations_settings):
    settings.RQ = {"WORKER_CLASS": "conversations.worker.ConcurrentWorker"}
    assert check_config() == []
    conversations_settings.update(WORKER_THREADS=0, WORKER_IDLE_CONNECTIONS=-1)
    assert check_config() == [Error("WORKER_THREADS (0) must be at least 1.", hint="See docs/deployment.md.",
                                    id="conversations.E015"),
                              Error("WORKER_IDLE_CONNECTIONS (-1) must be at least 0.", hint="See docs/deployment.md.",
                                    id="conversations.E015")]


def test_a_throttle_rate_drf_cannot_parse_is_refused_at_start_up(conversations_settings):
    conversations_settings.update(TURN_RATE_PER_OWNER="ten a minute", TURN_RATE_PER_IP="10/fortnight")
    hint = 'Use "<number>/<sec|min|hour|day>", e.g. "10/min", or "" for no limit.'
    assert check_config() == [
        Error("TURN_RATE_PER_OWNER 'ten a minute' is not a rate.", hint=hint, id="conversations.E012"),
        Error("TURN_RATE_PER_IP '10/fortnight' is not a rate.", hint=hint, id="conversations.E012"),
    ]
    conversations_settings.update(TURN_RATE_PER_OWNER="", TURN_RATE_PER_IP="5/minute")
    assert check_config() == []


@pytest.mark.parametrize("prefix", [129, -1])
def test_an_ipv6_prefix_that_is_no_prefix_length_is_refused_at_start_up(prefix, conversations_settings):
    conversations_settings.update(IPV6_PREFIX=prefix)
    assert check_config() == [Error(
        f"IPV6_PREFIX {prefix!r} is not an IPv6 prefix length.",
        hint="Use a whole number from 0 to 128; 64 counts each subscriber's network as one address.",
        id="conversations.E019")]
    conversations_settings.update(IPV6_PREFIX="56")  # from the environment
    assert check_config() == []


def test_a_misspelled_key_is_a_warning_naming_the_setting_meant(settings):
    settings.CONVERSATIONS = {**settings.CONVERSATIONS, "JOB_TIMOUT": 30, "COLOUR": "blue"}
    assert check_config() == [
        Warning("CONVERSATIONS['JOB_TIMOUT'] is not a setting of conversations; it is ignored.",
                hint="Did you mean 'JOB_TIMEOUT'?", id="conversations.W005"),
        Warning("CONVERSATIONS['COLOUR'] is not a setting of conversations; it is ignored.",
                hint="The settings are listed in conversations/conf.py.", id="conversations.W005"),
    ]


# -- the cache every process must share -------------------------------------------------------

LOCMEM = "django.core.cache.backends.locmem.LocMemCache"
SHARED_CACHE_HINT = ('Use a cache every process shares: {"BACKEND": "conversations.cache.RedisCache", "LOCATION": '
                     'REDIS_URL} (or Django\'s RedisCache), or point CONVERSATIONS["CACHE_ALIAS"] at one.')


def process_local(alias, kind):
    return Error(
        f"CACHES[{alias!r}] is a {kind}, which each process keeps to itself: the steps a worker publishes never "
        "reach the web processes (the widget shows nothing until the turn's row is read from the database), and "
        "Stop never reaches the worker.", hint=SHARED_CACHE_HINT, id="conversations.E021")


def test_the_suites_redis_cache_is_shared(conversations_settings):
    assert check_cache() == []


@pytest.mark.parametrize("backend, kind", [
    (LOCMEM, "LocMemCache"),
    ("django.core.cache.backends.dummy.DummyCache", "DummyCache"),
    (f"{__name__}.SiteCache", "LocMemCache"),
])
def test_a_cache_each_process_keeps_to_itself_is_refused(settings, conversations_settings, backend, kind):
    settings.CACHES = {**settings.CACHES, "chat": {"BACKEND": backend}}
    conversations_settings.update(CACHE_ALIAS="chat")
    assert check_cache() == [process_local("chat", kind)]


class SiteCache(LocMemCache):
    """A site's own cache class, built on the local-memory one."""


def test_djangos_default_cache_is_refused_unless_jobs_run_in_the_web_process(settings, conversations_settings):
    settings.CACHES = {"default": {"BACKEND": LOCMEM}}  # what a site without CACHES gets
    assert check_cache() == [process_local("default", "LocMemCache")]
    settings.RQ_QUEUES = {"default": {**settings.RQ_QUEUES["default"], "ASYNC": False}}
    assert check_cache() == []


def test_a_file_cache_works_on_one_machine_only(settings, tmp_path):
    settings.CACHES = {**settings.CACHES, "default": {
        "BACKEND": "django.core.cache.backends.filebased.FileBasedCache", "LOCATION": str(tmp_path)}}
    assert check_cache() == [Warning(
        "CACHES['default'] is a FileBasedCache: processes on this machine share it, but a worker on another machine "
        "would publish its turns' steps where no web process reads them.",
        hint="Use Redis (conversations.cache.RedisCache), which the queue needs anyway; or keep every worker on the "
             "web server's machine and silence this warning.", id="conversations.W020")]


def test_a_cache_alias_that_is_not_in_caches(conversations_settings):
    conversations_settings.update(CACHE_ALIAS="state")
    assert check_cache() == [Error(
        "CACHES has no cache 'state', which CONVERSATIONS['CACHE_ALIAS'] names.",
        hint="Add it to CACHES (a Redis cache every process shares), or set CACHE_ALIAS to one you have.",
        id="conversations.E020")]


# -- check --deploy ---------------------------------------------------------------------------

DEMO_IN_PRODUCTION = Warning(
    "PROVIDER is 'demo': visitors get the offline demo model's canned answers, not a real model.",
    hint="Set CONVERSATIONS['PROVIDER'] ('openai', 'anthropic' or your own), with MODEL and API_KEY.",
    id="conversations.W030")


def test_the_deploy_checks_run_with_check_deploy_only():
    assert check_deploy in registry.get_checks(include_deployment_checks=True)
    assert check_deploy not in registry.get_checks()


def test_a_real_provider_with_the_default_limits_passes_the_deploy_checks(conversations_settings):
    assert check_deploy() == [DEMO_IN_PRODUCTION]
    conversations_settings.update(PROVIDER="openai", API_KEY="sk-test", TURN_RATE_PER_OWNER="10/min",
                                  TURN_RATE_PER_IP="30/min", DAILY_TOKEN_BUDGET=200000)
    assert check_deploy() == []


def test_behind_a_proxy_without_num_proxies_the_per_ip_limit_is_shared_by_everyone(settings, conversations_settings):
    conversations_settings.update(PROVIDER="openai", API_KEY="sk-test", TURN_RATE_PER_IP="30/min")
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": None}
    warning = Warning(
        "The site is behind a reverse proxy (SECURE_PROXY_SSL_HEADER or USE_X_FORWARDED_HOST is set) but "
        "REST_FRAMEWORK['NUM_PROXIES'] is not: the per-IP turn limit sees every visitor as the proxy, so a few "
        "visitors use it up for everyone.",
        hint="Set REST_FRAMEWORK['NUM_PROXIES'] to the number of proxies in front of Django (see SECURITY.md).",
        id="conversations.W031")
    assert check_deploy() == [warning]
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    assert check_deploy() == []


def test_a_paid_provider_with_every_limit_off(conversations_settings):
    conversations_settings.update(PROVIDER="anthropic", API_KEY="sk-ant-test", TURN_RATE_PER_OWNER="",
                                  TURN_RATE_PER_IP="0", DAILY_TOKEN_BUDGET=0)
    assert check_deploy() == [Warning(
        "TURN_RATE_PER_OWNER, TURN_RATE_PER_IP and DAILY_TOKEN_BUDGET are all off: anyone who can reach the page "
        "can make the site pay for model calls without limit.",
        hint="Set at least one of them (the defaults are 10/min, 30/min and 200000 tokens a day).",
        id="conversations.W032")]
    conversations_settings.update(DAILY_TOKEN_BUDGET=50000)
    assert check_deploy() == []


@pytest.mark.django_db  # on Django 6.1 the check command opens the database (failed alone there without it)
def test_a_base_url_in_the_environment_that_the_settings_do_not_read_is_named_by_check(conversations_settings,
                                                                                      monkeypatch, capsys):
    from django.core.management import call_command

    # The settings read PROVIDER, MODEL and API_KEY (as the README's block once did), not BASE_URL.
    monkeypatch.setenv("CONVERSATIONS_BASE_URL", "http://user:pw@gateway.internal:4000/v1?key=sk-no")
    monkeypatch.setenv("CONVERSATIONS_API_KEY", "sk-from-the-environment")
    conversations_settings.update(PROVIDER="openai", MODEL="gpt-4o-mini", API_KEY="sk-from-the-environment")
    call_command("check")
    output = capsys.readouterr().err

    assert ("(conversations.W008) CONVERSATIONS_BASE_URL names http://gateway.internal:4000, but the turns call "
            "https://api.openai.com: the environment's value is not in CONVERSATIONS['BASE_URL'].") in output
    assert 'HINT: Read it in settings.py, as the README\'s block does: "BASE_URL": ' \
           'os.environ.get("CONVERSATIONS_BASE_URL", "")' in output
    assert "sk-" not in output and "pw@" not in output
    assert output.count("conversations.W008") == 1  # the key the settings do read is not named


def test_a_key_in_the_environment_that_the_settings_replace_is_named_without_its_value(conversations_settings,
                                                                                      monkeypatch):
    monkeypatch.setenv("CONVERSATIONS_API_KEY", "sk-from-the-environment")
    conversations_settings.update(PROVIDER="openai", API_KEY="sk-in-settings")
    (warning,) = [m for m in check_config() if m.id == "conversations.W008"]

    assert warning.msg == ("CONVERSATIONS_API_KEY is set, but the settings use another key: the environment's value "
                           "is not in CONVERSATIONS['API_KEY'].")


def test_environment_variables_the_settings_read_raise_no_warning(conversations_settings, monkeypatch):
    monkeypatch.setenv("CONVERSATIONS_BASE_URL", "http://gateway.internal:4000/v1")
    conversations_settings.update(PROVIDER="openai", BASE_URL="http://gateway.internal:4000/v1", API_KEY="sk-x")
    assert [m for m in check_config() if m.id == "conversations.W008"] == []


def test_a_base_url_two_parsers_read_differently_is_refused_at_start_up(conversations_settings):
    conversations_settings.update(PROVIDER="openai", API_KEY="sk-x",
                                  BASE_URL="https://attacker.example\\@gw.example.com/v1")
    assert [e for e in check_config() if e.id == "conversations.E016"] == [Error(
        "BASE_URL is not a plain URL: no turn can be sent to it.",
        hint="Write it as scheme://host[:port]/path, without a user name, backslash, space, control character or "
             "percent-encoding before the path (a gateway's credentials go in API_KEY).", id="conversations.E016")]


@pytest.mark.parametrize("job_timeout", [40, 39])
def test_a_chain_whose_primary_could_never_be_called_is_refused(conversations_settings, job_timeout):
    """The defaults but JOB_TIMEOUT, and one fallback: 40 - 20 - 15 leaves the primary 5 s, which
    it never has once the job has begun (MIN_CALL_BUDGET 5): every turn would go to the fallback."""
    conversations_settings.update(JOB_TIMEOUT=job_timeout, DEADLINE_MARGIN=20, FALLBACK_RESERVE=15, MIN_CALL_BUDGET=5,
                                  CALL_TIMEOUT=60, TOOL_RESERVE=5, STATE_TTL=600, FALLBACKS=[{"PROVIDER": "demo"}])
    left = job_timeout - 35
    assert [e for e in check_config() if e.id == "conversations.E017"] == [Error(
        f"JOB_TIMEOUT - DEADLINE_MARGIN - FALLBACK_RESERVE ({left}s) is not more than MIN_CALL_BUDGET (5s): the "
        "primary provider could never be called, and every turn would go to its fallback.",
        hint="Raise JOB_TIMEOUT above 40s, or lower FALLBACK_RESERVE or DEADLINE_MARGIN.", id="conversations.E017")]

    conversations_settings.update(JOB_TIMEOUT=41)
    assert check_config() == []


def test_a_telemetry_mode_that_does_not_exist_and_message_text_in_spans(conversations_settings):
    conversations_settings.update(TELEMETRY="jaeger")
    (error,) = [m for m in check_config() if m.id == "conversations.E080"]
    assert "'jaeger' is not a telemetry mode" in error.msg
    conversations_settings.update(TELEMETRY="otlp", TELEMETRY_CONTENT=True)
    # W080 where the otel extra is not installed (the newest pair's venv: dev.py's NEWEST_EXTRAS).
    try:
        import opentelemetry.exporter.otlp.proto.http  # noqa: F401
        import opentelemetry.sdk  # noqa: F401
        expected = []
    except ImportError:
        expected = ["conversations.W080"]
    assert [m.id for m in check_config() if m.id.startswith("conversations.E08") or m.id == "conversations.W080"] \
        == expected
    assert [m.id for m in check_deploy() if m.id == "conversations.W081"] == ["conversations.W081"]
