"""The capture writer's housekeeping (clawhub.conversations.capture.writer): every SYNC_INTERVAL the open
spool segment is synced, and every HOUSEKEEPING_INTERVAL, once Redis answers and the stream is under its
bounds again, what was spooled (this process's records, and those of writers that died on this host) is
forwarded to the stream, and the records a dead writer had in flight are reported lost. A part of
``CaptureWriter``.
"""

from __future__ import annotations

import asyncio
import logging
import time

from clawhub.conversations.capture.spool import SYNC_INTERVAL

logger = logging.getLogger("clawhub.gateway.capture")

HOUSEKEEPING_INTERVAL = 0.5
PIPELINE_BYTES = 8 * 1024 * 1024  # one XADD pipeline carries at most this much

# Module-level counters (this process): how records left the gateway.
STATS = {"submitted": 0, "streamed": 0, "spooled": 0, "forwarded": 0, "dropped": 0, "op_failures": 0}


class SpoolHousekeeping:
    """Uses the writer's ``spool``, ``cfg``, ``_redis`` and its stream-bound state and helpers."""

    async def _housekeeping(self) -> None:
        last_round = 0.0
        while True:
            await asyncio.sleep(SYNC_INTERVAL)
            try:
                if self.spool.has_open_segment():
                    await asyncio.to_thread(self.spool.sync)
                if time.monotonic() - last_round < HOUSEKEEPING_INTERVAL:
                    continue
                last_round = time.monotonic()
                self.spool.rescan()
                if self._redis is not None:
                    if self._over_bytes:
                        await self._refresh_bytes()
                    if time.monotonic() >= self._redis_down_until and not self._over_bytes:
                        await self._forward_spool()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("capture housekeeping failed")

    async def _refresh_bytes(self) -> None:
        cfg = self.cfg
        pipe = self._redis.pipeline(transaction=False)
        pipe.get(cfg.bytes_key)
        pipe.xlen(cfg.stream)
        try:
            raw, length = await asyncio.wait_for(pipe.execute(), cfg.redis_timeout * 2)
            total = int(raw or 0)
        except Exception as exc:
            self._redis_failed(exc)
            return
        # Hysteresis: spool until the backlog is well under the bound again.
        self._over_bytes = total > cfg.max_bytes * 0.9 or int(length) > cfg.maxlen * 0.9
        self._alarmed = total > self.cfg.max_bytes * self.cfg.alarm_ratio

    async def _forward_spool(self, final: bool = False) -> None:
        """Moves spooled records (this process's, and those of writers that died here) into the stream."""
        from clawhub.conversations.capture.consumer import folder_lock

        instances = [i for i in self.spool.instances() if i.segments or not i.alive]
        if not instances:
            return
        with folder_lock(self.cfg.spool_dir, "forward") as held:
            if not held:
                return  # another process on this host forwards
            for instance in instances:
                if instance.name == self.instance and self.spool.has_open_segment():
                    self.spool.seal()  # Redis is back: what we spooled meanwhile can go now
                if instance.alive and instance.name != self.instance:
                    continue  # a live writer forwards its own
                for segment in instance.segments:
                    if not self.spool.is_sealed(instance, segment):
                        break
                    if not await self._forward_segment(segment):
                        return
                if not instance.alive:
                    lost = self.spool.finish_instance(instance)
                    await self._report_lost(instance.name, lost)

    async def _forward_segment(self, segment) -> bool:
        cfg = self.cfg
        while True:
            offset = self.spool.acked(segment)
            frames = self.spool.read(segment, offset, max_records=cfg.batch_records, max_bytes=PIPELINE_BYTES)
            if not frames:
                if offset >= self.spool.size(segment):
                    self.spool.retire(segment)
                return True
            pipe = self._redis.pipeline(transaction=False)
            size = 0
            for frame in frames:
                if frame.payload is None:
                    pipe.xadd(cfg.dead_stream, {"r": frame.raw, "reason": "damaged spool frame"})
                    continue
                pipe.xadd(cfg.stream, {"r": frame.payload})
                size += len(frame.payload)
            pipe.incrby(cfg.bytes_key, size)
            pipe.hincrby(cfg.stats_key, "forwarded", len(frames))
            pipe.xlen(cfg.stream)
            try:
                results = await asyncio.wait_for(pipe.execute(), cfg.redis_timeout * 4)
            except Exception as exc:
                self._redis_failed(exc)
                return False
            self.spool.ack(segment, frames[-1].end)
            STATS["forwarded"] += len(frames)
            self._note_bytes(int(results[-3]), int(results[-1]))

    async def _report_lost(self, instance: str, lost: list[str]) -> None:
        from clawhub.conversations.capture.consumer import report_lost

        if not lost:
            return
        report_lost(instance, lost)
        try:
            await asyncio.wait_for(self._redis.hincrby(self.cfg.stats_key, "lost_in_flight", len(lost)),
                                   self.cfg.redis_timeout * 2)
        except Exception as exc:
            self._redis_failed(exc)
