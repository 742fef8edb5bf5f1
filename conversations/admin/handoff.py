"""The inbox of conversations handed to a person, and the page where a staff member takes one,
reads the whole transcript, replies, hands it back to the assistant or closes it. Only users
with ``conversations.answer_handoff`` see either; the rules are ``engine.handoff``'s.

Both pages live: ``admin-live.js`` polls their JSON twin (``live/`` and ``<id>/live/``, ETag and
304) and draws what changed in place. The page and its JSON are built by the same functions
here, so a row or a message reads the same whether the server or the script drew it."""

import datetime
import hashlib
import json
import time
import uuid

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, Subquery
from django.core.serializers.json import DjangoJSONEncoder
from django.http import Http404, HttpResponse, HttpResponseNotModified
from django.shortcuts import get_object_or_404, redirect
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.dateformat import time_format
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..conf import get_config
from ..engine import handoff
from ..models import Conversation, Message, WaitingConversation
from ..redaction import hide_keys
from .readonly import PermissionGatedAdmin
from .timeline import build_transcript

PERMISSION = "conversations.answer_handoff"
ACTIONS = {"hand_back": handoff.hand_back, "close": handoff.close}


TEMPLATES = "admin/conversations/waitingconversation/"
# ms between two looks of a staff page at its JSON: a new request shows within about that.
POLL_INTERVAL_MS = 1000


def wait_text(since, now=None):
    """How long a visitor has waited, as "3 min" or "1 h 5 min"."""
    if since is None:
        return "—"
    minutes = int(((now or timezone.now()) - since) / datetime.timedelta(minutes=1))
    if minutes < 60:
        return _("%(minutes)d min") % {"minutes": minutes}
    return _("%(hours)d h %(minutes)d min") % {"hours": minutes // 60, "minutes": minutes % 60}


def wait_so_far(conversation):
    """How long the visitor waited for a person: until now while no one answers it, until the
    take once someone did (the wait is over then)."""
    until = None if handoff.unanswered(conversation) else conversation.handoff_taken_at
    return wait_text(conversation.handoff_requested_at, until)


def live_response(request, body):
    """``body`` as JSON with an ETag of its content, or 304 when the page has it already. The
    content is built in full either way (one or two queries): what the ETag saves is the page's
    work and the transfer, and it can never name a content that is not the current one."""
    data = json.dumps(body, cls=DjangoJSONEncoder, sort_keys=True)
    etag = '"%s"' % hashlib.sha256(data.encode()).hexdigest()[:32]
    if etag in request.headers.get("If-None-Match", ""):
        response = HttpResponseNotModified()
    else:
        response = HttpResponse(data, content_type="application/json")
    response["ETag"] = etag
    response["Cache-Control"] = "private, no-cache"
    return response


def live_strings():
    """What ``admin-live.js`` writes itself, translated for the page (it has no catalogue of its own)."""
    return {"new_request": _("A visitor is waiting for a person."),
            "new_message": _("The visitor wrote a new message."),
            "offline": _("The page cannot reach the server: it is not updating."),
            "waiting_title": _("(%(count)s waiting)")}


@admin.register(WaitingConversation)
class WaitingConversationAdmin(PermissionGatedAdmin):
    """The inbox: every conversation staff hold, the longest wait first, with who took it."""

    permission = PERMISSION
    list_display = ("waited", "assistant", "state", "taken_by", "last_words")
    list_display_links = ("waited", "last_words")
    list_per_page = 50
    actions = None
    sortable_by = ()  # the longest wait first, always: the live page keeps the rows in that order

    def get_queryset(self, request):
        # What the visitor wrote last, not the assistant's answer or its hand_to_person tool's text.
        last = (Message.objects.filter(conversation=OuterRef("pk"), role=Message.Role.USER).order_by("-id")
                .values("content")[:1])
        return handoff.waiting().annotate(last_content=Subquery(last))  # one query for the whole page

    def get_ordering(self, request):
        return ("handoff_requested_at",)

    def get_urls(self):
        live = [path("live/", self.admin_site.admin_view(self.inbox_live), name="conversations_handoff_inbox_live"),
                path("<path:object_id>/live/", self.admin_site.admin_view(self.answer_live),
                     name="conversations_handoff_answer_live")]
        return live + super().get_urls()

    def changelist_view(self, request, extra_context=None):
        context = {"title": _("Conversations waiting for a person"), "live_strings": live_strings(),
                   "poll_interval": POLL_INTERVAL_MS, "live_url": reverse("admin:conversations_handoff_inbox_live")}
        return super().changelist_view(request, {**context, **(extra_context or {})})

    def inbox_rows(self, request):
        """The inbox's first page as the script draws it: one dict per row, in the list's order."""
        rows = self.get_queryset(request).order_by(*self.get_ordering(request))[:self.list_per_page]
        return [{"id": str(row.pk), "url": reverse("admin:conversations_waitingconversation_change", args=[row.pk]),
                 "waited": self.waited(row), "assistant": str(row.assistant) if row.assistant_id else "—",
                 "state": self.state(row), "taken_by": self.taken_by(row), "last_words": self.last_words(row),
                 "unanswered": handoff.unanswered(row)} for row in rows]

    def inbox_live(self, request):
        """``live/``: the inbox's rows and how many wait with no one answering (the page's title)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        rows, held = self.inbox_rows(request), self.get_queryset(request)
        count = held.count()
        names = self.opts.verbose_name if count == 1 else self.opts.verbose_name_plural
        # Every one no one answers, the ones past the first page too (the longest wait comes first).
        unanswered = (held.filter(handoff=Conversation.Handoff.WAITING).count()
                      + sum(1 for row in held.filter(handoff=Conversation.Handoff.TAKEN) if handoff.holder_gone(row)))
        return live_response(request, {"rows": rows, "count": count, "count_text": f"{count} {names}",
                                       "waiting": unanswered})

    @admin.display(description=gettext_lazy("waiting for"), ordering="handoff_requested_at")
    def waited(self, obj):
        return wait_so_far(obj)

    @admin.display(description=gettext_lazy("state"))
    def state(self, obj):
        return obj.get_handoff_display()

    @admin.display(description=gettext_lazy("taken by"))
    def taken_by(self, obj):
        return obj.handoff_by.get_username() if obj.handoff_by_id else "—"

    @admin.display(description=gettext_lazy("last message"))
    def last_words(self, obj):
        return hide_keys(obj.last_content or "")[:80]

    def conversation(self, request, object_id):
        """Any conversation, not only the inbox's: the page still shows one just handed back or closed."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            pk = uuid.UUID(str(object_id))
        except ValueError:
            raise Http404 from None
        return get_object_or_404(Conversation.objects.select_related("assistant", "handoff_by"), pk=pk)

    def answer_live(self, request, object_id):
        """``<id>/live/?after=<message id>``: the answer page's state for this staff member, and the
        messages written after the last one the page shows."""
        conversation = self.conversation(request, object_id)
        try:
            after = int(request.GET.get("after", "0"))
        except ValueError:
            after = 0
        rows = list(conversation.messages.filter(id__gt=after).select_related("author").order_by("id"))
        live = controls(conversation, request.user)
        # Drawn by the page's own templates, autoescaped: the script inserts them as they are.
        status = render_to_string(f"{TEMPLATES}status.html", {"live": live, "conversation": conversation}, request)
        entries = [{"id": entry["id"], "html": render_to_string(f"{TEMPLATES}entry.html", {"entry": entry}, request)}
                   for entry in transcript(rows)]
        return live_response(request, {**live, "status_html": status, "entries": entries})

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """The answer page; a POST takes, replies, hands back or closes, then comes back here."""
        conversation = self.conversation(request, object_id)
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
        return TemplateResponse(request, f"{TEMPLATES}answer.html",
                                {**self.admin_site.each_context(request), **self.page(request, conversation, draft)})

    def page(self, request, conversation, draft):
        rows = list(conversation.messages.select_related("author").order_by("id"))
        return {
            "opts": self.opts, "title": _("Conversation for a person"), "conversation": conversation,
            "transcript": transcript(rows), "draft": draft, "max_length": get_config()["MAX_MESSAGE_LENGTH"],
            "as_name": handoff.staff_name(request.user), "live": controls(conversation, request.user),
            "live_strings": live_strings(), "poll_interval": POLL_INTERVAL_MS,
            "live_url": reverse("admin:conversations_handoff_answer_live", args=[conversation.pk]),
            "last_id": rows[-1].pk if rows else 0,
        }


def transcript(rows):
    """``rows`` (messages, in order) as the answer page shows them: text only, a staff message
    signed as its visitor reads it."""
    entries = build_transcript(None, rows)
    for entry, row in zip(entries, rows):
        entry["id"] = row.pk
        entry["author"] = handoff.staff_name(row.author) if row.role == Message.Role.STAFF else ""
        entry["for_staff"] = row.turn_id is None and row.role == Message.Role.USER
        entry["time"] = time_format(timezone.localtime(entry.pop("created_at")), "H:i:s")
    return entries


def controls(conversation, user):
    """What the answer page shows ``user`` of ``conversation`` now, and may let them do: the
    reply box is theirs only while they hold it (an unanswered one offers Take alone, so a
    mistaken Close cannot end it for its visitor); a colleague's take greys it out."""
    Handoff = Conversation.Handoff
    holder = conversation.handoff_by.get_username() if conversation.handoff_by_id else ""
    told = handoff.told_no_one_free(conversation, time.time())
    return {
        "state": conversation.handoff, "state_label": conversation.get_handoff_display(),
        "held": conversation.handoff in Conversation.HELD, "holder": holder, "holder_id": conversation.handoff_by_id,
        "waited": wait_so_far(conversation),
        "can_take": handoff.may_take(conversation, user), "can_reply": handoff.holds(conversation, user),
        "taken_by_other": (conversation.handoff == Handoff.TAKEN and not handoff.holds(conversation, user)
                           and not handoff.holder_gone(conversation)),
        "told_no_one_free": told,
        "told_at": (time_format(timezone.localtime(conversation.handoff_requested_at + datetime.timedelta(
            seconds=get_config()["HANDOFF_WAIT"])), "H:i") if told else ""),
    }
