"""``python manage.py capture_consumer``: stores the turns the gateway handed off
(clawhub.conversations.capture.consumer).

Runs until SIGTERM or SIGINT, then finishes the batch in hand (nothing unacknowledged is lost: it is
delivered again). ``--check`` exits 0 when a consumer reported within ``--max-age`` seconds (a liveness
probe), 1 if not. ``--requeue-undecodable`` puts the dead letters an older consumer could not decode and this
one can back on the stream (after an upgrade that changed the record format; deploy/README.md, "Upgrades").
"""

import gc
import signal
import threading

from django.core.management.base import BaseCommand, CommandError

from clawhub.conversations.capture.consumer import CaptureConsumer, requeue_undecodable
from clawhub.conversations.capture.handoff import HandoffSettings, handoff_state


class Command(BaseCommand):
    help = "Store captured turns from the durable hand-off (Redis stream or local spool) in the database."

    def add_arguments(self, parser):
        parser.add_argument("--check", action="store_true", help="Exit 0 if a consumer reported recently.")
        parser.add_argument("--max-age", type=float, default=60.0)
        parser.add_argument("--requeue-undecodable", action="store_true", dest="requeue",
                            help="Put dead letters an older consumer could not decode back on the stream.")

    def handle(self, *args, check: bool, max_age: float, requeue: bool, **options):
        cfg = HandoffSettings.from_settings(in_process=False)
        if requeue:
            if not cfg.redis_url:
                raise CommandError("--requeue-undecodable reads the Redis dead-letter stream: set REDIS_URL.")
            moved, left = requeue_undecodable(cfg)
            self.stdout.write(f"requeued {moved} dead letters on {cfg.stream}; {left} still undecodable")
            return
        if check:
            age = handoff_state(cfg).get("heartbeat_age")
            if age is None or age > max_age:
                raise CommandError(f"no capture consumer reported in the last {max_age:.0f} s")
            self.stdout.write(f"capture consumer reported {age:.1f} s ago")
            return
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, frame: stop.set())
        consumer = CaptureConsumer(cfg)
        # What Django and the app loaded at start lives as long as the process: left out of the collector's
        # full passes, which otherwise walk ~100,000 such objects (~80 ms each) as batches come and go.
        gc.collect()
        gc.freeze()
        where = cfg.stream if cfg.redis_url else str(cfg.spool_dir)
        self.stdout.write(f"capture consumer {consumer.name} reading {where}")
        try:
            consumer.run(stop)
        finally:
            consumer.close()
        self.stdout.write(f"capture consumer stopped: {consumer.stats}")
