"""Helpers for the deployment tests: where deploy/ is, and which settings the code reads."""

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

# env.str("NAME", ...), env.int(...), env.db(...), env("NAME") ... and os.environ.get/setdefault("NAME"),
# os.getenv("NAME"), os.environ["NAME"] (reads only, not assignments).
_ENV_READ = re.compile(r"""\benv(?:\.[a-z_]+)?\(\s*["']([A-Z][A-Z0-9_]*)["']""")
_OS_READ = re.compile(
    r"""\bos\.(?:environ\.get|environ\.setdefault|getenv)\(\s*["']([A-Z][A-Z0-9_]*)["']"""
    r"""|\bos\.environ\[\s*["']([A-Z][A-Z0-9_]*)["']\s*\](?!\s*=(?!=))"""
)
# The fake upstream (clawhub/devtools, a test double shipped in the package) reads FAKE_* knobs: they are not
# deployment settings.
EXCLUDED_PREFIXES = ("FAKE_",)


def settings_read_by_code() -> dict[str, set[str]]:
    """Every environment variable the code reads, with the files that read it."""
    found: dict[str, set[str]] = {}
    files = [ROOT / "manage.py", *DEPLOY.glob("*.py")]
    for folder in ("clawhub", "workers"):
        files += (ROOT / folder).rglob("*.py")
    for path in files:
        text = path.read_text(encoding="utf-8")
        for match in [*_ENV_READ.finditer(text), *_OS_READ.finditer(text)]:
            name = next(group for group in match.groups() if group)
            if not name.startswith(EXCLUDED_PREFIXES):
                found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def env_example_names() -> set[str]:
    """Names in deploy/env.example, set (NAME=...) or shown at their default (# NAME=...)."""
    text = (DEPLOY / "env.example").read_text(encoding="utf-8")
    return set(re.findall(r"^#?\s?([A-Z][A-Z0-9_]*)=", text, flags=re.MULTILINE))


def markdown_table_names(path: Path, heading: str) -> set[str]:
    """Backticked names in the first column of the table under ``## <heading>``."""
    text = path.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^## |\Z)", text, flags=re.MULTILINE | re.DOTALL)
    assert match, f"no '## {heading}' section in {path}"
    names: set[str] = set()
    for line in match.group(1).splitlines():
        if line.startswith("|"):
            first_cell = line.split("|")[1]
            names.update(re.findall(r"`([A-Z][A-Z0-9_]*)`", first_cell))
    return names


def load_k8s_documents() -> list[tuple[Path, dict]]:
    docs = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc:
                docs.append((path, doc))
    return docs


@pytest.fixture(scope="session")
def compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text(encoding="utf-8"))
