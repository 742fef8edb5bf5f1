"""The admin of the site's knowledge: each source with its counts and last update, what is out
of date, and a box to try a query as a kind of visitor (anonymous, or a chosen user) and see
what the assistant's search_site would find for them. Passages are facts of the index: read-only."""

from urllib.parse import urljoin, urlsplit

from django import forms
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse
from django.utils.translation import gettext_lazy as _

from ..conf import get_config
from ..endpoints import origin
from ..knowledge.index import out_of_date, status
from ..knowledge.search import clears, search
from ..models import Passage


class TryQueryForm(forms.Form):
    query = forms.CharField(label=_("query"), max_length=500)
    visitor = forms.CharField(label=_("as the user (username; empty: an anonymous visitor)"), max_length=150,
                              required=False)

    def clean_visitor(self):
        name = self.cleaned_data["visitor"].strip()
        if not name:
            return None
        model = get_user_model()
        user = model._default_manager.filter(**{model.USERNAME_FIELD: name}).first()
        if user is None:
            raise forms.ValidationError(_("No user has that username."))
        return user


def link_or_none(url, site):
    """``url`` resolved on ``site`` (this site's origin) when it is a page of this site over
    http(s), as the widget links a source; else None (the title is shown as text). A backslash,
    whitespace or a control character is never linked: a browser reads ``/\\host/`` as
    ``//host/``, another site, where a parser here would read a path."""
    text = str(url or "")
    if any(char == "\\" or char.isspace() or not char.isprintable() for char in text):
        return None
    absolute = urljoin(site + "/", text)
    parts = urlsplit(absolute)
    return absolute if parts.scheme in ("http", "https") and origin(f"{parts.scheme}://{parts.netloc}") == site else None


@admin.register(Passage)
class PassageAdmin(admin.ModelAdmin):
    """The sources page (this admin's list), then a read-only list of one source's passages."""

    list_display = ("title", "source", "object_pk", "position", "updated")
    list_filter = ("source",)
    search_fields = ("title", "object_pk")
    readonly_fields = ("source", "object_pk", "title", "url", "text", "position", "updated")

    def get_queryset(self, request):
        # A passage's vectors (SEARCH_EMBEDDINGS, about 8 KB each) are the search's, never shown here.
        return super().get_queryset(request).defer("embedding")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # the index follows the site's rows; rebuild_knowledge is the way to mend it

    def changelist_view(self, request, extra_context=None):
        if "source" in request.GET or "q" in request.GET or "p" in request.GET:
            return super().changelist_view(request, extra_context)  # one source's passages
        if not self.has_view_permission(request):
            # What a search finds as any user is as private as the passages themselves.
            raise PermissionDenied
        form = TryQueryForm(request.GET if "query" in request.GET else None)
        hits = None
        if form.is_valid():
            floor = float(get_config()["SEARCH_FLOOR"])
            site = origin(request.build_absolute_uri("/"))
            hits = [{**hit.as_dict(), "link": link_or_none(hit.url, site), "under_floor": not clears(hit, floor)}
                    for hit in search(form.cleaned_data["query"], user=form.cleaned_data["visitor"], limit=10)]
        rows = [{**row, "out_of_date": out_of_date(row)} for row in status()]
        context = {**self.admin_site.each_context(request), "opts": self.opts, "rows": rows, "form": form,
                   "hits": hits, "title": _("Knowledge sources")}
        return TemplateResponse(request, "admin/conversations/passage/sources.html", context)
