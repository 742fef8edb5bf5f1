"""The admin of assistants: editing them (a form that offers the site's registered tools and
configured credentials, and refuses what cannot work), the versions each has answered with,
the overview of what each did and cost per day, and, for the turn list, the assistant, rating
and cost columns and the CSV export of rated turns."""

import json

from django import forms
from django.contrib import admin
from django.db import models
from django.db.models import Count
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.text import capfirst
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..assistants import CHAIN_KEYS, CONFIGURE_FIELDS, registered_tools
from ..conf import get_config
from ..knowledge.registry import sources as knowledge_sources
from ..models import Assistant, AssistantVersion, Turn
from ..templatetags.conversations import embed_snippet
from .overview import overview
from .timeline import seconds

OVERVIEW_DAYS = (7, 30, 90)


CONFIGURE_PERMISSION = "conversations.configure_provider"


def can_configure(user):
    """Whether ``user`` may edit ``CONFIGURE_FIELDS`` (superusers have every permission)."""
    return user.has_perm(CONFIGURE_PERMISSION)


class LinesField(forms.CharField):
    """A list of strings edited as lines of a textarea (empty lines dropped)."""

    widget = forms.Textarea(attrs={"rows": 4})

    def prepare_value(self, value):
        return "\n".join(value) if isinstance(value, list) else value

    def to_python(self, value):
        return [line.strip() for line in (value or "").splitlines() if line.strip()]


class ChainField(forms.JSONField):
    """An assistant's fallbacks as indented JSON, each entry's keys in the order of ``CHAIN_KEYS``
    (PostgreSQL's jsonb keeps none). An empty box is None (the site's ``FALLBACKS``), not the
    ``null`` that Django's JSON field would show; ``[]`` is no fallbacks."""

    def prepare_value(self, value):
        if value is None or isinstance(value, forms.fields.InvalidJSONInput):
            return value or ""
        if isinstance(value, list):
            rank = {key: index for index, key in enumerate(CHAIN_KEYS)}
            value = [dict(sorted(e.items(), key=lambda item: rank.get(item[0], len(rank))))
                     if isinstance(e, dict) else e for e in value]
        return json.dumps(value, indent=2, ensure_ascii=False)


class AssistantForm(forms.ModelForm):
    """Tools are chosen among the site's registered ones, the credential among the configured names."""

    base_url = forms.URLField(required=False, max_length=500, assume_scheme="https")
    tools = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple)
    approval_tools = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple)
    knowledge_sources = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple)
    credential = forms.ChoiceField(required=False)
    fallbacks = ChainField(required=False, widget=forms.Textarea(attrs={"rows": 4, "class": "vLargeTextField"}))
    redact = ChainField(required=False, widget=forms.Textarea(attrs={"rows": 1, "class": "vLargeTextField"}))
    suggestions = LinesField(required=False, help_text=gettext_lazy("One per line, at most 4."))
    allowed_origins = LinesField(required=False)

    class Meta:
        model = Assistant
        fields = "__all__"
        # As the form's own base_url field: the admin builds the model's too when that is read-only.
        formfield_callback = staticmethod(
            lambda db_field, **kwargs: db_field.formfield(**{"assume_scheme": "https", **kwargs})
            if isinstance(db_field, models.URLField) else db_field.formfield(**kwargs))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not self.instance.pk and "provider" not in kwargs.get("initial", {}):
            # A new assistant starts from the site's provider, not the model's "demo" (canned answers).
            self.initial.update(provider=get_config()["PROVIDER"], model=get_config()["MODEL"])
        for name in ("base_url", "tools", "approval_tools", "knowledge_sources", "credential", "fallbacks",
                     "suggestions", "allowed_origins", "redact"):  # as the model's fields
            if name not in self.fields:  # read-only for this user (CONFIGURE_FIELDS)
                continue
            model_field = Assistant._meta.get_field(name)
            self.fields[name].label = capfirst(model_field.verbose_name)
            self.fields[name].help_text = self.fields[name].help_text or model_field.help_text
        try:
            names = list(registered_tools())
        except (ImportError, TypeError, ValueError):  # conversations.E011 names the broken tool
            names = []
        current = list(self.instance.tools or []) if self.instance.pk else []
        self.fields["tools"].choices = [(name, name) for name in dict.fromkeys(names + current)]
        if "approval_tools" in self.fields:
            asked = list(self.instance.approval_tools or []) if self.instance.pk else []
            self.fields["approval_tools"].choices = [(name, name) for name in dict.fromkeys(names + asked)]
        chosen = list(self.instance.knowledge_sources or []) if self.instance.pk else []
        self.fields["knowledge_sources"].choices = [(name, name) for name in dict.fromkeys(
            list(knowledge_sources()) + chosen)]
        if "credential" in self.fields:
            credentials = list(get_config()["CREDENTIALS"])
            if self.instance.credential and self.instance.credential not in credentials:
                credentials.append(self.instance.credential)  # shown, so that clean() can say it is gone
            self.fields["credential"].choices = [("", _("— the site's API_KEY —"))] + [(c, c) for c in credentials]


class VersionInline(admin.TabularInline):
    """The configurations the assistant has answered with, newest first (read-only)."""

    model = AssistantVersion
    fields = ("fingerprint", "created_at", "turn_count", "configuration")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request, obj=None):
        return False

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(turn_count=Count("turns"))

    @admin.display(description=gettext_lazy("turns"))
    def turn_count(self, obj):
        return obj.turn_count

    @admin.display(description=gettext_lazy("configuration"))
    def configuration(self, obj):
        return configuration_html(obj)


def configuration_html(version):
    """A version's snapshot as escaped, indented JSON."""
    return format_html('<pre class="assistant-snapshot">{}</pre>',
                       json.dumps(version.snapshot, indent=2, ensure_ascii=False, sort_keys=True))


@admin.register(Assistant)
class AssistantAdmin(admin.ModelAdmin):
    form = AssistantForm
    list_display = ("name", "slug", "active", "access", "provider", "model", "tool_list", "turn_count")
    list_filter = ("active", "access", "provider")
    search_fields = ("name", "slug", "model")
    prepopulated_fields = {"slug": ["name"]}
    inlines = [VersionInline]
    fieldsets = [
        (None, {"fields": ("name", "slug", "active")}),
        (gettext_lazy("Who may chat"), {"fields": ("access", "access_permission")}),
        (gettext_lazy("What answers"), {"fields": ("system_prompt", ("provider", "model"), "base_url", "credential",
                                                   "tools", "approval_tools", "knowledge_sources", "fallbacks",
                                                   "handoff")}),
        (gettext_lazy("Limits (empty: the site's)"), {"fields": (("max_steps", "max_tokens"),
                                                                 ("call_timeout", "job_timeout"))}),
        (gettext_lazy("What the widget shows first"), {"fields": ("greeting", "suggestions")}),
        (gettext_lazy("On other sites"), {"fields": ("allowed_origins", "script_tag")}),
        (gettext_lazy("Privacy (empty: the site's)"), {"fields": ("redact", ("retention_days", "retention_from"))}),
    ]
    readonly_fields = ("script_tag",)

    class Media:
        css = {"all": ["conversations/admin.css"]}

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(turn_count=Count("turns"))

    def get_readonly_fields(self, request, obj=None):
        """Where the assistant's calls go and with which key, for superusers and holders of
        ``configure_provider`` only: with ``change_assistant`` alone, a staff user could send
        every credential and every visitor's conversation to a server of their own."""
        readonly = list(super().get_readonly_fields(request, obj))
        if not can_configure(request.user):
            readonly += [name for name in CONFIGURE_FIELDS if name not in readonly]
        return readonly

    def save_model(self, request, obj, form, change):
        if not change and not can_configure(request.user):
            # The provider field was not the user's to choose: the site's, as the form would suggest.
            obj.provider = get_config()["PROVIDER"]
        super().save_model(request, obj, form, change)

    def get_object(self, request, object_id, from_field=None):
        """The assistant of the change page, knowing this site's address (for ``script_tag``)."""
        found = super().get_object(request, object_id, from_field)
        if found is not None:
            found.snippet = embed_snippet(request, found)
        return found

    @admin.display(description=gettext_lazy("script tag"))
    def script_tag(self, obj):
        """What a site owner pastes into a page of an allowed origin (docs/widget.md)."""
        snippet = getattr(obj, "snippet", "")
        if not snippet:
            return _("Shown once the assistant is saved.")
        return format_html('<pre class="conversations-snippet"><code>{}</code></pre><div class="help">{}</div>', snippet,
                           _("Paste it into the pages of the sites above, where the widget should appear."))

    @admin.display(description=gettext_lazy("tools"))
    def tool_list(self, obj):
        return ", ".join(obj.tools) or "—"

    @admin.display(description=gettext_lazy("turns"), ordering="turn_count")
    def turn_count(self, obj):
        return obj.turn_count

    def get_urls(self):
        name = f"{self.opts.app_label}_{self.opts.model_name}_overview"
        return [path("overview/", self.admin_site.admin_view(self.overview_view), name=name)] + super().get_urls()

    def overview_view(self, request):
        """Per assistant and day: turns, endings, median duration, low margin, thumbs up, tokens, cost."""
        if not request.user.has_perm("conversations.view_turn"):
            from django.core.exceptions import PermissionDenied

            raise PermissionDenied
        try:
            days = int(request.GET.get("days", 30))
        except ValueError:
            days = 30
        days = days if days in OVERVIEW_DAYS else 30
        rows = overview(days)
        for row in rows:
            row["ended"] = [(value, label, row[f"status_{value}"]) for value, label in Turn.Status.choices
                            if row[f"status_{value}"]]
            row["duration_text"] = seconds(row["duration_median"], 1)
            row["margin_text"] = seconds(row["margin_p10"], 1)
            row["turns_url"] = turns_url(row)
        context = {**self.admin_site.each_context(request), "opts": self.opts, "rows": rows, "days": days,
                   "day_choices": OVERVIEW_DAYS, "title": _("What each assistant did, per day")}
        return TemplateResponse(request, "admin/conversations/assistant/overview.html", context)


def turns_url(row):
    """The turn list filtered to one row of the overview."""
    url = reverse("admin:conversations_turn_changelist")
    assistant = f"assistant__id__exact={row['assistant']}" if row["assistant"] else "assistant__isnull=True"
    day = row["day"]
    return f"{url}?{assistant}&enqueued_at__year={day.year}&enqueued_at__month={day.month}&enqueued_at__day={day.day}"


# -- the turn list: assistant, version, rating and cost; the CSV export -------------------------
