"""Questions of a test set from CSV: a header row, then one question per row.

Columns: ``question`` (required), ``visitor`` (anonymous, signed_in or member), ``must_contain`` and
``must_not_contain`` (phrases separated by ``|``), ``must_cite``, ``must_use_tool``,
``max_seconds``, ``max_cost``, ``earlier_messages`` (JSON). Unknown columns are refused, so
that a misspelt check is not silently dropped."""

import csv
import io
import json
from decimal import Decimal, InvalidOperation

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils.translation import gettext as _

from .models import TestQuestion

COLUMNS = ("question", "visitor", "must_contain", "must_not_contain", "must_cite", "must_use_tool", "max_seconds",
           "max_cost", "earlier_messages")
MAX_ROWS = 500


def phrases(value):
    return [part.strip() for part in (value or "").split("|") if part.strip()]


def question_from_row(number, row):
    """A ``TestQuestion`` (unsaved, no test set) from CSV ``row``; raises ``ValidationError`` naming the row."""
    def refuse(reason):
        return ValidationError(_("Row %(number)d: %(reason)s") % {"number": number, "reason": reason})

    text = (row.get("question") or "").strip()
    if not text or len(text) > TestQuestion.MAX_LENGTH:
        raise refuse(_("a question of 1 to %(limit)d characters is required.") % {"limit": TestQuestion.MAX_LENGTH})
    visitor = (row.get("visitor") or TestQuestion.Visitor.ANONYMOUS).strip()
    if visitor not in TestQuestion.Visitor.values:
        raise refuse(_("visitor must be one of %(kinds)s.") % {"kinds": ", ".join(TestQuestion.Visitor.values)})
    try:
        earlier = json.loads(row.get("earlier_messages") or "[]")
    except ValueError:
        raise refuse(_("earlier_messages must be JSON.")) from None
    if not isinstance(earlier, list) or not all(
            isinstance(m, dict) and m.get("role") in ("user", "assistant") and isinstance(m.get("content"), str)
            for m in earlier):
        raise refuse(_('earlier_messages must be a list of {"role": "user" or "assistant", "content": "…"}.'))
    try:
        seconds = float(row["max_seconds"]) if (row.get("max_seconds") or "").strip() else None
        cost = Decimal(row["max_cost"]) if (row.get("max_cost") or "").strip() else None
    except (ValueError, InvalidOperation):
        raise refuse(_("max_seconds and max_cost must be numbers.")) from None
    return TestQuestion(question=text, visitor=visitor, earlier_messages=earlier,
                        must_contain=phrases(row.get("must_contain")),
                        must_not_contain=phrases(row.get("must_not_contain")),
                        must_cite=(row.get("must_cite") or "").strip()[:500],
                        must_use_tool=(row.get("must_use_tool") or "").strip()[:200],
                        max_seconds=seconds, max_cost=cost)


def import_csv(test_set, text):
    """Add the questions of CSV ``text`` to ``test_set``, after its own; all or none. Returns how many."""
    # The whole text to the reader, not its lines one by one: a quoted field may hold a line break
    # (a question of two paragraphs). Its CRLF and CR become LF, in a field too, as a form's text does.
    reader = csv.DictReader(io.StringIO(text, newline=None))
    number = 0  # the last record read (the header is the first): the next one failed
    try:
        fieldnames, number = reader.fieldnames or [], 1
        unknown = sorted(set(fieldnames) - set(COLUMNS))
        if "question" not in fieldnames or unknown:
            raise ValidationError(_("The CSV's first row must name its columns, among: %(columns)s (unknown: "
                                    "%(unknown)s).") % {"columns": ", ".join(COLUMNS),
                                                        "unknown": ", ".join(unknown) or "—"})
        questions = []
        for number, row in enumerate(reader, start=2):
            if len(questions) >= MAX_ROWS:
                raise ValidationError(_("At most %(limit)d questions at a time.") % {"limit": MAX_ROWS})
            questions.append(question_from_row(number, row))
    except csv.Error as exc:  # a field past the csv module's size limit, say
        raise ValidationError(_("Row %(number)d: this is not CSV the importer can read (%(reason)s).")
                              % {"number": number + 1, "reason": exc}) from None
    last = test_set.questions.order_by("-position").values_list("position", flat=True).first() or 0
    for offset, question in enumerate(questions, start=1):
        question.test_set = test_set
        question.position = last + offset
    with transaction.atomic():
        TestQuestion.objects.bulk_create(questions)
    return len(questions)
