"""Gateway worker processes for tests: ``uvicorn clawhub.asgi:application`` on a port of its own, on this
test run's database and Redis, so a test can run several workers at once or kill one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
from django.db import connection

from tests.gateway.conftest import wait_until
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class GatewayProcess:
    url: str
    process: subprocess.Popen
    log: Path

    @property
    def v1(self) -> str:
        return f"{self.url}/v1"

    def kill(self) -> None:
        """SIGKILL: a crash, nothing cleaned up."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])


def database_url() -> str:
    """The test database this run's rows are committed to (transactional_db)."""
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def start_gateway_process(upstreams: list[dict], log: Path, **env: str) -> GatewayProcess:
    port = free_port()
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "clawhub.settings.test",
                   "DATABASE_URL": database_url(), "CLAWHUB_UPSTREAMS": json.dumps(upstreams),
                   "GATEWAY_HEALTH_INTERVAL": "1", **env}
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "clawhub.asgi:application", "--port", str(port),
             "--no-access-log", "--log-level", "warning"],
            env=environment, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    gateway = GatewayProcess(f"http://127.0.0.1:{port}", process, log)

    def up() -> bool:
        assert process.poll() is None, f"gateway process exited:\n{gateway.log_tail()}"
        try:
            return httpx.get(f"{gateway.v1}/models", timeout=1).status_code == 401
        except httpx.HTTPError:
            return False

    wait_until(up, timeout=60, interval=0.2)
    return gateway
