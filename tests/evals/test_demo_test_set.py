"""The demo ships a test set for its help articles, which its help desk passes with the demo model."""

import django.apps
import pytest
from django.core.management import call_command

from conversations.models import TestRun, TestSet


@pytest.mark.django_db(transaction=True)
def test_the_demo_help_desk_passes_its_help_articles_test_set(capsys):
    from importlib import import_module

    # A transactional test starts without the data migration's articles: written (and indexed) again.
    import_module("chatproject.migrations.0002_help_articles").add_articles(django.apps.apps, None)
    call_command("load_demo_test_set")
    call_command("load_demo_test_set")  # a second time changes nothing
    assert TestSet.objects.get(name="help-articles").questions.count() == 8

    call_command("run_test_set", "help-articles", "--threshold", "1", "--burst", "--concurrency", "4")

    out = capsys.readouterr().out
    assert "live: 8/8 passed (100%)" in out, out
    assert TestRun.objects.get().status == TestRun.Status.FINISHED
