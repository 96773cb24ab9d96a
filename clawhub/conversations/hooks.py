"""Where conversations hand turns to judging (the judge task).

``on_turn_ready_for_judging`` runs after the transaction that linked or closed the turns has committed
(capture and the idle sweep register it with ``transaction.on_commit``), so a task it enqueues always finds
the rows.
"""

import logging

from django.db import transaction

logger = logging.getLogger("clawhub.conversations")


def on_turn_ready_for_judging(turn_ids: list[int]) -> None:
    """Main turns that just got their next state or were closed without one: one judge task each.

    Callers already run this after commit; ``on_commit`` keeps that true for a caller inside a transaction (it
    runs at once when there is none)."""
    from workers.tasks.judging import JUDGE_QUEUE, judge_turn  # the Celery app loads only when judging starts

    logger.debug("%d turns ready for judging", len(turn_ids))
    for turn_id in turn_ids:
        transaction.on_commit(
            lambda turn_id=turn_id: judge_turn.apply_async(args=[turn_id], queue=JUDGE_QUEUE), robust=True
        )
