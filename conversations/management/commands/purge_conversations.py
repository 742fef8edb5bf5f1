"""``manage.py purge_conversations [--dry-run] [--batch N] [--batch-time SECONDS] [--pause SECONDS]``: delete the
conversations whose retention has run out (``RETENTION_DAYS`` after ``RETENTION_FROM``, or an
assistant's own values), with every turn, message, call record and rating in them.

Meant for cron (once a day, say). It deletes in short transactions of ``--batch`` messages at
most, ``--pause`` seconds apart (on SQLite, whose write lock is the whole database's, each aiming
to hold it ``--batch-time`` seconds), so that visitors' turns never wait long behind it
(``engine.retention``); a conversation with a turn in flight or held by staff is left for the
next run. With ``RETENTION_KEEP_TOTALS``, the deleted turns' ratings, tokens and costs are first
added to anonymous daily totals. Running it twice deletes nothing the second time.
"""

from django.core.management.base import BaseCommand, CommandError

from conversations.conf import get_config
from conversations.engine.retention import purge, timing_problems


class Command(BaseCommand):
    help = "Delete the conversations whose retention (RETENTION_DAYS, or the assistant's) has run out."

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true", help="Count what would be deleted; delete nothing.")
        parser.add_argument("--batch", type=int, default=None,
                            help="Messages deleted per transaction at most (default: RETENTION_BATCH).")
        parser.add_argument("--batch-time", type=float, default=None,
                            help="On SQLite, seconds a transaction aims to hold the write lock "
                                 "(default: RETENTION_BATCH_TIME).")
        parser.add_argument("--pause", type=float, default=None,
                            help="Seconds between two transactions (default: RETENTION_PAUSE).")

    def handle(self, *args, dry_run=False, batch=None, batch_time=None, pause=None, **options):
        cfg = get_config()
        given = {"RETENTION_BATCH": ("--batch", batch), "RETENTION_BATCH_TIME": ("--batch-time", batch_time),
                 "RETENTION_PAUSE": ("--pause", pause)}
        # Each value is named as the option that gave it, else as the setting (the system check's).
        problems = timing_problems(*(cfg[key] if value is None else value for key, (_flag, value) in given.items()),
                                   names=[key if value is None else flag for key, (flag, value) in given.items()])
        if problems:
            raise CommandError("; ".join(problems) + ".")
        done = purge(batch=batch, batch_time=batch_time, pause=pause, dry_run=dry_run)
        counts = ", ".join(f"{done.counts.get(kind, 0)} {kind}" for kind in
                           (("conversations", "messages") if dry_run else
                            ("conversations", "turns", "messages", "calls", "ratings")))
        if dry_run:
            self.stdout.write(f"Would delete {counts}.")
        else:
            self.stdout.write(f"Deleted {counts} in {done.batches} transactions "
                              f"(the longest {done.longest * 1000:.0f} ms).")
