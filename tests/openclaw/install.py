"""Installs the real OpenClaw CLI, pinned, with the Node it needs (>= 24.16), into the npm CLI cache
(tests/clients/npm.py). Run it by hand with ``python -m tests.openclaw.install``; it prints the CLI's path.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from tests.clients.npm import bin_path, cli_env, ensure_installed, node_path

OPENCLAW_VERSION = "2026.9.6"


@dataclass(frozen=True)
class OpenClaw:
    root: Path  # the install prefix
    node: Path
    cli: Path  # openclaw's entry script, run with ``node``

    def env(self, home: Path) -> dict[str, str]:
        """An environment that runs this OpenClaw with its own Node and its state under ``home``."""
        return cli_env(self.root, home)


def ensure_openclaw() -> OpenClaw:
    """The cached install, made first if it is missing or incomplete."""
    root = ensure_installed(f"openclaw-{OPENCLAW_VERSION}", [f"openclaw@{OPENCLAW_VERSION}"])
    found = OpenClaw(root=root, node=node_path(root), cli=bin_path(root, "openclaw"))
    if not found.cli.exists():
        raise RuntimeError(f"OpenClaw install in {root} is incomplete: {found}")
    return found


if __name__ == "__main__":
    claw = ensure_openclaw()
    print(claw.node, claw.cli, file=sys.stdout)
