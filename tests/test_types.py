import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_finds_nothing():
    # What it checks and how: [tool.mypy] in pyproject.toml (the engine, the services and the selectors, with
    # the django-stubs plugin). Its cache (.mypy_cache) makes a rerun a few seconds.
    result = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
