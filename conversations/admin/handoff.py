"""The inbox of conversations handed to a person, and the page where a staff member takes one,
reads the whole transcript, replies, hands it back to the assistant or closes it. Only users
with ``conversations.answer_handoff`` see either; the rules are ``engine.handoff``'s."""

import datetime
import uuid

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, Subquery
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..conf import get_config
from ..engine import handoff
from ..models import Conversation, Message, WaitingConversation
from ..redaction import hide_keys
from .timeline import build_transcript

PERMISSION = "conversations.answer_handoff"
ACTIONS = {"hand_back": handoff.hand_back, "close": handoff.close}


def wait_text(since, now=None):
    """How long a visitor has waited, as "3 min" or "1 h 5 min"."""
    if since is None:
        return "—"
    minutes = int(((now or timezone.now()) - since) / datetime.timedelta(minutes=1))
    if minutes < 60:
        return _("%(minutes)d min") % {"minutes": minutes}
    return _("%(hours)d h %(minutes)d min") % {"hours": minutes // 60, "minutes": minutes % 60}


@admin.register(WaitingConversation)
class WaitingConversationAdmin(admin.ModelAdmin):
    """The inbox: every conversation staff hold, the longest wait first, with who took it."""

    list_display = ("waited", "assistant", "state", "taken_by", "last_words")
    list_display_links = ("waited",)
    list_per_page = 50

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm(PERMISSION)

    has_change_permission = has_view_permission

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_queryset(self, request):
        last = Message.objects.filter(conversation=OuterRef("pk")).order_by("-id").values("content")[:1]
        return handoff.waiting().annotate(last_content=Subquery(last))  # one query for the whole page

    def get_ordering(self, request):
        return ("handoff_requested_at",)

    @admin.display(description=gettext_lazy("waiting for"), ordering="handoff_requested_at")
    def waited(self, obj):
        return wait_text(obj.handoff_requested_at)

    @admin.display(description=gettext_lazy("state"))
    def state(self, obj):
        return obj.get_handoff_display()

    @admin.display(description=gettext_lazy("taken by"))
    def taken_by(self, obj):
        return obj.handoff_by.get_username() if obj.handoff_by_id else "—"

    @admin.display(description=gettext_lazy("last message"))
    def last_words(self, obj):
        return hide_keys(obj.last_content or "")[:80]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """The answer page; a POST takes, replies, hands back or closes, then comes back here."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        # Any conversation, not only the inbox's: the page still shows one just handed back or closed.
        try:
            pk = uuid.UUID(str(object_id))
        except ValueError:
            raise Http404 from None
        conversation = get_object_or_404(Conversation.objects.select_related("assistant", "handoff_by"), pk=pk)
        draft = ""
        if request.method == "POST":
            action, draft = request.POST.get("action", ""), request.POST.get("content", "")
            try:
                if action == "reply":
                    handoff.reply(conversation.pk, request.user, draft)
                    draft = ""
                elif action == "take":  # "holder": whom a superuser's page offered to take it over from
                    handoff.take(conversation.pk, request.user, holder=request.POST.get("holder"))
                elif action in ACTIONS:
                    ACTIONS[action](conversation.pk, request.user)
                else:
                    raise handoff.Refused(_("Choose what to do."))
            except handoff.Refused as exc:
                messages.error(request, exc.message)  # the reply stays in the box below: nothing lost
            else:
                done = {"reply": _("Your reply was sent."), "take": _("You are answering this conversation."),
                        "hand_back": _("Handed back to the assistant."), "close": _("The conversation is closed.")}
                messages.success(request, done[action])
                return redirect(request.path)
            conversation.refresh_from_db()
        return TemplateResponse(request, "admin/conversations/waitingconversation/answer.html",
                                {**self.admin_site.each_context(request), **self.page(request, conversation, draft)})

    def page(self, request, conversation, draft):
        rows = list(conversation.messages.select_related("author").order_by("id"))
        transcript = build_transcript(None, rows)
        for entry, row in zip(transcript, rows):
            entry["author"] = handoff.staff_name(row.author) if row.role == "staff" else ""
            entry["for_staff"] = row.turn_id is None and row.role == "user"
        can_answer = handoff.may_answer(conversation, request.user)
        return {
            "opts": self.opts, "title": _("Conversation for a person"), "conversation": conversation,
            "transcript": transcript, "draft": draft, "max_length": get_config()["MAX_MESSAGE_LENGTH"],
            "waited": wait_text(conversation.handoff_requested_at),
            "can_take": handoff.may_take(conversation, request.user), "can_answer": can_answer,
            "taken_by_other": conversation.handoff == Conversation.Handoff.TAKEN and not can_answer,
            "as_name": handoff.staff_name(request.user),
        }
