"""Per assistant and day: how many turns, how they ended, how long they took, how close to the
deadline their final write came, what visitors thought of them, and what they cost.

Everything is computed by the database with a number of queries that does not depend on the
number of turns: one aggregate query grouped by (day, assistant) for the counts and sums, and
the percentiles either in that same query (PostgreSQL's ``percentile_cont``, through the
``PercentileCont`` aggregate below) or, on databases without it (SQLite), one query per
percentile that ranks each group's values with window functions and returns only the one or
two rows each percentile sits between (``window_percentiles``): a number of rows that grows
with the groups shown, never with the turns.
"""

import math
from collections import defaultdict
from datetime import datetime, time, timedelta

from django.db import connections
from django.db.models import (Aggregate, Case, Count, DateField, F, FloatField, Func, Q, Sum, Value, When,
                              Window)
from django.db.models.functions import Floor, RowNumber
from django.utils import timezone

from ..models import Turn

GROUP = ("day", "assistant")


class Seconds(Func):
    """``end - start`` in seconds, as a float, computed by the database itself (PostgreSQL's
    ``EXTRACT(EPOCH …)``, MySQL's ``TIMESTAMPDIFF``, SQLite's native ``julianday()`` rather than
    Django's Python callback for datetime arithmetic, which costs a Python call per row)."""

    output_field = FloatField()
    template = "CAST(EXTRACT(EPOCH FROM (%(expressions)s)) AS double precision)"
    arg_joiner = " - "

    def as_sqlite(self, compiler, connection, **extra):
        return self.as_sql(compiler, connection, template="((julianday(%(expressions)s)) * 86400.0)",
                           arg_joiner=") - julianday(", **extra)

    def as_mysql(self, compiler, connection, **extra):  # MySQL and MariaDB: the arguments swap places
        end, start = self.get_source_expressions()
        return Func(start, end, template="(TIMESTAMPDIFF(MICROSECOND, %(expressions)s) / 1000000.0)", arg_joiner=", ",
                    output_field=FloatField()).as_sql(compiler, connection, **extra)


DURATION = Seconds(F("finished_at"), F("started_at"))
# (name, expression, percentile): the medians and low percentiles the overview shows.
PERCENTILES = [("duration_median", DURATION, 0.5), ("margin_p10", F("margin_left"), 0.1)]


class PercentileCont(Aggregate):
    """PostgreSQL's ``percentile_cont(p) WITHIN GROUP (ORDER BY expression)``: the value below
    which a fraction ``p`` of the group's values fall, interpolated; NULLs are left out."""

    function = "PERCENTILE_CONT"
    name = "PercentileCont"
    template = "%(function)s(%(percentile)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    allow_distinct = False

    def __init__(self, expression, percentile, **extra):
        if not 0 <= percentile <= 1:
            raise ValueError("a percentile is between 0 and 1")
        super().__init__(expression, percentile=repr(float(percentile)), **extra)


def has_percentile_cont(alias="default"):
    return connections[alias].vendor == "postgresql"


def window_percentiles(queryset, expression, percentile):
    """``{(day, assistant_id): value}``: the ``percentile`` of ``expression`` in each group of
    ``queryset`` (annotated with ``day``), interpolated between ranks as ``percentile_cont`` is.

    One query: each group's non-null values are ranked (``ROW_NUMBER``) and counted (``COUNT``
    over the group), and only the rows at ``floor(1 + p·(n − 1))`` and the next rank come back.
    """
    partition = [F(name) for name in GROUP]
    ranked = (queryset.annotate(value=expression).filter(value__isnull=False)
              .annotate(rank=Window(RowNumber(), partition_by=partition, order_by=F("value").asc()),
                        size=Window(Count("pk"), partition_by=partition))
              .annotate(low=Floor(Value(1.0) + Value(float(percentile)) * (F("size") - Value(1.0)),
                                  output_field=FloatField()))
              .filter(rank__gte=F("low"), rank__lte=F("low") + 1)
              .values_list(*GROUP, "rank", "size", "value"))
    found = defaultdict(dict)
    sizes = {}
    for day, assistant, rank, size, value in ranked:
        found[(day, assistant)][rank] = value
        sizes[(day, assistant)] = size
    result = {}
    for group, values in found.items():
        position = 1 + percentile * (sizes[group] - 1)
        low = math.floor(position)
        below, above = values.get(low), values.get(low + 1)
        fraction = position - low
        result[group] = below if above is None or not fraction else below + (above - below) * fraction
    return result


def local_days(days, now=None):
    """The last ``days`` local days, newest first, each ``(date, its first instant)`` (aware)."""
    today = timezone.localtime(now).date()
    zone = timezone.get_current_timezone()
    dates = [today - timedelta(days=back) for back in range(days)]
    return [(date, timezone.make_aware(datetime.combine(date, time.min), zone)) for date in dates]


def day_of(days):
    """The local day a turn was enqueued on, as ``CASE WHEN enqueued_at >= <midnight> THEN <date> …``
    over the window's midnights: plain comparisons the database runs natively (exact across
    daylight-saving changes), where ``TruncDate`` costs SQLite a Python call per row."""
    return Case(*[When(enqueued_at__gte=start, then=Value(date)) for date, start in days],
                output_field=DateField())


def overview(days=30, now=None, alias="default"):
    """The rows of the overview, newest day first and by assistant name within a day (the site's
    settings last); each a
    dict of the group's numbers (durations and margins in seconds). ``assistant`` is None for
    turns answered by the site's settings."""
    window = local_days(days, now)
    # A test run's turns (evals) are not visitors': left out.
    base = Turn.objects.using(alias).filter(enqueued_at__gte=window[-1][1], conversation__internal=False).annotate(
        day=day_of(window))
    statuses = {f"status_{value}": Count("pk", filter=Q(status=value)) for value in Turn.Status.values}
    aggregates = dict(
        turns=Count("pk"), **statuses,
        rated=Count("pk", filter=~Q(rating="")), thumbs_up=Count("pk", filter=Q(rating=Turn.Rating.UP)),
        tokens_in=Sum("input_tokens"), tokens_out=Sum("output_tokens"), total_cost=Sum("cost"),
        unpriced=Count("pk", filter=Q(cost__isnull=True) & (Q(input_tokens__gt=0) | Q(output_tokens__gt=0))),
    )
    in_query = has_percentile_cont(alias)
    if in_query:
        aggregates.update({name: PercentileCont(expression, p) for name, expression, p in PERCENTILES})
    rows = list(base.values(*GROUP, "assistant__name", "assistant__slug").annotate(**aggregates)
                .order_by("-day", F("assistant__name").asc(nulls_last=True)))
    if not in_query:
        for name, expression, p in PERCENTILES:
            values = window_percentiles(base, expression, p)
            for row in rows:
                row[name] = values.get((row["day"], row["assistant"]))
    for row in rows:
        row["thumbs_up_share"] = row["thumbs_up"] / row["rated"] if row["rated"] else None
        if isinstance(row["day"], str):  # MySQL and MariaDB hand the CASE's dates back as text
            row["day"] = datetime.strptime(row["day"], "%Y-%m-%d").date()
    return rows
