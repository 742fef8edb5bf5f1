"""``manage.py worker_status``: every worker process listening on the turns' queue, when it was
last seen, and the turns it runs now.

A ``ConcurrentWorker`` is last seen when it last renewed its lease (several times a second while
it lives); one whose lease has expired is shown ``dead`` until a reaper (another process, the
poll view) has continued its turns. A forking ``Worker`` is last seen at its RQ heartbeat. Reads
Redis only: safe to run at any time, on any host that reaches it.
"""

import time

from django.core.management.base import BaseCommand
from rq import Worker as RQWorker

from conversations.infra import lease, queue


class Command(BaseCommand):
    help = "List the worker processes, when each was last seen, and the turns each runs now."

    def handle(self, *args, **options):
        connection = queue.get_queue().connection
        now = time.time()
        leased = lease.holders(connection)
        expired = set(lease.expired(connection, list(leased))) if leased else set()
        rows = {name: (f"{now - seen:.1f}s ago", "dead (lease expired)" if name in expired else "alive")
                for name, seen in leased.items()}
        for worker in RQWorker.all(queue=queue.get_queue()):
            if worker.name not in rows:
                beat = worker.last_heartbeat.timestamp() if worker.last_heartbeat else None
                rows[worker.name] = (f"{now - beat:.1f}s ago" if beat else "never", worker.get_state())
        if not rows:
            self.stdout.write("No worker process is registered.")
            return
        for name, (seen, status) in sorted(rows.items()):
            jobs = queue.jobs_of(name, connection)
            self.stdout.write(f"{name}  {status}  last seen {seen}  turns: {len(jobs)}")
            for job_id in jobs:
                self.stdout.write(f"  turn {queue.turn_id_from_job_id(job_id) or '-'}  job {job_id}")
