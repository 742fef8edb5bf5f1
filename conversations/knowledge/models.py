"""The index of the site's knowledge: passages of the registered sources' objects, and the
objects whose indexing failed and waits for another try. Defined under the app's label, so
they live in its migrations (``0010_site_knowledge``)."""

from django.db import models
from django.utils.translation import gettext_lazy as _


class Passage(models.Model):
    """A piece of about a thousand characters of one object of a source, as it was when indexed.
    A search returns passages; who may read them is decided at search time from the object's
    current row, never from what was indexed."""

    source = models.CharField(_("source"), max_length=100)
    object_pk = models.CharField(_("object"), max_length=64)
    title = models.CharField(_("title"), max_length=300)
    url = models.CharField(_("URL"), max_length=500)
    text = models.TextField(_("text"))
    position = models.PositiveIntegerField(_("position"), default=0)
    updated = models.DateTimeField(_("indexed at"), auto_now=True)
    # Only with SEARCH_EMBEDDINGS: {"model", "text": the vector of its title and text, "title": its
    # title's}, from the embeddings endpoint when it was indexed (knowledge.embeddings).
    embedding = models.JSONField(_("embedding"), null=True, blank=True, editable=False)

    class Meta:
        app_label = "conversations"
        ordering = ["source", "object_pk", "position"]
        verbose_name = _("passage")
        verbose_name_plural = _("passages")
        indexes = [models.Index(fields=["source", "object_pk"], name="conv_passage_object")]

    def __str__(self):
        return f"{self.title} #{self.position}"


class _SourceObject(models.Model):
    """A row about one object of a registered source, named by the source and the object's key."""

    source = models.CharField(max_length=100)
    object_pk = models.CharField(max_length=64)

    class Meta:
        abstract = True

    def __str__(self):
        return f"{self.source}:{self.object_pk}"


class StaleObject(_SourceObject):
    """An object whose indexing failed after its save (logged then): ``knowledge_status`` lists
    it and ``rebuild_knowledge`` indexes it again."""

    reason = models.CharField(max_length=500, blank=True)
    marked_at = models.DateTimeField(auto_now=True)

    class Meta:
        app_label = "conversations"
        verbose_name = _("stale object")
        verbose_name_plural = _("stale objects")
        constraints = [models.UniqueConstraint(fields=["source", "object_pk"], name="conv_stale_object_unique")]


class IndexedObject(_SourceObject):
    """One object as it was indexed: a hash of what it gave the index (its title, URL and
    passages), so that ``knowledge_status`` finds what changed by comparing it with what the
    object would give now, whatever changed it (a save, a bulk ``update()``, ``loaddata``, a
    migration)."""

    digest = models.CharField(max_length=64)
    indexed_at = models.DateTimeField(auto_now=True)

    class Meta:
        app_label = "conversations"
        verbose_name = _("indexed object")
        verbose_name_plural = _("indexed objects")
        constraints = [models.UniqueConstraint(fields=["source", "object_pk"], name="conv_indexed_object_unique")]
