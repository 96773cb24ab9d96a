"""Persists the gateway's TurnRecords: sessions, turns, next-state links and usage, a batch at a time.

The capture consumer (``capture.consumer``) calls ``capture_store(batch)``. A batch is one transaction of a
fixed number of queries, whatever its size. If the batch fails, each record is retried alone, so one bad
record costs only itself: the others are committed and ``CaptureFailed`` names the ones that failed, so that
the consumer retries them and, in the end, dead-letters them (never a silent skip). Records already stored
(a batch delivered twice) are skipped, turns and usage alike.

Per batch, in order: skip known request ids, and the records of users who turned storage off; find or create
the sessions the client named (``capture.items``); infer the others from the messages
(``conversations.identity``, ``capture.linking``); lock every existing session touched, in id order, so that
concurrent writers number turns and link next states one after the other (``capture.graph``); create turns;
link each session's waiting main turn to the new main turn's user or tool messages; close sessions the client
said are done; add usage; hand linked and closed turns to judging after commit.
"""

import logging
import threading
from collections.abc import Callable, Iterable, Sequence

from django.db import connection, transaction
from django.utils import timezone

from clawhub.conversations.capture.graph import Graph
from clawhub.conversations.capture.items import item_of, resolve_explicit_sessions
from clawhub.conversations.capture.linking import infer_sessions, write_turns
from clawhub.conversations.capture.records import TurnRecord
from clawhub.conversations.capture.rows import int_array, json_text
from clawhub.conversations.models import Turn
from clawhub.conversations.privacy import capture_allowed_many
from clawhub.conversations.services import turns_ready_notify

logger = logging.getLogger("clawhub.conversations.capture")

# Counters the metrics endpoint can export, next to the gateway writer's.
STATS = {"stored": 0, "duplicates": 0, "failed": 0, "batch_retries": 0}
_stats_lock = threading.Lock()


# Usage metering lives in an app above conversations (clawhub.usage), which registers its writer here from its
# AppConfig.ready(). It runs in the store's transaction with every new record of a batch (side turns, failed
# requests and users who turned storage off included), and for a dead-lettered record alone.
_usage_recorder: Callable[..., None] | None = None


def register_usage_recorder(recorder: Callable[..., None]) -> None:
    """``recorder(records=...)`` meters the served requests of an iterable of TurnRecords."""
    global _usage_recorder
    _usage_recorder = recorder


def _meter_usage(records: Iterable[TurnRecord]) -> None:
    if _usage_recorder is None:
        raise RuntimeError("no usage recorder registered: is clawhub.usage in INSTALLED_APPS?")
    _usage_recorder(records=records)


def _count(name: str, n: int = 1) -> None:
    with _stats_lock:
        STATS[name] += n


class CaptureFailed(Exception):
    """Records of a batch that could not be stored while the database answered (a deadlock, a statement
    timeout, a schema mismatch, a bug on an odd body). The rest of the batch is committed; nothing of these
    was written."""

    def __init__(self, failures: list[tuple[TurnRecord, Exception]]):
        self.failures = failures
        super().__init__("; ".join(f"turn {record.request_id}: {type(exc).__name__}: {exc}"
                                   for record, exc in failures[:5]))


def capture_store(records: list[TurnRecord]) -> None:
    """Stores a batch of records. Never leaves a record half-written. Raises ``CaptureFailed`` (after
    committing the others) for records that cannot be stored while the database answers, and the database's
    own error when it cannot be reached at all: either way the caller still holds the records and decides."""
    if not records:
        return
    try:
        with transaction.atomic():
            stored = _store(records)
        _count("stored", stored)  # counted after the commit: PostgreSQL checks foreign keys only then
        return
    except Exception:
        if not _database_usable():
            raise
        _count("batch_retries")
        logger.exception("capture of a batch of %d turns failed; storing them one by one", len(records))
    failures: list[tuple[TurnRecord, Exception]] = []
    for record in records:
        try:
            with transaction.atomic():
                stored = _store([record])
            _count("stored", stored)
        except Exception as exc:
            if not _database_usable():
                raise  # the rest waits for the database; what was committed is skipped as known next time
            _count("failed")
            logger.exception("capture of turn %s failed", record.request_id)
            failures.append((record, exc))
    if failures:
        raise CaptureFailed(failures)


def capture_usage_only(*, record: TurnRecord) -> None:
    """Meters a record that will never become a turn (the consumer dead-lettered it): it was still served."""
    try:
        with transaction.atomic():
            _meter_usage([record])
    except Exception:
        logger.exception("usage of turn %s could not be recorded either", record.request_id)


def _database_usable() -> bool:
    try:
        connection.ensure_connection()
        return connection.is_usable()
    except Exception:
        return False


def _store(records: Sequence[TurnRecord]) -> int:
    """Stores what is new in ``records``; returns how many turns it wrote."""
    now = timezone.now()
    records = _unseen(records)
    if not records:
        return 0
    # A user who turned storage off is served and metered, but none of their turns is written. (Their records
    # leave no request id behind, so only their usage would count twice if a batch were delivered twice.)
    allowed = capture_allowed_many({(r.user_id, r.key_id) for r in records})
    kept = [r for r in records if allowed[(r.user_id, r.key_id)][0]]
    if kept:
        _lock_owners({(r.tenant_id, r.user_id) for r in kept})
        items = [item_of(r) for r in sorted(kept, key=lambda r: (r.started_at, r.request_id))]
        resolve_explicit_sessions(items)
        graph = Graph.load(items)
        infer_sessions(items, graph)
        if not graph.covers(items):
            # A new turn's parent may be older than the prefixes read: read them all and infer again.
            for it in items:
                if not it.external_id:
                    it.session_ref = None
            graph = Graph.load(items, nearest=False)
            infer_sessions(items, graph)
        graph.lock_sessions(items)
        ready = write_turns(items, graph, now)
        turns_ready_notify(turns=ready)
    _meter_usage(records)
    return len(kept)


def _lock_owners(owners: set[tuple[int, int]]) -> None:
    """Serialises writers per (tenant, user) until commit, with transaction-scoped advisory locks taken in
    one statement in a fixed order (so two writers never deadlock on them).

    Linking reads what other writers committed: a turn whose parent another gateway process is writing
    right now must either see that parent, or be seen by it (the parent then adopts it). Without the lock,
    both transactions could look before either commits and the link would be lost. Other users' batches
    never wait on each other. SQLite (the embedded default) has one writer at a time anyway."""
    if connection.vendor != "postgresql" or not owners:
        return
    keys = sorted({(tenant_id << 32) ^ user_id for tenant_id, user_id in owners})
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(k) FROM (SELECT unnest(%s::bigint[]) AS k ORDER BY 1) AS owners",
            [int_array(keys)],
        )


def _known_request_ids(request_ids: list[str]) -> set[str]:
    if connection.vendor != "postgresql":
        known = Turn.objects.filter(request_id__in=request_ids).order_by()
        return set(known.values_list("request_id", flat=True))
    # One statement per batch: raw SQL, as the queryset's building and compiling cost more CPU than the query.
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT request_id FROM {connection.ops.quote_name(Turn._meta.db_table)} "
            "WHERE request_id = ANY(ARRAY(SELECT json_array_elements_text(%s::json))::varchar[])",
            [json_text(request_ids)],  # one text: the driver quotes a list's items one by one in Python
        )
        return {row[0] for row in cursor.fetchall()}


def _unseen(records: Sequence[TurnRecord]) -> list[TurnRecord]:
    by_id: dict[str, TurnRecord] = {}
    for record in records:
        by_id.setdefault(record.request_id, record)
    known = _known_request_ids(list(by_id))
    if known or len(by_id) < len(records):
        _count("duplicates", len(records) - len(by_id) + len(known))
    return [r for request_id, r in by_id.items() if request_id not in known]
