"""LiteLLM's proxy as bench_gateway's baseline: installed once into a venv of its own, started in front of the
same upstream, its version for the report."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from clawhub.devtools.processes import spawn, wait_http

ROOT = Path(__file__).resolve().parents[2]
# LiteLLM lives in a venv of its own: its pins (pydantic, httpx, openai, ...) fight ours. ".venv-*" is ignored
# by git; the venv is made once with the .venv's uv from the project's lock file (requirements/litellm.txt,
# compiled from litellm.in) and reused while that file stays the same.
LITELLM_VENV = ROOT / ".venv-litellm"
LITELLM_LOCK = ROOT / "requirements" / "litellm.txt"
LITELLM_REQUIREMENT = "litellm[proxy]==1.108.7"  # what litellm.in pins; the report names it
# The strongest configuration that runs here: virtual keys need LiteLLM's database, whose Prisma engine is
# downloaded at first start and cannot be here; so a master key and no database.
LITELLM_MODE = "master key, no database (virtual keys need Prisma, whose engine cannot be downloaded here)"


def ensure_litellm(log=sys.stderr) -> str | None:
    """The litellm executable: LITELLM_BIN if set, else .venv-litellm (created or refreshed on first use).

    Returns None, after saying why on ``log``, when it cannot be installed (no index reachable)."""
    given = os.environ.get("LITELLM_BIN")
    if given:
        return given if os.path.exists(given) else None
    exe = LITELLM_VENV / "bin" / "litellm"
    stamp = LITELLM_VENV / ".clawhub-stamp"
    lock = LITELLM_LOCK.read_text()
    if exe.exists() and stamp.exists() and stamp.read_text() == lock:
        return str(exe)
    uv = Path(sys.executable).parent / "uv"
    uv_cmd = [str(uv)] if uv.exists() else [sys.executable, "-m", "uv"]
    python = shutil.which("python3.11") or sys.executable
    log.write(f"bench_gateway: installing {LITELLM_LOCK} into {LITELLM_VENV} (once)\n")
    log.flush()
    try:
        if not (LITELLM_VENV / "bin" / "python").exists():
            subprocess.run([*uv_cmd, "venv", "-q", "--python", python, str(LITELLM_VENV)], check=True)
        subprocess.run([*uv_cmd, "pip", "sync", "-q", "--python", str(LITELLM_VENV / "bin" / "python"),
                        str(LITELLM_LOCK)], check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        log.write(f"bench_gateway: could not install LiteLLM: {exc}\n")
        return None
    stamp.write_text(lock)
    return str(exe)


def start_litellm(exe: str, upstream: str, port: int, workers: int) -> tuple[subprocess.Popen, str]:
    """LiteLLM's proxy in LITELLM_MODE, in front of the same upstream."""
    config = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    config.write(f"""model_list:
  - model_name: tiny
    litellm_params:
      model: hosted_vllm/tiny
      api_base: {upstream}/v1
      api_key: none
general_settings:
  master_key: sk-bench-master
litellm_settings:
  drop_params: true
""")
    config.close()
    # Without DATABASE_URL: LiteLLM would take ClawHub's database for its own and try to start Prisma.
    process = spawn([exe, "--config", config.name, "--port", str(port), "--num_workers", str(workers)],
                    drop=("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE"))
    wait_http(f"http://127.0.0.1:{port}/health/liveliness", timeout=180)
    return process, "sk-bench-master"


def litellm_version(exe: str) -> str:
    python = Path(exe).parent / "python"
    try:
        code = "import importlib.metadata as m; print(m.version('litellm'))"
        return subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                              timeout=60).stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
