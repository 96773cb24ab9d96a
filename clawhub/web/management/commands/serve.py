"""Runs ClawHub on this machine: the web app (and, as later parts land, the gateway, workers and vLLM)."""

import os

from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Run ClawHub's web app and gateway with uvicorn."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("CLAWHUB_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("CLAWHUB_PORT", "8000")))

    def handle(self, *args, host: str, port: int, **options):
        import uvicorn

        self.stdout.write(f"ClawHub is starting on http://{host}:{port}/  (data in {settings.DATA_DIR})")
        self.stdout.write("Sign up at /signup/, then create an API key to get your OpenClaw settings.")
        uvicorn.run("clawhub.asgi:application", host=host, port=port, log_level="info")
