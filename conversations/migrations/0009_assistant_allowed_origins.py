from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('conversations', '0008_usage_estimated'),
    ]

    operations = [
        migrations.AddField(
            model_name='assistant',
            name='allowed_origins',
            field=models.JSONField(blank=True, default=list, help_text='Sites whose pages may embed this assistant with the script tag below, one origin per line: https://www.example.com, or https://*.example.com for every subdomain.', verbose_name='allowed origins'),
        ),
    ]
