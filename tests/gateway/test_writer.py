"""The gateway's capture writer on the real Redis: a full stream is never trimmed (records spool instead), a
shutdown hands every record to the log whatever failed before it, and a cancelled sender gives back the batch
it had taken. In-process: the writer is what is under test, not the server around it."""

import asyncio
import time
import uuid

import pytest
import redis
from prometheus_client import REGISTRY

from clawhub.conversations.capture.consumer import CaptureConsumer
from clawhub.conversations.capture.handoff import HandoffSettings
from clawhub.conversations.capture.records import TurnRecord, decode
from clawhub.conversations.capture.spool import Spool
from clawhub.conversations.capture.writer import STATS, CaptureWriter


def record(request_id: str) -> TurnRecord:
    return TurnRecord(request_id=request_id, route="chat", key_id=1, user_id=1, tenant_id=1, group_id=None,
                      model="base", upstream_model="tiny", adapter_version_id=None, upstream="u",
                      status="complete", http_status=200, started_at=1.0, latency_ms=2.0,
                      request={"messages": [{"role": "user", "content": "hi"}]})


@pytest.fixture
def log(tmp_path):
    """A capture stream and spool folder of this test's own; no consumer runs until the test starts one."""
    cfg = HandoffSettings.from_settings(stream=f"test-capture:{uuid.uuid4().hex}",
                                        spool_dir=tmp_path / "spool", in_process=False)
    client = redis.Redis.from_url(cfg.redis_url)
    yield cfg, client
    client.delete(cfg.stream, cfg.dead_stream, cfg.bytes_key, cfg.stats_key)
    client.close()


async def until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def delivered(cfg: HandoffSettings, client: redis.Redis) -> list[str]:
    """Every request id a consumer takes off the stream, until it is empty."""
    stored: list[TurnRecord] = []
    consumer = CaptureConsumer(cfg, store=stored.extend)
    while client.xlen(cfg.stream):
        consumer.run_once()
    consumer.close()
    return [r.request_id for r in stored]


def spooled(cfg: HandoffSettings) -> list[str]:
    spool = Spool(cfg.spool_dir, max_bytes=cfg.spool_max_bytes)
    return [decode(frame.payload).request_id
            for instance in spool.instances() for segment in instance.segments
            for frame in spool.read(segment, spool.acked(segment), max_records=10**6, max_bytes=10**9)]


def test_a_stream_over_its_count_bound_spools_and_never_trims_unread_records(log):
    """Before: XADD MAXLEN ~ 50 dropped whole 100-entry nodes of records no consumer had read. Each record
    that waits in the spool because the stream is full is counted."""
    cfg, client = log
    full = REGISTRY.get_sample_value("clawhub_capture_stream_full_total") or 0.0
    cfg.maxlen = 50
    ids = [f"r{i}" for i in range(400)]

    async def scenario():
        writer = CaptureWriter(handoff=cfg)
        writer.start()
        spooled_before = STATS["spooled"]
        for rid in ids[:300]:
            writer.submit(record(rid))
        await until(lambda: not writer._outbox and not writer._sending)
        assert client.xlen(cfg.stream) == 300  # one pipeline went over the bound; nothing was trimmed
        for rid in ids[300:]:
            writer.submit(record(rid))  # the stream is full: these wait in the spool
        await until(lambda: not writer._outbox and not writer._sending)
        assert STATS["spooled"] - spooled_before == 100 and len(spooled(cfg)) == 100
        assert REGISTRY.get_sample_value("clawhub_capture_stream_full_total") - full == 100
        assert client.xlen(cfg.stream) == 300
        await writer.aclose()  # a clean stop forwards the spool

    asyncio.run(scenario())
    got = delivered(cfg, client)
    assert sorted(got) == sorted(ids), f"{len(set(ids) - set(got))} records lost"


def logged(cfg: HandoffSettings, client: redis.Redis) -> list[str]:
    """The request ids in the log: the stream and the spool."""
    return [decode(fields[b"r"]).request_id for _, fields in client.xrange(cfg.stream)] + spooled(cfg)


def test_a_cancelled_sender_gives_back_the_batch_it_had_taken(log):
    """Before: the records the sender had popped for its XADD were in neither the outbox nor the log."""
    cfg, client = log

    async def scenario():
        writer = CaptureWriter(handoff=cfg)
        writer.start()
        taken = asyncio.Event()

        async def hanging_xadd(items, size):  # Redis stalls mid-call
            taken.set()
            await asyncio.Event().wait()

        writer._xadd = hanging_xadd
        writer.submit(record("r1"))
        writer.submit(record("r2"))
        await asyncio.wait_for(taken.wait(), 5)
        assert not writer._outbox  # the sender holds both
        sender = writer._tasks[0]
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
        del writer._xadd  # Redis answers again
        await writer.aclose()

    asyncio.run(scenario())
    assert sorted(logged(cfg, client)) == ["r1", "r2"]


def test_aclose_stops_the_writer_and_spools_its_records_when_the_final_hand_off_raises(log):
    """Before: aclose() skipped stop() when _shutdown_tasks() raised: the queued record was in no log and the
    writer's thread and spool file stayed open."""
    cfg, client = log

    async def scenario():
        writer = CaptureWriter(handoff=cfg)
        writer.start()

        async def broken_flush(final=False):
            raise RuntimeError("the final hand-off failed")

        writer._flush_outbox = broken_flush
        writer.submit(record("r1"))
        with pytest.raises(RuntimeError):
            await writer.aclose()
        assert writer._thread is None  # stopped

    asyncio.run(scenario())
    assert logged(cfg, client) == ["r1"]


def test_gateway_shutdown_hands_off_every_turn_when_an_earlier_close_raises(log, settings):
    """Before: the upstream pool's stop raising skipped writer.stop(), and the queued turn was lost."""
    from clawhub.gateway.app import Gateway
    from clawhub.gateway.config import GatewayConfig

    cfg, client = log
    settings.CAPTURE_STREAM, settings.CAPTURE_SPOOL_DIR = cfg.stream, str(cfg.spool_dir)
    settings.CAPTURE_CONSUMER_IN_PROCESS = False

    async def scenario():
        gateway = Gateway(GatewayConfig.from_settings(
            upstreams=[{"url": "http://127.0.0.1:9", "base_model": "tiny", "api_key": ""}],
            redis_url=settings.REDIS_URL))
        await gateway.startup()

        async def broken_stop():
            raise RuntimeError("the upstream pool could not stop cleanly")

        gateway.pool.stop = broken_stop
        gateway.writer.submit(record("served-1"))
        await gateway.shutdown()
        assert not gateway.writer._outbox

    asyncio.run(scenario())
    assert logged(cfg, client) == ["served-1"]
