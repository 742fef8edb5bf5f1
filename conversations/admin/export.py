"""The rated turns as CSV, for a spreadsheet: every cell quoted, and none read as a formula."""

import re

from django.db.models import OuterRef, Subquery

from ..models import Message


CSV_COLUMNS = ["turn", "finished_at", "assistant", "version", "rating", "comment", "question", "answer", "status",
               "model", "input_tokens", "output_tokens", "cost"]


# A spreadsheet runs a cell that starts with one of these as a formula (CSV injection).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


# Where a spreadsheet may start a new cell or row inside our one: the separator of another
# locale (";" in most European Excels, tab, "|") or a line break, when it does not honour the
# quotes. A formula start after any of them (spaces between) gets a quote too.
_FORMULA_AFTER_SEPARATOR = re.compile("(^|[,;|\t\r\n])( *)(?=[" + re.escape("".join(FORMULA_STARTS)) + "])")


def csv_cell(value):
    """``value`` as a CSV cell that no spreadsheet runs, whichever separator it splits on: a
    formula start at the beginning, or after a separator or line break, gets a quote (``'``)."""
    text = "" if value is None else str(value)
    return _FORMULA_AFTER_SEPARATOR.sub(r"\1\2'", text)


def rated_rows(queryset):
    """The rated turns of ``queryset`` with their question and last answer, in one query."""
    messages = Message.objects.filter(turn=OuterRef("pk"))
    question = messages.filter(role=Message.Role.USER).order_by("id").values("content")[:1]
    answer = messages.filter(role=Message.Role.ASSISTANT).exclude(content="").order_by("-id").values("content")[:1]
    return (queryset.exclude(rating="").select_related("assistant", "assistant_version")
            .annotate(question=Subquery(question), answer=Subquery(answer)).order_by("finished_at"))
