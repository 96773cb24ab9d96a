"""Benchmarks the capture hand-off's durability on Redis: AOF everysec vs always (devtools.handoff_bench)."""

import sys

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = ("Time the capture hand-off on a Redis of its own with appendfsync everysec and always, kill that "
            "Redis under load and count the acknowledged records it lost.")

    def add_arguments(self, parser):
        parser.add_argument("--rate", type=float, default=200.0, help="paced records per second")
        parser.add_argument("--seconds", type=float, default=5.0, help="length of each measurement")
        parser.add_argument("--bytes", type=int, default=4096, help="record size")
        parser.add_argument("--senders", type=int, default=8, help="concurrent senders when saturated")

    def handle(self, *args, rate, seconds, bytes, senders, **options):
        from clawhub.devtools.handoff_bench import run

        run(rate=rate, seconds=seconds, payload_bytes=bytes, senders=senders, out=sys.stdout)
