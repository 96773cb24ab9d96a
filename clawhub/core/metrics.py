"""Prometheus metrics: what every part of ClawHub counts, and how ``/metrics`` renders it.

Counters and histograms are module-level objects; the part that owns an event increments them where it happens
(the calls each part makes are listed in deploy/README.md, "Metrics"). Under gunicorn every worker is its own
process, so with ``PROMETHEUS_MULTIPROC_DIR`` set prometheus_client writes values to files there and
``render_metrics`` adds them up across processes (deploy/gunicorn.conf.py empties the folder at start and
removes dead workers' gauges).

Queue depths and training runs by state are not counted by anyone: they are read at scrape time (Redis LLEN,
one database query) by ``ScrapeTimeCollector``, so they are right however many processes run.

Label values must stay few: use ``model_label`` for the model label, never a raw user-chosen string.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily, Metric

log = logging.getLogger(__name__)

# Generations run from milliseconds (a cached short answer) to the gateway's 600 s upstream timeout.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
# A judge task takes seconds; a training run up to hours.
TASK_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0)

# The Celery queues whose depth is reported, and the queue names as they are spelled in Redis.
QUEUES = ("judge", "train")

# --- gateway (/v1) ------------------------------------------------------------------------------------------

GATEWAY_REQUESTS = Counter(
    "clawhub_gateway_requests",
    "Requests the /v1 gateway answered. route: chat | completions | models; model: model_label(client"
    " model id); status: the HTTP status sent to the client.",
    ["route", "model", "status"],
)
GATEWAY_REQUEST_DURATION = Histogram(
    "clawhub_gateway_request_duration_seconds",
    "Time from the request's arrival to the last byte of the response (the whole stream for SSE).",
    ["route", "model"],
    buckets=LATENCY_BUCKETS,
)
GATEWAY_TIME_TO_FIRST_TOKEN = Histogram(
    "clawhub_gateway_time_to_first_token_seconds",
    "Streams only: time from the request's arrival to the first content chunk sent to the client.",
    ["route", "model"],
    buckets=TTFT_BUCKETS,
)
GATEWAY_TOKENS = Counter(
    "clawhub_gateway_tokens",
    "Tokens served, from the upstream's usage (or the estimate for a cut stream). kind: prompt | completion.",
    ["kind", "model"],
)
QUOTA_REJECTIONS = Counter(
    "clawhub_quota_rejections",
    "Requests refused with 429. limit: rpm | tpm | concurrency | group_rpm | group_tpm | group_concurrency"
    " | budget.",
    ["limit"],
)
UPSTREAM_ERRORS = Counter(
    "clawhub_upstream_errors",
    "Failures talking to a vLLM upstream. kind: connect | timeout | http_4xx | http_5xx | protocol | cut"
    " (stream ended early) | no_upstream (none healthy).",
    ["kind"],
)
CAPTURE_FAILURES = Counter(
    "clawhub_capture_failures",
    "Turns that could not be handed off or stored. reason: spool_full | not_started (dropped by the gateway)"
    " | dead_letter (moved aside by the consumer). The request itself was served.",
    ["reason"],
)

CAPTURE_HANDOFFS = Counter(
    "clawhub_capture_handoffs",
    "Finished turns handed to the durable log. path: stream (Redis) | spool (local file: no Redis, or Redis"
    " unreachable or over its byte bound).",
    ["path"],
)
CAPTURE_STREAM_FULL = Counter(
    "clawhub_capture_stream_full",
    "Finished turns spooled locally because the Redis stream was over its byte or count bound: the unread"
    " turns a trim (XADD MAXLEN) would have dropped. They are forwarded once the backlog is under the bound.",
)
REDIS_FAILURES = Counter(
    "clawhub_redis_failures",
    "Redis calls of the gateway that failed or timed out. part: quota (served without limits: fail-open) |"
    " quota_release | capture (the record went to the local spool).",
    ["part"],
)
GATEWAY_STALE_SERVED = Counter(
    "clawhub_gateway_stale_served",
    "Lookups answered from the last good value past its TTL because the database did not answer."
    " what: key | adapter.",
    ["what"],
)
GATEWAY_UNAVAILABLE = Counter(
    "clawhub_gateway_unavailable",
    "Requests answered 503 because a lookup could not be made and nothing was known. what: key | adapter.",
    ["what"],
)

GENERATION_BUMPS_DEFERRED = Counter(
    "clawhub_generation_bumps_deferred",
    "Changes (a key revoked or edited, an adapter switched) whose generation bump the shared cache did not"
    " take: kept in the database and made by the periodic sweep (clawhub.core.generations).",
)

# --- adapters on the upstreams ------------------------------------------------------------------------------

ADAPTER_LOADS = Counter(
    "clawhub_adapter_loads",
    "POST /v1/load_lora_adapter calls made by the gateway. outcome: ok | error.",
    ["outcome"],
)
ADAPTER_LOAD_DURATION = Histogram(
    "clawhub_adapter_load_duration_seconds",
    "How long loading an adapter into an upstream took (requests wait for it).",
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
ADAPTER_EVICTIONS = Counter(
    "clawhub_adapter_evictions",
    "Adapters unloaded from an upstream. reason: lru (over capacity) | retired (older version after a swap).",
    ["reason"],
)

# --- workers ------------------------------------------------------------------------------------------------

TASK_DURATION = Histogram(
    "clawhub_task_duration_seconds",
    "Celery task run time, observed in the worker by the task_prerun/task_postrun hooks. state: the task's"
    " end state (SUCCESS, FAILURE, RETRY, ...).",
    ["task", "state"],
    buckets=TASK_BUCKETS,
)


def _unregistered_model_label(model: str | None) -> str:
    # Until the tenants app registers its rule nothing is known about ids, and a raw id must never be a label.
    return "none" if not model else "other"


_model_label: Callable[[str | None], str] = _unregistered_model_label


def register_model_label(label: Callable[[str | None], str]) -> None:
    """Sets the rule ``model_label`` follows; the tenants app, which owns model ids, registers it in its
    ``AppConfig.ready()`` (core imports no app)."""
    global _model_label
    _model_label = label


def model_label(model: str | None) -> str:
    """The ``model`` label value for a client-facing model id, with few distinct values.

    Group ids carry a slug per group; they are folded into ``clawhub-group`` so a site with thousands of
    groups does not create thousands of series (per-group numbers are in the usage dashboards).
    """
    return _model_label(model)


# --- scrape-time gauges -------------------------------------------------------------------------------------


# What the apps read at scrape time, as core imports no app (the gateway: its capture log's state): name ->
# a function returning metric families. Collected after core's own, in the order registered.
_registered_collectors: dict[str, Callable[[], Iterable[Metric]]] = {}


def register_collector(name: str, collect: Callable[[], Iterable[Metric]]) -> None:
    """Adds ``collect``'s families to every /metrics scrape. Called from the app's ``AppConfig.ready()``;
    registering a name again replaces its function. ``collect`` must not raise: a scrape returns the other
    metrics whatever one part's state."""
    _registered_collectors[name] = collect


class ScrapeTimeCollector:
    """Reads queue depths, training runs by state and what the apps register at scrape time, so no process
    has to keep them."""

    def collect(self) -> Iterator[Metric]:
        yield from self._queue_depth()
        yield from self._training_runs()
        for collect in _registered_collectors.values():
            yield from collect()

    def _queue_depth(self) -> Iterable[Metric]:
        from django.conf import settings

        family = GaugeMetricFamily("clawhub_queue_depth", "Messages waiting in a Celery queue.",
                                   labels=["queue"])
        try:
            depths = queue_depths(settings.CELERY_BROKER_URL,
                                  getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", None) or {})
        except Exception as exc:  # a scrape must still return the other metrics while the broker is down
            log.warning("queue depth unavailable: %s", type(exc).__name__)
            return []
        for queue, depth in depths.items():
            family.add_metric([queue], depth)
        return [family]

    def _training_runs(self) -> Iterable[Metric]:
        from django.apps import apps

        # The training app lands separately; until it is installed there is nothing to report.
        if not apps.is_installed("clawhub.training"):
            return []
        try:
            counts = training_runs_by_state()
        except Exception as exc:
            log.warning("training runs by state unavailable: %s", type(exc).__name__)
            return []
        family = GaugeMetricFamily("clawhub_training_runs", "Training runs by state.", labels=["state"])
        for state, count in sorted(counts.items()):
            family.add_metric([state], count)
        return [family]


def queue_depths(broker_url: str, transport_options: dict[str, Any]) -> dict[str, int]:
    """Messages waiting in each of QUEUES: LLEN of the queue's lists (Redis), or the broker's files."""
    scheme = broker_url.split("://", 1)[0]
    if scheme in ("redis", "rediss"):
        import redis

        # kombu keeps one list per priority step: "<queue>" for 0 and "<queue>\x06\x16<step>" for the others
        # (its default steps are 0, 3, 6, 9).
        steps = transport_options.get("priority_steps", [0, 3, 6, 9])
        sep = transport_options.get("sep", "\x06\x16")
        client = redis.Redis.from_url(broker_url, socket_connect_timeout=1, socket_timeout=1)
        try:
            pipe = client.pipeline(transaction=False)
            for queue in QUEUES:
                for step in steps:
                    pipe.llen(f"{queue}{sep}{step}" if step else queue)
            lengths = pipe.execute()
        finally:
            client.close()
        per_queue = len(steps)
        return {queue: sum(lengths[i * per_queue:(i + 1) * per_queue]) for i, queue in enumerate(QUEUES)}
    if scheme == "filesystem":
        folder = Path(transport_options.get("data_folder_in", "."))
        # kombu's filesystem transport names each message "<time>_<uuid>.<queue>.msg".
        names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
        return {queue: sum(1 for n in names if n.endswith(f".{queue}.msg")) for queue in QUEUES}
    return {}


def training_runs_by_state() -> dict[str, int]:
    from django.apps import apps
    from django.db.models import Count

    model = apps.get_model("training", "TrainingRun")
    field = next(f for f in ("state", "status") if any(x.name == f for x in model._meta.get_fields()))
    # Every known state appears, zeros included, so a dashboard can tell "none running" from "no data".
    counts = {value: 0 for value, _ in (model._meta.get_field(field).choices or [])}
    for row in model.objects.values(field).annotate(n=Count("pk")).order_by():
        counts[str(row[field])] = row["n"]
    return counts


# --- rendering ----------------------------------------------------------------------------------------------


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class _Combined:
    def __init__(self, *collectors: Any):
        self.collectors = collectors

    def collect(self) -> Iterator[Metric]:
        for collector in self.collectors:
            yield from collector.collect()


def process_registry() -> Any:
    """This process's metrics, or all processes' when PROMETHEUS_MULTIPROC_DIR is set."""
    if multiprocess_dir():
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return registry
    return REGISTRY


def render_metrics() -> tuple[bytes, str]:
    """The Prometheus text exposition and its content type."""
    return generate_latest(_Combined(process_registry(), ScrapeTimeCollector())), CONTENT_TYPE_LATEST


# --- Celery hooks -------------------------------------------------------------------------------------------

_task_started: dict[str, float] = {}


def _on_task_prerun(task_id: str | None = None, **_: Any) -> None:
    if task_id:
        _task_started[task_id] = time.monotonic()


def _on_task_postrun(task_id: str | None = None, task: Any = None, state: str | None = None,
                     **_: Any) -> None:
    started = _task_started.pop(task_id or "", None)
    if started is not None:
        TASK_DURATION.labels(task=getattr(task, "name", "unknown"), state=state or "UNKNOWN").observe(
            time.monotonic() - started
        )


def _on_worker_process_shutdown(pid: int | None = None, **_: Any) -> None:
    if multiprocess_dir():
        multiprocess.mark_process_dead(pid or os.getpid())


def _on_worker_init(**_: Any) -> None:
    """Serves this worker's metrics (all its pool processes' with PROMETHEUS_MULTIPROC_DIR) on a port."""
    from django.conf import settings

    port = getattr(settings, "CLAWHUB_WORKER_METRICS_PORT", 0)
    if not port:
        return
    from prometheus_client import start_http_server

    # PROMETHEUS_MULTIPROC_DIR must start empty (a tmpfs or emptyDir per container does that): files from an
    # earlier run would be added to this run's numbers.
    start_http_server(port, registry=process_registry())
    log.info("worker metrics on :%s/metrics", port)


def connect_celery_signals() -> None:
    """Task durations, and the worker's own /metrics port when CLAWHUB_WORKER_METRICS_PORT is set."""
    from celery import signals

    signals.task_prerun.connect(_on_task_prerun, weak=False, dispatch_uid="clawhub.metrics.task_prerun")
    signals.task_postrun.connect(_on_task_postrun, weak=False, dispatch_uid="clawhub.metrics.task_postrun")
    signals.worker_init.connect(_on_worker_init, weak=False, dispatch_uid="clawhub.metrics.worker_init")
    signals.worker_process_shutdown.connect(_on_worker_process_shutdown, weak=False,
                                            dispatch_uid="clawhub.metrics.worker_process_shutdown")
