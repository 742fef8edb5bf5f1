"""The merged CONVERSATIONS configuration: one object every caller shares, which none can change."""

import re
from pathlib import Path

import pytest

from conversations.conf import DEFAULTS, get_config
from tests.support.helpers import FAST

ROOT = Path(__file__).resolve().parents[2]


def test_the_shared_configuration_cannot_be_changed_by_a_caller(conversations_settings):
    conversations_settings.update(TOOLS=["chatproject.tools.current_time"])
    cfg = get_config()

    with pytest.raises(TypeError):
        cfg["JOB_TIMEOUT"] = 1
    with pytest.raises(AttributeError):
        cfg["TOOLS"].append("chatproject.tools.search_faq")

    assert get_config()["JOB_TIMEOUT"] == FAST["JOB_TIMEOUT"]
    assert list(get_config()["TOOLS"]) == ["chatproject.tools.current_time"]
    assert {**cfg, "JOB_TIMEOUT": 1}["JOB_TIMEOUT"] == 1  # a copy is the caller's to change


def test_list_settings_from_the_environment_are_split_on_commas(conversations_settings):
    conversations_settings.update(TOOLS=" chatproject.tools.current_time, ,chatproject.tools.search_faq ")
    assert get_config()["TOOLS"] == ("chatproject.tools.current_time", "chatproject.tools.search_faq")


def _readme_configuration_rows():
    """The keys each row of the README's configuration table names (its first cell)."""
    readme = (ROOT / "README.md").read_text()
    table = readme.split("| key | default | meaning |", 1)[1].split("\n\n", 1)[0]
    return [re.findall(r"`([A-Z0-9_]+)`", row.split("|")[1]) for row in table.splitlines()[2:]]


def test_the_readme_configuration_table_lists_every_setting_once():
    named = [key for row in _readme_configuration_rows() for key in row]
    assert sorted(key for key in named if named.count(key) > 1) == []
    assert [key for key in DEFAULTS if key not in named] == []
    assert [key for key in named if key not in DEFAULTS] == []


def test_every_check_id_is_documented_where_the_readme_and_deadlines_md_list_them():
    # Every id the app writes: the checks, and the rules they report wherever those live (a fallback
    # chain's in assistants.py, a knowledge source's in its registry), as ``id="…"`` or as a value.
    sources = [path for path in (ROOT / "conversations").rglob("*.py") if "migrations" not in path.parts]
    written = {found for path in sources
               for found in re.findall(r'(?:id=|\(|, )"(conversations\.[EW]\d{3})"', path.read_text())}
    table = set(re.findall(r"^\| `(conversations\.[EW]\d{3})` \|", (ROOT / "docs" / "deadlines.md").read_text(), re.M))
    assert sorted(written ^ table) == []
    # The README's list: single ids and ranges such as `E000`…`E008`.
    readme = (ROOT / "README.md").read_text().replace("\n", " ")
    listed = readme.split("with an error id (", 1)[1].split("lists them", 1)[0]
    ids = set()
    for first, last in re.findall(r"`(?:conversations\.)?([EW]\d{3})`(?:…`([EW]\d{3})`)?", listed):
        last = last or first
        ids |= {f"conversations.{first[0]}{n:03d}" for n in range(int(first[1:]), int(last[1:]) + 1)}
    assert sorted(written ^ ids) == []


def test_the_demo_sqlite_database_commits_without_waiting_for_the_disk(tmp_path):
    """A turn commits after every round-trip: on the demo's SQLite database each commit goes to a
    write-ahead log, synced only at checkpoints, not to a rollback journal synced twice per commit."""
    import os
    import subprocess
    import sys

    script = ("import django; django.setup(); from django.db import connection; c = connection.cursor(); "
              "print(c.execute('PRAGMA journal_mode').fetchone()[0], c.execute('PRAGMA synchronous').fetchone()[0])")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "chatproject.settings",
           "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}"}
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["wal", "1"]  # synchronous=NORMAL
