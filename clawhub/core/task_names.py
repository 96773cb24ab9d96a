"""Celery task names and queues, defined once: ``clawhub.core.tasks`` sends by these names and
``clawhub.core.celery_app`` routes them (a module of plain constants, so the Celery app can read it without
importing the sender that loads the app).

Queues and who consumes them (every worker command in deploy/ and ``./dev run``'s worker must say so):

- ``judge``: judging turns, and the periodic jobs of judging (idle sessions, the unjudged sweep); CPU workers.
- ``train``: training runs and promotions (load, evaluate, switch); one process per GPU.
- ``housekeeping``: periodic bookkeeping that must never wait behind an hour of training (start runs for full
  batches, the promotion sweep, unloading drained adapters, the retention purge, generation bumps that
  failed); the judge workers take it.
- ``default``: everything else (the health ping).
"""

JUDGE_QUEUE = "judge"
TRAIN_QUEUE = "train"
HOUSEKEEPING_QUEUE = "housekeeping"
DEFAULT_QUEUE = "default"
QUEUES = (JUDGE_QUEUE, TRAIN_QUEUE, HOUSEKEEPING_QUEUE, DEFAULT_QUEUE)

JUDGE_TURN = "clawhub.judge.turn"
JUDGE_TURNS = "clawhub.judge.turns"
JUDGE_SWEEP = "clawhub.judge.sweep"
CLOSE_IDLE = "clawhub.conversations.close_idle"
TRAIN_RUN = "clawhub.train.run"
PROMOTE = "clawhub.train.promote"
TRAIN_KICK = "clawhub.train.kick"
PROMOTION_SWEEP = "clawhub.train.sweep"
UNLOAD_DRAINED = "clawhub.train.unload_drained"
RETENTION_PURGE = "clawhub.retention.purge"
GENERATIONS_SWEEP = "clawhub.core.generations_sweep"
HEALTH_PING = "clawhub.health.ping"
ACCOUNT_MAIL = "clawhub.accounts.mail"

TASK_QUEUES: dict[str, str] = {
    JUDGE_TURN: JUDGE_QUEUE,
    JUDGE_TURNS: JUDGE_QUEUE,
    JUDGE_SWEEP: JUDGE_QUEUE,
    CLOSE_IDLE: JUDGE_QUEUE,
    TRAIN_RUN: TRAIN_QUEUE,
    PROMOTE: TRAIN_QUEUE,
    TRAIN_KICK: HOUSEKEEPING_QUEUE,
    PROMOTION_SWEEP: HOUSEKEEPING_QUEUE,
    UNLOAD_DRAINED: HOUSEKEEPING_QUEUE,
    RETENTION_PURGE: HOUSEKEEPING_QUEUE,
    GENERATIONS_SWEEP: HOUSEKEEPING_QUEUE,
    HEALTH_PING: DEFAULT_QUEUE,
    # Password reset, address verification and "someone tried to sign up" mails: off the request path, so
    # the answer takes as long whether or not a mail goes out (and a slow mail server holds no web worker).
    ACCOUNT_MAIL: HOUSEKEEPING_QUEUE,
}
