"""What the capture log tells operators: its readiness check (/readyz, /readyz/gateway) and its scrape-time
gauges (/metrics). Core serves those endpoints and imports no app, so the conversations app registers both in
its ``AppConfig.ready()``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from clawhub.core.health import CheckFailed

log = logging.getLogger("clawhub.gateway.capture_status")  # the name its log lines have always had

# What the capture log reports at scrape time (capture.handoff.handoff_state): clawhub_capture_<name>.
CAPTURE_GAUGES = (
    ("backlog", "Finished turns waiting in the Redis stream to be stored (read or not)."),
    ("backlog_bytes", "Bytes of finished turns waiting to be stored (stream, or spool without Redis)."),
    ("max_bytes", "The log's byte bound: above it the gateway spools locally (stream) or drops (spool)."),
    ("pending", "Turns a consumer has read and not yet acknowledged."),
    ("lag_seconds", "Age of the oldest turn not yet stored."),
    ("spool_bytes", "Bytes in this host's local spool folder."),
    ("spool_max_bytes", "The local spool's byte bound: beyond it turns are dropped."),
    ("stored", "Turns the consumers stored (acknowledged after commit), since the log was created."),
    ("retries", "Store attempts the consumers repeated (database outage or a failing record)."),
    ("dead_letters", "Records moved to the dead letters (undecodable, or failing after every attempt)."),
    ("lost_in_flight", "Requests in flight when a gateway process crashed (from its journal)."),
    ("forwarded", "Spooled turns the gateway moved into the stream once Redis answered again."),
    ("heartbeat_age", "Seconds since a capture consumer last reported."),
)


def check_capture() -> dict[str, Any]:
    """The capture log takes records: this host's spool is below its bound. A Redis stream that is unreachable
    or over its byte bound is no reason to stop serving (turns wait in the spool); the body says so."""
    from clawhub.conversations.capture.handoff import HandoffSettings, handoff_state
    from clawhub.conversations.capture.spool import Spool

    cfg = HandoffSettings.from_settings()
    try:
        state = handoff_state(cfg)
    except Exception as exc:
        log.warning("capture log state unavailable: %s: %s", type(exc).__name__, exc)
        used = Spool(cfg.spool_dir, max_bytes=cfg.spool_max_bytes).rescan() if cfg.spool_dir.is_dir() else 0
        state = {"backend": "redis", "stream": "unreachable", "spool_bytes": used}
    if state["spool_bytes"] >= cfg.spool_max_bytes * 0.95:
        raise CheckFailed("capture spool full")
    detail = {k: state[k] for k in ("backend", "stream", "backlog", "pending", "spool_bytes") if k in state}
    if "lag_seconds" in state:
        detail["lag_seconds"] = round(state["lag_seconds"], 1)
    return detail


def collect_capture_gauges() -> Iterable[Metric]:
    from clawhub.conversations.capture.handoff import handoff_state

    try:
        state = handoff_state()
    except Exception as exc:
        log.warning("capture log state unavailable: %s", type(exc).__name__)
        return []
    families = []
    for name, help_text in CAPTURE_GAUGES:
        value = state.get(name)
        if value is None:
            continue
        family = GaugeMetricFamily(f"clawhub_capture_{name}", help_text, labels=["backend"])
        family.add_metric([state["backend"]], float(value))
        families.append(family)
    return families
