"""Users' privacy switches as capture sees them, and the retention purge of old turns.

Capture (``conversations.capture.store.capture_store``) calls
``capture_allowed`` / ``capture_allowed_many`` before storing a turn: a user with ``store_turns`` off is
served and metered (usage), but their turns are not written.
"""

from collections.abc import Iterable
from datetime import timedelta
from functools import lru_cache

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from clawhub.accounts.models import User
from clawhub.conversations.models import Session, Turn
from clawhub.keys.models import ApiKey


def capture_allowed_many(
    pairs: Iterable[tuple[int, int | None]],
) -> dict[tuple[int, int | None], tuple[bool, bool]]:
    """``capture_allowed`` for a batch of (user_id, key_id) pairs, in one query whatever the batch size."""
    pairs = set(pairs)
    user_ids = sorted({u for u, _ in pairs})
    key_ids = sorted({k for _, k in pairs if k is not None})
    users: dict[int, tuple[bool, bool]] = {}
    keys: dict[int, bool] = {}
    # Raw SQL: capture asks this once per batch, and building and compiling two querysets cost it ~0.9 ms
    # of CPU, more than the rest of a small batch's reads.
    for kind, pk, store, train in _switches(user_ids, key_ids):
        if kind == "u":
            users[pk] = (bool(store), bool(train))
        else:
            keys[pk] = bool(train)
    result = {}
    for user_id, key_id in pairs:
        store, train = users.get(user_id, (False, False))
        if key_id is not None:
            train = train and keys.get(key_id, False)
        result[(user_id, key_id)] = (store, store and train)
    return result


def _switches(user_ids: list[int], key_ids: list[int]) -> list[tuple]:
    """("u", id, store_turns, training_enabled) of the active users, ("k", id, None, training_enabled) of
    the keys."""
    with connection.cursor() as cursor:
        cursor.execute(_switches_sql(len(user_ids), len(key_ids)), [*user_ids, *key_ids])
        return cursor.fetchall()


@lru_cache(maxsize=256)
def _switches_sql(users: int, keys: int) -> str:
    quote = connection.ops.quote_name
    user, key = User._meta, ApiKey._meta

    def column(meta, name: str) -> str:
        return quote(meta.get_field(name).column)

    def among(n: int) -> str:
        return ", ".join(["%s"] * n) or "NULL"  # IN (NULL) matches nothing

    return (
        f"SELECT 'u', {column(user, 'id')}, {column(user, 'store_turns')}, "
        f"{column(user, 'training_enabled')} "
        f"FROM {quote(user.db_table)} WHERE {column(user, 'id')} IN ({among(users)}) "
        f"AND {column(user, 'is_active')} "
        f"UNION ALL SELECT 'k', {column(key, 'id')}, NULL, {column(key, 'training_enabled')} "
        f"FROM {quote(key.db_table)} WHERE {column(key, 'id')} IN ({among(keys)})"
    )


def capture_allowed(user_id: int, key_id: int | None) -> tuple[bool, bool]:
    """(store, train) for a turn of this user through this key: store it at all (the user's ``store_turns``),
    and let it train an adapter (the user's and the key's ``training_enabled``; nothing stored, nothing
    trained). An unknown or inactive user gives (False, False)."""
    return capture_allowed_many([(user_id, key_id)])[(user_id, key_id)]


def turns_purge_older_than(*, days: int | None = None, batch_size: int = 1000) -> int:
    """Deletes turns older than ``days`` (default settings.CLAWHUB_RETENTION_DAYS; 0 keeps everything) with
    their judgments and samples, trained ones too (the adapter keeps what it learned; the text goes), then the
    sessions left without turns. Short transactions of ``batch_size`` turns, so capture is never held up for
    long. Returns how many turns were deleted.
    """
    days = settings.CLAWHUB_RETENTION_DAYS if days is None else days
    if days <= 0:
        return 0
    cutoff = timezone.now() - timedelta(days=days)
    deleted = 0
    while True:
        with transaction.atomic():
            ids = list(Turn.objects.filter(created_at__lt=cutoff).order_by("id").values_list("id", flat=True)
                       [:batch_size])
            if not ids:
                break
            _detach_from(ids)
            # Judgments and samples cascade from the turn.
            Turn.objects.filter(id__in=ids).delete()
        deleted += len(ids)
        if len(ids) < batch_size:
            break
    # Sessions whose every turn is gone and that saw no activity since the cutoff.
    Session.objects.filter(last_activity_at__lt=cutoff, turns__isnull=True).delete()
    return deleted


def _detach_from(base_ids: list[int]) -> None:
    """Turns that stay but are stored against turns about to go (what they added to a base's prompt) are
    rewritten whole first, so their prompts can still be rebuilt."""
    from clawhub.conversations.selectors import stored_prompts
    from clawhub.conversations.storage import dumps, pack_ids

    gone = set(base_ids)
    staying = list(Turn.objects.filter(prompt_base_id__in=gone).exclude(id__in=gone).only("id", "session_id"))
    if not staying:
        return
    prompts = stored_prompts(session_ids={t.session_id for t in staying})
    for turn in staying:
        messages, ids, _ = prompts.get(turn.pk, (None, None, None))
        fields = {"prompt_base": None, "messages_shared": 0, "prompt_token_ids_shared": 0}
        if messages is not None:
            fields["messages_added"] = dumps(messages)
        fields["prompt_token_ids_added"] = pack_ids(ids) if ids is not None else None
        if ids is None:
            fields["prompt_token_count"] = None
        Turn.objects.filter(pk=turn.pk).update(**fields)
