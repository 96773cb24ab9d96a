"""Users' privacy switches as capture sees them, and the retention purge of old turns.

Capture (``conversations.capture.store.capture_store``) calls
``capture_allowed`` / ``capture_allowed_many`` before storing a turn: a user with ``store_turns`` off is
served and metered (usage), but their turns are not written.
"""

from collections.abc import Iterable
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from clawhub.accounts.models import User
from clawhub.conversations.models import Session, Turn
from clawhub.keys.models import ApiKey


def capture_allowed_many(
    pairs: Iterable[tuple[int, int | None]],
) -> dict[tuple[int, int | None], tuple[bool, bool]]:
    """``capture_allowed`` for a batch of (user_id, key_id) pairs, in two queries whatever the batch size."""
    pairs = set(pairs)
    users = {
        pk: (store, train)
        for pk, store, train in User.objects.filter(pk__in={u for u, _ in pairs}, is_active=True)
        .values_list("pk", "store_turns", "training_enabled")
    }
    keys = dict(ApiKey.objects.filter(pk__in={k for _, k in pairs if k is not None})
                .values_list("pk", "training_enabled"))
    result = {}
    for user_id, key_id in pairs:
        store, train = users.get(user_id, (False, False))
        if key_id is not None:
            train = train and keys.get(key_id, False)
        result[(user_id, key_id)] = (store, store and train)
    return result


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
