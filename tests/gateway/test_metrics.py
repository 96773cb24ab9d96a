"""Prometheus metrics and request ids of the /v1 gateway.

The gateway under test runs in this process, so its metrics are in prometheus_client's default registry. Every
assertion looks at the change of a counter across one action: other tests move the same counters.
"""

import re
from dataclasses import replace

import httpx
import openai
import orjson
import pytest
from prometheus_client import REGISTRY

from clawhub.conversations.capture.handoff import HandoffSettings
from clawhub.conversations.capture.records import TurnRecord, decode, encode
from clawhub.conversations.capture.writer import CaptureWriter
from clawhub.gateway.meters import ServedRequests
from tests.factories import make_key, make_user
from tests.gateway.conftest import activate_adapter, inside_one_minute, wait_until
from tests.ports import free_port

MSGS = [{"role": "user", "content": "hi"}]


def value(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Delta:
    """value(name, **labels) now minus when the Delta was made."""

    def __init__(self, name: str, **labels):
        self.name, self.labels = name, labels
        self.start = value(name, **labels)

    def __call__(self) -> float:
        return value(self.name, **self.labels) - self.start


def requests_delta(route="chat", model="clawhub-personal", status="200") -> Delta:
    return Delta("clawhub_gateway_requests_total", route=route, model=model, status=status)


def chat(gateway, secret, **body) -> httpx.Response:
    return httpx.post(f"{gateway.v1}/chat/completions", headers={"Authorization": f"Bearer {secret}"},
                      json={"model": "clawhub-personal", "messages": MSGS, **body}, timeout=30)


def personal_key():
    user = make_user()
    _, secret = make_key(user)
    activate_adapter(user.tenant)
    return secret


def test_a_served_request_counts_requests_duration_and_tokens(gateway):
    secret = personal_key()
    ok = requests_delta()
    duration = Delta("clawhub_gateway_request_duration_seconds_count", route="chat", model="clawhub-personal")
    prompt = Delta("clawhub_gateway_tokens_total", kind="prompt", model="clawhub-personal")
    completion = Delta("clawhub_gateway_tokens_total", kind="completion", model="clawhub-personal")
    ttft = Delta("clawhub_gateway_time_to_first_token_seconds_count", route="chat", model="clawhub-personal")

    usage = chat(gateway, secret).json()["usage"]
    # The writer thread updates the metrics from the record, off the event loop: they arrive with the batch.
    wait_until(lambda: ok() == 1)
    assert duration() == 1 and ttft() == 0
    assert (prompt(), completion()) == (usage["prompt_tokens"], usage["completion_tokens"])

    streamed = requests_delta(route="completions", model="base")
    stream_ttft = Delta("clawhub_gateway_time_to_first_token_seconds_count", route="completions",
                        model="base")
    with httpx.stream("POST", f"{gateway.v1}/completions", headers={"Authorization": f"Bearer {secret}"},
                      json={"model": "base", "prompt": "x", "stream": True}) as response:
        assert response.status_code == 200
        response.read()
    wait_until(lambda: streamed() == 1)
    assert stream_ttft() == 1

    # A Messages request is served as chat and counted under the API the client spoke, as its refusals are.
    messages, as_chat = requests_delta(route="messages"), requests_delta()
    assert httpx.post(f"{gateway.v1}/messages", headers={"x-api-key": secret}, timeout=30, json={
        "model": "clawhub-personal", "max_tokens": 4, "messages": MSGS}).status_code == 200
    wait_until(lambda: messages() == 1)
    assert as_chat() == 0


def test_refusals_before_a_turn_exists_are_counted_too(gateway):
    secret = personal_key()
    unauthorised = requests_delta(model="none", status="401")
    bad = requests_delta(model="none", status="400")  # refused before the body named a model
    assert chat(gateway, "chk_nope").status_code == 401
    assert chat(gateway, secret, n="two").status_code == 400
    assert (unauthorised(), bad()) == (1, 1)

    models = requests_delta(route="models", model="none")
    assert httpx.get(f"{gateway.v1}/models", headers={"Authorization": f"Bearer {secret}"}).status_code == 200
    assert models() == 1


def test_quota_rejections_name_the_limit(gateway):
    _, limited = make_key(make_user(), rpm_limit=1)
    inside_one_minute()
    rejections = Delta("clawhub_quota_rejections_total", limit="rpm")
    too_many = requests_delta(model="base", status="429")
    assert chat(gateway, limited, model="base").status_code == 200
    assert chat(gateway, limited, model="base").status_code == 429
    assert (rejections(), too_many()) == (1, 1)


def test_upstream_errors_by_kind(gateway_factory, fake):
    secret = personal_key()
    gateway = gateway_factory([fake.url], read_timeout=0.5)
    kinds = {kind: Delta("clawhub_upstream_errors_total", kind=kind)
             for kind in ("http_5xx", "http_4xx", "timeout", "cut")}
    assert chat(gateway, secret, fake_fault="refuse").status_code == 502
    assert chat(gateway, secret, fake_fault="detail").status_code == 400
    assert chat(gateway, secret, fake_fault="sleep", fake_sleep=2).status_code == 504
    with httpx.stream("POST", f"{gateway.v1}/chat/completions", headers={"Authorization": f"Bearer {secret}"},
                      json={"model": "clawhub-personal", "messages": MSGS, "stream": True,
                            "fake_fault": "die:3"}) as response:
        response.read()
    counted = {kind: delta() for kind, delta in kinds.items()}
    assert counted == {"http_5xx": 1, "http_4xx": 1, "timeout": 1, "cut": 1}
    failed = requests_delta(status="502")
    assert chat(gateway, secret, fake_fault="refuse").status_code == 502
    wait_until(lambda: failed() == 1)


def test_no_healthy_upstream_counts_connect_and_no_upstream(gateway_factory):
    secret = personal_key()
    gateway = gateway_factory([f"http://127.0.0.1:{free_port()}"], health_interval=60)
    gateway.app.pool.upstreams[0].healthy = True  # as if the last check had passed: the connect fails now
    connect = Delta("clawhub_upstream_errors_total", kind="connect")
    none = Delta("clawhub_upstream_errors_total", kind="no_upstream")
    assert chat(gateway, secret, model="base").status_code == 503
    assert (connect(), none()) == (1, 1)


def test_adapter_loads_and_no_evictions_by_the_gateway(gateway_factory, fake):
    gateway = gateway_factory([fake.url], max_adapters=1)
    loads_ok = Delta("clawhub_adapter_loads_total", outcome="ok")
    loads_error = Delta("clawhub_adapter_loads_total", outcome="error")
    load_time = Delta("clawhub_adapter_load_duration_seconds_count")
    lru = Delta("clawhub_adapter_evictions_total", reason="lru")
    first, second = personal_key(), personal_key()
    assert chat(gateway, first).status_code == 200
    assert chat(gateway, second).status_code == 200  # capacity 1: vLLM evicts on its own, the gateway not
    broken = make_user()
    _, broken_secret = make_key(broken)
    activate_adapter(broken.tenant, path="/srv/adapters/missing")
    assert chat(gateway, broken_secret).status_code == 502
    assert (loads_ok(), loads_error(), load_time(), lru()) == (2, 1, 3, 0)


@pytest.mark.django_db(transaction=True)
def test_capture_failures_by_reason(tmp_path):
    """A full spool drops (and counts) a turn; a record that keeps failing goes to the dead letters."""
    def broken_store(batch):
        raise RuntimeError("this record cannot be stored")

    record = TurnRecord(request_id="r1", route="chat", key_id=1, user_id=1, tenant_id=1, group_id=None,
                        model="base", upstream_model="tiny", adapter_version_id=None, upstream="",
                        status="complete", http_status=200, started_at=0.0, latency_ms=1.0)
    full = Delta("clawhub_capture_failures_total", reason="spool_full")
    dead = Delta("clawhub_capture_failures_total", reason="dead_letter")
    served = requests_delta(model="base")

    one_record = len(encode(record)) + 40
    cfg = HandoffSettings.from_settings(redis_url="", spool_dir=tmp_path, spool_max_bytes=one_record,
                                        max_attempts=2)
    writer = CaptureWriter(store=broken_store, handoff=cfg, interval=0.01, observer=ServedRequests())
    writer.start()  # no event loop here: records go straight to the spool
    assert writer.submit(record) and not writer.submit(replace(record, request_id="r2"))
    assert full() == 1
    wait_until(lambda: dead() == 1)  # the consumer thread tried r1 twice, then moved it aside
    writer.stop()
    assert served() == 2  # a dropped record's request is still counted
    letters = (writer.cfg.spool_dir / "dead-letters.jsonl").read_text().splitlines()
    assert len(letters) == 1
    letter = orjson.loads(letters[0])
    assert decode(letter["payload"].encode()) == record and "failed 2 times" in letter["reason"]


def test_request_ids_are_echoed_recorded_and_cleaned(gateway):
    secret = personal_key()
    made = chat(gateway, secret).headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", made)
    assert gateway.spy.last().trace_id == made

    response = httpx.post(f"{gateway.v1}/chat/completions", timeout=30,
                          headers={"Authorization": f"Bearer {secret}", "X-Request-Id": "trace-42.a:b"},
                          json={"model": "clawhub-personal", "messages": MSGS, "stream": True})
    assert response.headers["x-request-id"] == "trace-42.a:b"
    records = gateway.spy.wait_for(2)
    assert records[-1].trace_id == "trace-42.a:b"
    # The record keeps its own unique id for capture: a client may send the same X-Request-Id twice.
    assert records[-1].request_id != records[-2].request_id != "trace-42.a:b"

    # Refusals carry it too, and an id unfit for logs and headers is replaced.
    refused = httpx.get(f"{gateway.v1}/models", headers={"X-Request-Id": "x" * 200})
    assert refused.status_code == 401 and re.fullmatch(r"[0-9a-f]{32}", refused.headers["x-request-id"])

    sdk = openai.OpenAI(base_url=gateway.v1, api_key=secret, max_retries=0)
    raw = sdk.chat.completions.with_raw_response.create(model="clawhub-personal", messages=MSGS,
                                                        extra_headers={"X-Request-Id": "sdk-1"})
    assert raw.headers["x-request-id"] == "sdk-1"
