"""The layer contracts (``[tool.importlinter]`` in pyproject.toml), run by import-linter: no app imports an
app above it, beyond the listed imports that are still to be moved; inside conversations, nothing below the
capture package imports it."""

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Wiring, not an app: settings and URL/ASGI/WSGI entry points may import any app.
WIRING = {"clawhub.settings", "clawhub.urls", "clawhub.asgi", "clawhub.wsgi"}


def contract() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]


def test_the_layer_contract_is_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "2 kept, 0 broken" in result.stdout
    assert "Capture runs one way through conversations KEPT" in result.stdout


def test_every_conversations_module_has_a_place_in_the_capture_contract():
    """A new module of clawhub/conversations must be placed above or below capture, or the contract would not
    see whether it reaches back into capture."""
    capture = next(c for c in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"] if c["name"] == "Capture runs one way through conversations")
    named = {name.strip() for layer in capture["layers"] for name in layer.replace("|", ":").split(":")}
    app = ROOT / "clawhub" / "conversations"
    found = {path.stem for path in app.iterdir()
             if not path.name.startswith(("_", ".")) and path.name != "migrations"
             and (path.suffix == ".py" or (path / "__init__.py").exists())}
    assert found == named


def test_every_app_has_a_layer():
    """A new app (a package or top-level module of clawhub/ or workers/) must be placed in a layer, or the
    contract would not see its imports."""
    named = {name.strip() for layer in contract()["layers"] for name in layer.replace("|", ":").split(":")}
    found = set()
    for package in ("clawhub", "workers"):
        for path in (ROOT / package).iterdir():
            if path.name.startswith(("_", ".")) or path.suffix not in ("", ".py"):
                continue
            if path.is_dir() and not (path / "__init__.py").exists():
                continue
            found.add(f"{package}.{path.stem}")
    assert found - WIRING - named == set()
    assert named - found == set()  # no layer names an app that is gone
