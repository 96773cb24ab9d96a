from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "clawhub.gateway"

    def ready(self) -> None:
        from clawhub.core import health, metrics
        from clawhub.gateway import capture_status

        # Core serves /readyz and /metrics and imports no app: the capture log reports through these.
        health.register_readiness_check("capture", capture_status.check_capture, gateway=True)
        metrics.register_collector("capture", capture_status.collect_capture_gauges)
