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
from django.db.models import Aggregate, Count, DurationField, ExpressionWrapper, F, FloatField, Q, Sum, Value, Window
from django.db.models.functions import Floor, RowNumber, TruncDate
from django.utils import timezone

from .models import Turn

GROUP = ("day", "assistant")
DURATION = ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField())
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


def turns_since(days, now=None):
    """The turns enqueued since the start of the day ``days - 1`` days ago (local time)."""
    now = timezone.localtime(now)
    first = datetime.combine(now.date() - timedelta(days=days - 1), time.min)
    return Turn.objects.filter(enqueued_at__gte=timezone.make_aware(first, now.tzinfo))


def overview(days=30, now=None, alias="default"):
    """The rows of the overview, newest day first and by assistant name within a day; each a
    dict of the group's numbers. ``assistant`` is None for turns answered by the site's settings."""
    base = turns_since(days, now).using(alias).annotate(day=TruncDate("enqueued_at"))
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
                .order_by("-day", "assistant__name"))
    if not in_query:
        for name, expression, p in PERCENTILES:
            values = window_percentiles(base, expression, p)
            for row in rows:
                row[name] = values.get((row["day"], row["assistant"]))
    for row in rows:
        row["thumbs_up_share"] = row["thumbs_up"] / row["rated"] if row["rated"] else None
        if isinstance(row["duration_median"], (int, float)):  # a backend that returns microseconds
            row["duration_median"] = timedelta(microseconds=row["duration_median"])
    return rows
