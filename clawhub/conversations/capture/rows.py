"""Bulk writes of capture's rows, cheaper than Django's bulk_create/bulk_update on PostgreSQL (COPY, and one
UPDATE … FROM json_to_recordset), and model instances made without ``Model.__init__``."""

from collections.abc import Iterable
from datetime import datetime
from functools import lru_cache

import orjson
from django.db import connection
from django.db.models import JSONField
from django.db.models.base import ModelState


def update_rows(model, objs: list, fields: list[str]) -> None:
    """What ``bulk_update(objs, fields)`` does, as one ``UPDATE … FROM json_to_recordset(…)`` statement.

    bulk_update builds a CASE WHEN expression per object and field; in the gateway's writer thread that cost
    more CPU than the rest of capture together (py-spy under bench_gateway). The rows travel as one JSON
    text (orjson, in C), not as a placeholder per value, which the driver would quote one by one in Python.
    Rows are updated in id order, the order their sessions were locked in.
    """
    if not objs:
        return
    if connection.vendor != "postgresql":
        # The casts below are PostgreSQL's; the embedded SQLite default takes Django's portable path.
        model.objects.bulk_update(sorted(objs, key=lambda o: o.pk), fields)
        return
    meta = model._meta
    columns = [meta.pk, *(meta.get_field(name) for name in fields)]
    quote = connection.ops.quote_name
    rows = [
        {column.column: _json_value(column, getattr(obj, column.attname)) for column in columns}
        for obj in sorted(objs, key=lambda o: o.pk)
    ]
    # json_to_recordset gives SQL NULL for a JSON null, in a jsonb column too (as the driver sends None).
    record = ", ".join(f"{quote(column.column)} {column.db_type(connection)}" for column in columns)
    assignments = ", ".join(f"{quote(c.column)} = v.{quote(c.column)}" for c in columns[1:])
    pk = quote(meta.pk.column)
    sql = (
        f"UPDATE {quote(meta.db_table)} AS t SET {assignments} "
        f"FROM json_to_recordset(%s::json) AS v ({record}) WHERE t.{pk} = v.{pk}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [json_text(rows)])


def _json_value(field, value):
    """A field's value as orjson writes it for PostgreSQL to read back: JSON fields as their JSON, plain
    values and datetimes (RFC 3339, with their offset) as they are, anything else prepared by the field."""
    if value is None or isinstance(field, JSONField) or type(value) in _JSON_PLAIN:
        return value
    if isinstance(value, datetime):
        return value
    return field.get_db_prep_save(value, connection)


_JSON_PLAIN = (str, int, float, bool)


def json_text(value) -> str:
    """``value`` as one JSON text, for a ``%s::json`` parameter."""
    return orjson.dumps(value).decode()


def int_array(values: Iterable[int]) -> str:
    """A PostgreSQL array literal of integers, for a ``%s::bigint[]`` parameter: one string the driver
    quotes in C, where it dumps a list element by element in Python (a batch's lookups hold thousands)."""
    return "{" + ",".join(map(str, map(int, values))) + "}"


_PLAIN = (str, int, float, bool, bytes)  # exact types the driver takes as they are


def insert_rows(model, objs: list) -> None:
    """What ``bulk_create(objs)`` does, as one ``COPY`` (ids drawn from the table's sequence first), and
    sets each object's primary key.

    bulk_create (and a multi-row INSERT alike) cost more CPU than the rest of storing a turn: a field's
    preparation per value, JSON dumped with the standard library, then the driver splitting a statement of
    thousands of placeholders and quoting each value in Python. COPY rows are formatted by the driver's C
    code; JSON goes through orjson (the records came through orjson, so it takes every value in them).
    """
    if not objs:
        return
    if connection.vendor != "postgresql":
        model.objects.bulk_create(objs)  # the embedded SQLite default: Django's portable path
        return
    meta = model._meta
    fields = [f for f in meta.concrete_fields if not f.primary_key]
    quote = connection.ops.quote_name
    json_fields = {f.attname for f in fields if isinstance(f, JSONField)}
    columns = ", ".join(quote(f.column) for f in [meta.pk, *fields])
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, %s)) FROM generate_series(1, %s)",
            [meta.db_table, meta.pk.column, len(objs)],
        )
        ids = [row[0] for row in cursor.fetchall()]
        # Django's wrapper turns the driver's errors into django.db ones (a DataError stays a DataError), as
        # for any query; the COPY itself goes through the driver's cursor, which Django does not wrap.
        with connection.wrap_database_errors:
            with cursor.cursor.copy(f"COPY {quote(meta.db_table)} ({columns}) FROM STDIN") as copy:
                for pk, obj in zip(ids, objs, strict=True):
                    values = obj.__dict__
                    row: list = [pk]
                    for f in fields:
                        value = values[f.attname]
                        if f.attname in json_fields:
                            value = None if value is None else orjson.dumps(value).decode()
                        elif isinstance(value, str):
                            value = str.__str__(value)  # a choices member as its plain value
                        elif not (value is None or type(value) in _PLAIN):
                            value = f.get_db_prep_save(value, connection)
                        row.append(value)
                    copy.write_row(row)
    for obj, pk in zip(objs, ids, strict=True):
        obj.pk = pk
        obj._state.adding = False
        obj._state.db = connection.alias


@lru_cache(maxsize=4)
def _defaults(model) -> tuple[dict, list]:
    """(attname -> default of every field with a constant default, the fields whose default is made anew)."""
    fields = model._meta.concrete_fields
    made = [f for f in fields if f.has_default() and callable(f.default)]
    return {f.attname: f.get_default() for f in fields if f not in made}, made


def blank(model):
    """An unsaved instance with every field at its default, without Model.__init__ (which costs more than
    all the fields set after it): every field is set, so none is deferred."""
    constant, made = _defaults(model)
    obj = model.__new__(model)
    obj._state = ModelState()
    obj.__dict__.update(constant)
    for field in made:
        obj.__dict__[field.attname] = field.get_default()
    return obj


def set_fields(obj, **values) -> None:
    for name, value in values.items():
        setattr(obj, name, value)
