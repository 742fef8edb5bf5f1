from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('conversations', '0007_assistant_access'),
    ]

    operations = [
        migrations.AddField(
            model_name='turn',
            name='usage_estimated',
            field=models.BooleanField(default=False, verbose_name='usage estimated'),
        ),
    ]
