"""Erasure in the admin: two actions on the conversation list, each behind its own permission
(``conversations.erase_conversations``) and a confirmation page that lists what will go, and
the read-only list of the audit entries erasures leave."""

from django.contrib import admin, messages
from django.template.response import TemplateResponse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from ..engine import privacy
from ..models import Erasure, RetainedTotal, user_label
from .readonly import ReadOnlyAdmin

ERASE_PERMISSION = "conversations.erase_conversations"

# How the confirmation page and the audit list name each count ``Plan.counts`` gives.
COUNT_LABELS = {
    "conversations": gettext_lazy("conversations"),
    "turns": gettext_lazy("turns"),
    "ratings": gettext_lazy("ratings"),
    "calls": gettext_lazy("call records"),
    "messages_user": gettext_lazy("visitor messages"),
    "messages_assistant": gettext_lazy("assistant messages"),
    "messages_tool": gettext_lazy("tool results"),
    "messages_staff": gettext_lazy("staff replies"),
    "jobs": gettext_lazy("queued jobs"),
    "cached": gettext_lazy("cached copies"),
}


def labelled(counts):
    return [(COUNT_LABELS.get(key, key), number) for key, number in counts.items()]


def owners_of(queryset):
    """The owners of the conversations in ``queryset``: ``[(label, erase keyword arguments)]``,
    a user once by their id, an anonymous owner by their token (which the page never shows)."""
    seen, owners = set(), []
    for conversation in queryset.select_related("user").order_by("created_at"):
        if conversation.user_id is not None:
            key, label, kwargs = ("user", conversation.user_id), user_label(conversation.user), {
                "user": conversation.user_id}
        else:
            key, label, kwargs = ("visitor", conversation.owner_token), _("an anonymous visitor"), {
                "visitor": conversation.owner_token}
        if key not in seen:
            seen.add(key)
            owners.append((label, kwargs))
    return owners


class EraseActions:
    """The conversation list's erasure actions (mixed into ``ConversationAdmin``)."""

    def has_erase_permission(self, request):
        return request.user.has_perm(ERASE_PERMISSION)

    @admin.action(description=gettext_lazy("Erase the selected conversations everywhere"), permissions=["erase"])
    def erase_selected(self, request, queryset):
        ids = list(queryset.values_list("pk", flat=True))
        jobs = [(_("the selected conversations"), {"conversation": ids})]
        return self._erase(request, jobs, "erase_selected", queryset)

    @admin.action(description=gettext_lazy("Erase everything of the selected conversations' owners"),
                  permissions=["erase"])
    def erase_owners(self, request, queryset):
        return self._erase(request, owners_of(queryset), "erase_owners", queryset)

    def _erase(self, request, jobs, action, queryset):
        if request.POST.get("post") != "yes":
            planned = [(label, labelled(privacy.plan(**kwargs).counts())) for label, kwargs in jobs]
            context = {**self.admin_site.each_context(request), "opts": self.opts, "planned": planned,
                       "action": action, "selected": [str(pk) for pk in queryset.values_list("pk", flat=True)],
                       "title": _("Erase these conversations everywhere?")}
            return TemplateResponse(request, "admin/conversations/conversation/erase_confirmation.html", context)
        entries = [privacy.erase(**kwargs, by=request.user) for _label, kwargs in jobs]
        erased = sum(entry.counts.get("conversations", 0) for entry in entries)
        self.message_user(request, ngettext("%(count)d conversation was erased everywhere.",
                                            "%(count)d conversations were erased everywhere.", erased)
                          % {"count": erased}, messages.SUCCESS)
        return None


@admin.register(Erasure)
class ErasureAdmin(ReadOnlyAdmin):
    """The audit entries: what was erased, when, by whom; nothing of what it was."""

    list_display = ("created_at", "kind", "by", "what_went")
    list_filter = ("kind",)
    fields = ("created_at", "kind", "by", "subject_digest", "what_went")
    readonly_fields = fields
    date_hierarchy = "created_at"

    @admin.display(description=gettext_lazy("what went"))
    def what_went(self, obj):
        return ", ".join(f"{number} {label}" for label, number in labelled(obj.counts) if number)


@admin.register(RetainedTotal)
class RetainedTotalAdmin(ReadOnlyAdmin):
    """What retention kept of the conversations it deleted: anonymous daily totals, read-only."""

    list_display = ("day", "assistant", "turns", "rated_up", "rated_down", "input_tokens", "output_tokens", "cost")
    list_filter = ("assistant",)
    date_hierarchy = "day"
