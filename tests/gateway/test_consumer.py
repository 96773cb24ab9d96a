"""The capture consumer on the real Redis stream and the real capture_store: a record that fails to store
while the database answers is retried, then dead-lettered with a metric, and never acknowledged silently; the
good records around it are stored. In-process (the consumer's process is not what is under test here; the
killed consumer is in test_durability.py)."""

import dataclasses
import uuid

import pytest
import redis
from django.db import OperationalError
from prometheus_client import REGISTRY

from clawhub.conversations.capture import store
from clawhub.conversations.capture.consumer import CaptureConsumer
from clawhub.conversations.capture.handoff import HandoffSettings, handoff_state
from clawhub.conversations.capture.records import RawIds, decode, encode
from clawhub.conversations.models import Turn
from clawhub.conversations.selectors import turn_prompt_token_ids
from clawhub.usage.models import UsageDaily
from tests.conversations.conftest import make_record, user
from tests.factories import make_key


def counter(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
def stream(tmp_path):
    """A capture stream of this test's own on the test Redis, with two tries per failing record."""
    cfg = HandoffSettings.from_settings(stream=f"test-capture:{uuid.uuid4().hex}", spool_dir=tmp_path,
                                        max_attempts=2)
    client = redis.Redis.from_url(cfg.redis_url)
    yield cfg, client
    client.delete(cfg.stream, cfg.dead_stream, cfg.bytes_key, cfg.stats_key)
    client.close()


def hand_off(cfg: HandoffSettings, client: redis.Redis, records) -> None:
    """What the gateway's sender does: XADD each record and raise the byte counter."""
    for record in records:
        payload = encode(record)
        client.xadd(cfg.stream, {"r": payload})
        client.incrby(cfg.bytes_key, len(payload))


def consume(consumer: CaptureConsumer, cfg: HandoffSettings, client: redis.Redis) -> None:
    while client.xlen(cfg.stream):
        consumer.run_once()


@pytest.mark.django_db(transaction=True)
def test_a_record_that_fails_to_store_is_dead_lettered_with_a_metric_and_the_rest_stored(stream):
    cfg, client = stream
    key = make_key()[0]
    good1 = make_record(key, [user("one")])
    bad = make_record(key, [user("two")], model="m" * 500)  # longer than the column: the database refuses it
    nul = make_record(key, [user("three\u0000")])  # PostgreSQL's jsonb refuses NUL characters
    good2 = make_record(key, [user("four")])
    dead = counter("clawhub_capture_failures_total", reason="dead_letter")
    hand_off(cfg, client, [good1, bad, nul, good2])

    consumer = CaptureConsumer(cfg)
    consume(consumer, cfg, client)

    assert set(Turn.objects.values_list("request_id", flat=True)) == {good1.request_id, good2.request_id}
    letters = client.xrange(cfg.dead_stream)
    assert sorted(decode(fields[b"r"]).request_id for _, fields in letters) == sorted(
        [bad.request_id, nul.request_id])
    reasons = [fields[b"reason"].decode() for _, fields in letters]
    assert all(r.startswith("failed 2 times: DataError") for r in reasons), reasons
    assert counter("clawhub_capture_failures_total", reason="dead_letter") == dead + 2
    # Nothing waits or is pending: every record was either stored or dead-lettered, and /metrics says which.
    state = handoff_state(cfg)
    assert (state["backlog"], state["pending"], state["stored"], state["dead_letters"]) == (0, 0, 2, 2)
    assert state["retries"] >= 2 and state["backlog_bytes"] == 0
    # The dead-lettered requests were served all the same: their usage counts where it can be written (the
    # record with the over-long model cannot be metered under that model either).
    assert UsageDaily.objects.get(key=key, model=key.owner.tenant.model_id).requests == 3


@pytest.mark.django_db(transaction=True)
def test_a_record_that_fails_once_is_retried_and_stored_once(stream):
    """A deadlock or a statement timeout passes: the record is stored on its second try, not dead-lettered."""
    cfg, client = stream
    key = make_key()[0]
    records = [make_record(key, [user(f"turn {i}")]) for i in range(3)]
    flaky = records[1]
    calls = []

    def deadlocks_once(batch):
        calls.append([r.request_id for r in batch])
        if len(calls) == 1:
            others = [r for r in batch if r is not flaky]
            store.capture_store(others)
            raise store.CaptureFailed([(flaky, OperationalError("deadlock detected"))])
        store.capture_store(batch)

    hand_off(cfg, client, records)
    consumer = CaptureConsumer(cfg, store=deadlocks_once)
    consume(consumer, cfg, client)

    assert calls[1:] == [[flaky.request_id]]  # the others were acknowledged after the first commit
    assert sorted(Turn.objects.values_list("request_id", flat=True)) == sorted(r.request_id for r in records)
    state = handoff_state(cfg)
    assert (state["backlog"], state["pending"], state["stored"], state["dead_letters"]) == (0, 0, 3, 0)


@pytest.mark.django_db(transaction=True)
def test_the_consumer_keeps_its_database_connection_from_batch_to_batch(stream, monkeypatch):
    """With DATABASE_CONN_MAX_AGE=0 (the web's default) Django's close_old_connections reconnects for every
    batch, which cost a consumer at steady load more CPU than the turns it stored."""
    from django.db import connection

    cfg, client = stream
    key = make_key()[0]
    consumer = CaptureConsumer(cfg)
    assert connection.settings_dict["CONN_MAX_AGE"] == 0
    connects = []
    connect = connection.connect
    monkeypatch.setattr(connection, "connect", lambda: connects.append(1) or connect())
    for i in range(3):
        hand_off(cfg, client, [make_record(key, [user(f"turn {i}")])])
        consume(consumer, cfg, client)
    assert Turn.objects.count() == 3
    assert len(connects) <= 1


@pytest.mark.django_db(transaction=True)
def test_a_read_that_finds_a_few_records_waits_for_more_and_stores_them_in_one_batch(stream):
    """At steady load each read finds one or two records, and a batch costs about ten queries whatever its
    size: the consumer lingers (CAPTURE_BATCH_LINGER_MS) for what arrives meanwhile."""
    import threading

    cfg, client = stream
    cfg = dataclasses.replace(cfg, batch_linger=0.5)
    key = make_key()[0]
    consumer = CaptureConsumer(cfg)
    consumer.source.backlog()  # the group exists before the first record
    hand_off(cfg, client, [make_record(key, [user("first")])])
    later = threading.Timer(0.05, hand_off, (cfg, client, [make_record(key, [user(f"more {i}")])
                                                          for i in range(4)]))
    later.start()
    consumer.run_once()
    later.join()
    assert Turn.objects.count() == 5
    assert consumer.stats["batches"] == 1


@pytest.mark.django_db(transaction=True)
def test_records_of_the_old_format_and_the_new_store_the_same_prompt_ids(stream):
    """A record the gateway handed off before prompt ids followed it as text (one JSON object, ids inside it)
    waits in a stream or spool across the upgrade: it is stored as before. The new format stores the same ids;
    ids that are not a list of uint32 leave the turn without served prompt ids, never the turn lost."""
    cfg, client = stream
    key = make_key()[0]
    tenant = key.owner.tenant
    # Byte for byte what the gateway before this format handed off (fields it did not know yet missing).
    old = (
        '{"request_id":"old-format","route":"chat","key_id":KEY,"user_id":USER,"tenant_id":TENANT,'
        '"group_id":null,'
        '"model":"clawhub-personal","upstream_model":"base","adapter_version_id":null,"upstream":"http://u",'
        '"status":"complete","http_status":200,"started_at":1700000000.0,"latency_ms":12.0,"ttft_ms":null,'
        '"stream":false,"session_id":null,"turn_type":null,"session_done":false,"request":{"model":'
        '"clawhub-personal","messages":[{"role":"user","content":"old"}]},"choices":[{"index":0,'
        '"finish_reason":"stop","message":{"role":"assistant","content":"Sure."}}],"token_ids":[7,8],'
        '"logprobs":[-0.1,-0.2],"prompt_token_ids":[101,102,103],"prompt_tokens":3,"completion_tokens":2,'
        '"usage_estimated":false,"error":null,"trace_id":"t"}'
    )
    old = old.replace("KEY", str(key.pk)).replace("USER", str(key.owner_id)).replace("TENANT", str(tenant.pk))
    new = make_record(key, [user("new")], prompt_token_ids=RawIds(b"[101,102,104]"), token_ids=[7, 8])
    broken = make_record(key, [user("broken")], prompt_token_ids=RawIds(b"[101,-2]"), token_ids=[7, 8])
    client.xadd(cfg.stream, {"r": old.encode()})
    client.incrby(cfg.bytes_key, len(old.encode()))
    hand_off(cfg, client, [new, broken])
    assert b"\n[101,102,104]" in encode(new)

    consume(CaptureConsumer(cfg), cfg, client)

    turns = {t.request_id: t for t in Turn.objects.all()}
    assert turn_prompt_token_ids(turn=turns["old-format"]) == [101, 102, 103]
    assert turn_prompt_token_ids(turn=turns[new.request_id]) == [101, 102, 104]
    assert turns[new.request_id].prompt_token_count == 3 and turns[new.request_id].token_ids == [7, 8]
    assert turn_prompt_token_ids(turn=turns[broken.request_id]) is None
    assert turns[broken.request_id].prompt_token_count is None
    state = handoff_state(cfg)
    assert (state["backlog"], state["stored"], state["dead_letters"]) == (0, 3, 0)


@pytest.mark.django_db(transaction=True)
def test_dead_letters_an_older_consumer_could_not_decode_are_requeued_and_stored(stream, settings):
    """During an upgrade a consumer older than the gateway dead-letters records in the new format as
    undecodable; ``capture_consumer --requeue-undecodable`` puts those this consumer reads back on the
    stream. Letters of records that failed to store, and what still does not decode, stay where they are."""
    from io import StringIO

    from django.core.management import call_command

    cfg, client = stream
    settings.CAPTURE_STREAM = cfg.stream
    key = make_key()[0]
    new = make_record(key, [user("after the upgrade")], prompt_token_ids=RawIds(b"[5,6,7]"), token_ids=[1])
    failed = make_record(key, [user("refused")])
    letters = [(encode(new), "undecodable: JSONDecodeError: trailing characters at line 1 column 900"),
               (encode(failed), "failed 5 times: DataError: value too long"),
               (b"\x00not a record", "undecodable: JSONDecodeError: unexpected character")]
    for i, (payload, reason) in enumerate(letters):
        client.xadd(cfg.dead_stream, {"r": payload, "reason": reason, "id": f"{i}-0"})

    out = StringIO()
    call_command("capture_consumer", "--requeue-undecodable", stdout=out)

    assert "requeued 1 dead letters" in out.getvalue() and "1 still undecodable" in out.getvalue()
    assert [fields[b"reason"][:6] for _, fields in client.xrange(cfg.dead_stream)] == [b"failed", b"undeco"]
    consume(CaptureConsumer(cfg), cfg, client)
    assert turn_prompt_token_ids(turn=Turn.objects.get(request_id=new.request_id)) == [5, 6, 7]
    assert not Turn.objects.filter(request_id=failed.request_id).exists()
    state = handoff_state(cfg)
    assert (state["backlog"], state["backlog_bytes"], state["stored"]) == (0, 0, 1)

def test_redis_replies_are_parsed_by_hiredis_wherever_the_project_installs():
    """hiredis parses Redis replies in C: a 64 KB record read off the capture stream cost 61 us of CPU in
    redis-py's Python parser and 17-20 us with it. Every lock file carries it."""
    from pathlib import Path

    from redis.utils import HIREDIS_AVAILABLE

    assert HIREDIS_AVAILABLE
    locks = Path(__file__).resolve().parents[2] / "requirements"
    for lock in ("base", "run", "dev", "train"):
        assert "\nhiredis==" in (locks / f"{lock}.txt").read_text(), lock
