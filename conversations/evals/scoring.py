"""Deterministic checks of one test-run answer: each gives ``{"check", "passed", "reason"}``, the
reason a sentence an owner reads in the admin (never the answer's text itself)."""

import re
from decimal import Decimal

from django.utils.translation import gettext as _

from ..models import Message, Turn


def answer_text(turn):
    """What the visitor would have read: the turn's assistant messages, in order."""
    return "\n".join(m.content for m in turn.messages.filter(role=Message.Role.ASSISTANT).order_by("id")
                     if m.content)


def tools_used(turn):
    return sorted(set(turn.messages.filter(role=Message.Role.TOOL).values_list("tool_name", flat=True)))


def check(name, passed, reason):
    return {"check": name, "passed": bool(passed), "reason": str(reason)}


def score(question, turn):
    """The checks ``question`` asks of ``turn`` (ended): always that it ended completed; then
    each of contains, does not contain, cites, used tool, within seconds and cost it sets."""
    text = answer_text(turn)
    folded = text.casefold()
    checks = [check("completed", turn.status == Turn.Status.COMPLETED,
                    _("It ended %(status)s.") % {"status": turn.status})]
    for phrase in question.must_contain or []:
        found = phrase.casefold() in folded
        checks.append(check("contains", found, (_("The answer contains “%(phrase)s”.") if found else
                                                _("The answer does not contain “%(phrase)s”.")) % {"phrase": phrase}))
    for phrase in question.must_not_contain or []:
        found = phrase.casefold() in folded
        checks.append(check("does_not_contain", not found, (
            _("The answer contains “%(phrase)s”, which it must not.") if found else
            _("The answer does not contain “%(phrase)s”.")) % {"phrase": phrase}))
    if question.must_cite:
        found = question.must_cite.casefold() in folded
        checks.append(check("cites", found, (_("The answer cites %(source)s.") if found else
                                             _("The answer does not cite %(source)s.")) % {
            "source": question.must_cite}))
    if question.must_use_tool:
        used = tools_used(turn)
        found = question.must_use_tool in used
        checks.append(check("used_tool", found, (_("It used the tool %(tool)s.") if found else
                                                 _("It did not use the tool %(tool)s (used: %(used)s).")) % {
            "tool": question.must_use_tool, "used": ", ".join(used) or "—"}))
    if question.max_seconds is not None:
        took = turn.duration
        ok = took is not None and took <= question.max_seconds
        checks.append(check("within_seconds", ok, _("It took %(took)s s; at most %(limit)s s allowed.") % {
            "took": "—" if took is None else f"{took:.1f}", "limit": f"{question.max_seconds:g}"}))
    if question.max_cost is not None:
        ok = turn.cost is not None and Decimal(turn.cost) <= question.max_cost
        checks.append(check("cost", ok, _("It cost %(cost)s; at most %(limit)s allowed.") % {
            "cost": "—" if turn.cost is None else f"{turn.cost:f}", "limit": f"{question.max_cost:f}"}))
    return checks


VERDICT = re.compile(r"^\W*(PASS|FAIL)\b\W*(.*)", re.I | re.S)
JUDGE_PROMPT = ("Judge this answer of a website's assistant against the rubric.\n\nRubric:\n{rubric}\n\n"
                "Question:\n{question}\n\nAnswer:\n{answer}\n\n"
                "Reply with PASS or FAIL, a colon, and one sentence saying why.")


def judge_prompt(test_set, question, turn):
    return JUDGE_PROMPT.format(rubric=test_set.rubric or "-", question=question.question,
                               answer=answer_text(turn) or "(no answer)")


def judged(judge_turn):
    """The judge's check from its turn (ended): its verdict, PASS or FAIL, and its reason."""
    if judge_turn is None or judge_turn.status != Turn.Status.COMPLETED:
        return check("judge", False, _("The judge gave no verdict (it ended %(status)s).") % {
            "status": judge_turn.status if judge_turn is not None else Turn.Status.CANCELLED})
    found = VERDICT.match(answer_text(judge_turn).strip())
    if found is None:
        return check("judge", False, _("The judge gave no verdict."))
    reason = " ".join(found.group(2).split())[:300]
    return check("judge", found.group(1).upper() == "PASS", _("The judge: %(verdict)s. %(reason)s") % {
        "verdict": found.group(1).upper(), "reason": reason})
