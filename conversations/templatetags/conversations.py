"""``{% load conversations %}{% chat_widget %}``: the chat widget on any Django page."""

import json
import logging

from django import template
from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.db import DatabaseError
from django.middleware.csrf import get_token
from django.templatetags.static import static
from django.urls import reverse
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from .. import assistants
from ..assistants import settings_for
from ..core.rules import WIDGET_GIVE_UP_MARGIN
from ..models import Assistant, Turn

register = template.Library()
logger = logging.getLogger("conversations.widget")


def widget_strings():
    """Every string the widget shows, in the active language (keys match STRINGS in widget.js)."""
    return {
        "title": _("Assistant"),
        "region": _("Chat with the assistant"),
        "log": _("Conversation"),
        "label": _("Your message"),
        "hint": _("Enter sends, Shift+Enter adds a line."),
        "send": _("Send"),
        "stop": _("Stop"),
        "thinking": _("The assistant is thinking…"),
        # Translators: the status line while a message waits for a free worker (none took it within seconds).
        "waiting": _("Waiting for the assistant to start…"),
        # Translators: the status line while the answer is being streamed in.
        "writing": _("The assistant is writing…"),
        # Translators: shown in place of the widget when its script could not be loaded.
        "unavailable": _("The assistant could not load."),
        # Translators: a step of the answer; name is a tool's name and its arguments.
        "using_tool": _("Using %(name)s…"),
        "tool_result": _("%(name)s: %(result)s"),
        "tool_failed": _("%(name)s failed: %(result)s"),
        "stopping": _("Stopping…"),
        "stopped": _("You stopped this answer."),
        "reconnecting": _("Connection lost. Reconnecting…"),
        # Translators: the status line while the answer waits for another worker to take it over.
        "resuming": _("Reconnecting…"),
        "timed_out": _("The assistant did not finish in time. Please try again."),
        "failed": _("Something went wrong and the assistant could not answer. Please try again."),
        "incomplete": _("This answer is incomplete."),
        "send_failed": _("Your message could not be sent. Check your connection and try again."),
        "busy": _("The assistant is still answering. Wait for it to finish or press Stop."),
        "gone": _("This conversation is no longer available. Send your message again to start a new one."),
        # Translators: the label of the button that closes the assistant's floating panel.
        "close": _("Close"),
        # Translators: a link to the site's sign-in page, shown instead of the text box.
        "sign_in": _("Sign in to chat with the assistant."),
        # Translators: the thumbs up and down under an answer, and the comment that may follow.
        "rate": _("Rate this answer"),
        "rate_up": _("Helpful"),
        "rate_down": _("Not helpful"),
        "comment_label": _("Anything to add? (optional)"),
        "comment_send": _("Send feedback"),
        "rated": _("Thanks for your feedback."),
        # Translators: the heading of the links, under an answer, to the site's pages it was found in.
        "sources": _("Sources"),
        # Translators: a conversation handed to a person from the site's staff (the handoff).
        "talk_to_person": _("Talk to a person"),
        "handoff_waiting": _("A person will reply here. You can keep writing: they will read it."),
        # Translators: name is how the site signs its staff, e.g. "Ana from support".
        "handoff_taken": _("%(name)s joined the conversation."),
        "handoff_returned": _("You are talking to the assistant again."),
        "handoff_closed": _("This conversation was closed by our staff."),
        "handoff_expired": _("No one is free to answer right now. You can wait, or go back to the assistant."),
        "back_to_assistant": _("Back to the assistant"),
        "approval_needed": _("The assistant asks for your approval before it does this:"),
        "approval_details": _("Details"),
        "approve": _("Approve"),
        "decline": _("Decline"),
        "approval_staff": _("Our staff must approve this before the assistant goes on."),
        "approval_waiting": _("Waiting for your approval…"),
        # Translators: a link-like button under the chat; it erases the whole conversation, after a confirm.
        "delete_conversation": _("Delete this conversation"),
        "delete_confirm": _("Delete this conversation and everything in it? This cannot be undone."),
        "deleted": _("The conversation was deleted."),
        # How long the chat is kept (retention_note), where the site shows it.
        "retention": "",
    }


def retention_note(cfg):
    """The line the widget shows about how long a chat is kept, under ``cfg`` (an assistant's
    settings): empty unless ``WIDGET_RETENTION_NOTE`` is on and a retention is set."""
    days = cfg["RETENTION_DAYS"]
    if not cfg["WIDGET_RETENTION_NOTE"] or days <= 0:
        return ""
    if cfg["RETENTION_FROM"] == "created":
        return ngettext("This chat is deleted %(days)d day after it started.",
                        "This chat is deleted %(days)d days after it started.", days) % {"days": days}
    return ngettext("This chat is deleted %(days)d day after its last message.",
                    "This chat is deleted %(days)d days after its last message.", days) % {"days": days}


MODES = ("inline", "launcher")


@register.inclusion_tag("conversations/widget.html", takes_context=True)
def chat_widget(context, title="", mode="inline", key="", assistant=""):
    """Render the widget (its element and script) with every string translated.

    ``title`` replaces the header text (by default the assistant's name); ``mode`` is
    ``"inline"`` (a panel where the tag is) or ``"launcher"`` (a button in a corner of the window
    that opens the panel); ``key`` names the widget's conversation, for a page with several
    widgets that should keep theirs wherever they stand (without it, the widget's place on the
    page is its key, or the assistant's slug when it has one: a conversation belongs to one
    assistant, so a widget never resumes another assistant's). ``assistant`` is the slug of the
    assistant that answers the conversations this widget starts; an unknown or inactive one
    renders nothing and logs a warning, so that a page never breaks on it. When
    ``CONVERSATIONS["LOGIN_REQUIRED"]`` is on and the visitor is anonymous, the widget shows a
    sign-in link instead of its text box, and the page gets neither the assistant's greeting nor
    its suggestions; so too for an assistant whose access policy (``Assistant.allows``) wants a
    signed-in visitor. An assistant the visitor may not use even signed in (staff only, a
    permission) renders one sentence saying so instead of the widget. Returns the context of
    ``conversations/widget.html``.
    """
    if mode not in MODES:
        raise template.TemplateSyntaxError(f"chat_widget: mode must be one of {', '.join(MODES)}, not {mode!r}")
    chosen = None
    if assistant:
        chosen = find_assistant(str(assistant), context.get("request"))
        if chosen is None:
            return {"hidden": True}
        key = key or f"assistant-{chosen.slug}"
    request = context.get("request")
    # Also sets the csrftoken cookie for the widget's POSTs.
    csrf_token = get_token(request) if request is not None else ""
    cfg = settings_for(chosen)
    strings = widget_strings()
    strings["retention"] = retention_note(cfg)
    if title or chosen is not None:
        strings["title"] = str(title or chosen.name)
    login_url = ""
    user = getattr(request, "user", None)
    signed_in = user is not None and user.is_authenticated
    if chosen is not None and not chosen.allows(user) and (signed_in or chosen.access != chosen.Access.SIGNED_IN):
        # Signing in would not help: say so, and leave the assistant's words out of the page.
        return {"refused": assistants.access_refused_message(chosen, user)}
    if not signed_in and (cfg["LOGIN_REQUIRED"] or (chosen is not None and not chosen.allows(user))):
        # Back to this page once signed in, the way Django's own login_required sends a visitor.
        login_url = redirect_to_login(request.get_full_path() if request is not None else "/", settings.LOGIN_URL).url
        # The greeting and suggestions are the assistant's words for those who may chat: not in
        # the page of a visitor who is only offered the sign-in link.
        chosen_words = False
    else:
        chosen_words = chosen is not None
    return {
        "mode": mode,
        "key": str(key),
        "api_url": reverse("conversations:conversation-list"),
        "job_timeout": cfg["JOB_TIMEOUT"],
        "max_length": cfg["MAX_MESSAGE_LENGTH"],
        # Passed rather than copied into widget.js, so that the script and the server never disagree.
        "give_up_margin": WIDGET_GIVE_UP_MARGIN,
        "comment_max_length": Turn._meta.get_field("rating_comment").max_length,
        "csrf_cookie": settings.CSRF_COOKIE_NAME,
        "csrf_token": csrf_token,
        "login_url": login_url,
        "strings": strings,
        "assistant": chosen,
        "greeting": chosen.greeting if chosen_words else "",
        "suggestions": json.dumps(list(chosen.suggestions), ensure_ascii=False) if chosen_words else "[]",
        # The "Talk to a person" button, where the assistant offers it (engine/handoff.py).
        "handoff": chosen_words and chosen.offers_handoff("button"),
    }


def find_assistant(slug, request=None):
    """The active assistant ``slug``, or None (logged as a warning with the page's path)."""
    path = getattr(request, "path", "?")
    try:
        found = Assistant.objects.filter(slug=slug, active=True).first()
    except DatabaseError:  # e.g. its table not migrated yet: the page still renders, without the widget
        logger.warning("chat_widget: assistants cannot be read on %s", path, exc_info=True)
        return None
    if found is None:
        logger.warning("chat_widget: no active assistant %r on %s; the widget is not shown", slug, path)
    return found


def embed_snippet(request, assistant=None):
    """The one script tag that puts the widget of ``assistant`` (None: the site's default) on a page
    of any site allowed to embed it (docs/widget.md), with this site's absolute URLs."""
    token_path = reverse("conversations:widget-token")
    api_root = request.build_absolute_uri(token_path[:-len("widget-token/")])
    slug = f' data-assistant="{assistant.slug}"' if assistant is not None else ""
    return (f'<script src="{request.build_absolute_uri(static("conversations/embed.js"))}" '
            f'data-api="{api_root}"{slug} defer></script>')
