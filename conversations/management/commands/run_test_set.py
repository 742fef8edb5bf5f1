"""``manage.py run_test_set NAME [--threshold 0.9] [--draft] [--concurrency 2] [--max-cost X] [--burst]``:
run a test set as real turns, print each side's pass rate, cost and time and the questions whose
result changed, and exit with status 1 when the pass rate (the draft's, with ``--draft``) is
below the threshold, or the run could not finish: a site's CI can gate a change on it.

The turns run on the site's workers; ``--burst`` runs a worker in this process instead, until
the run ends (for a CI job with no worker of its own).
"""

import time
from decimal import Decimal

from django.core.management.base import BaseCommand, CommandError

from conversations.assistants import settings_for
from conversations.conf import get_config
from conversations.evals import drafts, runs
from conversations.models import TestRun, TestSet


class Command(BaseCommand):
    help = "Run a test set against the live assistant (and its newest draft) and score the answers."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--threshold", type=float, default=0.9, help="Lowest pass rate that succeeds (0-1).")
        parser.add_argument("--draft", action="store_true",
                            help="Run the assistant's newest unpromoted draft too; the threshold applies to it.")
        parser.add_argument("--concurrency", type=int, default=2,
                            help="Turns at a time (queued or running), at most 10.")
        parser.add_argument("--max-cost", type=Decimal, default=None,
                            help="Start no more turns once the run has cost this much.")
        parser.add_argument("--burst", action="store_true", help="Run the turns in a worker in this process.")

    def handle(self, name, threshold, draft, concurrency, max_cost, burst, **options):
        try:
            test_set = TestSet.objects.select_related("assistant").get(name=name)
        except TestSet.DoesNotExist:
            raise CommandError(f"No test set {name!r}.") from None
        if not test_set.questions.exists():
            raise CommandError(f"The test set {name!r} has no questions.")
        chosen = None
        if draft:
            chosen = drafts.newest(test_set.assistant)
            if chosen is None:
                raise CommandError(f"The assistant {test_set.assistant.slug!r} has no unpromoted draft.")
        run = runs.start_run(test_set, draft=chosen, concurrency=concurrency, max_cost=max_cost)
        # Every turn ends within its job timeout; the run cannot take longer than its turns one after another.
        turns = run.results.count()
        longest = max(settings_for(a)["JOB_TIMEOUT"] for a in [test_set.assistant] + (
            [chosen.applied()] if chosen else []))
        deadline = time.monotonic() + turns * (longest + 5) + 30
        worker = self.worker() if burst else None
        try:
            while runs.unfinished(run):
                if time.monotonic() > deadline:
                    runs.stop(run)
                    raise CommandError(f"Test run {run.pk} did not finish in time; stopped.")
                if worker is not None:
                    worker.work(burst=True)
                else:
                    time.sleep(0.5)
                runs.advance(run)
        except KeyboardInterrupt:
            runs.stop(run)
            raise CommandError(f"Test run {run.pk} stopped.") from None
        return self.report(run, threshold, "draft" if draft else "live")

    def worker(self):
        from django.db import connections
        from django_rq import get_worker

        connections.close_all()  # a forked work horse must not share this process's database socket
        worker = get_worker(get_config()["QUEUE"])
        worker.subscribe = lambda: None  # no command channel for a worker that ends with the run
        return worker

    def report(self, run, threshold, side):
        found = runs.summary(run)
        for name, figures in found["sides"].items():
            cost = "—" if figures["cost"] is None else format(figures["cost"], "f")
            self.stdout.write(f"{name}: {figures['passed']}/{figures['questions']} passed "
                              f"({figures['pass_rate']:.0%}), cost {cost}, {figures['seconds']:.1f} s in all")
        for question in found["changed"]:
            self.stdout.write(f"changed: {question}")
        for result in run.results.filter(side=side, passed=False).select_related("question"):
            self.stdout.write(f"failed ({side}): {result.question}: {' '.join(runs.failed_reasons(result))}")
        rate = found["sides"][side]["pass_rate"]
        if run.status != TestRun.Status.FINISHED:
            raise CommandError(f"Test run {run.pk} ended {run.status}.")
        if rate < threshold:
            raise CommandError(f"The {side} pass rate {rate:.0%} is below the threshold {threshold:.0%}.")
        self.stdout.write(f"Test run {run.pk}: the {side} pass rate {rate:.0%} meets the threshold {threshold:.0%}.")
