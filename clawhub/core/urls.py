"""Routes for the operational endpoints. OpsEndpointsMiddleware answers these paths first; the routes keep
them reachable (and reversible) where that middleware is not installed."""

from django.urls import path

from clawhub.core import health

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("readyz/gateway", health.readyz_gateway, name="readyz-gateway"),
    path("metrics", health.metrics, name="metrics"),
]
