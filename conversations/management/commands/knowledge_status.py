"""``manage.py knowledge_status``: each knowledge source's counts and last update, and what is
out of date (objects not indexed, changed since, indexed but gone or unpublished, failed to
index, without vectors when ``SEARCH_EMBEDDINGS`` is on; sources no longer registered). Exits 1
when anything is, so cron or a deploy can act."""

import sys

from django.core.management.base import BaseCommand

from conversations.knowledge.index import out_of_date, status


def _few(pks):
    return ", ".join(pks[:10]) + (f" and {len(pks) - 10} more" if len(pks) > 10 else "")


class Command(BaseCommand):
    help = "Report what the knowledge index is missing or holds out of date."

    def handle(self, *args, **options):
        rows = status()
        if not rows:
            self.stdout.write("No knowledge source is registered.")
            return
        stale = False
        for row in rows:
            if not row["registered"]:
                self.stdout.write(f"{row['name']}: not registered any more, {row['passages']} passages to drop "
                                  "(rebuild_knowledge drops them)")
                stale = True
                continue
            objects = "model missing" if row["objects"] is None else f"{row['objects']} published objects"
            self.stdout.write(f"{row['name']} ({row['model']}): {objects}, {row['indexed']} indexed in "
                              f"{row['passages']} passages, last update {row['last_update'] or 'never'}")
            for key, what in (("missing", "not indexed"), ("changed", "changed since indexed"),
                              ("orphans", "indexed but deleted or unpublished"), ("stale", "failed to index"),
                              ("unembedded", "without vectors of SEARCH_EMBEDDINGS' model")):
                if row[key]:
                    self.stdout.write(f"  {len(row[key])} {what}: {_few(row[key])}")
            stale = stale or out_of_date(row)
        if stale:
            self.stdout.write("Out of date: run manage.py rebuild_knowledge.")
            sys.exit(1)
        self.stdout.write("Up to date.")
