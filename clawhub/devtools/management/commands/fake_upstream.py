"""Serves the vLLM-shaped fake upstream (clawhub.devtools.fake_upstream) for tests, demos and benchmarks."""

import os

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Run a fast vLLM-shaped fake upstream on --port."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8100)
        parser.add_argument("--base-model", default="tiny")
        parser.add_argument("--api-key", default="")
        parser.add_argument("--load-delay", type=float, default=0.05)

    def handle(self, *args, host: str, port: int, base_model: str, api_key: str, load_delay: float,
               **options):
        import uvicorn

        # The fake reads its configuration from the environment when it is imported.
        os.environ["FAKE_BASE_MODEL"] = base_model
        os.environ["FAKE_API_KEY"] = api_key
        os.environ["FAKE_LOAD_DELAY"] = str(load_delay)
        self.stdout.write(f"fake vLLM upstream ({base_model}) on http://{host}:{port}/")
        uvicorn.run("clawhub.devtools.fake_upstream:app", host=host, port=port, log_level="warning",
                    access_log=False)
