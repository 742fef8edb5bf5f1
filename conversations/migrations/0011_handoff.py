import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('conversations', '0010_site_knowledge'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='WaitingConversation',
            fields=[
            ],
            options={
                'verbose_name': 'conversation for a person',
                'verbose_name_plural': 'conversations for a person',
                'proxy': True,
                'indexes': [],
                'constraints': [],
            },
            bases=('conversations.conversation',),
        ),
        migrations.AlterModelOptions(
            name='conversation',
            options={'ordering': ['-created_at'], 'permissions': [('answer_handoff', 'Can answer conversations handed to a person')], 'verbose_name': 'conversation', 'verbose_name_plural': 'conversations'},
        ),
        migrations.AddField(
            model_name='assistant',
            name='handoff',
            field=models.CharField(blank=True, choices=[('', 'never'), ('button', "the visitor's “Talk to a person” button"), ('tool', "the assistant's hand_to_person tool"), ('both', 'the button and the tool')], default='', help_text="Staff with the “answer handoff” permission then answer in the admin's inbox.", max_length=10, verbose_name='hand to a person through'),
        ),
        migrations.AddField(
            model_name='conversation',
            name='handoff',
            field=models.CharField(blank=True, choices=[('', 'with the assistant'), ('waiting', 'waiting for a person'), ('taken', 'answered by a person'), ('returned', 'handed back to the assistant'), ('closed', 'closed by staff')], db_index=True, default='', max_length=10, verbose_name='handoff'),
        ),
        migrations.AddField(
            model_name='conversation',
            name='handoff_by',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL, verbose_name='taken by'),
        ),
        migrations.AddField(
            model_name='conversation',
            name='handoff_requested_at',
            field=models.DateTimeField(blank=True, null=True, verbose_name='person asked for at'),
        ),
        migrations.AddField(
            model_name='conversation',
            name='handoff_taken_at',
            field=models.DateTimeField(blank=True, null=True, verbose_name='taken at'),
        ),
        migrations.AddField(
            model_name='message',
            name='author',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AlterField(
            model_name='message',
            name='role',
            field=models.CharField(choices=[('user', 'user'), ('assistant', 'assistant'), ('tool', 'tool'), ('staff', 'staff')], max_length=16),
        ),
        migrations.AlterField(
            model_name='message',
            name='turn',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='messages', to='conversations.turn'),
        ),
    ]
