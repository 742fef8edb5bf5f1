"""A site without the ``otel`` extra: nothing imports ``opentelemetry``, and a turn runs as before,
posted, run by a forking worker and polled to its end, in a process where that package cannot
be imported (a ``sys.meta_path`` finder refuses it), even with ``TELEMETRY`` set."""

import json
import subprocess
import sys

import pytest

from conversations.models import Turn
from tests.support.helpers import ROOT, worker_env

pytestmark = pytest.mark.django_db(transaction=True)

SCRIPT = r"""
import json, os, sys

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Refuse())
import django
django.setup()
from django.conf import settings
settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]  # as pytest-django's test settings
from django.core.checks import run_checks
from conversations.infra import telemetry
from tests.support.helpers import make_client, poll_until_done, run_worker, start_turn

client = make_client()
started = start_turn(client, "Hello?")
run_worker("conversations.worker.Worker")
final = poll_until_done(client, started["poll_url"])
print(json.dumps({"available": telemetry.AVAILABLE, "id": started["id"], "status": final["status"],
                  "answer": final["messages"][-1]["content"],
                  "checks": sorted(m.id for m in run_checks() if m.id and m.id.startswith("conversations.W08")),
                  "loaded": sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")}))
"""


def test_a_turn_runs_where_opentelemetry_cannot_be_imported(conversations_settings):
    env = worker_env(TELEMETRY="otlp")
    env["DJANGO_SETTINGS_MODULE"] = "chatproject.settings"
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["available"] is False and result["loaded"] == []
    assert result["status"] == "completed" and result["answer"]
    assert Turn.objects.get(pk=result["id"]).status == "completed"
    # The site asked for OTLP without the packages: the check says so; nothing else changes.
    assert result["checks"] == ["conversations.W080"]
