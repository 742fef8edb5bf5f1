"""The statements a running turn sends on its hot path, as raw SQL: its claim, each round trip's
fenced ``UPDATE`` and its ``INSERT``s (the new transcript row, the call records), the final
write, and the job's two reads (its turn with the rows it needs, its transcript; sent together by
the job); and the two
``INSERT``s of the POST that starts it (the turn, the visitor's message).

Why raw: a turn sends one transaction per model or tool round trip (the seed's durable save),
and Django's ORM spent far more CPU building and compiling each of those statements than the
database spent running it: the round trip's ``UPDATE`` of the turn cost 345 µs through a prebuilt
queryset against 25 µs sent as raw SQL (docs/benchmarks.md, turn overhead). The statements are
the same ones the ORM sent; only their text is built once per process and kept. Only what the
hot path needs is here: ``update`` takes plain values (no expressions) and no ``None`` in its
``where`` (``= NULL`` matches nothing; the ORM writes ``IS NULL``).

What stays the ORM's: every table and column name comes from the models' ``_meta``
(``db_table``, each field's ``column``), so a swapped table name or a ``db_column`` still works;
each value goes through its field's own ``pre_save`` (``auto_now_add``) and ``get_db_prep_save``
(a UUID on SQLite, a JSON column, an aware datetime, a decimal, as each backend wants them), and
each value read through the converters the ORM would apply; the connection is the one the
database router names for writing the model (for the two reads, for reading it, as the ORM's
reads), and the statements run on it inside the caller's transaction. An ``INSERT`` of a model
that has ``pre_save`` or ``post_save`` receivers (a site's own, the knowledge index of a registered model) is made by the ORM's ``save()``
instead, so that they still hear of it (an ``UPDATE`` of a queryset sends no signal either way).
Placeholders are ``%s`` and the SQL is portable (``RETURNING`` only where the backend says it can;
elsewhere the driver's last row id), so PostgreSQL, SQLite and MySQL/MariaDB run the same text;
on PostgreSQL the first of a step's statements may carry the step's ``SET LOCAL`` after it
(``dbconn.folded``).

A round trip's statements are built first (``update_statement``, ``insert_statement``,
``insert_statements``) and sent together by ``send()``: where the driver binds parameters on the
client (psycopg 3, Django's default for PostgreSQL; ``dbconn.binds_on_client``) as one string,
in one network round trip, each statement's result read in turn; elsewhere one after the other,
as before. They run in the caller's transaction either way, so a fence that fails (an ``UPDATE``
matching no row) still rolls every one of them back when the caller raises.
"""

from typing import Callable, NamedTuple

from django.db import connections, router
from django.db.models import Model, Q, signals

from ..infra import dbconn
from ..models import Conversation, Message, Turn
from ..owners import owned_by_sql

_SQL = {}  # (connection alias, kind, model, shape) -> the statement's text, built once
ACTIVE = sorted(Turn.ACTIVE_STATUSES)  # a turn's active statuses, in one order: one statement's text


def _connection(model):
    return connections[router.db_for_write(model)]


def _field(meta, name):
    return meta.pk if name == "pk" else meta.get_field(name)


class Statement(NamedTuple):
    """One statement to ``send()``: its text and parameters on ``connection``, and ``read(cursor)``,
    which reads its result (the cursor on it) and returns what ``send()`` gives back for it. A
    ``Statement`` with no ``sql`` is an ORM save made in its place (``read()`` makes it, no cursor)."""

    connection: object
    sql: str | None
    params: list
    read: Callable


def send(*statements):
    """Send ``statements`` (``Statement``) in order, in the caller's transaction; returns what each
    one's ``read`` gave (an ``UPDATE``: how many rows it matched; an ``INSERT``: its instances, their
    primary keys set; a read: its instance or instances). Consecutive statements on one connection whose driver binds on the client go
    as one string (one round trip), the step's ``SET LOCAL`` after them (``dbconn.folded``)."""
    results, batch = [], []

    def flush():
        if not batch:
            return
        connection = batch[0].connection
        with connection.cursor() as cursor:
            cursor.execute(dbconn.folded(connection, "; ".join(b.sql for b in batch)),
                           [param for b in batch for param in b.params])
            for index, statement in enumerate(batch):
                if index:
                    cursor.nextset()
                results.append(statement.read(cursor))
        batch.clear()

    for statement in statements:
        if statement.sql is None:
            flush()
            results.append(statement.read(None))
        elif batch and _same_string(batch[0], statement):
            batch.append(statement)
        else:
            flush()
            batch.append(statement)
    flush()
    return results


def _same_string(first, statement):
    """Whether ``send()`` sends ``statement`` in the same string as ``first``: both SQL, on one
    connection whose driver binds on the client."""
    return first.sql is not None and statement.sql is not None and statement.connection is first.connection \
        and dbconn.binds_on_client(first.connection)


def one_string(statements):
    """Whether ``send()`` sends all of ``statements`` as one string."""
    return all(_same_string(statements[0], statement) for statement in statements)


# PostgreSQL's SQLSTATE for a division by zero: how ``or_fail``'s statement fails.
_FENCE_FAILED = "22012"


def _first_value(cursor):
    return cursor.fetchone()[0]


def or_fail(statement):
    """``statement``, an ``UPDATE`` of one row (``update_statement``), made to fail when it matches
    none, so that the statements sent with it as one string (``dbconn.one_string_transaction``) roll
    back with it (``failed_fence`` tells that failure); its result is 1. PostgreSQL only: the
    ``UPDATE`` runs inside a ``WITH``, whose rows are then counted and divided into one."""
    return statement._replace(sql=f"WITH fenced AS ({statement.sql} RETURNING 1) SELECT 1 / COUNT(*) FROM fenced",
                              read=_first_value)


def failed_fence(error):
    """Whether the database ``error`` a string of statements raised is ``or_fail``'s: its ``UPDATE``
    matched no row, and nothing of the string was written."""
    return getattr(error.__cause__, "sqlstate", None) == _FENCE_FAILED


def update(model, values, **where):
    """``UPDATE`` the rows of ``model`` matching ``where`` with ``values`` (field name -> value);
    returns how many rows matched. ``where``: ``name=value`` or ``name__in=[values]`` (``pk`` names
    the primary key), joined by AND, as ``QuerySet.filter(**where).update(**values)`` would (no
    signal is sent by either)."""
    return send(update_statement(model, values, **where))[0]


def _rowcount(cursor):
    return cursor.rowcount


def update_statement(model, values, **where):
    """``update()``'s statement, to ``send()`` with others."""
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
    params = [_prep_save(_field(meta, name), value, connection) for name, value in values.items()]
    for name, value in where.items():
        if name.endswith("__in"):
            field = _field(meta, name[:-4])
            params += [field.get_db_prep_value(v, connection) for v in value]
        else:
            params.append(_field(meta, name).get_db_prep_value(value, connection))
    return Statement(connection, sql, params, _rowcount)


def _prep_save(field, value, connection):
    # A foreign key may be given its row, as QuerySet.update takes it: the row's key is stored.
    if field.is_relation and isinstance(value, Model):
        value = getattr(value, field.target_field.attname)
    return field.get_db_prep_save(value, connection)


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
    return send(insert_statement(obj))[0]


def insert_statement(obj):
    """``insert()``'s statement, to ``send()`` with others (its result: ``obj``, saved)."""
    model = type(obj)
    connection = _connection(model)
    if _hears_saves(model):
        return Statement(connection, None, [], lambda _cursor: _orm_saved(obj))
    sql, fields, returns, numbered = _insert_sql(connection, model, 1)

    def read(cursor):
        if returns:
            obj.pk = cursor.fetchone()[0]
        elif numbered:
            obj.pk = connection.ops.last_insert_id(cursor, model._meta.db_table, model._meta.pk.column)
        _saved(obj, connection)
        return obj

    return Statement(connection, sql, _values(obj, fields, connection), read)


def _orm_saved(obj):
    obj.save(force_insert=True)
    return obj


def insert_many(objs):
    """Save the new instances ``objs`` (of one model) with one ``INSERT``, as ``bulk_create`` does
    (no signal sent; primary keys set where the backend returns them)."""
    send(*insert_statements(objs))


def insert_statements(objs):
    """``insert_many()``'s statements (none for no ``objs``), to ``send()`` with others."""
    if not objs:
        return []
    model = type(objs[0])
    connection = _connection(model)
    fields = _insert_fields(model._meta)
    # As bulk_create: in batches the backend's limit on a statement's parameters allows.
    size = max(1, connection.ops.bulk_batch_size(fields, objs))
    found = []
    for start in range(0, len(objs), size):
        batch = objs[start:start + size]
        sql, fields, returns, _numbered = _insert_sql(connection, model, len(batch))
        params = []
        for obj in batch:
            params += _values(obj, fields, connection)

        def read(cursor, batch=batch, returns=returns):
            if returns:
                for obj, (pk,) in zip(batch, cursor.fetchall()):
                    obj.pk = pk
            for obj in batch:
                _saved(obj, connection)
            return batch

        found.append(Statement(connection, sql, params, read))
    return found


# -- the POST's count of the turns a new one is admitted on --------------------------------


def turn_counts(conversation_id, *, here=False, owner=None, owners_active=False, since=None):
    """What ``limits.TurnCounts`` reads, in one raw statement built once per shape:
    ``(here_active, here, owners_active, tokens_today)``, as ``Turn.objects.filter(read).aggregate()``
    counted them: the turns of conversation ``conversation_id`` queued or running, all of them
    (``here``), the owner's queued or running (``owners_active``) and the tokens of the owner's
    turns enqueued since ``since`` (not None); what was not asked for is 0. ``owner``: the
    ``(user_id, token)`` the owner is known by (``owners.owned_by_sql``), or None; the owner's turns
    are read only when it is given and a count of them is asked for, and then only those that can
    count (this conversation's, the active ones, today's). The ORM spent about 3 ms of CPU
    building this one aggregate for each POST, the database 15–50 µs running it (docs/benchmarks.md)."""
    connection = connections[router.db_for_read(Turn)]
    turn, conversation = Turn._meta, Conversation._meta
    quote = connection.ops.quote_name
    t, c = quote("T0"), quote("T1")

    def column(alias, meta, name):
        return f"{alias}.{quote(_field(meta, name).column)}"

    owned = None
    if owner is not None and (owners_active or since is not None):
        user_id, token = owner
        owned = owned_by_sql(conversation.get_field("user").target_field.get_db_prep_value(user_id, connection),
                             conversation.get_field("owner_token").get_db_prep_value(token, connection),
                             column(c, conversation, "user"), column(c, conversation, "owner_token"))
    owner_sql, owner_params = owned or (None, [])
    key = (connection.alias, "turn counts", here, owners_active, since is not None, owner_sql)
    sql = _SQL.get(key)
    if sql is None:
        this = f"{column(t, turn, 'conversation')} = %s"
        active = f"{column(t, turn, 'status')} IN ({', '.join(['%s'] * len(ACTIVE))})"
        today = f"{column(t, turn, 'enqueued_at')} >= %s"
        counted = [f"COUNT(CASE WHEN {this} AND {active} THEN 1 END)"]
        if here:
            counted.append(f"COUNT(CASE WHEN {this} THEN 1 END)")
        if owners_active:
            counted.append(f"COUNT(CASE WHEN {active} THEN 1 END)")
        if since is not None:
            counted.append(" + ".join(f"COALESCE(SUM(CASE WHEN {today} THEN {column(t, turn, name)} END), 0)"
                                      for name in ("input_tokens", "output_tokens")))
        where, join = this, ""
        if owner_sql is not None:
            read = [this] + ([active] if owners_active else []) + ([today] if since is not None else [])
            where = f"{owner_sql} AND ({' OR '.join(read)})"
            join = (f" INNER JOIN {quote(conversation.db_table)} {c} ON {column(t, turn, 'conversation')} = "
                    f"{c}.{quote(conversation.pk.column)}")
        sql = _SQL[key] = f"SELECT {', '.join(counted)} FROM {quote(turn.db_table)} {t}{join} WHERE {where}"
    pk = conversation.pk.get_db_prep_value(conversation.pk.to_python(conversation_id), connection)
    day = None if since is None else turn.get_field("enqueued_at").get_db_prep_value(since, connection)
    params = [pk, *ACTIVE] + ([pk] if here else []) + (list(ACTIVE) if owners_active else []) + (
        [day, day] if since is not None else [])
    if owner_sql is not None:
        params += owner_params + [pk] + (list(ACTIVE) if owners_active else []) + ([day] if since is not None else [])
    else:
        params.append(pk)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        values = iter(cursor.fetchone())
    here_active = next(values)
    return (here_active, next(values) if here else 0, next(values) if owners_active else 0,
            int(next(values)) if since is not None else 0)


def first_statement(queryset):
    """The first row of ``queryset`` (its instance, or None), as a statement to ``send()`` with
    others: the ORM's own SQL for it, and its values through the ORM's own converters."""
    connection = connections[queryset.db]
    names = [field.attname for field in queryset.model._meta.concrete_fields]
    compiler = queryset.values_list(*names).query.get_compiler(connection=connection)
    sql, params = compiler.as_sql()

    def read(cursor):
        found = cursor.fetchone()
        if found is None:
            return None
        return queryset.model.from_db(connection.alias, names, next(compiler.results_iter(results=[[found]])))

    return Statement(connection, sql, list(params), read)


# -- reads: a job's first two queries ------------------------------------------------------


def _reader(connection, model, alias):
    """``(columns, converters)`` to read ``model``'s row under the table alias ``alias``: its
    columns' SQL, and for each column that needs them, the converters the ORM would apply (a UUID
    or a JSON column on SQLite, a datetime, a boolean, a decimal)."""
    key = (connection.alias, "read", model, alias)
    found = _SQL.get(key)
    if found is None:
        quote = connection.ops.quote_name
        fields = model._meta.concrete_fields
        converters = []
        for index, field in enumerate(fields):
            column = field.get_col(alias)
            found_converters = connection.ops.get_db_converters(column) + column.get_db_converters(connection)
            if found_converters:
                converters.append((index, found_converters, column))
        columns = ", ".join(f"{quote(alias)}.{quote(field.column)}" for field in fields)
        found = _SQL[key] = (columns, converters)
    return found


def _row(model, connection, values, converters):
    """The instance of ``model`` the ORM would make of ``values`` (every concrete column, in order)."""
    for index, functions, column in converters:
        value = values[index]
        for function in functions:
            value = function(value, column, connection)
        values[index] = value
    return model.from_db(connection.alias, [f.attname for f in model._meta.concrete_fields], values)


def _plain(*models):
    # A model whose fields live in more than one table (multi-table inheritance) is read by the ORM.
    return not any(model._meta.parents for model in models)


def get(model, pk, related=()):
    """``model.objects.select_related(*related).get(pk=pk)`` as one raw statement, built once:
    ``related`` names foreign keys (``a`` or ``a__b``), each joined as ``select_related`` joins it
    and cached on its instance. Raises ``model.DoesNotExist``."""
    return send(get_statement(model, pk, related))[0]


def get_statement(model, pk, related=()):
    """``get()``'s statement, to ``send()`` with others (its result: the instance; reading it raises
    ``model.DoesNotExist``)."""
    connection = connections[router.db_for_read(model)]
    meta = model._meta
    chain = [(None, None, model)]  # (parent index, foreign key, model) for each table, in order
    for path in related:
        parent = 0
        for name in path.split("__"):
            field = chain[parent][2]._meta.get_field(name)
            found = next((i for i, (p, f, _m) in enumerate(chain) if p == parent and f is field), None)
            if found is None:
                chain.append((parent, field, field.related_model))
                found = len(chain) - 1
            parent = found
    if not _plain(*(m for _p, _f, m in chain)):
        return Statement(connection, None, [], lambda _cursor: model._default_manager.select_related(*related).get(pk=pk))
    key = (connection.alias, "get", model, tuple(related))
    sql = _SQL.get(key)
    if sql is None:
        quote = connection.ops.quote_name
        columns, joins, inner = [], [], {0}
        for index, (parent, field, table_model) in enumerate(chain):
            columns.append(_reader(connection, table_model, f"T{index}")[0])
            if field is not None:
                kind = "INNER" if parent in inner and not field.null else "LEFT OUTER"
                if kind == "INNER":
                    inner.add(index)
                joins.append(f" {kind} JOIN {quote(table_model._meta.db_table)} {quote(f'T{index}')} ON "
                             f"{quote(f'T{index}')}.{quote(field.target_field.column)} = "
                             f"{quote(f'T{parent}')}.{quote(field.column)}")
        sql = _SQL[key] = (f"SELECT {', '.join(columns)} FROM {quote(meta.db_table)} {quote('T0')}{''.join(joins)} "
                           f"WHERE {quote('T0')}.{quote(meta.pk.column)} = %s")

    def read(cursor):
        values = cursor.fetchone()
        if values is None:
            raise model.DoesNotExist(f"{meta.object_name} matching query does not exist.")
        instances, start = [], 0
        for index, (parent, field, table_model) in enumerate(chain):
            width = len(table_model._meta.concrete_fields)
            part = list(values[start:start + width])
            start += width
            pk_value = part[table_model._meta.concrete_fields.index(table_model._meta.pk)]
            instance = None if pk_value is None else _row(table_model, connection, part,
                                                           _reader(connection, table_model, f"T{index}")[1])
            instances.append(instance)
            if field is not None and instances[parent] is not None:
                field.set_cached_value(instances[parent], instance)
        return instances[0]

    return Statement(connection, sql, [meta.pk.get_db_prep_value(meta.pk.to_python(pk), connection)], read)


def transcript(conversation_id, turn_id):
    """The messages a turn's history is made of, in order, as ``runner.transcript`` asks for them:
    the conversation's rows of ``turn_id`` and of its turns that are not active (and the rows of
    no turn: a handoff's), as ``Message.objects.filter(Q(turn_id=turn_id) |
    ~Q(turn__status__in=Turn.ACTIVE_STATUSES), conversation_id=conversation_id).order_by("id")``."""
    return send(transcript_statement(turn_id, conversation_id))[0]


def transcript_statement(turn_id, conversation_id=None):
    """``transcript()``'s statement, to ``send()`` with others (its result: the list of messages).
    Without ``conversation_id``, the conversation is the turn's own, found by the statement: the
    job reads its turn and its transcript in one send, not knowing the conversation yet."""
    connection = connections[router.db_for_read(Message)]
    if not _plain(Message, Turn):
        def orm(_cursor):
            conversation = conversation_id if conversation_id is not None else \
                Turn.objects.values_list("conversation_id", flat=True).get(pk=turn_id)
            return list(Message.objects.filter(Q(turn_id=turn_id) | ~Q(turn__status__in=Turn.ACTIVE_STATUSES),
                                               conversation_id=conversation).order_by("id"))
        return Statement(connection, None, [], orm)
    known = conversation_id is not None
    key = (connection.alias, "transcript", known)
    sql = _SQL.get(key)
    message, turn = Message._meta, Turn._meta
    if sql is None:
        quote = connection.ops.quote_name
        m, t = quote("T0"), quote("T1")
        turn_column = quote(message.get_field("turn").column)
        status = f"{t}.{quote(turn.get_field('status').column)}"
        conversation = "%s" if known else (
            f"(SELECT {quote('T2')}.{quote(turn.get_field('conversation').column)} FROM {quote(turn.db_table)} "
            f"{quote('T2')} WHERE {quote('T2')}.{quote(turn.pk.column)} = %s)")
        sql = _SQL[key] = (
            f"SELECT {_reader(connection, Message, 'T0')[0]} FROM {quote(message.db_table)} {m} "
            f"LEFT OUTER JOIN {quote(turn.db_table)} {t} ON {m}.{turn_column} = {t}.{quote(turn.pk.column)} "
            f"WHERE ({m}.{turn_column} = %s OR NOT ({status} IN ({', '.join(['%s'] * len(ACTIVE))}) "
            f"AND {status} IS NOT NULL)) AND {m}.{quote(message.get_field('conversation').column)} = {conversation} "
            f"ORDER BY {m}.{quote(message.pk.column)} ASC")
    turn_value = turn.pk.get_db_prep_value(turn.pk.to_python(turn_id), connection)
    params = [turn_value, *ACTIVE,
              Conversation._meta.pk.get_db_prep_value(conversation_id, connection) if known else turn_value]
    converters = _reader(connection, Message, "T0")[1]

    def read(cursor):
        return [_row(Message, connection, list(values), converters) for values in cursor.fetchall()]

    return Statement(connection, sql, params, read)
