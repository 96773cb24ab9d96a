"""The capture hand-off's parts: the record format, the spool, the consumer's recovery of a crashed writer,
and the gateway's fallbacks (stale lookups, fail-open quotas). The whole path under faults is in
test_durability.py."""

import asyncio
import os
from dataclasses import replace

import httpx
import orjson
import pytest
from prometheus_client import REGISTRY

from clawhub.conversations.capture.consumer import CaptureConsumer
from clawhub.conversations.capture.handoff import HandoffSettings, handoff_state
from clawhub.conversations.capture.records import RawIds, TurnRecord, decode, encode
from clawhub.conversations.capture.spool import FRAME, Spool
from clawhub.conversations.models import Turn
from clawhub.gateway.auth import KeyInfo
from clawhub.gateway.dbreads import CachedLoader
from clawhub.gateway.errors import GatewayError
from clawhub.gateway.quotas import GroupLimits, RedisLimiter
from tests.factories import make_key
from tests.gateway.conftest import wait_until
from tests.ports import free_port


def record(request_id: str = "r1", **fields) -> TurnRecord:
    return TurnRecord(request_id=request_id, route="chat", key_id=1, user_id=1, tenant_id=1, group_id=None,
                      model="base", upstream_model="tiny", adapter_version_id=None, upstream="u",
                      status="complete", http_status=200, started_at=1.0, latency_ms=2.0,
                      request={"messages": [{"role": "user", "content": "hé ✓"}]}, **fields)


def counter(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_records_round_trip_and_survive_fields_added_or_removed():
    original = record(token_ids=[1, 2, 3], logprobs=[-0.5, -0.25], session_id="s")
    assert decode(encode(original)) == original
    # A record written by a newer gateway (an unknown field) or an older one (a field missing) still decodes.
    newer = encode(original)[:-1] + b',"field_from_the_future":1}'
    assert decode(newer) == original
    older = encode(original).replace(b',"trace_id":""', b"")
    assert decode(older) == original


def test_prompt_ids_the_gateway_kept_as_text_follow_the_record_unparsed():
    """vLLM's prompt ids as the gateway cut them out (RawIds) follow the record's JSON after a newline:
    neither side parses them with the record; parsed ids (a list) stay inside the JSON, as every record did
    before."""
    text = b"[151644,8948,0,4294967295]"
    kept = record(token_ids=[1, 2], prompt_token_ids=RawIds(text))
    payload = encode(kept)
    head, tail = payload.split(b"\n")
    assert tail == text and b'"prompt_token_ids":null' in head and b"151644" not in head
    back = decode(payload)
    assert isinstance(back.prompt_token_ids, RawIds) and back.prompt_token_ids.raw == text
    assert back == replace(kept, prompt_token_ids=[151644, 8948, 0, 4294967295]) == kept
    assert len(back.prompt_token_ids) == 4 and list(back.prompt_token_ids) == [151644, 8948, 0, 4294967295]
    parsed = record(prompt_token_ids=[5, 6])
    assert b"\n" not in encode(parsed) and decode(encode(parsed)).prompt_token_ids == [5, 6]
    # The JSON object never holds a raw newline, even when the conversation does.
    newline = replace(kept, request={"messages": [{"role": "user", "content": "a\nb"}]})
    assert decode(encode(newline)) == newline


def test_the_spool_reader_stops_at_a_torn_frame_and_flags_a_damaged_one(tmp_path):
    spool = Spool(tmp_path, max_bytes=10**6)
    spool.open_writer("w1")
    payloads = [encode(record(f"r{i}")) for i in range(3)]
    for payload in payloads:
        assert spool.append(payload)
    segment = spool.instances()[0].segments[0]
    # A write cut by a crash: a header and half a payload.
    with open(segment, "ab") as f:
        f.write(FRAME.pack(len(payloads[0]), 0, 0.0) + payloads[0][:10])
    frames = spool.read(segment, 0, max_records=10, max_bytes=10**6)
    assert [f.payload for f in frames] == payloads
    # One flipped byte inside the second frame: its checksum fails, the frames around it are intact.
    data = bytearray(segment.read_bytes())
    data[frames[0].end + FRAME.size + 5] ^= 0xFF
    segment.write_bytes(bytes(data))
    damaged = spool.read(segment, 0, max_records=10, max_bytes=10**6)
    assert [f.payload is None for f in damaged] == [False, True, False]


def test_a_crashed_writer_is_consumed_and_its_in_flight_requests_counted(tmp_path):
    cfg = HandoffSettings.from_settings(redis_url="", spool_dir=tmp_path)
    writer = Spool(tmp_path, max_bytes=10**6)
    writer.open_writer("dead")
    for rid in ("a", "b", "c"):
        writer.begin(rid)
    for rid in ("a", "b"):
        assert writer.append(encode(record(rid)))
        writer.end(rid)
    os.close(writer._lock_fd)  # the process dies: its lock goes, nothing is closed cleanly

    stored: list[TurnRecord] = []
    consumer = CaptureConsumer(cfg, store=stored.extend)
    for _ in range(4):
        consumer.run_once()
    assert [r.request_id for r in stored] == ["a", "b"]
    state = handoff_state(cfg)
    assert state["lost_in_flight"] == 1 and state["stored"] == 2 and state["backlog_bytes"] == 0
    assert not list(tmp_path.glob("dead.*")), "the dead writer's files are gone once consumed"


def test_a_spool_written_before_prompt_ids_followed_the_record_is_read_after_the_upgrade(tmp_path):
    """A gateway's spool outlives an upgrade (a pod's volume, the embedded data folder): records spooled in
    the old format (one JSON object, ids inside it) and in the new one, side by side, are read alike."""
    cfg = HandoffSettings.from_settings(redis_url="", spool_dir=tmp_path)
    spool = Spool(tmp_path, max_bytes=10**6)
    spool.open_writer("upgraded")
    old = {**orjson.loads(encode(record("old"))), "prompt_token_ids": [7, 8, 9]}
    del old["api"], old["clamped_max_tokens"]  # fields older gateways did not write yet
    assert spool.append(orjson.dumps(old))
    assert spool.append(encode(record("new", prompt_token_ids=RawIds(b"[7,8,10]"))))
    stored: list[TurnRecord] = []
    consumer = CaptureConsumer(cfg, store=stored.extend)
    for _ in range(3):
        consumer.run_once()
    assert [(r.request_id, list(r.prompt_token_ids)) for r in stored] == [("old", [7, 8, 9]),
                                                                           ("new", [7, 8, 10])]
    assert handoff_state(cfg)["dead_letters"] == 0


@pytest.mark.django_db(transaction=True)
def test_the_gateway_on_the_spool_alone_stores_turns(gateway_factory, fake, settings):
    """The embedded default: no Redis, the spool is the log, the consumer stores real turns."""
    settings.REDIS_URL = ""  # serve_gateway hands the limiter settings.REDIS_URL too
    gw = gateway_factory([fake.url], real_capture=True)
    assert gw.app.writer.cfg.redis_url == ""
    key, secret = make_key()
    for i in range(3):
        response = httpx.post(f"{gw.v1}/chat/completions", headers={"Authorization": f"Bearer {secret}"},
                              json={"model": "base", "messages": [{"role": "user", "content": f"hi {i}"}]},
                              timeout=30)
        assert response.status_code == 200
    wait_until(lambda: Turn.objects.filter(key=key).count() == 3, timeout=20)
    assert gw.app.writer.spool.used_bytes > 0  # it went through the spool file


def test_lookups_serve_the_last_good_value_while_the_database_is_down():
    async def scenario():
        answers = {"k": "v1"}
        down = {"on": False}

        async def load(key):
            if down["on"]:
                raise ConnectionError("database unreachable")
            return answers.get(key)

        cache = CachedLoader(load, ttl=0.0, what="key", stale_for=60, timeout=1)
        assert await cache.get("k") == "v1"
        down["on"] = True
        stale = counter("clawhub_gateway_stale_served_total", what="key")
        assert await cache.get("k") == "v1"  # past its TTL, but the last good value
        assert counter("clawhub_gateway_stale_served_total", what="key") == stale + 1
        with pytest.raises(GatewayError) as refused:
            await cache.get("never-seen")
        assert refused.value.status == 503 and refused.value.retry_after
        # Back up: the first successful read wins, a revocation included.
        down["on"] = False
        answers["k"] = None
        cache.forget("k")
        assert await cache.get("k") is None

    asyncio.run(scenario())


def test_a_lookup_admission_confirms_stays_fresh_until_its_max_age(monkeypatch):
    """Confirmed (its generation found unchanged) it is not read again every ttl; unconfirmed (Redis away)
    it expires after ttl as before; confirmed or not, it is read again ten ttls (at most CONFIRMED_MAX_AGE)
    after its read."""
    from types import SimpleNamespace

    from clawhub.gateway import dbreads

    clock = [1000.0]
    monkeypatch.setattr(dbreads, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    cache = CachedLoader(None, ttl=60.0, what="key")
    cache.put("k", "v")
    for _ in range(9):  # 450 s, each step within the ttl of the last confirmation
        clock[0] += 50
        assert cache.peek("k") == (True, "v")
        cache.confirm("k")
    clock[0] += 59
    assert cache.peek("k") == (True, "v")
    clock[0] += 2  # 511 s after the read, 61 s after the last confirmation
    assert cache.peek("k") == (False, None)
    cache.put("k", "v2")
    for _ in range(12):
        clock[0] += 50
        cache.confirm("k")
    assert cache.peek("k") == (False, None)  # 600 s after its read however often confirmed
    cache.confirm("never-read")
    assert cache.peek("never-read") == (False, None)
    short = CachedLoader(None, ttl=2.0, what="key")
    short.put("k", "v")
    for _ in range(10):
        clock[0] += 1.5
        short.confirm("k")
    assert short.peek("k") == (True, "v")  # 15 s after its read
    clock[0] += 5.1
    short.confirm("k")
    assert short.peek("k") == (False, None)  # ten ttls: 20 s


def test_quotas_fail_open_with_a_metric_when_redis_does_not_answer():
    info = KeyInfo(key_id=1, user_id=1, tenant_id=1, group_id=None, model_id="clawhub-personal",
                   allowed_models=frozenset(), rpm=1, tpm=None, concurrency=None, expires_at=None,
                   generation_key="g")

    async def scenario():
        limiter = RedisLimiter(f"redis://127.0.0.1:{free_port()}/0", GroupLimits(), slot_ttl=10, timeout=0.2)
        before = counter("clawhub_redis_failures_total", part="quota")
        assert await limiter.admit(info, "r1", "7") == (True, None)  # admitted, nothing checked
        assert await limiter.admit(info, "r2", "7") == (True, None)  # rpm=1, but nothing can be counted
        await limiter.release(info, "r1", 10)
        assert counter("clawhub_redis_failures_total", part="quota") == before + 2
        await limiter.close()

    asyncio.run(scenario())


def test_a_spool_refuses_records_beyond_its_byte_bound(tmp_path):
    payload = encode(record())
    spool = Spool(tmp_path, max_bytes=2 * (FRAME.size + len(payload)))
    spool.open_writer("w")
    assert spool.append(payload) and spool.append(payload)
    assert not spool.append(encode(replace(record(), request_id="r3")))
    spool.close_writer()
