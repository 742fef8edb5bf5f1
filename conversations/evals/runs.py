"""Test runs: each question of a test set asked as a real turn, through the site's workers and
under the same clocks as a visitor's, of the live assistant and (optionally) a draft, at most
``concurrency`` turns at a time and within a cost limit; each answer scored (``scoring``).

Nothing here blocks on a turn: ``advance(run)`` scores the turns that ended, starts the next
ones the limits allow and ends the run when every question has a result. Every write that ends
a test run's turn calls it (``advance_for``, through ``lifecycle.turn_ended``): the turn's job,
Stop, the worker's parent for a work horse that died, the repair of a dead job. So a run goes on
with only the site's workers, and no page or command has to be watching; ``manage.py
run_test_set`` calls it too while it waits. Showing a run changes nothing.
"""

import logging
import secrets
from decimal import Decimal

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, transaction
from django.db.models import CharField, EmailField, Q, Sum, TextField
from django.utils import timezone
from django.utils.translation import gettext as _
from redis.exceptions import RedisError

from ..conf import get_config
from ..engine import lifecycle
from ..infra import state
from ..models import Conversation, Message, Turn
from .models import TestQuestion, TestResult, TestRun
from .scoring import judge_prompt, judged, score

logger = logging.getLogger("conversations.evals")

# Test turns at a time, at most: a run must leave the workers to the visitors.
MAX_CONCURRENCY = 10

# The users a signed-in and a member question's conversations belong to: no password, no staff flag.
TEST_VISITORS = {TestQuestion.Visitor.SIGNED_IN: "conversations-test-visitor",
                 TestQuestion.Visitor.MEMBER: "conversations-test-member"}


def start_run(test_set, *, draft=None, concurrency=2, max_cost=None, user=None):
    """Create a run of ``test_set`` (against ``draft`` too, when given) with a pending result per
    question and side, and start its first turns. Returns the run."""
    if draft is not None and draft.assistant_id != test_set.assistant_id:
        raise ValueError("the draft is not of the test set's assistant")
    with transaction.atomic():
        run = TestRun.objects.create(test_set=test_set, draft=draft, concurrency=min(max(1, concurrency),
                                                                                       MAX_CONCURRENCY),
                                     max_cost=max_cost, started_by=user)
        sides = [TestResult.Side.LIVE] + ([TestResult.Side.DRAFT] if draft is not None else [])
        TestResult.objects.bulk_create([TestResult(run=run, question=q, side=side)
                                        for q in test_set.questions.all() for side in sides])
    advance(run)
    return run


def advance(run):
    """Score what ended (asking the judge first, where the test set has one), start what the
    limits allow, end the run when nothing is left. Returns the run, refreshed. Safe to call
    from several processes at once (the run's row is locked)."""
    started = []
    with transaction.atomic():
        run = TestRun.objects.select_for_update().select_related("test_set").get(pk=run.pk)
        for result in run.results.filter(scored=False, turn__status__in=Turn.DONE_STATUSES).select_related(
                "turn", "question", "judge_turn"):
            started += settle(run, result)
        if run.status == TestRun.Status.RUNNING:
            pending = list(run.results.filter(turn__isnull=True).select_related("question").order_by(
                "question__position", "question_id", "side"))
            # the turns of one run (a judge's too) are never more than ``concurrency`` at once
            in_flight = (run.results.filter(turn__status__in=Turn.ACTIVE_STATUSES).count()
                         + run.results.filter(judge_turn__status__in=Turn.ACTIVE_STATUSES).count() + len(started))
            over_budget = past_cost_limit(run)
            if over_budget:
                pending = []
            started += [ask(run, result) for result in pending[:max(0, run.concurrency - in_flight)]]
            waiting = run.results.filter(scored=False, turn__isnull=False).exists()
            # ``pending`` is every question not asked yet, unless over budget; with nothing started it is still so
            if not started and not waiting and (over_budget or not pending):
                # Past the cost limit, the questions not asked stay without a result: stopped, not finished.
                run.status = TestRun.Status.STOPPED if over_budget else TestRun.Status.FINISHED
                run.finished_at = timezone.now()
                run.save(update_fields=["status", "finished_at"])
    for turn in started:
        try:
            state.publish(state.state_from_db(turn))
        except RedisError:
            logger.exception("Could not publish the queued state of turn %s", turn.id)
    run.refresh_from_db()
    return run


def advance_for(turn):
    """``advance`` the run ``turn`` (ended) answered or judged for, if any; called once each test
    run's turn has ended, however it ended (``lifecycle.turn_ended``). Returns the run, or None."""
    run = TestRun.objects.filter(Q(results__turn=turn) | Q(results__judge_turn=turn)).first()
    return advance(run) if run is not None else None


def settle(run, result):
    """Score ``result``, whose turn ended; with a judge, first start the judge's turn (returned,
    in a list) and score once it has ended. A stopped run asks no judge."""
    judge_id = run.test_set.judge_id
    if judge_id is not None and result.judge_turn_id is None and run.status == TestRun.Status.RUNNING:
        conversation = Conversation.objects.create(assistant_id=judge_id, internal=True,
                                                   owner_token=secrets.token_urlsafe(32))
        judge_turn, _message = lifecycle.create(conversation, judge_prompt(run.test_set, result.question, result.turn))
        result.judge_turn = judge_turn
        result.save(update_fields=["judge_turn"])
        return [judge_turn]
    if result.judge_turn_id is not None and not result.judge_turn.done:
        return []
    record(result, judged(result.judge_turn) if judge_id is not None else None)
    return []


def unfinished(run):
    """Whether ``run`` still runs or has turns to score (a stopped run's last turns ending)."""
    run.refresh_from_db()
    return run.status == TestRun.Status.RUNNING or run.results.filter(scored=False, turn__isnull=False).exists()


def spent(run):
    """What the run's turns cost so far, the judge's included, in one query; None while none of
    them had a price (a model not in ``PRICES``, the demo's): nothing is known, rather than 0."""
    found = run.results.aggregate(answers=Sum("turn__cost"), judge=Sum("judge_turn__cost"))
    if found["answers"] is None and found["judge"] is None:
        return None
    return (found["answers"] or Decimal(0)) + (found["judge"] or Decimal(0))


_NOT_READ = object()


def past_cost_limit(run, cost=_NOT_READ):
    """Whether ``run`` has a cost limit and its turns have cost that much: it starts no more
    questions (those not asked yet stay without a result) and ends stopped. ``cost``: what
    ``spent(run)`` returned, when the caller has it already (else it is read, if there is a limit)."""
    if run.max_cost is None:
        return False
    if cost is _NOT_READ:
        cost = spent(run)
    return (cost or Decimal(0)) >= run.max_cost


def not_asked(run):
    """How many of ``run``'s questions were not asked (of one side or both): left out by Stop or
    the cost limit."""
    return run.results.filter(turn__isnull=True).values("question").distinct().count()


def test_visitor(kind):
    """The user who asks a ``kind`` question (signed in, or member), created when missing. The
    member is in the ``TEST_MEMBER_GROUPS`` (those that exist) and the signed-in visitor in no
    group, whatever was changed by hand since: each sees what a real visitor of its kind would.
    Nothing assumes Django's own user model: the user is found by its ``USERNAME_FIELD`` and
    created as ``createsuperuser`` creates one (``test_user_fields``, ``create_user``)."""
    model = get_user_model()
    name = TEST_VISITORS[kind]
    login = {model.USERNAME_FIELD: test_field_value(model, model.USERNAME_FIELD, name)}
    user = model._default_manager.filter(**login).first()
    if user is None:
        try:
            with transaction.atomic():
                user = create_user(model, test_user_fields(model, name))
        except IntegrityError:  # another run created it a moment ago
            user = model._default_manager.get(**login)
    if hasattr(user, "groups"):  # a custom user model may have none
        names = get_config()["TEST_MEMBER_GROUPS"] if kind == TestQuestion.Visitor.MEMBER else ()
        user.groups.set(Group.objects.filter(name__in=names))
    return user


def test_user_fields(model, name):
    """The fields a test visitor named ``name`` is created with, for the site's user ``model``: its
    login (``USERNAME_FIELD``) and those of the ``REQUIRED_FIELDS`` that must be filled in, the
    fields ``createsuperuser`` asks for."""
    values = {field_name: test_field_value(model, field_name, name)
              for field_name in (model.USERNAME_FIELD, *model.REQUIRED_FIELDS)}
    return {field_name: value for field_name, value in values.items() if value is not None}


def test_field_value(model, field_name, name):
    """What a test visitor named ``name`` has in ``model``'s field ``field_name``: None for a
    required field that has a default or may be left empty (the login is always filled in); an
    address at a domain that never receives mail for an e-mail field; else ``name``. Raises
    ``ImproperlyConfigured``, saying what to do, for a field that a name cannot fill."""
    field = model._meta.get_field(field_name)
    if field_name != model.USERNAME_FIELD and (field.has_default() or field.blank or field.null):
        return None
    if isinstance(field, EmailField):
        return f"{name}@example.invalid"  # RFC 2606: never a real mailbox
    if isinstance(field, (CharField, TextField)):
        return name[:field.max_length] if field.max_length else name
    problem = (f"The test visitor {name!r} cannot be created: the user model {model._meta.label} requires "
               f"{field_name!r}, which a name cannot fill and has no default.")
    if field_name == model.USERNAME_FIELD:
        raise ImproperlyConfigured(f"{problem} Ask the test set's questions as an anonymous visitor.")
    login = test_field_value(model, model.USERNAME_FIELD, name)
    raise ImproperlyConfigured(f"{problem} Create the user whose {model.USERNAME_FIELD} is {login!r} yourself, "
                               "without a usable password, or give the field a default.")


def create_user(model, fields):
    """A user of ``model`` with ``fields`` and no usable password, made by its manager's
    ``create_user`` (as ``createsuperuser`` calls it: the fields by name) where it has one."""
    manager = model._default_manager
    if hasattr(manager, "create_user"):
        user = manager.create_user(**fields, password=None)  # Django's makes the password unusable
        if user.has_usable_password():
            user.set_unusable_password()
            user.save(update_fields=["password"])
        return user
    user = model(**fields)
    user.set_unusable_password()
    user.save()
    return user


def ask(run, result):
    """Start ``result``'s question as a turn in a conversation of its own (the run's, never a
    visitor's), after its earlier messages. Call inside the run's transaction; returns the turn."""
    question = result.question
    user = test_visitor(question.visitor) if question.visitor in TEST_VISITORS else None
    conversation = Conversation.objects.create(
        assistant_id=run.test_set.assistant_id, internal=True, user=user,
        owner_token="" if user is not None else secrets.token_urlsafe(32))
    for earlier in question.earlier_messages or []:
        if isinstance(earlier, dict) and earlier.get("role") in ("user", "assistant"):
            Message.objects.create(conversation=conversation, role=earlier["role"],
                                   content=str(earlier.get("content", "")))
    draft = run.draft if result.side == TestResult.Side.DRAFT else None
    turn, _message = lifecycle.create(conversation, question.question, draft=draft)
    result.turn = turn
    result.save(update_fields=["turn"])
    return turn


def record(result, verdict=None):
    """Score ``result``'s ended turn (with the judge's ``verdict``, a check, when there is one) and
    keep its version, time and cost."""
    turn = result.turn
    result.checks = score(result.question, turn) + ([verdict] if verdict is not None else [])
    result.passed = all(c["passed"] for c in result.checks)
    result.version_id = turn.assistant_version_id
    result.seconds = turn.duration
    result.cost = turn.cost
    result.scored = True
    result.save(update_fields=["checks", "passed", "version", "seconds", "cost", "scored"])


def stop(run):
    """End ``run`` now: no more turns start, and its queued and running turns are stopped (each
    ends cancelled, and is scored so). Returns the run."""
    with transaction.atomic():
        updated = TestRun.objects.filter(pk=run.pk, status=TestRun.Status.RUNNING).update(
            status=TestRun.Status.STOPPED, finished_at=timezone.now())
    if updated:
        active = Turn.objects.filter(status__in=Turn.ACTIVE_STATUSES).filter(
            pk__in=[pk for pair in run.results.values_list("turn", "judge_turn") for pk in pair if pk])
        for turn in active:
            try:
                lifecycle.stop(turn, end_orphaned=True)
            except RedisError:
                logger.exception("Could not stop turn %s of test run %s", turn.pk, run.pk)
    return advance(run)


def summary(run):
    """Per side: questions, answered, passed, pass rate (of all questions), cost, seconds (total
    and slowest); and the questions whose result differs between the sides."""
    sides = {}
    results = list(run.results.select_related("question").order_by("question__position", "question_id"))
    for side in TestResult.Side.values:
        rows = [r for r in results if r.side == side]
        if not rows:
            continue
        passed = sum(1 for r in rows if r.passed)
        sides[side] = {
            "questions": len(rows), "answered": sum(1 for r in rows if r.scored), "passed": passed,
            "pass_rate": passed / len(rows),
            # None when no answer had a price (a model without one in PRICES, the demo's)
            "cost": sum((r.cost for r in rows if r.cost is not None), Decimal(0))
            if any(r.cost is not None for r in rows) else None,
            "seconds": sum(r.seconds for r in rows if r.seconds is not None),
            "slowest": max((r.seconds for r in rows if r.seconds is not None), default=None),
        }
    by_question = {}
    for r in results:
        by_question.setdefault(r.question_id, {})[r.side] = r
    changed = [pair["live"].question for pair in by_question.values()
               if "live" in pair and "draft" in pair and pair["live"].scored and pair["draft"].scored
               and pair["live"].passed != pair["draft"].passed]
    return {"sides": sides, "changed": changed}


def failed_reasons(result):
    """The reasons of ``result``'s failed checks, or why it has none."""
    if not result.scored:
        return [_("Not run.")]
    return [c["reason"] for c in result.checks if not c["passed"]]
