"""``manage.py import_test_set NAME FILE.csv --assistant SLUG``: add a CSV's questions to test set
NAME (created for assistant SLUG when it does not exist). The columns are in ``evals.csvimport``."""

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from conversations.evals.csvimport import import_csv
from conversations.models import Assistant, TestSet


class Command(BaseCommand):
    help = "Add the questions of a CSV file to a test set."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("file")
        parser.add_argument("--assistant", help="The assistant's slug, for a new test set.")

    def handle(self, name, file, assistant=None, **options):
        test_set = TestSet.objects.filter(name=name).first()
        if test_set is None:
            if not assistant:
                raise CommandError(f"No test set {name!r}: name its assistant with --assistant to create it.")
            try:
                test_set = TestSet.objects.create(name=name, assistant=Assistant.objects.get(slug=assistant))
            except Assistant.DoesNotExist:
                raise CommandError(f"No assistant {assistant!r}.") from None
        with open(file, encoding="utf-8-sig", newline="") as handle:
            text = handle.read()
        try:
            count = import_csv(test_set, text)
        except ValidationError as exc:
            raise CommandError(" ".join(exc.messages)) from None
        self.stdout.write(f"{count} questions added to {test_set.name} ({test_set.questions.count()} in all).")
