from django import template
from django.middleware.csrf import get_token
from django.urls import reverse

from ..conf import get_config

register = template.Library()


@register.inclusion_tag("conversations/widget.html", takes_context=True)
def chat_widget(context, title=""):
    """Render the chat widget: ``{% load conversations %}{% chat_widget %}``."""
    request = context.get("request")
    if request is not None:
        get_token(request)  # make sure the csrftoken cookie is set for the widget's POSTs
    cfg = get_config()
    return {
        "api_url": reverse("conversations:conversation-list"),
        "job_timeout": cfg["JOB_TIMEOUT"],
        "max_length": cfg["MAX_MESSAGE_LENGTH"],
        "title": title,
    }
