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
        # Spans and metrics: the SDK is set up here only when CONVERSATIONS["TELEMETRY"] asks for it.
        from .conf import get_config  # the settings are read once the apps are ready
        from .engine import handoff  # the models it counts are ready only now
        from .infra import telemetry  # set up once the settings can be read

        telemetry.configure(get_config()["TELEMETRY"])
        telemetry.observe_handoffs(handoff.waiting_count)
        # Once, after all the apps' migrations: a site's data migration may run after this app's.
        post_migrate.connect(checks.report_after_migrate, sender=self, dispatch_uid="conversations_knowledge_built")
