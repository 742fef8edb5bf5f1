from django.apps import AppConfig


def members_only_rule(queryset, user):
    """Members-only articles for signed-in (active) users; everyone else sees the public ones."""
    if user.is_authenticated and user.is_active:
        return queryset
    return queryset.filter(members_only=False)


class DemoConfig(AppConfig):
    name = "chatproject"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from conversations import knowledge

        knowledge.register("chatproject.Article", name="help", title="title", body="body", html=True,
                           url="get_absolute_url", published="published", visible=members_only_rule,
                           updated="updated_at")
