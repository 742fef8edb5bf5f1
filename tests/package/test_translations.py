"""Every sentence the app marks for translation reads in Spanish: the app's strings are
collected afresh (``makemessages``, in a copy of the app, so the checkout's catalogue is left
as it is) and each is looked up the way a page or an answer does, through the compiled
catalogue. A string added without its Spanish, or a ``.po`` not compiled again, shows up here.
"""

import ast
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

from django.utils import translation

APP = Path(__file__).resolve().parents[2] / "conversations"
DJANGO_ADMIN = Path(sys.executable).with_name("django-admin")

# ``msgid "…"`` (possibly ``msgid_plural``), with --no-wrap on one line.
_ENTRY = re.compile(r'^msgid "(.*)"\n(?:msgid_plural "(.*)"\n)?', re.M)


def _collected_catalogue(directory):
    """The app's Spanish catalogue as ``makemessages`` would write it today."""
    copy = directory / "conversations"
    shutil.copytree(APP, copy, ignore=shutil.ignore_patterns("__pycache__", "*.mo"))
    # Without the test settings: makemessages needs none, and they are not importable from the copy.
    environment = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    made = subprocess.run([str(DJANGO_ADMIN), "makemessages", "-l", "es", "--no-obsolete", "--no-wrap"], cwd=copy,
                          env=environment, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    return copy / "locale" / "es" / "LC_MESSAGES" / "django.po"


def test_every_sentence_of_the_app_reads_in_spanish(tmp_path):
    catalogue = _collected_catalogue(tmp_path)
    # Untranslated, or only guessed by makemessages from a similar string (fuzzy, never used).
    missing = subprocess.run(["msgattrib", "--untranslated", "--no-wrap", str(catalogue)], check=True,
                             capture_output=True, text=True).stdout
    fuzzy = subprocess.run(["msgattrib", "--only-fuzzy", "--no-wrap", str(catalogue)], check=True,
                           capture_output=True, text=True).stdout
    english = []
    with translation.override("es"):
        for text in (missing, fuzzy):
            for singular, plural in _ENTRY.findall(text):
                singular = ast.literal_eval(f'"{singular}"')
                if not singular:
                    continue  # the catalogue's header
                # Django's own catalogues answer some (the admin's "Home"): what the visitor reads counts.
                shown = (translation.ngettext(singular, ast.literal_eval(f'"{plural}"'), 2) if plural
                         else translation.gettext(singular))
                if shown in (singular, ast.literal_eval(f'"{plural}"')):
                    english.append(singular)
    assert english == []
