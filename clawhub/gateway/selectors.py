"""Reads of the gateway's registry: which upstream holds which adapter."""

def adapter_in_flight(*, adapter_name: str) -> int | None:
    """How many requests on any gateway process hold a lease on this adapter now (clawhub.gateway.quotas);
    None when Redis is not configured or does not answer (then nobody can tell)."""
    import time

    from django.conf import settings

    if not settings.REDIS_URL:
        return None
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=settings.GATEWAY_REDIS_TIMEOUT,
                                  socket_connect_timeout=settings.GATEWAY_REDIS_TIMEOUT)
    try:
        return int(client.zcount(f"gw:busy:{adapter_name}", time.time(), "+inf"))
    except redis.RedisError:
        return None
    finally:
        client.close()
