from django.apps import AppConfig


class ConversationsConfig(AppConfig):
    name = "clawhub.conversations"

    def ready(self) -> None:
        from clawhub.conversations.capture import status
        from clawhub.core import health, metrics

        # Core serves /readyz and /metrics and imports no app: the capture log reports through these.
        health.register_readiness_check("capture", status.check_capture, gateway=True)
        metrics.register_collector("capture", status.collect_capture_gauges)
