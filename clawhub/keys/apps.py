from django.apps import AppConfig


class KeysConfig(AppConfig):
    name = "clawhub.keys"

    def ready(self) -> None:
        from clawhub.keys import schema  # noqa: F401  (registers the OpenAPI description of key auth)
