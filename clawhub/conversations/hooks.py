"""Where conversations hand turns to judging (the judge task).

``on_turn_ready_for_judging`` runs after the transaction that linked or closed the turns has committed
(capture and the idle sweep register it with ``transaction.on_commit``), so a task it enqueues always finds
the rows.
"""

import logging

from clawhub.core import tasks

logger = logging.getLogger("clawhub.conversations")


# Turns per fan-out message. A capture batch makes up to a few hundred turns ready at once, and Celery spends
# about 0.5 ms of CPU on every message it sends: one message per batch, and a judge worker sends the rest.
FAN_OUT = 500


def on_turn_ready_for_judging(turn_ids: list[int]) -> None:
    """Main turns that just got their next state or were closed without one: one judge task each, sent
    directly for a single turn, else through one ``judge_turns`` fan-out message per FAN_OUT turns.

    Callers already run this after commit; ``enqueue_on_commit`` keeps that true for a caller inside a
    transaction (it sends at once when there is none)."""
    turn_ids = list(turn_ids)
    logger.debug("%d turns ready for judging", len(turn_ids))
    if len(turn_ids) == 1:
        tasks.enqueue_on_commit(tasks.JUDGE_TURN, turn_ids[0])
        return
    for start in range(0, len(turn_ids), FAN_OUT):
        tasks.enqueue_on_commit(tasks.JUDGE_TURNS, *turn_ids[start:start + FAN_OUT])
