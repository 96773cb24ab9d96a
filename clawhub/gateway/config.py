"""The gateway's settings, read once from Django settings when a gateway app is built."""

from dataclasses import dataclass, field

from clawhub.gateway.quotas import GroupLimits


@dataclass
class GatewayConfig:
    upstreams: list[dict] = field(default_factory=list)
    max_body_bytes: int = 4 * 1024 * 1024
    connect_timeout: float = 5.0
    read_timeout: float = 600.0
    health_interval: float = 5.0
    key_cache_seconds: float = 10.0
    adapter_cache_seconds: float = 2.0
    redis_url: str = ""  # empty: quotas are counted inside this process
    group_limits: GroupLimits = field(default_factory=GroupLimits)
    capture_queue_size: int = 20000
    upstream_keepalive: float = 4.0  # seconds an idle upstream connection is kept; below vLLM's own 5 s
    lease_seconds: float = 30.0  # a concurrency lease's life; renewed every third of it while a request runs
    redis_timeout: float = 0.5  # every Redis call of residency (quotas have their own, the same setting)

    @classmethod
    def from_settings(cls, **overrides) -> "GatewayConfig":
        from django.conf import settings

        values = dict(
            upstreams=list(settings.CLAWHUB_UPSTREAMS),
            max_body_bytes=settings.GATEWAY_MAX_BODY_BYTES,
            connect_timeout=settings.GATEWAY_UPSTREAM_CONNECT_TIMEOUT,
            read_timeout=settings.GATEWAY_UPSTREAM_TIMEOUT,
            health_interval=settings.GATEWAY_HEALTH_INTERVAL,
            key_cache_seconds=settings.GATEWAY_KEY_CACHE_SECONDS,
            adapter_cache_seconds=settings.GATEWAY_ADAPTER_CACHE_SECONDS,
            redis_url=settings.REDIS_URL,
            group_limits=GroupLimits(rpm=settings.GATEWAY_GROUP_RPM, tpm=settings.GATEWAY_GROUP_TPM,
                                     concurrency=settings.GATEWAY_GROUP_CONCURRENCY),
            capture_queue_size=settings.GATEWAY_CAPTURE_QUEUE_SIZE,
            upstream_keepalive=settings.GATEWAY_UPSTREAM_KEEPALIVE_SECONDS,
            lease_seconds=settings.GATEWAY_LEASE_SECONDS,
            redis_timeout=settings.GATEWAY_REDIS_TIMEOUT,
        )
        values.update(overrides)
        return cls(**values)
