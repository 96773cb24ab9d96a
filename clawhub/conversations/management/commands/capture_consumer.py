"""``python manage.py capture_consumer``: stores the turns the gateway handed off
(clawhub.conversations.capture.consumer).

Runs until SIGTERM or SIGINT, then finishes the batch in hand (nothing unacknowledged is lost: it is
delivered again). ``--check`` exits 0 when a consumer reported within ``--max-age`` seconds (a liveness
probe), 1 if not.
"""

import signal
import threading

from django.core.management.base import BaseCommand, CommandError

from clawhub.conversations.capture.consumer import CaptureConsumer
from clawhub.conversations.capture.handoff import HandoffSettings, handoff_state


class Command(BaseCommand):
    help = "Store captured turns from the durable hand-off (Redis stream or local spool) in the database."

    def add_arguments(self, parser):
        parser.add_argument("--check", action="store_true", help="Exit 0 if a consumer reported recently.")
        parser.add_argument("--max-age", type=float, default=60.0)

    def handle(self, *args, check: bool, max_age: float, **options):
        cfg = HandoffSettings.from_settings(in_process=False)
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
        where = cfg.stream if cfg.redis_url else str(cfg.spool_dir)
        self.stdout.write(f"capture consumer {consumer.name} reading {where}")
        try:
            consumer.run(stop)
        finally:
            consumer.close()
        self.stdout.write(f"capture consumer stopped: {consumer.stats}")
