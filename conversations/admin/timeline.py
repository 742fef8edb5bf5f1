"""The turn page's content, built from the database for the admin's templates: the timeline
of every provider call attempt and tool run, the transcript, the RQ job, and the formatting
they share. Nothing here is an admin class; ``admin.py`` renders what these return.
"""

import json

from django.urls import NoReverseMatch, reverse
from django.utils.translation import gettext as _
from redis.exceptions import RedisError
from rq.exceptions import NoSuchJobError
from rq.job import Job

from ..infra import queue
from ..conf import get_config
from ..core.types import Outcome
from ..models import CallRecord, Turn
from ..redaction import hide_keys


def seconds(value, digits=2):
    """``value`` seconds as text ("1.25 s"), or an em dash when unknown."""
    return "—" if value is None else f"{value:.{digits}f} s"


def percent(value, scale):
    """``value`` as a CSS percentage of ``scale``, clamped to 0–100, always with a dot decimal."""
    share = 0.0 if not scale else max(0.0, min(100.0, value / scale * 100))
    return f"{share:.2f}%"


OUTCOME_CLASS = {Outcome.OK: "ok", Outcome.SKIPPED: "skipped", Outcome.TIMEOUT: "timeout"}


def build_timeline(turn, calls):
    """The timeline of ``turn`` from its ``CallRecord`` rows, ready for the template.

    Every position is a percentage of the job timeout (RQ's ``job_timeout``), so the right
    edge is the moment RQ would kill the job; markers show the job's own deadline and the
    final write. Offsets are measured from the turn's start in the job, like the records.
    Returns a dict with ``rows``, ``markers``, ``ticks`` and ``totals``.
    """
    job_timeout = turn.job_timeout or float(get_config()["JOB_TIMEOUT"])
    margin = turn.deadline_margin if turn.deadline_margin is not None else float(get_config()["DEADLINE_MARGIN"])
    scale = max([job_timeout] + [c.started_offset + c.duration for c in calls])
    rows = []
    for call in calls:
        allowed = call.timeout if call.timeout is not None else 0.0
        rows.append({
            "kind": call.get_kind_display(),
            "kind_code": call.kind,
            "name": hide_keys(call.name),
            "attempt": call.attempt,
            "offset": seconds(call.started_offset),
            "timeout": seconds(call.timeout),
            "remaining_before": seconds(call.remaining_before),
            "duration": seconds(call.duration),
            "outcome": call.get_outcome_display(),
            "outcome_class": OUTCOME_CLASS.get(call.outcome, "error"),
            "status_code": call.status_code,
            "detail": hide_keys(call.detail),
            "left": percent(call.started_offset, scale),
            "width": percent(call.duration, scale),
            # The grey band is the time the call was allowed; the solid bar inside it, what it took.
            "allowed_width": percent(min(allowed, scale - call.started_offset), scale),
        })
    markers = [{"label": _("deadline"), "at": seconds(job_timeout - margin, 1),
                "left": percent(job_timeout - margin, scale), "css": "deadline"},
               {"label": _("job timeout"), "at": seconds(job_timeout, 1),
                "left": percent(job_timeout, scale), "css": "job-timeout"}]
    if turn.margin_left is not None:
        written = job_timeout - turn.margin_left
        markers.append({"label": _("final write"), "at": seconds(written, 1), "left": percent(written, scale),
                        "css": "final-write"})
    totals = {
        "model": seconds(sum(c.duration for c in calls if c.kind == CallRecord.Kind.MODEL)),
        "tool": seconds(sum(c.duration for c in calls if c.kind == CallRecord.Kind.TOOL)),
        "attempts": sum(1 for c in calls if c.kind == CallRecord.Kind.MODEL),
        "runs": sum(1 for c in calls if c.kind == CallRecord.Kind.TOOL),
    }
    ticks = [{"left": percent(scale * i / 4, scale), "label": seconds(scale * i / 4, 1)} for i in range(5)]
    return {"rows": rows, "markers": markers, "ticks": ticks, "totals": totals,
            "job_timeout": seconds(job_timeout, 1), "deadline": seconds(job_timeout - margin, 1),
            "margin_left": seconds(turn.margin_left, 1)}


def build_transcript(turn, rows):
    """The messages of ``turn`` in order, each a dict the template renders as escaped text."""
    entries = []
    for message in rows:
        calls = [{"id": c.get("id", ""), "name": hide_keys(c.get("name", "")),
                  "arguments": hide_keys(json.dumps(c.get("arguments") or {}, indent=2, ensure_ascii=False,
                                                 sort_keys=True))}
                 for c in (message.tool_calls or []) if isinstance(c, dict)]
        entries.append({"role": message.role, "role_label": message.get_role_display(),
                        "content": hide_keys(message.content), "tool_calls": calls,
                        "tool_name": hide_keys(message.tool_name), "tool_call_id": message.tool_call_id,
                        "is_error": message.is_error, "created_at": message.created_at})
    return entries


def job_status(turn):
    """The RQ job of ``turn`` as ``(status, url)``: status is RQ's, "gone" or "unknown"; url is
    django-rq's job page (None when there is nothing to link to)."""
    if not turn.job_id:
        return None, None
    rq_queue = queue.get_queue()
    try:
        job = Job.fetch(turn.job_id, connection=rq_queue.connection, serializer=rq_queue.serializer)
        status = job.get_status(refresh=False)
        status = getattr(status, "value", status) or "unknown"  # JobStatus is an Enum: show "finished"
    except NoSuchJobError:
        return "gone", None
    except RedisError:
        return "unknown (Redis unreachable)", None
    return status, rq_job_url(rq_queue.name, turn.job_id)


def rq_job_url(queue_name, job_id):
    """django-rq's job detail page for ``job_id``, or None when its URLs are not installed."""
    from django_rq.settings import get_queues_map

    index = get_queues_map().get(queue_name)
    if index is None:
        return None
    try:
        return reverse("django_rq:job_detail", kwargs={"queue_index": index, "job_id": job_id})
    except NoReverseMatch:
        return None


def build_approvals(turn):
    """The tool calls of ``turn`` that asked for a person's approval: what was asked (summary and
    exact arguments, as text), who could approve it, who decided and when, and what the call returned."""
    return [{"call_id": a.call_id, "tool": a.tool_name, "summary": hide_keys(a.summary),
             "arguments": hide_keys(json.dumps(a.arguments, indent=2, ensure_ascii=False, sort_keys=True)),
             "approver": a.get_approver_display(), "status": a.get_status_display(), "status_code": a.status,
             "requested_at": a.requested_at, "expires_at": a.expires_at, "decided_by": a.decider_label,
             "decided_at": a.decided_at, "run_started_at": a.run_started_at, "result": hide_keys(a.result)}
            for a in turn.approvals.select_related("decided_by").order_by("id")]


def turn_page(turn):
    """What the turn page's template shows besides the fields: timeline, transcript, the error
    the visitor saw, and whether the turn is still active."""
    return {
        "timeline": build_timeline(turn, list(turn.calls.order_by("started_offset", "id"))),
        "transcript": build_transcript(turn, list(turn.messages.order_by("id"))),
        "turn_error": hide_keys(turn.error),
        "approvals": build_approvals(turn),
        "is_active": turn.status in Turn.ACTIVE_STATUSES,
    }
