"""Keeping the index in step with the site: an object is split into passages when it is saved
and its passages removed when it is deleted or unpublished, after the transaction commits. A
failure to index is logged and marked (``StaleObject``), never raised into the site's save;
``rebuild`` and ``status`` are the management commands' work."""

import hashlib
import json
import logging

from django.db import Error, connections, router, transaction
from django.db.models import Max
from django.db.models.signals import post_delete, post_save

from . import embeddings
from .counts import index_changed
from .models import IndexedObject, Passage, StaleObject
from .registry import follow, source_for_model, sources
from .text import html_to_text, normalize, split_passages

logger = logging.getLogger("conversations.knowledge")

TITLE_CHARS = Passage._meta.get_field("title").max_length
URL_CHARS = Passage._meta.get_field("url").max_length


def passages_of(source, obj):
    """The unsaved ``Passage`` rows of ``obj`` under ``source`` (none for an unpublished object)."""
    body = source.read(obj, "body")
    text = html_to_text(body) if source.html else normalize(body)
    title = normalize(source.read(obj, "title"))[:TITLE_CHARS]
    url = source.read(obj, "url")[:URL_CHARS]
    return [Passage(source=source.name, object_pk=str(obj.pk), title=title, url=url, text=piece, position=number)
            for number, piece in enumerate(split_passages(text))]


def digest(rows):
    """The hash of what an object gives the index (its passages' title, URL and texts, in order)."""
    content = json.dumps([[row.title, row.url, row.text] for row in rows], ensure_ascii=False)
    return hashlib.sha256(content.encode()).hexdigest()


def lock_object(using, source_name, pk):
    """Hold object ``pk`` of ``source_name`` until the transaction on ``using`` ends (PostgreSQL: an
    advisory lock), so that two refreshes of one object replace its passages one after the other:
    each deletes only the passages it sees, and without it both deleted before either inserted,
    leaving two copies. SQLite writes one transaction at a time already."""
    connection = connections[using]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s), hashtext(%s))", [source_name, str(pk)])


def with_vectors(source, obj, rows):
    """With ``SEARCH_EMBEDDINGS``, give ``rows`` their vectors from the endpoint (one request per
    object); returns why it could not (the rows are then kept without: found by their words
    alone), or "". Off: nothing, and no request."""
    if not rows or embeddings.options() is None:
        return ""
    try:
        vectors = embeddings.embed(embeddings.passage_texts(rows))
    except embeddings.EmbeddingsUnavailable as exc:
        logger.warning("Could not embed %s:%s, indexed without vectors (rebuild_knowledge tries again): %s",
                       source.name, obj.pk, exc)
        return f"embeddings: {exc}"
    for row, kept in zip(rows, embeddings.stored(vectors, embeddings.model_name())):
        row.embedding = kept
    return ""


def index_object(source, obj):
    """Replace the passages of ``obj`` with its current ones (none if it is not published); returns
    how many it has now. One transaction: a search sees the old passages or the new, never none.
    Passages that could not get their vectors (``with_vectors``) mark the object stale."""
    model = type(obj)
    published = model._default_manager.filter(source.published_filter(), pk=obj.pk).exists()
    rows = passages_of(source, obj) if published else []
    unembedded = with_vectors(source, obj, rows)
    using = router.db_for_write(Passage)
    with transaction.atomic(using=using):
        lock_object(using, source.name, obj.pk)
        Passage.objects.filter(source=source.name, object_pk=str(obj.pk)).delete()
        Passage.objects.bulk_create(rows)
        StaleObject.objects.filter(source=source.name, object_pk=str(obj.pk)).delete()
        if published:
            IndexedObject.objects.update_or_create(source=source.name, object_pk=str(obj.pk),
                                                   defaults={"digest": digest(rows)})
        else:
            IndexedObject.objects.filter(source=source.name, object_pk=str(obj.pk)).delete()
        transaction.on_commit(index_changed, using=using)
    if unembedded:
        mark_stale(source.name, obj.pk, unembedded)
    return len(rows)


def remove_object(source_name, pk):
    """Drop the passages of object ``pk`` of ``source_name``."""
    using = router.db_for_write(Passage)
    with transaction.atomic(using=using):
        lock_object(using, source_name, pk)
        Passage.objects.filter(source=source_name, object_pk=str(pk)).delete()
        StaleObject.objects.filter(source=source_name, object_pk=str(pk)).delete()
        IndexedObject.objects.filter(source=source_name, object_pk=str(pk)).delete()
        transaction.on_commit(index_changed, using=using)


def mark_stale(source_name, pk, reason):
    """Note that object ``pk`` could not be indexed (``reason``), for the next rebuild; logs when
    even that cannot be written (``Error``: a closed connection's ``InterfaceError`` is no
    ``DatabaseError``, and it must not reach the site's request either)."""
    try:
        StaleObject.objects.update_or_create(source=source_name, object_pk=str(pk),
                                             defaults={"reason": str(reason)[:500]})
    except Error:
        logger.exception("Could not mark %s:%s as stale", source_name, pk)


def refresh(source, model, pk):
    """Index object ``pk`` of ``model`` as it is now (removed if it is gone); never raises."""
    try:
        obj = model._default_manager.filter(pk=pk).first()
        if obj is None:
            remove_object(source.name, pk)
        else:
            index_object(source, obj)
    except Exception as exc:  # noqa: BLE001 - any failure of the site's callables or the database
        logger.exception("Could not index %s:%s; marked stale for rebuild_knowledge", source.name, pk)
        mark_stale(source.name, pk, f"{type(exc).__name__}: {exc}")


def on_save(sender, instance, raw=False, using=None, **kwargs):
    """post_save: index the object once its transaction commits (a rolled-back save indexes nothing)."""
    if raw:  # loaddata: the fixture's rows may refer to others not loaded yet; rebuild_knowledge indexes them
        return
    for source in source_for_model(sender):
        transaction.on_commit(lambda source=source, pk=instance.pk: refresh(source, sender, pk), using=using)


def on_delete(sender, instance, using=None, **kwargs):
    """post_delete: drop the object's passages once its transaction commits."""
    for source in source_for_model(sender):
        pk = instance.pk

        def drop(source=source, pk=pk):
            try:
                remove_object(source.name, pk)
            except Error as exc:
                logger.exception("Could not remove %s:%s from the index", source.name, pk)
                mark_stale(source.name, pk, f"{type(exc).__name__}: {exc}")
        transaction.on_commit(drop, using=using)


_FOLLOWED = {}  # label_lower -> the model class the receivers are connected to


def follow_models(registered):
    """Connect the receivers to the models of the ``registered`` sources and disconnect them from
    models no source names any more. Only those: a receiver of every model's deletes would cost
    every ``QuerySet.delete()`` of the site (sessions, purges, the index's own passages) its fast
    delete, a row loaded and a signal sent per deleted row."""
    wanted = {}
    for source in registered.values():
        model = source.model_class()
        if model is not None:  # a missing model is conversations.E050
            wanted[model._meta.label_lower] = model
    for label, model in list(_FOLLOWED.items()):
        if wanted.get(label) is not model:
            post_save.disconnect(sender=model, dispatch_uid="conversations_knowledge_save")
            post_delete.disconnect(sender=model, dispatch_uid="conversations_knowledge_delete")
            del _FOLLOWED[label]
    for label, model in wanted.items():
        if label not in _FOLLOWED:
            post_save.connect(on_save, sender=model, dispatch_uid="conversations_knowledge_save")
            post_delete.connect(on_delete, sender=model, dispatch_uid="conversations_knowledge_delete")
            _FOLLOWED[label] = model


def connect():
    """Follow the sources' models (``apps.ready``), now and as sources are registered later by apps
    whose ``ready()`` runs after this one's."""
    follow(follow_models)


def rebuild(name=None):
    """Index every object of source ``name`` (all sources for None) again, and drop passages of
    objects gone or unpublished and, for None, of sources no longer registered. Returns
    ``{source: passages}``; a name that is not registered is only dropped."""
    registered = sources()
    chosen = [registered[name]] if name in registered else ([] if name else list(registered.values()))
    counts = {}
    for source in chosen:
        model = source.model_class()
        if model is None:  # the check reports it; its passages are stale by definition
            Passage.objects.filter(source=source.name).delete()
            IndexedObject.objects.filter(source=source.name).delete()
            counts[source.name] = 0
            continue
        total, seen = 0, set()
        for obj in model._default_manager.filter(source.published_filter()).order_by("pk").iterator(chunk_size=500):
            total += index_object(source, obj)
            seen.add(str(obj.pk))
        indexed = indexed_pks(source.name)
        for pk in indexed - seen:
            remove_object(source.name, pk)
        StaleObject.objects.filter(source=source.name).exclude(object_pk__in=seen).delete()
        counts[source.name] = total
    if name is None or name not in registered:
        gone = Passage.objects.exclude(source__in=list(registered)) if name is None else Passage.objects.filter(
            source=name)
        objects = (IndexedObject.objects.exclude(source__in=list(registered)) if name is None
                   else IndexedObject.objects.filter(source=name))
        dropped = set(gone.values_list("source", flat=True).distinct())
        gone.delete()
        objects.delete()
        StaleObject.objects.filter(source__in=dropped | ({name} if name else set())).delete()
        counts.update({each: 0 for each in dropped})
    index_changed()
    return counts


def indexed_pks(name):
    """The pks (strings) of the objects of source ``name`` that the index holds anything of."""
    return (set(IndexedObject.objects.filter(source=name).values_list("object_pk", flat=True))
            | set(Passage.objects.filter(source=name).values_list("object_pk", flat=True).distinct()))


def changed_pks(source, published, digests):
    """The pks of the ``published`` objects of ``source`` indexed (``digests``: pk → hash) with
    other content than they would give the index now: changed by a bulk ``update()``, ``loaddata``
    or a migration, which send no signal, or indexed before hashes were kept (no hash)."""
    changed = []
    for obj in published.order_by("pk").iterator(chunk_size=500):
        pk = str(obj.pk)
        if pk in digests and digests[pk] != digest(passages_of(source, obj)):
            changed.append(pk)
    return changed


def status():
    """What is out of date, per source: ``[{"name", "model", "registered", "objects", "indexed",
    "passages", "last_update", "missing", "changed", "orphans", "stale", "unembedded"}]``, sources with
    passages but no registration included (``registered`` False: a rebuild drops them). An object
    is found changed by its content (``IndexedObject.digest``), whatever changed it."""
    rows = []
    registered = sources()
    for source in registered.values():
        model = source.model_class()
        passages = Passage.objects.filter(source=source.name)
        kept = IndexedObject.objects.filter(source=source.name)
        digests = dict(kept.values_list("object_pk", "digest"))
        digests.update({pk: "" for pk in set(passages.values_list("object_pk", flat=True)) - set(digests)})
        row = {"name": source.name, "model": source.model, "registered": True, "passages": passages.count(),
               "indexed": len(digests), "last_update": kept.aggregate(at=Max("indexed_at"))["at"],
               "stale": sorted(StaleObject.objects.filter(source=source.name).values_list("object_pk", flat=True)),
               "unembedded": unembedded(passages)}
        if model is None:
            row.update(objects=None, missing=[], changed=[], orphans=sorted(digests))
        else:
            published = model._default_manager.filter(source.published_filter())
            pks = {str(pk) for pk in published.values_list("pk", flat=True)}
            row.update(objects=len(pks), missing=sorted(pks - set(digests)),
                       changed=changed_pks(source, published, digests), orphans=sorted(set(digests) - pks))
        rows.append(row)
    for name in Passage.objects.exclude(source__in=list(registered)).values_list("source", flat=True).distinct():
        passages = Passage.objects.filter(source=name)
        rows.append({"name": name, "model": "", "registered": False, "objects": None, "passages": passages.count(),
                     "indexed": passages.values("object_pk").distinct().count(),
                     "last_update": passages.aggregate(at=Max("updated"))["at"], "missing": [], "changed": [],
                     "orphans": [], "stale": [], "unembedded": []})
    return rows


def unembedded(passages):
    """With ``SEARCH_EMBEDDINGS``, the objects (pks, sorted) some of whose ``passages`` have no vector
    of its model (indexed before the option, or while the endpoint was down): their searches fall
    back to the words. Off: none."""
    if embeddings.options() is None:
        return []
    embedded = passages.filter(embedding__model=embeddings.model_name()).values("pk")
    return sorted(set(passages.exclude(pk__in=embedded).values_list("object_pk", flat=True)))


def never_built(source):
    """Whether ``source`` has published objects and the index holds nothing of it: registered
    after its rows existed (an existing table, ``loaddata``, a data migration, ``bulk_create``),
    which no save has indexed."""
    model = source.model_class()
    if model is None or IndexedObject.objects.filter(source=source.name).exists() or Passage.objects.filter(
            source=source.name).exists():
        return False
    return model._default_manager.filter(source.published_filter()).exists()


def out_of_date(row):
    """Whether a ``status()`` row needs a rebuild."""
    return not row["registered"] or bool(row["missing"] or row["changed"] or row["orphans"] or row["stale"]
                                         or row["unembedded"])
