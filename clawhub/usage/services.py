"""Writes for usage metering: add a batch of served requests to the daily rows.

Called by capture for every record, side turns and failed requests included, in capture's transaction. The
batch is summed in Python first, then each (day, key, model) row is incremented in the database, never
read-modify-written in Python, so concurrent writers (one per gateway process) never lose an increment.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime

from django.db import IntegrityError, connection, transaction
from django.db.models import F

from clawhub.conversations.capture.records import TurnRecord
from clawhub.usage.models import SUMMED, UsageDaily


@dataclass
class _Row:
    day: date
    key_id: int
    model: str
    user_id: int
    group_id: int | None
    tenant_id: int
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms_sum: float = 0.0
    ttft_ms_sum: float = 0.0
    streams: int = 0


def usage_record(*, records: Iterable[TurnRecord]) -> None:
    """Adds the records' requests, errors, tokens and latencies to their (day, key, model) rows."""
    rows = _aggregate(records)
    if not rows:
        return
    if connection.vendor in ("postgresql", "sqlite"):
        _upsert(rows)
    else:
        _increment_portably(rows)


def _aggregate(records: Iterable[TurnRecord]) -> list[_Row]:
    rows: dict[tuple[date, int, str], _Row] = {}
    for r in records:
        day = datetime.fromtimestamp(r.started_at, tz=UTC).date()
        row = rows.get((day, r.key_id, r.model))
        if row is None:
            row = rows[(day, r.key_id, r.model)] = _Row(
                day=day,
                key_id=r.key_id,
                model=r.model,
                user_id=r.user_id,
                group_id=r.group_id,
                tenant_id=r.tenant_id,
            )
        row.requests += 1
        row.errors += int(r.status == "failed" or r.http_status >= 400)
        row.prompt_tokens += max(int(r.prompt_tokens or 0), 0)
        row.completion_tokens += max(int(r.completion_tokens or 0), 0)
        row.latency_ms_sum += max(float(r.latency_ms or 0), 0.0)
        if r.stream:
            row.streams += 1
            row.ttft_ms_sum += max(float(r.ttft_ms or 0), 0.0)
    # One order for every writer, so that two batches touching the same rows wait instead of deadlocking.
    return [rows[k] for k in sorted(rows)]


def _upsert(rows: list[_Row]) -> None:
    """One INSERT … ON CONFLICT DO UPDATE SET x = x + EXCLUDED.x for the whole batch (PostgreSQL and SQLite
    both speak it; only the way to name the existing row differs)."""
    meta = UsageDaily._meta
    qn = connection.ops.quote_name
    table = qn(meta.db_table)
    columns = ["day", "key_id", "model", "user_id", "group_id", "tenant_id", *SUMMED]
    # PostgreSQL calls a bare column in SET ambiguous (EXCLUDED has it too); SQLite wants it bare.
    existing = f"{table}." if connection.vendor == "postgresql" else ""
    # Concrete fields, each with a column (get_field is typed for relations and generic keys too).
    conflict = ", ".join(qn(meta.get_field(name).column)  # type: ignore[union-attr, arg-type]
                         for name in ("day", "key", "model"))
    updates = ", ".join(f"{qn(c)} = {existing}{qn(c)} + excluded.{qn(c)}" for c in SUMMED)
    values = ", ".join(["(" + ", ".join(["%s"] * len(columns)) + ")"] * len(rows))
    sql = (
        f"INSERT INTO {table} ({', '.join(qn(c) for c in columns)}) VALUES {values} "
        f"ON CONFLICT ({conflict}) DO UPDATE SET {updates}"
    )
    params = [getattr(row, c) for row in rows for c in columns]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def _increment_portably(rows: list[_Row]) -> None:
    """For databases without a shared upsert syntax: increment in place, or insert and on a lost race
    increment the row the other writer inserted."""
    for row in rows:
        increments = {name: F(name) + getattr(row, name) for name in SUMMED}
        where = {"day": row.day, "key_id": row.key_id, "model": row.model}
        if UsageDaily.objects.filter(**where).update(**increments):
            continue
        try:
            with transaction.atomic():
                UsageDaily.objects.create(
                    **where,
                    user_id=row.user_id,
                    group_id=row.group_id,
                    tenant_id=row.tenant_id,
                    **{n: getattr(row, n) for n in SUMMED},
                )
        except IntegrityError:
            UsageDaily.objects.filter(**where).update(**increments)
