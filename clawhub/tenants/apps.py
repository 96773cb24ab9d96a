from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "clawhub.tenants"

    def ready(self) -> None:
        from clawhub.core import metrics
        from clawhub.tenants import naming

        # Metrics label requests by model id, whose rule lives here (core imports no app).
        metrics.register_model_label(naming.metric_label)
