"""System checks refuse budgets that cannot work; each message has an id and a hint."""

from django.core.checks import Error, Warning

import conversations.worker
from conversations.checks import check_config


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


def test_non_positive_clock(conversations_settings):
    conversations_settings.update(STALE_AFTER=0)
    assert check_config() == [Error("STALE_AFTER must be positive (it is 0).", hint="Use a positive number.",
                                    id="conversations.E004")]


def test_unparseable_number(conversations_settings, settings):
    settings.CONVERSATIONS = {**settings.CONVERSATIONS, "JOB_TIMEOUT": "two minutes"}
    assert check_config() == [Error("CONVERSATIONS['JOB_TIMEOUT'] = 'two minutes' is not a valid int",
                                    hint="Use a number for timeouts and limits.", id="conversations.E000")]


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
        "The RQ worker class is not conversations.worker.Worker: a killed work horse leaves its turn without a "
        "final state until a poll notices.",
        hint='Set RQ = {"WORKER_CLASS": "conversations.worker.Worker"} (or subclass it).',
        id="conversations.W001")]


class ChatWorker(conversations.worker.Worker):
    """A project's own worker class, built on ours."""


def test_a_subclass_of_our_worker_class_is_fine(settings):
    settings.RQ = {"WORKER_CLASS": f"{__name__}.ChatWorker"}
    assert check_config() == []


def test_a_throttle_rate_drf_cannot_parse_is_refused_at_start_up(conversations_settings):
    conversations_settings.update(TURN_RATE_PER_OWNER="ten a minute", TURN_RATE_PER_IP="10/fortnight")
    hint = 'Use "<number>/<sec|min|hour|day>", e.g. "10/min", or "" for no limit.'
    assert check_config() == [
        Error("TURN_RATE_PER_OWNER 'ten a minute' is not a rate.", hint=hint, id="conversations.E012"),
        Error("TURN_RATE_PER_IP '10/fortnight' is not a rate.", hint=hint, id="conversations.E012"),
    ]
    conversations_settings.update(TURN_RATE_PER_OWNER="", TURN_RATE_PER_IP="5/minute")
    assert check_config() == []


def test_a_misspelled_key_is_a_warning_naming_the_setting_meant(settings):
    settings.CONVERSATIONS = {**settings.CONVERSATIONS, "JOB_TIMOUT": 30, "COLOUR": "blue"}
    assert check_config() == [
        Warning("CONVERSATIONS['JOB_TIMOUT'] is not a setting of conversations; it is ignored.",
                hint="Did you mean 'JOB_TIMEOUT'?", id="conversations.W005"),
        Warning("CONVERSATIONS['COLOUR'] is not a setting of conversations; it is ignored.",
                hint="The settings are listed in conversations/conf.py.", id="conversations.W005"),
    ]
