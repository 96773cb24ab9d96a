"""What the capture fault tests run: a throwaway PostgreSQL cluster and Redis of their own (so stopping them
disturbs nobody), the production server (gunicorn + one uvicorn worker, production settings), the capture
consumer process, and a paced load generator that remembers what every request got.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from glob import glob
from pathlib import Path

import httpx

from tests.gateway.conftest import wait_until
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per load request otherwise
GUNICORN = ROOT / ".venv" / "bin" / "gunicorn"
METRICS_TOKEN = "durability-metrics-token"


def _pg_bin(name: str) -> str:
    found = sorted(glob(f"/usr/lib/postgresql/*/bin/{name}"))
    assert found, f"{name} not found under /usr/lib/postgresql/*/bin (apt-get install postgresql)"
    return found[-1]


def _as_postgres(cmd: list[str]) -> list[str]:
    # initdb and postgres refuse to run as root.
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


class ThrowawayPostgres:
    """A PostgreSQL cluster in a temporary folder on a port of its own; never the shared one on 5432."""

    def __init__(self):
        self.folder = Path(tempfile.mkdtemp(prefix="clawhub-pg-"))
        self.port = free_port()
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres", "postgres")
        self.data = self.folder / "data"
        self.log = self.folder / "postgres.log"

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/clawhub"

    def init(self) -> None:
        subprocess.run(_as_postgres([_pg_bin("initdb"), "-D", str(self.data), "-U", "postgres",
                                     "--auth=trust", "--no-sync"]), check=True, stdout=subprocess.DEVNULL)
        self.start()
        subprocess.run(_as_postgres([_pg_bin("createdb"), "-h", "127.0.0.1", "-p", str(self.port),
                                     "-U", "postgres", "clawhub"]), check=True)

    def start(self) -> None:
        subprocess.run(_as_postgres([
            _pg_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o",
            f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c max_connections=50", "start"]), check=True, stdout=subprocess.DEVNULL)

    def stop(self) -> None:
        subprocess.run(_as_postgres([_pg_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"]),
                       check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def query(self, sql: str, *params) -> list[tuple]:
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=clawhub",
                             connect_timeout=5) as conn:
            return conn.execute(sql, params).fetchall()


class ThrowawayRedis:
    """redis-server on its own port, in its own folder; ``durable`` turns on AOF (as deploy/ runs it), so a
    restart keeps the capture stream."""

    def __init__(self, folder: Path | None = None, *, durable: bool = False):
        self.folder = folder or Path(tempfile.mkdtemp(prefix="clawhub-redis-"))
        self.port, self.process, self.durable = free_port(), None, durable

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        exe = shutil.which("redis-server")
        assert exe, "redis-server is not installed (apt-get install redis-server)"
        self.process = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--dir", str(self.folder),
             "--appendonly", *(["yes", "--appendfsync", "everysec"] if self.durable else ["no"])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(self.answers, timeout=10)

    def answers(self) -> bool:
        import redis

        try:
            return redis.Redis(port=self.port, socket_connect_timeout=0.2).ping()
        except redis.RedisError:
            return False

    def client(self, db: int = 0):
        import redis

        return redis.Redis(port=self.port, db=db, socket_timeout=5)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()  # SIGTERM: Redis flushes its AOF and exits
            self.process.wait(10)
        self.process = None

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


def app_env(pg: ThrowawayPostgres, rds: ThrowawayRedis, upstream_url: str, spool: Path) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "clawhub.settings.production",
        "DJANGO_SECRET_KEY": "durability-test-" + os.urandom(24).hex(),  # production wants >= 50 chars
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DATABASE_URL": pg.url,
        "DATABASE_CONNECT_TIMEOUT": "2",
        "REDIS_URL": f"{rds.url}/0",
        "CELERY_BROKER_URL": f"{rds.url}/1",
        "CLAWHUB_SECURE_COOKIES": "false",
        "CLAWHUB_UPSTREAMS": json.dumps([{"url": upstream_url, "base_model": "tiny", "max_adapters": 8}]),
        "CLAWHUB_CAPTURE_SPOOL_DIR": str(spool),
        "CLAWHUB_CAPTURE_CLAIM_IDLE_SECONDS": "3",
        "METRICS_TOKEN": METRICS_TOKEN,
        "METRICS_ALLOWED_NETS": "",
        "CLAWHUB_LOG_LEVEL": "WARNING",
        # The paced load sends every request through two keys: no site default limits on new keys here.
        "CLAWHUB_KEY_DEFAULT_RPM_LIMIT": "0",
        "CLAWHUB_KEY_DEFAULT_CONCURRENCY_LIMIT": "0",
        # Lookups that expire within the outages here, so known keys and adapters take the path under test
        # (served stale while the database is away), not a fresh cache (60 s and 300 s by default).
        "GATEWAY_KEY_CACHE_SECONDS": "2",
        "GATEWAY_ADAPTER_CACHE_SECONDS": "2",
    }


def manage(env: dict[str, str], *args: str, timeout: float = 300) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


SETUP = """
import json, uuid
from tests.factories import make_key, make_user
from tests.gateway.conftest import activate_adapter
owner = make_user(f"durability-{uuid.uuid4().hex}@example.com")
activate_adapter(owner.tenant)
_, known = make_key(owner, name="known")
_, unseen = make_key(owner, name="never used before the outage")
print(json.dumps({"known": known, "unseen": unseen, "tenant": owner.tenant.pk}))
"""


def make_keys(env: dict[str, str]) -> dict:
    """A user with an active adapter and two keys, made in the throwaway database through the app's code."""
    out = manage(env, "shell", "-c", SETUP)
    return json.loads(out.strip().splitlines()[-1])


class Process:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path):
        self.name, self.argv, self.env, self.log_path = name, argv, env, log
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(self.argv, cwd=ROOT, env=self.env, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def signal(self, sig: int) -> None:
        os.killpg(self.process.pid, sig)

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                self.signal(signal.SIGTERM)
                self.process.wait(30)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                self.signal(signal.SIGKILL)
                self.process.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def children(self) -> list[int]:
        """The pids this process started (gunicorn's master: its workers)."""
        pid = self.process.pid
        try:
            return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except FileNotFoundError:
            return []


def gateway_process(env: dict[str, str], folder: Path, *, graceful: int = 20) -> tuple[Process, str]:
    port = free_port()
    gw_env = {**env, "CLAWHUB_BIND": f"127.0.0.1:{port}", "WEB_CONCURRENCY": "1",
              "CLAWHUB_GRACEFUL_TIMEOUT": str(graceful)}
    proc = Process("gateway", [str(GUNICORN), "clawhub.asgi:application", "-c", "deploy/gunicorn.conf.py"],
                   gw_env, folder / "gunicorn.log")
    return proc, f"http://127.0.0.1:{port}"


def wait_serving(proc: Process, base: str, timeout: float = 60) -> None:
    def up() -> bool:
        if proc.process.poll() is not None:
            raise AssertionError(f"gunicorn exited: {proc.log()[-3000:]}")
        try:
            return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, timeout=timeout, interval=0.2)


def consumer_process(env: dict[str, str], folder: Path) -> Process:
    return Process("consumer", [sys.executable, "manage.py", "capture_consumer"], env,
                   folder / "consumer.log")


# --- load ---------------------------------------------------------------------------------------------------


@dataclass
class Sent:
    session: str
    key: str  # "known" | "unseen"
    stream: bool
    started: float
    status: int | None = None
    retry_after: str | None = None
    headers_at: float | None = None
    done_at: float | None = None  # the whole body arrived
    error: str | None = None
    body: str = ""


@dataclass
class PacedLoad:
    """``rate`` requests per second until stopped, each a session of its own (``X-Session-Id``), alternating
    plain and streamed; ``unseen_every`` > 0 also sends every n-th request with the never-used key while
    ``send_unseen`` is set."""

    base: str
    secrets: dict
    rate: float = 20.0
    prefix: str = "load"
    unseen_every: int = 0
    sent: list[Sent] = field(default_factory=list)

    def __post_init__(self):
        self._stop = threading.Event()
        self.send_unseen = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)

    def retarget(self, base: str) -> None:
        self.base = base

    async def _run(self) -> None:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
        # A connect measured by this thread's event loop: with the whole suite on two cores the loop can be
        # starved for seconds, and a 2 s connect limit then failed a connection the kernel had already made
        # (ConnectTimeout, twice in full runs; never alone). 10 s still fails a gateway that stops accepting.
        async with httpx.AsyncClient(timeout=httpx.Timeout(30, connect=10), limits=limits) as client:
            tasks, i = [], 0
            start = time.monotonic()
            while not self._stop.is_set():
                i += 1
                unseen = self.unseen_every and self.send_unseen.is_set() and i % self.unseen_every == 0
                sent = Sent(f"{self.prefix}-{i}", "unseen" if unseen else "known", stream=i % 2 == 0,
                            started=time.monotonic())
                self.sent.append(sent)
                tasks.append(asyncio.create_task(self._one(client, sent)))
                await asyncio.sleep(max(0.0, start + i / self.rate - time.monotonic()))
            await asyncio.gather(*tasks)

    async def _one(self, client: httpx.AsyncClient, sent: Sent) -> None:
        body = {"model": "clawhub-personal", "stream": sent.stream,
                "messages": [{"role": "user", "content": f"request {sent.session}"}]}
        headers = {"Authorization": f"Bearer {self.secrets[sent.key]}", "X-Session-Id": sent.session}
        try:
            async with client.stream("POST", f"{self.base}/v1/chat/completions", json=body,
                                     headers=headers) as response:
                sent.status, sent.headers_at = response.status_code, time.monotonic()
                sent.retry_after = response.headers.get("retry-after")
                text = (await response.aread()).decode(errors="replace")
                if response.status_code != 200 or not sent.stream or text.rstrip().endswith("data: [DONE]"):
                    sent.done_at = time.monotonic()
                sent.body = text[:300]
        except httpx.HTTPError as exc:
            sent.error = type(exc).__name__

    def ok(self) -> list[Sent]:
        return [s for s in self.sent if s.status == 200 and s.done_at is not None]


def turns_by_session(pg: ThrowawayPostgres, prefix: str) -> dict[str, int]:
    rows = pg.query("SELECT s.external_id, count(t.id) FROM conversations_turn t "
                    "JOIN conversations_session s ON s.id = t.session_id "
                    "WHERE s.external_id LIKE %s GROUP BY s.external_id", f"{prefix}-%")
    return dict(rows)


def usage_requests(pg: ThrowawayPostgres, tenant: int) -> int:
    rows = pg.query("SELECT coalesce(sum(requests), 0) FROM usage_usagedaily WHERE tenant_id = %s", tenant)
    return int(rows[0][0])
