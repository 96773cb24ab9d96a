"""The Kubernetes manifests validate offline against Kubernetes 1.30's schemas and describe the topology."""

import copy

import pytest
import yaml
from kubernetes_validate import utils as k8s

from tests.deploy.conftest import DEPLOY, load_k8s_documents

K8S_VERSION = "1.30.0"
DOCS = [(path, doc) for path, doc in load_k8s_documents() if doc.get("kind") != "Kustomization"]


def by_name(kind: str, name: str) -> dict:
    for _, doc in DOCS:
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            return doc
    raise AssertionError(f"no {kind} {name} in deploy/k8s")


def pod_spec(doc: dict) -> dict:
    return doc["spec"]["template"]["spec"]


def container(doc: dict, index: int = 0) -> dict:
    return pod_spec(doc)["containers"][index]


@pytest.mark.parametrize("path,doc", DOCS, ids=[f"{p.name}:{d['kind']}" for p, d in DOCS])
def test_manifest_is_valid_kubernetes(path, doc):
    # strict: unknown fields are errors too (a typo like "livenessProbes" would otherwise pass silently).
    k8s.validate(doc, K8S_VERSION, strict=True)
    assert "namespace" not in doc["metadata"], f"{path.name}: manifests are namespace-less"


def test_the_validator_rejects_a_broken_manifest():
    broken = copy.deepcopy(by_name("StatefulSet", "clawhub-web"))
    container(broken)["livenessProbes"] = container(broken).pop("livenessProbe")
    with pytest.raises(k8s.ValidationError):
        k8s.validate(broken, K8S_VERSION, strict=True)


def test_kustomization_lists_every_manifest_and_nothing_else():
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    on_disk = {p.name for p in (DEPLOY / "k8s").glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk


def test_the_topology_is_complete():
    kinds = {(doc["kind"], doc["metadata"]["name"]) for _, doc in DOCS}
    assert {
        ("StatefulSet", "clawhub-web"),
        ("Service", "clawhub-web"),
        ("HorizontalPodAutoscaler", "clawhub-web"),
        ("PodDisruptionBudget", "clawhub-web"),
        ("Deployment", "clawhub-worker-judge"),
        ("HorizontalPodAutoscaler", "clawhub-worker-judge"),
        ("PodDisruptionBudget", "clawhub-worker-judge"),
        ("Deployment", "clawhub-worker-train"),
        ("Deployment", "clawhub-beat"),
        ("StatefulSet", "clawhub-vllm"),
        ("Service", "clawhub-vllm"),
        ("Job", "clawhub-migrate"),
        ("ConfigMap", "clawhub-config"),
        ("PersistentVolumeClaim", "clawhub-adapters"),
    } <= kinds


def test_no_secret_values_in_the_repository():
    assert not [path.name for path, doc in DOCS if doc["kind"] == "Secret"]
    for _, doc in DOCS:
        if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
            for c in pod_spec(doc).get("containers", []) + pod_spec(doc).get("initContainers", []):
                for env in c.get("env", []):
                    assert (
                        not any(w in env["name"] for w in ("SECRET", "PASSWORD", "TOKEN"))
                        or "valueFrom" in env
                    )


def test_app_pods_read_config_and_the_clawhub_secrets_secret():
    for kind, name in (("StatefulSet", "clawhub-web"), ("Deployment", "clawhub-worker-judge"),
                       ("Deployment", "clawhub-worker-train"), ("Deployment", "clawhub-beat"),
                       ("Deployment", "clawhub-capture-consumer")):
        refs = container(by_name(kind, name))["envFrom"]
        assert {"configMapRef": {"name": "clawhub-config"}} in refs
        assert {"secretRef": {"name": "clawhub-secrets"}} in refs
    assert {"secretRef": {"name": "clawhub-secrets"}} in container(by_name("Job", "clawhub-migrate"))[
        "envFrom"
    ]


def test_web_probes_and_migrations_first():
    web = by_name("StatefulSet", "clawhub-web")
    c = container(web)
    # The gateway's readiness, which a database outage does not fail: /v1 keeps serving known keys through it.
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz/gateway"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    init = pod_spec(web)["initContainers"][0]
    assert "migrate --check" in " ".join(init["command"])
    # Long streams must be allowed to finish on shutdown.
    assert pod_spec(web)["terminationGracePeriodSeconds"] >= 600


def test_the_capture_consumer_waits_for_migrations():
    """Started before the migration Job has run, it would fail every record against the old schema."""
    consumer = by_name("Deployment", "clawhub-capture-consumer")
    init = pod_spec(consumer)["initContainers"][0]
    assert "migrate --check" in " ".join(init["command"])
    assert init["image"] == container(consumer)["image"] and init["envFrom"] == container(consumer)["envFrom"]


def test_the_capture_spool_survives_a_pod_restart():
    """The web pods' spool (turns waiting while Redis is down, the in-flight journals) is on a claim of each
    replica's own, kept when a pod is deleted or the set scaled down, never on an emptyDir."""
    web = by_name("StatefulSet", "clawhub-web")
    data_dir = by_name("ConfigMap", "clawhub-config")["data"]["CLAWHUB_DATA_DIR"]
    spool_dir = by_name("ConfigMap", "clawhub-config")["data"].get("CLAWHUB_CAPTURE_SPOOL_DIR",
                                                                   f"{data_dir}/capture")
    mount = next(m for m in container(web)["volumeMounts"] if m["mountPath"] == spool_dir)
    assert not any(v["name"] == mount["name"] for v in pod_spec(web)["volumes"])  # not a pod volume
    claim = next(t for t in web["spec"]["volumeClaimTemplates"] if t["metadata"]["name"] == mount["name"])
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert web["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain",
                                                                   "whenScaled": "Retain"}
    assert pod_spec(web)["securityContext"]["fsGroup"] == pod_spec(web)["securityContext"]["runAsUser"]


def test_gpu_pods_land_on_gpu_nodes_and_share_the_adapters_volume_at_one_path():
    train = by_name("Deployment", "clawhub-worker-train")
    vllm = by_name("StatefulSet", "clawhub-vllm")
    for doc in (train, vllm):
        spec = pod_spec(doc)
        assert container(doc)["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert spec["nodeSelector"]
        assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
        claims = {
            v["name"]: v["persistentVolumeClaim"]["claimName"]
            for v in spec["volumes"]
            if "persistentVolumeClaim" in v
        }
        mounts = {m["name"]: m["mountPath"] for m in container(doc)["volumeMounts"]}
        adapters = next(name for name, claim in claims.items() if claim == "clawhub-adapters")
        assert mounts[adapters] == "/var/lib/clawhub/adapters"
    assert by_name("PersistentVolumeClaim", "clawhub-adapters")["spec"]["accessModes"] == ["ReadWriteMany"]


def test_train_worker_takes_one_task_at_a_time_and_beat_is_single():
    args = container(by_name("Deployment", "clawhub-worker-train"))["args"]
    assert args[args.index("-Q") + 1] == "train"
    assert args[args.index("--concurrency") + 1] == "1"
    assert args[args.index("--prefetch-multiplier") + 1] == "1"
    beat = by_name("Deployment", "clawhub-beat")
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"]["type"] == "Recreate"


def test_vllm_serves_loras_at_runtime_with_tool_calls_and_a_health_readiness():
    vllm = by_name("StatefulSet", "clawhub-vllm")
    c = container(vllm)
    command = " ".join(c["args"])
    for flag in (
        "--enable-lora",
        "--max-loras",
        "--max-lora-rank",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
    ):
        assert flag in command
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    # Each replica is addressable on its own through the headless Service, as CLAWHUB_UPSTREAMS lists them.
    assert by_name("Service", "clawhub-vllm")["spec"]["clusterIP"] == "None"
    assert vllm["spec"]["serviceName"] == "clawhub-vllm"
    upstreams = yaml.safe_load(by_name("ConfigMap", "clawhub-config")["data"]["CLAWHUB_UPSTREAMS"])
    assert [u["url"] for u in upstreams] == [
        f"http://clawhub-vllm-{i}.clawhub-vllm:8000" for i in range(vllm["spec"]["replicas"])
    ]


def test_autoscalers_and_budgets_target_what_exists():
    for name in ("clawhub-web", "clawhub-worker-judge"):
        hpa = by_name("HorizontalPodAutoscaler", name)
        target = hpa["spec"]["scaleTargetRef"]
        scaled = by_name(target["kind"], target["name"])
        # CPU utilisation needs CPU requests on the target's containers.
        assert container(scaled)["resources"]["requests"]["cpu"]
        pdb = by_name("PodDisruptionBudget", name)
        labels = scaled["spec"]["template"]["metadata"]["labels"]
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_app_containers_run_as_non_root():
    for _, doc in DOCS:
        if doc["kind"] in ("Deployment", "Job") or (doc["kind"], doc["metadata"]["name"]) == ("StatefulSet",
                                                                                            "clawhub-web"):
            assert pod_spec(doc)["securityContext"]["runAsNonRoot"] is True
            assert pod_spec(doc)["securityContext"]["runAsUser"] != 0
