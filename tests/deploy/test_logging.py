"""Structured logs: JSON lines with the request id, ids that travel through Celery, and no key material."""

import io
import json
import logging
import os
import subprocess
import sys

import pytest
from celery.contrib.testing.worker import start_worker
from django.test import Client

from clawhub.core import logging as ops_logging
from clawhub.core import metrics
from tests.deploy.conftest import ROOT
from workers.celery import app as celery_app

KEY = "chk_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8S9t0U1v"


@celery_app.task(name="tests.deploy.echo_request_id")
def echo_request_id() -> str | None:
    return ops_logging.get_request_id()


def capture(
    logger_name: str, *, json_format: bool = True
) -> tuple[logging.Logger, io.StringIO, logging.Handler]:
    """A logger wired like build_logging()'s console handler, writing into a buffer."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(ops_logging.RequestIdFilter())
    handler.addFilter(ops_logging.RedactFilter())
    handler.setFormatter(ops_logging.JsonFormatter() if json_format else logging.Formatter("%(message)s"))
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    return logger, stream, handler


@pytest.fixture
def json_log():
    logger, stream, handler = capture("clawhub.tests.json")
    yield logger, stream
    logger.removeHandler(handler)


def lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_carry_the_request_id_and_extra_fields(json_log):
    logger, stream = json_log
    token = ops_logging.set_request_id("req-123")
    try:
        logger.info("turn stored for tenant %s", 7, extra={"tenant_id": 7, "model": "clawhub-personal"})
    finally:
        ops_logging.reset_request_id(token)
    logger.warning("outside any request")
    first, second = lines(stream)
    assert first["message"] == "turn stored for tenant 7"
    assert first["level"] == "INFO" and first["logger"] == "clawhub.tests.json"
    assert first["request_id"] == "req-123"
    assert first["tenant_id"] == 7 and first["model"] == "clawhub-personal"
    assert first["time"].endswith("+00:00")
    assert second["request_id"] is None


def test_redaction_masks_keys_and_bearer_tokens_everywhere(json_log):
    logger, stream = json_log
    logger.info("key %s used", KEY, extra={"headers": {"authorization": f"Bearer {KEY}"}, "raw": f"x {KEY}"})
    logger.info("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig")
    try:
        raise ValueError(f"bad key {KEY}")
    except ValueError:
        logger.exception("request failed")
    output = stream.getvalue()
    assert "chk_A1b2" not in output and "eyJhbGci" not in output
    first, second, third = lines(stream)
    assert first["message"] == "key chk_[REDACTED] used"
    assert first["headers"]["authorization"] == "Bearer [REDACTED]"
    assert second["message"] == "Authorization: Bearer [REDACTED]"
    assert "ValueError: bad key chk_[REDACTED]" in third["exc"]


def test_redaction_also_protects_plain_text_handlers():
    logger, stream, handler = capture("clawhub.tests.text", json_format=False)
    try:
        logger.error("leaked %s", KEY)
        logger.error("broken format %s %s", KEY)  # a bad %-format must neither crash nor leak
    finally:
        logger.removeHandler(handler)
    assert "chk_[REDACTED]" in stream.getvalue() and "A1b2C3" not in stream.getvalue()


def test_invitation_tokens_in_logged_paths_are_masked(json_log):
    logger, stream = json_log
    token = "Qx3_vT9-aB7cD1eF2gH3iJ4kL5mN6oP7qR8sT9uV0w"  # what secrets.token_urlsafe(32) gives
    logger.warning("Not Found: %s", f"/api/invitations/{token}/accept/")
    logger.info('"GET /invitations/%s/ HTTP/1.1" 404', token)
    output = stream.getvalue()
    assert token not in output and token[:12] not in output
    first, second = lines(stream)
    assert first["message"] == "Not Found: /api/invitations/[REDACTED]/accept/"
    assert second["message"] == '"GET /invitations/[REDACTED]/ HTTP/1.1" 404'
    # A group's numbered invitation (revoke) is not a secret.
    assert ops_logging.redact("/groups/ops/invitations/12/revoke/") == "/groups/ops/invitations/12/revoke/"


def test_short_or_unrelated_strings_are_left_alone():
    assert ops_logging.redact("chk_short and checksum chk_") == "chk_short and checksum chk_"


def test_production_logging_config_emits_redacted_json(tmp_path):
    # dictConfig replaces the process's logging: run it in a child process.
    script = (
        "import logging, logging.config\n"
        "from clawhub.core.logging import build_logging, set_request_id\n"
        "logging.config.dictConfig(build_logging(level='INFO', json_format=True))\n"
        "set_request_id('req-prod')\n"
        f"logging.getLogger('clawhub.gateway').info('auth with %s', '{KEY}', extra={{'status': 401}})\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    (entry,) = [json.loads(line) for line in result.stderr.splitlines()]
    assert entry["message"] == "auth with chk_[REDACTED]"
    assert entry["request_id"] == "req-prod" and entry["status"] == 401


@pytest.fixture
def request_log():
    """Records the request id stamped on django.request's log lines while a request is handled."""
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            seen.append(record.request_id)

    handler = Collect()
    handler.addFilter(ops_logging.RequestIdFilter())
    logger = logging.getLogger("django.request")
    logger.addHandler(handler)
    yield seen
    logger.removeHandler(handler)


def test_middleware_takes_the_clients_request_id_and_echoes_it(db, request_log):
    client = Client(enforce_csrf_checks=True)
    response = client.get("/no-such-page/", HTTP_X_REQUEST_ID="client-req-42")
    assert response.status_code == 404
    assert response["X-Request-Id"] == "client-req-42"
    # django.request logs the 404 after the middleware has returned; the line still carries the id.
    assert request_log == ["client-req-42"]
    assert ops_logging.get_request_id() is None


@pytest.mark.parametrize("sent", [None, "x" * 200, "evil\r\nSet-Cookie: a=b", "has space"])
def test_middleware_makes_a_new_id_when_none_or_an_unsafe_one_is_sent(db, sent):
    client = Client(enforce_csrf_checks=True)
    headers = {"HTTP_X_REQUEST_ID": sent} if sent is not None else {}
    response = client.get("/no-such-page/", **headers)
    assert response["X-Request-Id"] != sent
    assert len(response["X-Request-Id"]) == 32 and int(response["X-Request-Id"], 16) >= 0


def test_the_request_id_travels_to_a_celery_task_and_its_duration_is_recorded():
    ops_logging.connect_celery_signals()
    metrics.connect_celery_signals()
    duration = metrics.TASK_DURATION.labels(task="tests.deploy.echo_request_id", state="SUCCESS")
    count_before = duration._sum.get(), sum(b.get() for b in duration._buckets)
    with start_worker(
        celery_app,
        pool="solo",
        concurrency=1,
        perform_ping_check=False,
        loglevel="WARNING",
        shutdown_timeout=10,
    ):
        token = ops_logging.set_request_id("req-celery-7")
        try:
            result = echo_request_id.delay()
        finally:
            ops_logging.reset_request_id(token)
        assert result.get(timeout=30) == "req-celery-7"
        # Published outside any request: the worker falls back to an id derived from the task id.
        untagged = echo_request_id.delay()
        assert untagged.get(timeout=30) == f"task-{untagged.id}"
    assert sum(b.get() for b in duration._buckets) == count_before[1] + 2
