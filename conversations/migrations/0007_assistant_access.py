from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('conversations', '0006_assistant_configure_permission'),
    ]

    operations = [
        migrations.AddField(
            model_name='assistant',
            name='access',
            field=models.CharField(choices=[('public', 'anyone (as LOGIN_REQUIRED allows)'), ('signed_in', 'signed-in users'), ('staff', 'staff'), ('permission', 'users with the permission below')], default='public', help_text='Checked when a conversation starts and again before each answer.', max_length=20, verbose_name='who may chat'),
        ),
        migrations.AddField(
            model_name='assistant',
            name='access_permission',
            field=models.CharField(blank=True, help_text='For "users with the permission below": "app_label.codename", e.g. "conversations.view_turn". Superusers hold every permission.', max_length=255, verbose_name='permission'),
        ),
    ]
