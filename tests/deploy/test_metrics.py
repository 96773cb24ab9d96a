"""/metrics: who may read it, what it exposes, and that values move and add up across processes."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from django.apps import apps
from django.conf import settings
from django.test import Client, override_settings

from clawhub.core import metrics
from tests.deploy.conftest import ROOT

PUBLIC_ADDRESS = "203.0.113.9"


@pytest.fixture
def client():
    return Client(enforce_csrf_checks=True)


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus text output, or None."""
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            found = dict(re.findall(r'(\w+)="([^"]*)"', line.partition("}")[0]))
            if found == labels:
                return float(line.rsplit(" ", 1)[1])
    return None


def scrape(client, **extra) -> str:
    response = client.get("/metrics", **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return response.content.decode()


def test_metrics_refused_from_a_public_address_without_a_token(client):
    response = client.get("/metrics", REMOTE_ADDR=PUBLIC_ADDRESS)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "permission_denied"


def test_metrics_allowed_from_loopback_by_default(client, db):
    assert "clawhub_gateway_requests" in scrape(client, REMOTE_ADDR="127.0.0.1")


@override_settings(METRICS_TOKEN="s3cret-metrics-token")
def test_metrics_with_the_token_from_anywhere_and_never_with_a_wrong_one(client, db):
    scrape(client, REMOTE_ADDR=PUBLIC_ADDRESS, HTTP_AUTHORIZATION="Bearer s3cret-metrics-token")
    assert client.get("/metrics", REMOTE_ADDR=PUBLIC_ADDRESS).status_code == 403
    wrong = client.get("/metrics", REMOTE_ADDR="127.0.0.1", HTTP_AUTHORIZATION="Bearer guess")
    assert wrong.status_code == 403


@override_settings(METRICS_TOKEN="", METRICS_ALLOWED_NETS=[])
def test_metrics_closed_when_neither_token_nor_networks_are_set(client):
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 403
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1", HTTP_AUTHORIZATION="Bearer ").status_code == 403


@override_settings(METRICS_ALLOWED_NETS=["10.0.0.0/8"])
def test_metrics_allowed_networks_are_cidrs(client, db):
    scrape(client, REMOTE_ADDR="10.42.0.7")
    assert client.get("/metrics", REMOTE_ADDR="11.0.0.1").status_code == 403


def test_a_counter_moves_after_it_is_incremented(client, db):
    labels = {"route": "chat", "model": "clawhub-personal", "status": "200"}
    before = sample(scrape(client), "clawhub_gateway_requests_total", **labels) or 0.0
    metrics.GATEWAY_REQUESTS.labels(**labels).inc()
    metrics.GATEWAY_TOKENS.labels(kind="completion", model="clawhub-personal").inc(42)
    metrics.GATEWAY_TIME_TO_FIRST_TOKEN.labels(route="chat", model="clawhub-personal").observe(0.2)
    text = scrape(client)
    assert sample(text, "clawhub_gateway_requests_total", **labels) == before + 1
    assert sample(text, "clawhub_gateway_tokens_total", kind="completion", model="clawhub-personal") >= 42
    assert (
        sample(
            text,
            "clawhub_gateway_time_to_first_token_seconds_bucket",
            route="chat",
            model="clawhub-personal",
            le="0.25",
        )
        >= 1
    )


def test_every_metric_family_is_exposed(client, db):
    text = scrape(client)
    for family, kind in [
        ("clawhub_gateway_requests", "counter"),
        ("clawhub_gateway_request_duration_seconds", "histogram"),
        ("clawhub_gateway_time_to_first_token_seconds", "histogram"),
        ("clawhub_gateway_tokens", "counter"),
        ("clawhub_quota_rejections", "counter"),
        ("clawhub_upstream_errors", "counter"),
        ("clawhub_capture_failures", "counter"),
        ("clawhub_adapter_loads", "counter"),
        ("clawhub_adapter_load_duration_seconds", "histogram"),
        ("clawhub_adapter_evictions", "counter"),
        ("clawhub_task_duration_seconds", "histogram"),
        ("clawhub_queue_depth", "gauge"),
        # read at scrape time from the capture log (the gateway app registers it)
        ("clawhub_capture_spool_bytes", "gauge"),
    ]:
        # The text format names counters with their _total suffix.
        name = f"{family}_total" if kind == "counter" else family
        assert f"# TYPE {name} {kind}" in text, family


def test_queue_depth_is_read_from_redis_at_scrape_time(client, db):
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    keys = ["judge", "judge\x06\x163", "train"]
    try:
        broker.delete(*keys)
        broker.lpush("judge", "m1", "m2")
        broker.lpush("judge\x06\x163", "m3")  # kombu's list for priority step 3
        broker.lpush("train", "m4")
        text = scrape(client)
        assert sample(text, "clawhub_queue_depth", queue="judge") == 3
        assert sample(text, "clawhub_queue_depth", queue="train") == 1
    finally:
        broker.delete(*keys)
        broker.close()


def test_queue_depth_of_the_filesystem_broker(tmp_path):
    for name in ("1_a.judge.msg", "2_b.judge.msg", "3_c.train.msg", "4_d.default.msg"):
        (tmp_path / name).write_text("{}")
    assert metrics.queue_depths("filesystem://", {"data_folder_in": str(tmp_path)}) == {
        "judge": 2,
        "train": 1,
    }


def test_a_dead_broker_does_not_break_the_scrape(client, db):
    with override_settings(CELERY_BROKER_URL="redis://127.0.0.1:1/0"):
        text = scrape(client)
    assert "clawhub_gateway_requests" in text and "clawhub_queue_depth{" not in text


def test_training_runs_by_state_appear_once_the_training_app_exists(client, db):
    text = scrape(client)
    if apps.is_installed("clawhub.training"):
        assert "# TYPE clawhub_training_runs gauge" in text
    else:
        assert "clawhub_training_runs" not in text


def test_model_label_keeps_series_few():
    assert metrics.model_label("clawhub-group-research-team") == "clawhub-group"
    assert metrics.model_label("clawhub-personal") == "clawhub-personal"
    assert metrics.model_label("gpt-4o") == "other"
    assert metrics.model_label(None) == "none"


_CHILD = """
from clawhub.core import metrics
metrics.GATEWAY_REQUESTS.labels(route="chat", model="base", status="200").inc({n})
"""
_RENDER = """
from prometheus_client import generate_latest
from clawhub.core import metrics
print(generate_latest(metrics.process_registry()).decode())
"""


def test_values_add_up_across_processes_in_multiprocess_mode(tmp_path: Path):
    # gunicorn runs several worker processes; each writes its values to PROMETHEUS_MULTIPROC_DIR and a scrape
    # served by any one of them must show the sum.
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    for n in (2, 3):
        subprocess.run([sys.executable, "-c", _CHILD.format(n=n)], env=env, check=True, timeout=60)
    out = subprocess.run(
        [sys.executable, "-c", _RENDER], env=env, check=True, timeout=60, capture_output=True, text=True
    ).stdout
    assert sample(out, "clawhub_gateway_requests_total", route="chat", model="base", status="200") == 5
