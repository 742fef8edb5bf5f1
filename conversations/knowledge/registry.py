"""Which of the site's models the assistant may search: sources, registered in code.

A site registers its models in its own ``AppConfig.ready()``::

    from conversations import knowledge

    class HelpConfig(AppConfig):
        def ready(self):
            knowledge.register("help.Article", title="title", body="body", html=True,
                               url=lambda article: f"/help/{article.slug}/", published="published",
                               visible=members_only_rule)

That call is the registry's only input: nothing is registered by importing a module. A
registration is checked by the system checks (``conversations.E050``…), never at the call, since
models may not all be loaded yet when it runs.
"""

import typing
from dataclasses import dataclass

from django.apps import apps
from django.core.exceptions import FieldDoesNotExist
from django.db.models import Q


@dataclass
class Source:
    """One registered model. ``title`` and ``body`` are field (or method) names or callables of an object
    (``html``: the body is HTML, reduced to text); ``url`` a field name or a callable returning
    the object's URL (a path on this site, or http(s)); ``published`` a boolean field name, a
    ``Q`` or a dict of lookups that a visible object matches; ``visible(queryset, user)`` narrows
    a queryset to the objects ``user`` (an ``AnonymousUser`` for a visitor who is not signed in)
    may open, after ``published``. ``updated`` names a field that changes at every save, so that
    ``knowledge_status`` can tell which objects changed since they were indexed (bulk updates
    bypass the signals)."""

    name: str
    model: str  # "app_label.ModelName"
    title: typing.Any = "title"
    body: typing.Any = "body"
    url: typing.Any = None
    published: typing.Any = None
    visible: typing.Callable | None = None
    html: bool = False
    updated: str | None = None

    def model_class(self):
        """The model class, or None when no installed app has it (the check says so)."""
        try:
            return apps.get_model(self.model)
        except (LookupError, ValueError):
            return None

    def problems(self):
        """What is wrong with this registration, as ``[(id, message, hint)]`` for the checks."""
        model = self.model_class()
        if model is None:
            return [("conversations.E050", f"Knowledge source {self.name!r} names the model {self.model!r}, which "
                     "no installed app has.", "Register an existing model as \"app_label.ModelName\", or remove "
                     "the registration and run manage.py rebuild_knowledge to drop its passages.")]
        found = []
        named = [("title", self.title), ("body", self.body), ("url", self.url), ("updated", self.updated)]
        if isinstance(self.published, str):
            named.append(("published", self.published))
        for option, value in named:
            if isinstance(value, str) and not (option != "updated" and hasattr(model, value)):
                try:
                    model._meta.get_field(value)
                except FieldDoesNotExist:
                    found.append(("conversations.E051", f"Knowledge source {self.name!r}: {option}={value!r} is not a "
                                  f"field of {self.model}.", f"Name a field of {model.__name__} or give a callable."))
        if self.url is None:
            found.append(("conversations.E052", f"Knowledge source {self.name!r} gives no url.",
                          "Pass url= a field name or a callable returning the object's URL; the answer links to it."))
        if self.visible is not None and not callable(self.visible):
            found.append(("conversations.E053", f"Knowledge source {self.name!r}: visible must be a callable.",
                          "Pass visible=lambda queryset, user: queryset.filter(...)."))
        return found

    def published_filter(self):
        """The ``Q`` an object must match to be shown to anyone (empty: every object)."""
        if self.published is None:
            return Q()
        if isinstance(self.published, str):
            return Q(**{self.published: True})
        if isinstance(self.published, dict):
            return Q(**self.published)
        return self.published

    def visible_to(self, queryset, user):
        """``queryset`` narrowed to what ``user`` may open: published, then the site's own rule."""
        queryset = queryset.filter(self.published_filter())
        return self.visible(queryset, user) if self.visible is not None else queryset

    def read(self, obj, option):
        value = getattr(self, option)
        if value is None:
            return ""
        result = value(obj) if callable(value) else getattr(obj, value)
        if callable(result):  # a method named by its name: url="get_absolute_url"
            result = result()
        return "" if result is None else str(result)


_SOURCES: dict[str, Source] = {}
_FOLLOWERS: list[typing.Callable] = []


def register(model, *, name=None, title="title", body="body", url=None, published=None, visible=None, html=False,
             updated=None):
    """Register ``model`` (a class or "app_label.ModelName") as a knowledge source; returns the
    ``Source``. ``name`` defaults to the model's label, lower-cased ("help.article"). Registering
    a name again replaces it (a reloaded app)."""
    label = model if isinstance(model, str) else model._meta.label
    source = Source(name=name or label.lower(), model=label, title=title, body=body, url=url, published=published,
                    visible=visible, html=html, updated=updated)
    _SOURCES[source.name] = source
    _changed()
    return source


def unregister(name):
    """Forget source ``name`` (its passages stay until ``rebuild_knowledge`` drops them)."""
    _SOURCES.pop(name, None)
    _changed()


def follow(callback):
    """Call ``callback(sources())`` now and after every registration or removal: the index connects
    its receivers to the sources' models only, including those of apps whose ``ready()`` runs
    after this app's. Returns nothing."""
    if callback not in _FOLLOWERS:
        _FOLLOWERS.append(callback)
    callback(sources())


def _changed():
    for callback in _FOLLOWERS:
        callback(sources())


def sources():
    """The registered sources, ``{name: Source}``, in registration order."""
    return dict(_SOURCES)


def source_for_model(model):
    """The sources registered for ``model`` (a class): a list, usually of one."""
    label = model._meta.label_lower
    # A migration's historical model has the label but not the site's methods: not followed
    # (``rebuild_knowledge`` indexes what a data migration wrote).
    return [s for s in _SOURCES.values() if s.model.lower() == label and s.model_class() is model]
