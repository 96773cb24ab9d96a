"""Benchmarks the capture consumer: CPU per stored turn as history grows (devtools.capture_bench)."""

import sys

from django.core.management.base import BaseCommand, CommandError


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


class Command(BaseCommand):
    help = "Drain handed-off turns through the capture consumer and print its CPU per stored turn."

    def add_arguments(self, parser):
        parser.add_argument("--records", type=int, default=2000, help="turns per workload and history level")
        parser.add_argument("--tenants", type=int, default=4)
        parser.add_argument("--history", default="10,1000,100000",
                            help="prior turns per tenant, comma-separated: one row per level")
        parser.add_argument("--workloads", default="repeat,unique,agent")
        parser.add_argument("--batch", default="200,20",
                            help="records per consumer fetch, comma-separated (200: draining a backlog; 20: "
                                 "steady load, where each fetch finds a few records)")
        parser.add_argument("--rate", type=float, default=0,
                            help="hand records off at this rate (per second) while the consumer runs its own "
                                 "loop, instead of draining --records handed off at once")
        parser.add_argument("--seconds", type=float, default=20, help="how long --rate hands records off")
        parser.add_argument("--linger", default="",
                            help="with --rate: the consumer's linger after a short read, ms, comma-separated "
                                 "(default: CLAWHUB_CAPTURE_BATCH_LINGER_MS)")

    def handle(self, *args, records, tenants, history, workloads, batch, rate, seconds, linger, **options):
        from django.conf import settings

        from clawhub.devtools.capture_bench import WORKLOADS, run

        chosen = [w.strip() for w in workloads.split(",") if w.strip()]
        if not chosen or set(chosen) - set(WORKLOADS):
            raise CommandError(f"--workloads takes a comma-separated list of {', '.join(WORKLOADS)}.")
        if not settings.REDIS_URL:
            raise CommandError("bench_capture measures the Redis stream consumer: set REDIS_URL.")
        if rate < 0 or seconds <= 0:
            raise CommandError("--rate takes a rate >= 0 and --seconds a duration > 0.")
        lingers = _ints(linger) or [settings.CAPTURE_BATCH_LINGER_MS]
        run(records=records, tenants=tenants, histories=_ints(history), workloads=chosen,
            batches=_ints(batch), out=sys.stdout, rate=rate, seconds=seconds,
            lingers=lingers if rate else None)
