"""The demo's one setting for seeing spans: ``TELEMETRY="console"`` prints them (and the metrics)
to standard output. A real turn, posted, run by a worker of each class (the demo's is the
concurrent one) and polled to its end, in a process of its own (the SDK's providers can be set once per process, and this one's are the
in-memory ones of the other telemetry tests), whose standard output is read."""

import json
import re
import subprocess
import sys

import pytest

from conversations.models import Turn
from tests.support.fakes import FakeProvider, openai_text
from tests.support.helpers import ROOT, worker_env

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

pytestmark = pytest.mark.django_db(transaction=True)

QUESTION = "Which refund applies to order ZQ-4411?"
ANSWER = "A full refund applies to order ZQ-4411."
RESULT = "RESULT "  # the script's line, once the SDK flushed what it held

SCRIPT = r"""
import json
import django
django.setup()
from django.conf import settings
settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]  # as pytest-django's test settings
from conversations.infra import telemetry
from tests.support.helpers import make_client, poll_until_done, run_worker, start_turn

client = make_client()
started = start_turn(client, %(question)r)
run_worker(%(worker)r)
final = poll_until_done(client, started["poll_url"])
telemetry.flush()
print(%(result)r + json.dumps({"id": started["id"], "status": final["status"]}), flush=True)
"""


def test_the_console_setting_prints_a_turns_spans_and_metrics(conversations_settings, worker_class):
    with FakeProvider(default=openai_text(ANSWER)) as fake:
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="k", MODEL="console-model",
                                      STREAM=False)
        env = worker_env(TELEMETRY="console")
        env["DJANGO_SETTINGS_MODULE"] = "chatproject.settings"
        done = subprocess.run([sys.executable, "-c", SCRIPT % {"question": QUESTION, "result": RESULT, "worker": worker_class}], env=env,
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout  # what the exporters printed, before the result line and at the process's exit
    (result,) = [json.loads(line[len(RESULT):]) for line in printed.splitlines() if line.startswith(RESULT)]
    assert result["status"] == "completed" and Turn.objects.get(pk=result["id"]).status == "completed"
    # ConsoleSpanExporter prints each span as a JSON object; the turn is one trace of them.
    names = re.findall(r'^    "name": "([^"]+)"', printed, re.MULTILINE)
    assert {"conversations.turn.enqueue", "conversations.turn.job", "chat console-model"} <= set(names), names
    trace_ids = set(re.findall(r'"trace_id": "(0x[0-9a-f]{32})"', printed))
    assert len(trace_ids) == 1
    assert '"gen_ai.request.model": "console-model"' in printed
    # ConsoleMetricExporter prints the metrics (flushed, and at exit): the turn counted by its status.
    assert '"name": "conversations.turns"' in printed and '"conversations.turn.status": "completed"' in printed
    # Message text stays out, as in any span by default.
    assert "ZQ-4411" not in printed and "refund" not in printed.lower()
