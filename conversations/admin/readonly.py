"""Admin lists whose rows the app writes: staff read them here and never add, change or delete a
row by hand (``ReadOnlyAdmin``), or, for an inbox, see it only with its own permission and act on it
through its actions (``PermissionGatedAdmin``)."""

from django.contrib import admin


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class PermissionGatedAdmin(ReadOnlyAdmin):
    """Shown (and its actions allowed) only to users holding ``permission``."""

    permission = None

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm(self.permission)

    has_change_permission = has_view_permission
