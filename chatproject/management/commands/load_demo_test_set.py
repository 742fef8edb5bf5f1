"""``manage.py load_demo_test_set``: the demo's help-desk assistant (the demo model, searching the
help articles) and its test set ``help-articles`` (``chatproject/help_test_set.csv``), created
once; what is there already is left as it is. ``python3 dev.py demo`` runs it."""

from pathlib import Path

from django.core.management.base import BaseCommand

from conversations.evals.csvimport import import_csv
from conversations.models import Assistant, TestSet

CSV = Path(__file__).resolve().parents[2] / "help_test_set.csv"


class Command(BaseCommand):
    help = "Create the demo's help-desk assistant and its help-articles test set, if missing."

    def handle(self, **options):
        assistant, _created = Assistant.objects.get_or_create(slug="help-desk", defaults={
            "name": "Help desk", "provider": "demo", "tools": ["search_site", "search_faq"],
            "system_prompt": "You answer questions about this shop from its help articles, with a link to the "
                             "article."})
        if TestSet.objects.filter(name="help-articles").exists():
            return
        test_set = TestSet.objects.create(name="help-articles", assistant=assistant, description=(
            "Questions the help articles answer; run: manage.py run_test_set help-articles"))
        count = import_csv(test_set, CSV.read_text(encoding="utf-8"))
        self.stdout.write(f"The test set help-articles has {count} questions.")
