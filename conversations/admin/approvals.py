"""The admin's list of tool calls waiting for staff approval (``@tool(approval=True, approver="staff")``),
the oldest first, like the handoff inbox: only for users with ``conversations.approve_toolcall``.
Approve and Decline are admin actions (a POST with Django's CSRF check) that go through
``engine.approvals.decide``, the one place an approval lands; each refusal is shown with its sentence."""

import json

from django.contrib import admin, messages
from django.urls import reverse
from django.utils.html import format_html
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..engine import approvals
from ..models import StaffApproval
from ..redaction import hide_keys
from .readonly import PermissionGatedAdmin

PERMISSION = "conversations.approve_toolcall"


@admin.register(StaffApproval)
class StaffApprovalAdmin(PermissionGatedAdmin):
    permission = PERMISSION
    list_display = ("requested_at", "tool_name", "summary", "arguments_text", "turn_link", "expires_at")
    list_display_links = None
    list_per_page = 50
    sortable_by = ()
    actions = ["approve", "decline"]

    def get_queryset(self, request):
        return approvals.staff_waiting()

    def get_ordering(self, request):
        return ("requested_at",)

    @admin.display(description=gettext_lazy("arguments"))
    def arguments_text(self, obj):
        return format_html("<pre>{}</pre>", hide_keys(json.dumps(obj.arguments, indent=1, ensure_ascii=False,
                                                                 sort_keys=True)))

    @admin.display(description=gettext_lazy("turn"))
    def turn_link(self, obj):
        return format_html('<a href="{}">{}</a>', reverse("admin:conversations_turn_change", args=[obj.turn_id]),
                           obj.turn_id)

    def _decide(self, request, queryset, approve):
        done = 0
        for approval in queryset.select_related("turn"):
            try:
                approvals.decide(approval.turn, approval.call_id, approval.arguments_sha256, approve,
                                 user=request.user, staff=True)
                done += 1
            except approvals.Refused as exc:
                self.message_user(request, f"{approval.tool_name} ({approval.call_id}): {exc.message}",
                                  messages.WARNING)
        if done:
            self.message_user(request, (_("%(count)d call(s) approved.") if approve else
                                        _("%(count)d call(s) declined.")) % {"count": done}, messages.SUCCESS)

    @admin.action(description=gettext_lazy("Approve the selected calls"))
    def approve(self, request, queryset):
        self._decide(request, queryset, True)

    @admin.action(description=gettext_lazy("Decline the selected calls"))
    def decline(self, request, queryset):
        self._decide(request, queryset, False)
