"""What the gateway does with each served request's TurnRecord besides capturing it: its Prometheus
metrics, and its key's last use. The capture writer (clawhub.conversations.capture.writer) runs both on its
thread, so the event loop pays for neither.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from clawhub.conversations.capture.records import TurnRecord
from clawhub.conversations.capture.writer import STATS
from clawhub.core import metrics

logger = logging.getLogger("clawhub.gateway.capture")

LAST_USED_EVERY = 60.0  # seconds between last_used_at updates of one key


class RequestMeters:
    """The per-request metrics of one served /v1 completion, taken from its TurnRecord.

    Label children are cached: ``labels()`` costs more than the increment itself, and the label sets are few.
    """

    def __init__(self) -> None:
        self._requests: dict[tuple, Any] = {}
        self._timings: dict[tuple, tuple[Any, Any]] = {}
        self._tokens: dict[str, tuple[Any, Any]] = {}

    def observe(self, record: TurnRecord) -> None:
        model = metrics.model_label(record.model)
        route = record.api or record.route  # the API the client spoke, as a refused request is counted
        key = (route, model, record.http_status)
        counter = self._requests.get(key)
        if counter is None:
            counter = self._requests[key] = metrics.GATEWAY_REQUESTS.labels(
                route=route, model=model, status=str(record.http_status)
            )
        counter.inc()
        timing = self._timings.get((route, model))
        if timing is None:
            timing = self._timings[(route, model)] = (
                metrics.GATEWAY_REQUEST_DURATION.labels(route=route, model=model),
                metrics.GATEWAY_TIME_TO_FIRST_TOKEN.labels(route=route, model=model),
            )
        timing[0].observe(record.latency_ms / 1000)
        if record.stream and record.ttft_ms is not None:
            timing[1].observe(record.ttft_ms / 1000)
        if record.prompt_tokens or record.completion_tokens:
            tokens = self._tokens.get(model)
            if tokens is None:
                tokens = self._tokens[model] = (
                    metrics.GATEWAY_TOKENS.labels(kind="prompt", model=model),
                    metrics.GATEWAY_TOKENS.labels(kind="completion", model=model),
                )
            if record.prompt_tokens:
                tokens[0].inc(record.prompt_tokens)
            if record.completion_tokens:
                tokens[1].inc(record.completion_tokens)


class ServedRequests:
    """The writer's record observer in the gateway: metrics for every record, last_used_at of their keys."""

    def __init__(self) -> None:
        self._meters = RequestMeters()
        self._last_used: dict[int, float] = {}

    def count(self, record: TurnRecord) -> None:
        self._meters.observe(record)

    def observe(self, records: list[TurnRecord]) -> None:
        """Writes last_used_at of the keys not written for LAST_USED_EVERY seconds."""
        now = time.monotonic()
        due = {r.key_id for r in records if now - self._last_used.get(r.key_id, -1e9) >= LAST_USED_EVERY}
        if not due:
            return
        from clawhub.gateway.services import api_keys_mark_used

        try:
            api_keys_mark_used(key_ids=sorted(due))
            self._last_used.update(dict.fromkeys(due, now))
        except Exception as exc:
            # Not a turn: a missed last_used_at is written with the next one. The database may be down.
            STATS["op_failures"] += 1
            logger.warning("updating last_used_at failed: %s: %s", type(exc).__name__, exc)
