"""``manage.py purge_conversations [--dry-run] [--batch N] [--pause SECONDS]``: delete the
conversations whose retention has run out (``RETENTION_DAYS`` after ``RETENTION_FROM``, or an
assistant's own values), with every turn, message, call record and rating in them.

Meant for cron (once a day, say). It deletes in short transactions of about ``--batch``
messages, ``--pause`` seconds apart, so that visitors' turns never wait long behind it
(``engine.retention``); a conversation with a turn in flight or held by staff is left for the
next run. With ``RETENTION_KEEP_TOTALS``, the deleted turns' ratings, tokens and costs are first
added to anonymous daily totals. Running it twice deletes nothing the second time.
"""

from django.core.management.base import BaseCommand

from conversations.engine.retention import purge


class Command(BaseCommand):
    help = "Delete the conversations whose retention (RETENTION_DAYS, or the assistant's) has run out."

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true", help="Count what would be deleted; delete nothing.")
        parser.add_argument("--batch", type=int, default=None,
                            help="Messages deleted per transaction (default: RETENTION_BATCH).")
        parser.add_argument("--pause", type=float, default=None,
                            help="Seconds between two transactions (default: RETENTION_PAUSE).")

    def handle(self, *args, dry_run=False, batch=None, pause=None, **options):
        done = purge(batch=batch, pause=pause, dry_run=dry_run)
        counts = ", ".join(f"{done.counts.get(kind, 0)} {kind}" for kind in
                           (("conversations", "messages") if dry_run else
                            ("conversations", "turns", "messages", "calls", "ratings")))
        if dry_run:
            self.stdout.write(f"Would delete {counts}.")
        else:
            self.stdout.write(f"Deleted {counts} in {done.batches} transactions "
                              f"(the longest {done.longest * 1000:.0f} ms).")
