"""What a configuration must satisfy, as system-check messages (no settings read here: a
configuration comes in). The site's settings (``checks``) and an assistant's settings over
them (``assistants.problems``) follow the same rules.
"""

from django.core.checks import Error, Warning


# Seconds the widget keeps polling past JOB_TIMEOUT (its data-give-up-margin default).
WIDGET_GIVE_UP_MARGIN = 30


def clock_errors(cfg):
    """The rules the clocks of ``cfg`` (a merged configuration) must follow, as check messages:
    every call fits in the job's own deadline, which fits in RQ's job timeout with a margin left
    for the final write. ``check_config`` applies them to the site's settings, and an assistant's
    ``clean()`` to the site's settings with its own limits over them."""
    errors = []
    job, margin, call = cfg["JOB_TIMEOUT"], cfg["DEADLINE_MARGIN"], cfg["CALL_TIMEOUT"]
    min_call = cfg["MIN_CALL_BUDGET"]
    if margin >= job:
        errors.append(Error(
            f"DEADLINE_MARGIN ({margin}s) must be smaller than JOB_TIMEOUT ({job}s).",
            hint="The job's own deadline is JOB_TIMEOUT - DEADLINE_MARGIN; it must leave time for work.",
            id="conversations.E001"))
    if min_call >= margin:
        errors.append(Error(
            f"MIN_CALL_BUDGET ({min_call}s) must be smaller than DEADLINE_MARGIN ({margin}s).",
            hint="The margin is what remains for the final write after the last call that may start.",
            id="conversations.E002"))
    if call < min_call:
        errors.append(Error(
            f"CALL_TIMEOUT ({call}s) is smaller than MIN_CALL_BUDGET ({min_call}s): no call could ever start.",
            hint="Raise CALL_TIMEOUT or lower MIN_CALL_BUDGET.",
            id="conversations.E003"))
    if margin < job and job - margin < min_call:
        errors.append(Error(
            f"JOB_TIMEOUT - DEADLINE_MARGIN ({job - margin}s) is less than MIN_CALL_BUDGET ({min_call}s): no model "
            "call could ever start.",
            hint="The job's own deadline must leave room for at least one call: raise JOB_TIMEOUT or lower "
                 "DEADLINE_MARGIN or MIN_CALL_BUDGET.",
            id="conversations.E008"))
    if cfg["CONNECT_TIMEOUT"] > call:
        errors.append(Warning(
            f"CONNECT_TIMEOUT ({cfg['CONNECT_TIMEOUT']}s) is longer than CALL_TIMEOUT ({call}s); a connect never gets "
            "more than the call's total limit.",
            hint="Set CONNECT_TIMEOUT to at most CALL_TIMEOUT (a few seconds is usual).",
            id="conversations.W003"))
    if cfg["TOOL_RESERVE"] < min_call:
        errors.append(Warning(
            f"TOOL_RESERVE ({cfg['TOOL_RESERVE']}s) is smaller than MIN_CALL_BUDGET ({min_call}s): a tool that uses "
            "its whole limit late in a turn leaves too little time for the model to read its result.",
            hint="Make TOOL_RESERVE at least MIN_CALL_BUDGET.",
            id="conversations.W004"))
    if cfg["QUEUE_WAIT"] > WIDGET_GIVE_UP_MARGIN:
        errors.append(Warning(
            f"QUEUE_WAIT ({cfg['QUEUE_WAIT']}s) is longer than the widget's give-up margin "
            f"({WIDGET_GIVE_UP_MARGIN}s): the widget stops polling JOB_TIMEOUT plus that margin after the message "
            "was sent, so a turn that waits this long for a worker and then runs its whole JOB_TIMEOUT ends after "
            "the visitor was told it did not finish.",
            hint=f"Keep QUEUE_WAIT at most {WIDGET_GIVE_UP_MARGIN}s and add workers rather than let turns wait, or "
                 "give the widget a data-give-up-margin of at least QUEUE_WAIT and silence this warning.",
            id="conversations.W006"))
    for key in ("JOB_TIMEOUT", "DEADLINE_MARGIN", "CALL_TIMEOUT", "CONNECT_TIMEOUT", "MIN_CALL_BUDGET", "STATE_TTL",
                "MAX_STEPS", "MAX_ATTEMPTS", "TOOL_TIMEOUT", "STALE_AFTER", "STREAM_IDLE_TIMEOUT", "PUBLISH_INTERVAL",
                "QUEUE_WAIT"):
        if cfg[key] <= 0:
            errors.append(Error(f"{key} must be positive (it is {cfg[key]}).", hint="Use a positive number.",
                                id="conversations.E004"))
    if cfg["STATE_TTL"] < job:
        errors.append(Error(
            f"STATE_TTL ({cfg['STATE_TTL']}s) is shorter than JOB_TIMEOUT ({job}s): a turn's state could expire "
            "while it runs.", hint="Make STATE_TTL at least JOB_TIMEOUT.", id="conversations.E005"))
    return errors


def reserve_errors(cfg):
    """With fallbacks, the reserve kept back for the next provider must let a call start
    (conversations.E014), and what is left before it must let the primary's first call start
    (conversations.E017): for the site's chain here, and for an assistant's chain and job timeout
    in ``problems``."""
    if not cfg["FALLBACKS"]:
        return []
    errors = []
    reserve, min_call = cfg["FALLBACK_RESERVE"], cfg["MIN_CALL_BUDGET"]
    if reserve < min_call:
        errors.append(Error(
            f"FALLBACK_RESERVE ({reserve}s) is smaller than MIN_CALL_BUDGET ({min_call}s): a provider that hangs "
            "would leave the next too little time to start.",
            hint="Make FALLBACK_RESERVE at least MIN_CALL_BUDGET.", id="conversations.E014"))
    primary = cfg["JOB_TIMEOUT"] - cfg["DEADLINE_MARGIN"] - reserve
    # Equal is not enough: the first call starts a moment after the job does.
    if primary <= min_call:
        errors.append(Error(
            f"JOB_TIMEOUT - DEADLINE_MARGIN - FALLBACK_RESERVE ({primary}s) is not more than MIN_CALL_BUDGET "
            f"({min_call}s): the primary provider could never be called, and every turn would go to its fallback.",
            hint=f"Raise JOB_TIMEOUT above {cfg['DEADLINE_MARGIN'] + reserve + min_call}s, or lower "
                 "FALLBACK_RESERVE or DEADLINE_MARGIN.", id="conversations.E017"))
    return errors


def rate_is_on(rate):
    """Whether a throttle rate setting switches its limit on: "" and "0" (or None, 0) switch it off."""
    return bool(rate) and str(rate).strip() != "0"
