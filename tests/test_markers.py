"""The markers that decide what `./dev test --fast` leaves out are given to the tests they name."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SLOW

ROOT = Path(__file__).resolve().parent.parent


def test_every_slow_entry_names_an_existing_module_or_test():
    for entry in SLOW:
        path, _, name = entry.partition("::")
        assert (ROOT / path).is_file(), entry
        if name:
            source = (ROOT / path).read_text()
            assert re.search(rf"^(async )?def {re.escape(name)}\(", source, re.M), entry


@pytest.mark.slow  # a second pytest collecting for real
def test_fast_selection_leaves_out_slow_worker_and_server_tests():
    """What `./dev test --fast` selects, collected for real: a listed test, a test of a listed module and a
    test with real Celery workers are left out; an ordinary test stays in."""
    deselect = re.search(r'^FAST_DESELECT="([^"]+)"', (ROOT / "dev").read_text(), re.M).group(1)
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-n", "0",
         "-m", deselect, "tests/gateway/test_traffic.py", "tests/test_settings.py",
         "tests/training/test_worker_kill.py", "tests/keys/test_services.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    ).stdout
    selected = {line.split("::")[0] for line in collected.splitlines() if "::" in line}
    kept = {"tests/gateway/test_traffic.py", "tests/test_settings.py", "tests/keys/test_services.py"}
    assert selected == kept, collected[-2000:]
    assert "test_a_crashed_workers_lease_frees_within_its_lease_period" not in collected
    assert "test_embedded_default_uses_sqlite_and_a_serverless_broker" not in collected
    assert "test_test_suite_runs_on_postgresql" in collected
