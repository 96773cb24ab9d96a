"""deploy/compose.yaml validates against the Compose Specification schema and wires the topology right."""

import copy
import importlib.resources
import json

import jsonschema
import pytest

from tests.deploy.conftest import DEPLOY


@pytest.fixture(scope="module")
def compose_schema() -> dict:
    # The Compose Specification's JSON schema as vendored by check-jsonschema (--builtin-schema
    # vendor.compose-spec).
    vendor = importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
    return json.loads((vendor / "compose-spec.json").read_text(encoding="utf-8"))


def errors(schema: dict, document: dict) -> list[str]:
    validator = jsonschema.validators.validator_for(schema)(schema, format_checker=jsonschema.FormatChecker())
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def test_compose_file_matches_the_compose_specification(compose, compose_schema):
    assert errors(compose_schema, compose) == []


def test_the_schema_check_catches_a_mistake(compose, compose_schema):
    broken = copy.deepcopy(compose)
    broken["services"]["web"]["depends_onn"] = ["postgres"]
    assert errors(compose_schema, broken)


def test_services(compose):
    assert {
        "postgres",
        "redis",
        "migrate",
        "web",
        "worker-judge",
        "worker-train",
        "beat",
        "vllm",
        "nginx",
    } <= set(compose["services"])


def test_app_services_read_env_example_and_wait_for_healthy_data_stores(compose):
    for name in ("migrate", "web", "worker-judge", "worker-train", "beat"):
        service = compose["services"][name]
        assert {"path": "./env.example"} in service["env_file"]
        assert (DEPLOY / "env.example").is_file()
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("web", "worker-judge", "worker-train", "beat"):
        depends = compose["services"][name]["depends_on"]
        assert depends["redis"]["condition"] == "service_healthy"
        assert depends["migrate"]["condition"] == "service_completed_successfully"
    assert compose["services"]["nginx"]["depends_on"]["web"]["condition"] == "service_healthy"


def test_web_runs_gunicorn_with_uvicorn_workers(compose):
    command = compose["services"]["web"]["command"]
    assert command[:2] == ["gunicorn", "clawhub.asgi:application"]
    assert "uvicorn.workers.UvicornWorker" in command


def test_workers_consume_their_queues(compose):
    judge = compose["services"]["worker-judge"]["command"]
    assert (
        judge[:4] == ["celery", "-A", "workers.celery", "worker"]
        and judge[judge.index("-Q") + 1].split(",") == ["judge", "housekeeping"]
    )
    train = compose["services"]["worker-train"]["command"]
    assert train[train.index("-Q") + 1] == "train"
    assert train[train.index("--concurrency") + 1] == "1"
    assert train[train.index("--prefetch-multiplier") + 1] == "1"
    assert "beat" in compose["services"]["beat"]["command"]


def gpu_devices(service: dict) -> list[dict]:
    return service["deploy"]["resources"]["reservations"]["devices"]


def test_gpu_reservations_and_the_shared_adapters_volume(compose):
    for name in ("worker-train", "vllm"):
        devices = gpu_devices(compose["services"][name])
        assert devices and all("gpu" in d["capabilities"] for d in devices)
    mounts = {
        name: [v.split(":") for v in compose["services"][name]["volumes"]]
        for name in ("worker-train", "vllm")
    }
    train_path = next(m[1] for m in mounts["worker-train"] if m[0] == "adapters")
    vllm_path = next(m[1] for m in mounts["vllm"] if m[0] == "adapters")
    # The gateway hands vLLM the path the trainer wrote: it must be the same inside both containers.
    assert train_path == vllm_path == "/var/lib/clawhub/adapters"
    assert "adapters" in compose["volumes"]


def test_vllm_command(compose):
    vllm = compose["services"]["vllm"]
    command = " ".join(vllm["command"])
    assert 'vllm serve "$$CLAWHUB_BASE_MODEL"' in command
    for flag in (
        "--enable-lora",
        "--max-loras 8",
        "--max-lora-rank 16",
        "--enable-auto-tool-choice",
        "--tool-call-parser hermes",
    ):
        assert flag in command
    assert vllm["environment"]["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"


def test_nginx_mounts_the_config_and_vllm_is_not_published(compose):
    assert "./nginx.conf:/etc/nginx/nginx.conf:ro" in compose["services"]["nginx"]["volumes"]
    # Only nginx is reachable from outside; vLLM has no per-user auth.
    published = [name for name, s in compose["services"].items() if s.get("ports")]
    assert published == ["nginx"]
