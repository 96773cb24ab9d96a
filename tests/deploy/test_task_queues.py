"""Every queue a task is routed to has a worker that consumes it, in each way ClawHub runs: the compose file,
the Kubernetes manifests, the worker image's default command and ``./dev run``'s embedded worker. A queue
nobody consumes fails silently: its periodic tasks just stop running."""

import importlib
import json
import pkgutil

import pytest

import workers.tasks
from clawhub.core import tasks
from clawhub.web.management.commands.serve import _app_children
from tests.deploy.conftest import DEPLOY, load_k8s_documents
from workers.celery import app

# Served by any worker started without -Q, and by the tests' own workers; no deployed task is routed there.
UNDEPLOYED = {tasks.DEFAULT_QUEUE}


def _queues(argv: list[str]) -> set[str]:
    return set(argv[argv.index("-Q") + 1].split(",")) if "-Q" in argv else set()


def test_every_task_is_declared_and_routed_to_its_queue():
    for module in pkgutil.iter_modules(workers.tasks.__path__):  # every task module, as the worker loads them
        importlib.import_module(f"workers.tasks.{module.name}")
    ours = {name for name in app.tasks if name.startswith("clawhub.")}
    assert ours == set(tasks.TASK_QUEUES)
    for name, queue in tasks.TASK_QUEUES.items():
        assert app.tasks[name].queue == queue, name
        assert app.amqp.router.route({}, name)["queue"].name == queue, name
    for entry in app.conf.beat_schedule.values():
        assert entry["options"]["queue"] == tasks.TASK_QUEUES[entry["task"]], entry


def test_compose_workers_consume_every_queue(compose):
    consumed = set().union(*(_queues(s["command"]) for s in compose["services"].values()
                             if isinstance(s.get("command"), list) and "worker" in s["command"]))
    assert set(tasks.QUEUES) - UNDEPLOYED <= consumed


def test_kubernetes_workers_consume_every_queue():
    consumed = set()
    for _, doc in load_k8s_documents():
        if doc.get("kind") != "Deployment":
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            consumed |= _queues([str(a) for a in container.get("command", []) + container.get("args", [])])
    assert set(tasks.QUEUES) - UNDEPLOYED <= consumed


def test_the_worker_image_consumes_judge_and_housekeeping():
    lines = (DEPLOY / "Dockerfile.worker").read_text().splitlines()
    cmd = json.loads(next(line for line in lines if line.startswith("CMD "))[4:])
    assert _queues(cmd) == {"judge", "housekeeping"}


@pytest.mark.django_db(databases=[])
def test_the_embedded_worker_consumes_every_queue():
    worker = next(c for c in _app_children({}, host="127.0.0.1", port=8000) if c.name == "worker")
    assert _queues(worker.argv) == set(tasks.QUEUES)
