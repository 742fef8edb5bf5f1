"""The site's knowledge found by content: a hash per indexed object (``IndexedObject``), which
``knowledge_status`` compares with what each object would give the index now; and, on SQLite,
the FTS5 table tokenized again in the site's language (stemmed for English), which migration
0010 built without a stemmer. Passages indexed before this migration have no hash: the status
reports their objects as changed until ``rebuild_knowledge`` runs."""

from django.conf import settings
from django.db import migrations, models

from conversations.knowledge.text import fts5_tokenizer

FTS = "conversations_passage_fts"


def fts_exists(cursor):
    cursor.execute("SELECT 1 FROM sqlite_master WHERE name = %s", [FTS])
    return cursor.fetchone() is not None


def tokenize(connection, tokenizer):
    """Recreate the FTS5 table with ``tokenizer`` and fill it from the passages; the triggers that
    keep it in step name the table, not its tokenizer, and stay as they are."""
    with connection.cursor() as cursor:
        if connection.vendor != "sqlite" or not fts_exists(cursor):
            return
        cursor.execute(f"DROP TABLE {FTS}")
        cursor.execute(f"CREATE VIRTUAL TABLE {FTS} USING fts5(title, text, content='conversations_passage', "
                       f"content_rowid='id', tokenize='{tokenizer}')")
        cursor.execute(f"INSERT INTO {FTS}({FTS}) VALUES ('rebuild')")


def forwards(apps, schema_editor):
    tokenize(schema_editor.connection, fts5_tokenizer(settings.LANGUAGE_CODE))


def backwards(apps, schema_editor):
    tokenize(schema_editor.connection, "unicode61 remove_diacritics 2")


class Migration(migrations.Migration):

    dependencies = [
        ("conversations", "0012_handoff_version"),
    ]

    operations = [
        migrations.CreateModel(
            name="IndexedObject",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("source", models.CharField(max_length=100)),
                ("object_pk", models.CharField(max_length=64)),
                ("digest", models.CharField(max_length=64)),
                ("indexed_at", models.DateTimeField(auto_now=True)),
            ],
            options={
                "verbose_name": "indexed object",
                "verbose_name_plural": "indexed objects",
                "constraints": [models.UniqueConstraint(fields=("source", "object_pk"),
                                                        name="conv_indexed_object_unique")],
            },
        ),
        migrations.RunPython(forwards, backwards),
    ]
