"""A passage's vectors, kept only when SEARCH_EMBEDDINGS is set (issue 39). A nullable column: on
SQLite an ALTER TABLE ADD COLUMN, so the FTS5 table's triggers on conversations_passage stay."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('conversations', '0019_test_question_member'),
    ]

    operations = [
        migrations.AddField(
            model_name='passage',
            name='embedding',
            field=models.JSONField(blank=True, editable=False, null=True, verbose_name='embedding'),
        ),
    ]
