"""Benchmarks /v1: direct upstream vs ClawHub vs LiteLLM, one JSON line per mode (devtools.gateway_bench)."""

import sys

from django.core.management.base import BaseCommand, CommandError


def unlike_production() -> list[str]:
    """What makes this run's gateway unlike production's: without REDIS_URL it keeps quotas in its own process
    and reads generations from the file cache, with SQLite behind it; figures from such a run are not the
    production path's."""
    from django.conf import settings

    lines = []
    if not settings.REDIS_URL:
        lines.append("REDIS_URL is not set: quotas are the in-process limiter's, generations come from the "
                     "file cache, not production's Redis path.")
    if settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        lines.append("DATABASE_URL is not set: SQLite, not PostgreSQL.")
    return lines


class Command(BaseCommand):
    help = "Drive the same load at a fake upstream directly, through ClawHub and through LiteLLM."

    def add_arguments(self, parser):
        parser.add_argument("--requests", type=int, default=2000)
        parser.add_argument("--concurrency", type=int, default=16)
        parser.add_argument("--workers", type=int, default=1)
        parser.add_argument("--max-tokens", type=int, default=20, help="20 tokens = 22 chunks per stream")
        parser.add_argument("--no-litellm", action="store_true")
        parser.add_argument("--body", choices=["short", "openclaw-32k", "openclaw-90k"], default="short",
                            help="one short message, or OpenClaw-shaped bodies (prompt, tools, history)")
        parser.add_argument("--mode", choices=["both", "plain", "stream"], default="both")
        parser.add_argument("--apis", default="chat,messages,responses",
                            help="ClawHub's APIs to drive, comma-separated: chat (chat completions), "
                                 "messages (Anthropic Messages), responses (OpenAI Responses)")
        parser.add_argument("--tenants", type=int, default=200,
                            help="tenants, each with its own key and active adapter, used in turn")
        parser.add_argument("--profile", default=None,
                            help="write a cProfile of the gateway's event loop here (costs CPU: the other "
                                 "figures of that run are not comparable)")

    def handle(self, *args, requests, concurrency, workers, max_tokens, no_litellm, body, mode, tenants,
               profile, apis, **options):
        from clawhub.devtools.gateway_bench import API_PATHS, run

        chosen = tuple(api.strip() for api in apis.split(",") if api.strip())
        if not chosen or set(chosen) - set(API_PATHS):
            raise CommandError(f"--apis takes a comma-separated list of {', '.join(API_PATHS)}.")
        modes = {"both": (False, True), "plain": (False,), "stream": (True,)}[mode]
        for line in unlike_production():
            self.stderr.write(line)
        run(requests=requests, concurrency=concurrency, workers=workers, max_tokens=max_tokens,
            litellm=not no_litellm, out=sys.stdout, body=body, modes=modes, tenants=tenants, profile=profile,
            apis=chosen)
