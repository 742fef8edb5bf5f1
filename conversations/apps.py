from django.apps import AppConfig
from django.db.models.signals import post_migrate
from django.utils.translation import gettext_lazy as _


class ConversationsConfig(AppConfig):
    name = "conversations"
    verbose_name = _("Conversations")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import checks, signals  # noqa: F401  (registers system checks and signal receivers)
        from .knowledge import index  # the app registry is ready: the index may follow the site's saves

        index.connect()
        # Once, after all the apps' migrations: a site's data migration may run after this app's.
        post_migrate.connect(checks.report_after_migrate, sender=self, dispatch_uid="conversations_knowledge_built")
