"""Where conversations hand turns to judging (the judge task).

``on_turn_ready_for_judging`` runs after the transaction that linked or closed the turns has committed
(capture and the idle sweep register it with ``transaction.on_commit``), so a task it enqueues always finds
the rows.
"""

import logging

from clawhub.core import tasks

logger = logging.getLogger("clawhub.conversations")


def on_turn_ready_for_judging(turn_ids: list[int]) -> None:
    """Main turns that just got their next state or were closed without one: one judge task each.

    Callers already run this after commit; ``enqueue_on_commit`` keeps that true for a caller inside a
    transaction (it sends at once when there is none)."""
    logger.debug("%d turns ready for judging", len(turn_ids))
    for turn_id in turn_ids:
        tasks.enqueue_on_commit(tasks.JUDGE_TURN, turn_id)
