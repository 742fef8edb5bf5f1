"""``manage.py rebuild_knowledge [SOURCE]``: index every object of a knowledge source again (all
sources when none is named), and drop the passages of objects deleted or unpublished, of objects
changed by bulk updates (which bypass the signals), and of sources no longer registered.

Run it after a bulk import or a ``queryset.update()``, when ``knowledge_status`` reports a source
out of date, or from cron (nightly) as a safety net: it only ever converges on the site's rows.
"""

from django.core.management.base import BaseCommand, CommandError

from conversations.knowledge.index import rebuild
from conversations.knowledge.models import Passage
from conversations.knowledge.registry import sources


class Command(BaseCommand):
    help = "Index a knowledge source (or all) again; drop passages of removed objects and sources."

    def add_arguments(self, parser):
        parser.add_argument("source", nargs="?", help="A registered source's name (default: all sources).")

    def handle(self, *args, source=None, **options):
        if source and source not in sources() and not Passage.objects.filter(source=source).exists():
            raise CommandError(f"No knowledge source is named {source!r}; registered: "
                               f"{', '.join(sources()) or 'none'}.")
        for name, count in rebuild(source).items():
            registered = name in sources()
            self.stdout.write(f"{name}: {count} passages" if registered else f"{name}: not registered, dropped")
