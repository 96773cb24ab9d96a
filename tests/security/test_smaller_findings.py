"""Finding 9 (the smaller ones): upstream error bodies are logged by shape, artifact paths are for staff,
vLLM in Kubernetes needs a key and is reachable only from the gateway and the workers."""

from pathlib import Path

import httpx
import pytest
import yaml

from clawhub.adapters.models import AdapterVersion
from clawhub.groups.models import Role
from tests.factories import add_member, make_group, make_user
from tests.review.conftest import ApiAs
from workers.upstream_errors import body_shape

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
PROMPT = "my diary: the thing I told nobody"


def test_an_upstream_error_body_is_described_not_quoted():
    echoed = httpx.Response(400, json={"error": {"message": f"This prompt is too long: '{PROMPT}'",
                                                 "type": "BadRequestError", "code": 400}})
    shape = body_shape(echoed)
    assert PROMPT not in shape and "diary" not in shape
    assert "application/json" in shape and "type=BadRequestError" in shape and "code=400" in shape
    assert "diary" not in body_shape(httpx.Response(500, text=f"Internal error on {PROMPT}"))


@pytest.mark.django_db
def test_artifact_paths_are_shown_to_staff_only():
    owner = make_user()
    group = make_group(owner)
    viewer = add_member(group, make_user(), Role.VIEWER)
    version = AdapterVersion.objects.create(tenant=group.tenant, version=1, state="active",
                                            artifact_path="/srv/clawhub/adapters/t9/v1")
    url = f"/api/adapters/versions/{version.pk}/"
    for person in (viewer, owner):
        body = ApiAs(person).get(url).json()
        assert body["artifact_path"] is None and body["version"] == 1
    assert ApiAs(make_user(is_staff=True)).get(url).json()["artifact_path"] == "/srv/clawhub/adapters/t9/v1"


@pytest.mark.django_db
def test_adapter_metrics_do_not_tell_a_tenant_about_other_tenants_runs():
    """Finding N14: a version's metrics said how many runs (of every tenant) used the train worker's resident
    base and how many tenants trained in the same pass. Site staff still see them."""
    owner = make_user()
    trainer = {"resident": {"loads": 1, "evictions": 0, "runs_on_this_load": 7}, "pass_tenants": 3,
               "base_seconds": 0.0}
    version = AdapterVersion.objects.create(tenant=owner.tenant, version=1, state="active",
                                            metrics={"steps": 4, "samples": 16, "trainer": trainer})
    url = f"/api/adapters/versions/{version.pk}/"
    mine = ApiAs(owner).get(url).json()["metrics"]
    assert mine == {"steps": 4, "samples": 16}
    assert ApiAs(make_user(is_staff=True)).get(url).json()["metrics"]["trainer"] == trainer


def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


def test_vllm_in_kubernetes_needs_an_api_key_from_the_secret():
    statefulset = _docs("vllm-statefulset.yaml")[0]
    container = statefulset["spec"]["template"]["spec"]["containers"][0]
    assert '--api-key "$VLLM_API_KEY"' in " ".join(container["args"])
    env = {e["name"]: e for e in container["env"]}
    assert env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "clawhub-secrets",
                                                               "key": "CLAWHUB_UPSTREAM_API_KEY"}


def test_only_the_gateway_and_workers_reach_vllm():
    policy = _docs("vllm-networkpolicy.yaml")[0]
    assert policy["kind"] == "NetworkPolicy"
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "vllm"
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    [rule] = policy["spec"]["ingress"]
    [source] = rule["from"]
    [expression] = source["podSelector"]["matchExpressions"]
    assert expression["key"] == "app.kubernetes.io/component" and expression["operator"] == "In"
    assert set(expression["values"]) == {"web", "worker-judge", "worker-train", "capture-consumer"}
    assert rule["ports"] == [{"protocol": "TCP", "port": 8000}]
    assert "vllm-networkpolicy.yaml" in yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]


def test_the_upstream_api_key_fills_upstreams_without_their_own(monkeypatch):
    import os
    import subprocess
    import sys

    code = ("import django; django.setup(); from django.conf import settings; "
            "print([u['api_key'] for u in settings.CLAWHUB_UPSTREAMS])")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "clawhub.settings.test",
           "CLAWHUB_UPSTREAM_API_KEY": "k" * 32,
           "CLAWHUB_UPSTREAMS": '[{"url": "http://a", "api_key": ""}, {"url": "http://b", "api_key": "own"}]'}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(["k" * 32, "own"])
