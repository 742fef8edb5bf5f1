"""The statements a running turn sends on its hot path, as raw SQL: its claim, each round trip's
fenced ``UPDATE`` and its ``INSERT``s (the new transcript row, the call records), and the final
write.

Why raw: a turn sends one transaction per model or tool round trip (the seed's durable save),
and Django's ORM spent far more CPU building and compiling each of those statements than the
database spent running it: the round trip's ``UPDATE`` of the turn cost 345 µs through a prebuilt
queryset against 25 µs sent as raw SQL (docs/benchmarks.md, turn overhead). The statements are
the same ones the ORM sent; only their text is built once per process and kept.

What stays the ORM's: every table and column name comes from the models' ``_meta``
(``db_table``, each field's ``column``), so a swapped table name or a ``db_column`` still works;
each value goes through its field's own ``pre_save`` (``auto_now_add``) and ``get_db_prep_save``
(a UUID on SQLite, a JSON column, an aware datetime, a decimal, as each backend wants them); the
connection is the one the database router names for writing the model, and the statements run on
it inside the caller's transaction. An ``INSERT`` of a model that has ``pre_save`` or ``post_save``
receivers (a site's own, the knowledge index of a registered model) is made by the ORM's ``save()``
instead, so that they still hear of it (an ``UPDATE`` of a queryset sends no signal either way).
Placeholders are ``%s`` and the SQL is portable (``RETURNING`` only where the backend says it can;
elsewhere the driver's last row id), so PostgreSQL, SQLite and MySQL/MariaDB run the same text.
"""

from django.db import connections, router
from django.db.models import signals

_SQL = {}  # (connection alias, kind, model, shape) -> the statement's text, built once


def _connection(model):
    return connections[router.db_for_write(model)]


def _field(meta, name):
    return meta.pk if name == "pk" else meta.get_field(name)


def update(model, values, **where):
    """``UPDATE`` the rows of ``model`` matching ``where`` with ``values`` (field name -> value);
    returns how many rows matched. ``where``: ``name=value`` or ``name__in=[values]`` (``pk`` names
    the primary key), joined by AND, as ``QuerySet.filter(**where).update(**values)`` would (no
    signal is sent by either)."""
    connection = _connection(model)
    meta = model._meta
    names = tuple(values)
    shape = (names, tuple((key, len(value) if key.endswith("__in") else None) for key, value in where.items()))
    key = (connection.alias, "update", model, shape)
    sql = _SQL.get(key)
    if sql is None:
        quote = connection.ops.quote_name
        assignments = ", ".join(f"{quote(_field(meta, name).column)} = %s" for name in names)
        conditions = []
        for name, size in shape[1]:
            if size is None:
                conditions.append(f"{quote(_field(meta, name).column)} = %s")
            else:
                column = quote(_field(meta, name[:-4]).column)
                conditions.append(f"{column} IN ({', '.join(['%s'] * size)})" if size else "1 = 0")
        sql = _SQL[key] = f"UPDATE {quote(meta.db_table)} SET {assignments} WHERE {' AND '.join(conditions)}"
    params = [_field(meta, name).get_db_prep_save(value, connection) for name, value in values.items()]
    for name, value in where.items():
        if name.endswith("__in"):
            field = _field(meta, name[:-4])
            params += [field.get_db_prep_value(v, connection) for v in value]
        else:
            params.append(_field(meta, name).get_db_prep_value(value, connection))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def _hears_saves(model):
    return signals.pre_save.has_listeners(model) or signals.post_save.has_listeners(model)


def _insert_fields(meta):
    """The concrete fields an ``INSERT`` names: all but a primary key the database numbers."""
    return [f for f in meta.concrete_fields if not (f.primary_key and getattr(f, "db_returning", False))]


def _insert_sql(connection, model, rows):
    """The ``INSERT`` of ``rows`` rows of ``model``, and whether it returns their primary keys."""
    key = (connection.alias, "insert", model, rows)
    found = _SQL.get(key)
    if found is None:
        meta = model._meta
        quote = connection.ops.quote_name
        fields = _insert_fields(meta)
        row = f"({', '.join(['%s'] * len(fields))})"
        sql = (f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "
               f"VALUES {', '.join([row] * rows)}")
        numbered = meta.pk in meta.db_returning_fields
        returns = numbered and (connection.features.can_return_columns_from_insert if rows == 1
                                else connection.features.can_return_rows_from_bulk_insert)
        if returns:
            sql += f" RETURNING {quote(meta.pk.column)}"
        found = _SQL[key] = (sql, fields, returns, numbered)
    return found


def _values(obj, fields, connection):
    # As the ORM's INSERT: each field's pre_save (auto_now_add sets the attribute), then its prep.
    return [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields]


def _saved(obj, connection):
    obj._state.adding = False
    obj._state.db = connection.alias


def insert(obj):
    """Save the new instance ``obj`` with one ``INSERT`` (its primary key set from the database);
    returns ``obj``. A model with save receivers is saved by ``obj.save()`` instead."""
    model = type(obj)
    if _hears_saves(model):
        obj.save(force_insert=True)
        return obj
    connection = _connection(model)
    sql, fields, returns, numbered = _insert_sql(connection, model, 1)
    with connection.cursor() as cursor:
        cursor.execute(sql, _values(obj, fields, connection))
        if returns:
            obj.pk = cursor.fetchone()[0]
        elif numbered:
            obj.pk = connection.ops.last_insert_id(cursor, model._meta.db_table, model._meta.pk.column)
    _saved(obj, connection)
    return obj


def insert_many(objs):
    """Save the new instances ``objs`` (of one model) with one ``INSERT``, as ``bulk_create`` does
    (no signal sent; primary keys set where the backend returns them)."""
    if not objs:
        return
    model = type(objs[0])
    connection = _connection(model)
    fields = _insert_fields(model._meta)
    # As bulk_create: in batches the backend's limit on a statement's parameters allows.
    size = max(1, connection.ops.bulk_batch_size(fields, objs))
    for start in range(0, len(objs), size):
        batch = objs[start:start + size]
        sql, fields, returns, _numbered = _insert_sql(connection, model, len(batch))
        params = []
        for obj in batch:
            params += _values(obj, fields, connection)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            if returns:
                for obj, (pk,) in zip(batch, cursor.fetchall()):
                    obj.pk = pk
        for obj in batch:
            _saved(obj, connection)
