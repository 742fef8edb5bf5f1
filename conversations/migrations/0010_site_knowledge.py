"""The site's knowledge: passages of the registered sources, the objects waiting to be indexed
again, and which sources an assistant may search. The full-text index is the database's own:
an FTS5 table kept in step by triggers on SQLite, a generated tsvector column with a GIN index
on PostgreSQL, none elsewhere
(the search falls back to ``icontains`` there)."""

from django.conf import settings
from django.db import migrations, models

from conversations.knowledge.text import pg_config

FTS = "conversations_passage_fts"

SQLITE_FORWARDS = [
    f"CREATE VIRTUAL TABLE {FTS} USING fts5(title, text, content='conversations_passage', content_rowid='id', "
    "tokenize='unicode61 remove_diacritics 2')",
    f"CREATE TRIGGER conversations_passage_fts_insert AFTER INSERT ON conversations_passage BEGIN "
    f"INSERT INTO {FTS}(rowid, title, text) VALUES (new.id, new.title, new.text); END",
    f"CREATE TRIGGER conversations_passage_fts_delete AFTER DELETE ON conversations_passage BEGIN "
    f"INSERT INTO {FTS}({FTS}, rowid, title, text) VALUES ('delete', old.id, old.title, old.text); END",
    f"CREATE TRIGGER conversations_passage_fts_update AFTER UPDATE ON conversations_passage BEGIN "
    f"INSERT INTO {FTS}({FTS}, rowid, title, text) VALUES ('delete', old.id, old.title, old.text); "
    f"INSERT INTO {FTS}(rowid, title, text) VALUES (new.id, new.title, new.text); END",
]
SQLITE_BACKWARDS = [
    "DROP TRIGGER IF EXISTS conversations_passage_fts_insert",
    "DROP TRIGGER IF EXISTS conversations_passage_fts_delete",
    "DROP TRIGGER IF EXISTS conversations_passage_fts_update",
    f"DROP TABLE IF EXISTS {FTS}",
]


def sqlite_has_fts5(cursor):
    try:
        cursor.execute("CREATE VIRTUAL TABLE temp.conversations_fts5_probe USING fts5(x)")
        cursor.execute("DROP TABLE temp.conversations_fts5_probe")
        return True
    except Exception:  # an SQLite built without FTS5: the search falls back to icontains
        return False


def create_search_index(apps, schema_editor):
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite" and sqlite_has_fts5(cursor):
            for statement in SQLITE_FORWARDS:
                cursor.execute(statement)
        elif connection.vendor == "postgresql":
            # A stored document (PostgreSQL 12+), in the site's language, the title weighing more
            # (A) than the text (B): ranking reads it instead of parsing every matching passage
            # again, which an expression index alone would leave to each search.
            config = pg_config(settings.LANGUAGE_CODE)
            cursor.execute(
                "ALTER TABLE conversations_passage ADD COLUMN search_document tsvector GENERATED ALWAYS AS ("
                f"setweight(to_tsvector('{config}'::regconfig, COALESCE(title, '')), 'A') || "
                f"setweight(to_tsvector('{config}'::regconfig, COALESCE(text, '')), 'B')) STORED")
            cursor.execute("CREATE INDEX conv_passage_search ON conversations_passage USING gin (search_document)")


def drop_search_index(apps, schema_editor):
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            for statement in SQLITE_BACKWARDS:
                cursor.execute(statement)
        elif connection.vendor == "postgresql":
            cursor.execute("DROP INDEX IF EXISTS conv_passage_search")
            cursor.execute("ALTER TABLE conversations_passage DROP COLUMN IF EXISTS search_document")


class Migration(migrations.Migration):

    dependencies = [
        ("conversations", "0009_assistant_allowed_origins"),
    ]

    operations = [
        migrations.CreateModel(
            name="Passage",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("source", models.CharField(max_length=100, verbose_name="source")),
                ("object_pk", models.CharField(max_length=64, verbose_name="object")),
                ("title", models.CharField(max_length=300, verbose_name="title")),
                ("url", models.CharField(max_length=500, verbose_name="URL")),
                ("text", models.TextField(verbose_name="text")),
                ("position", models.PositiveIntegerField(default=0, verbose_name="position")),
                ("updated", models.DateTimeField(auto_now=True, verbose_name="indexed at")),
            ],
            options={
                "verbose_name": "passage",
                "verbose_name_plural": "passages",
                "ordering": ["source", "object_pk", "position"],
                "indexes": [models.Index(fields=["source", "object_pk"], name="conv_passage_object")],
            },
        ),
        migrations.CreateModel(
            name="StaleObject",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("source", models.CharField(max_length=100)),
                ("object_pk", models.CharField(max_length=64)),
                ("reason", models.CharField(blank=True, max_length=500)),
                ("marked_at", models.DateTimeField(auto_now=True)),
            ],
            options={
                "verbose_name": "stale object",
                "verbose_name_plural": "stale objects",
                "constraints": [models.UniqueConstraint(fields=("source", "object_pk"),
                                                        name="conv_stale_object_unique")],
            },
        ),
        migrations.AddField(
            model_name="assistant",
            name="knowledge_sources",
            field=models.JSONField(blank=True, default=list, help_text="Names of the site's knowledge sources its "
                                   "search_site tool may search; empty: all of them.",
                                   verbose_name="knowledge sources"),
        ),
        migrations.RunPython(create_search_index, drop_search_index),
    ]
