"""The README's benchmark commands work right after ``./dev run``: the run lock carries what they import."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _pins(lock: str) -> dict[str, str]:
    text = (ROOT / "requirements" / lock).read_text()
    return dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", text, flags=re.M))


def test_the_run_lock_has_the_benchmark_clients_at_the_dev_locks_versions():
    run, dev = _pins("run.txt"), _pins("dev.txt")
    # bench_personas drives /v1 with the openai SDK; bench_trainer needs torch.
    for package in ("openai", "torch", "httpx"):
        assert package in run, f"requirements/run.txt lacks {package}"
        assert run[package] == dev[package]
