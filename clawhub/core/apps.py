from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "clawhub.core"

    def ready(self) -> None:
        from clawhub.core import strict

        strict.install()
